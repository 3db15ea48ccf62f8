"""ReplicaManager's ISR writes: the writes queued while a batch is in the store go together as
the next batch; a batch whose answer is lost is read back partition by partition."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from localcluster.broker.config import BrokerConfig
from localcluster.broker.replica_host import ISR_READ_BACK, ISR_WRITE
from localcluster.broker.replica_manager import ReplicaManager
from localcluster.replication.partition import IsrUpdate

UPDATE = IsrUpdate("t", 0, leader=1, leader_epoch=4, isr=(1, 2), zk_version=7, reason="caught up")


def manager_with(tmp_path, writer) -> tuple[ReplicaManager, list]:
    manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
    answered = []
    manager.isr_writer = writer
    manager.on_isr_write_answered = lambda u, ok, version: answered.append(
        (u.partition, ok, version)
    )
    return manager, answered


def test_writes_queued_during_a_batch_go_together_as_the_next(tmp_path):
    calls, entered, gate = [], None, None

    async def writer(updates, step):
        calls.append(([u.partition for u in updates], step))
        if len(calls) == 1:
            entered.set()
            await gate.wait()
        return [(True, 8) for _ in updates]

    async def run():
        nonlocal entered, gate
        entered, gate = asyncio.Event(), asyncio.Event()
        manager, answered = manager_with(tmp_path, writer)
        manager.write_isr(UPDATE)
        await entered.wait()  # the first batch is in the store
        for p in (1, 2):
            manager.write_isr(replace(UPDATE, partition=p))
        gate.set()
        await manager._isr_drain
        return answered

    answered = asyncio.run(run())
    assert calls == [([0], ISR_WRITE), ([1, 2], ISR_WRITE)]
    assert answered == [(0, True, 8), (1, True, 8), (2, True, 8)]


def test_a_batch_whose_answer_is_lost_is_read_back_per_partition(tmp_path):
    calls = []

    async def writer(updates, step):
        calls.append(([u.partition for u in updates], step))
        if step == ISR_WRITE:
            raise ConnectionError("the store did not answer")
        return [(True, 9)]

    async def run():
        manager, answered = manager_with(tmp_path, writer)
        steps = []

        def unanswered(update, step, reason):
            steps.append((update.partition, step))
            return ISR_READ_BACK if step == ISR_WRITE else None

        manager.on_isr_write_unanswered = unanswered
        manager.write_isr(UPDATE)
        manager.write_isr(replace(UPDATE, partition=1))
        await manager._isr_drain
        await asyncio.gather(*manager._isr_tasks)
        return answered, steps

    answered, steps = asyncio.run(run())
    assert calls[0] == ([0, 1], ISR_WRITE)
    assert sorted(calls[1:]) == [([0], ISR_READ_BACK), ([1], ISR_READ_BACK)]
    assert steps == [(0, ISR_WRITE), (1, ISR_WRITE)]
    assert sorted(answered) == [(0, True, 9), (1, True, 9)]
