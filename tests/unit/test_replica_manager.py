"""broker/replica_manager.py: the periodic checkpoints are written off the event loop's thread,
one write at a time, and a clean close waits for the write in progress; broker/log_manager.py
keeps the newest values on disk whatever order the writes come in."""

from __future__ import annotations

import asyncio
import threading

import pytest

from localcluster.broker.config import BrokerConfig
from localcluster.broker.replica_manager import ReplicaManager
from localcluster.protocol.controller_requests import PartitionState
from localcluster.replication import ready as r
from localcluster.storage import Record, encode_batch
from localcluster.storage.checkpoint import read_partition_offsets

DEADLINE_S = 10.0


def test_the_hw_checkpoint_is_written_on_its_own_thread_one_at_a_time(tmp_path):
    manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
    write = manager.log_manager.write_high_watermarks
    writes: list[tuple[str, dict]] = []
    entered, gate = threading.Event(), threading.Event()

    def slow_write(high_watermarks, taken=None):
        writes.append((threading.current_thread().name, dict(high_watermarks)))
        entered.set()
        assert gate.wait(DEADLINE_S)  # a write stuck in fsync
        write(high_watermarks, taken)

    manager.log_manager.write_high_watermarks = slow_write
    manager.core._checkpointed_hw[("t", 0)] = 5
    manager.checkpoint_high_watermarks()
    assert entered.wait(DEADLINE_S)  # the caller went on while the write waits
    manager.core._checkpointed_hw[("t", 0)] = 7  # the write has its own copy of the values
    manager.checkpoint_high_watermarks()  # skipped: one write at a time
    assert [(name.startswith("hw-checkpoint"), hws) for name, hws in writes] == [
        (True, {("t", 0): 5})
    ]
    closing = threading.Thread(target=manager.close, name="closing")
    closing.start()
    gate.set()
    closing.join(DEADLINE_S)
    assert not closing.is_alive()
    # close waited for the write in progress, then wrote the latest values itself
    assert [hws for _, hws in writes] == [{("t", 0): 5}, {("t", 0): 7}]
    assert writes[1][0] == "closing"
    assert read_partition_offsets(tmp_path / "replication-offset-checkpoint") == {("t", 0): 7}


def test_a_failed_checkpoint_write_is_logged_and_the_next_round_writes(tmp_path, caplog):
    manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
    write = manager.log_manager.write_high_watermarks
    failures = [OSError(28, "No space left on device")]

    def failing_once(high_watermarks, taken=None):
        if failures:
            raise failures.pop()
        write(high_watermarks, taken)

    manager.log_manager.write_high_watermarks = failing_once
    manager.core._checkpointed_hw[("t", 0)] = 3
    manager.checkpoint_high_watermarks()
    manager._hw_checkpoint.exception(DEADLINE_S)  # wait for it (it failed)
    manager.checkpoint_high_watermarks()
    assert manager._hw_checkpoint.result(DEADLINE_S) is None
    assert read_partition_offsets(tmp_path / "replication-offset-checkpoint") == {("t", 0): 3}
    assert "periodic checkpoint failed" in caplog.text
    manager.close()


def test_the_recovery_point_checkpoints_are_written_on_the_thread(tmp_path):
    manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
    lg = manager.log_manager.get_or_create(("t", 0))
    lg.append(encode_batch([Record(b"v") for _ in range(3)]), leader_epoch=0)
    writers = []
    write = manager.log_manager.write_recovery_points

    def recording(*args):
        writers.append(threading.current_thread().name)
        write(*args)

    manager.log_manager.write_recovery_points = recording
    manager.checkpoint_recovery_points()
    assert manager._recovery_checkpoint.result(DEADLINE_S) is None
    assert writers and writers[0].startswith("hw-checkpoint")
    assert read_partition_offsets(tmp_path / "recovery-point-offset-checkpoint") == {("t", 0): 3}
    assert read_partition_offsets(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 0}
    manager.close()


def test_values_taken_earlier_never_overwrite_newer_ones_on_disk(tmp_path):
    manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
    logs = manager.log_manager
    older, newer = logs.checkpoint_taken(), logs.checkpoint_taken()
    logs.write_high_watermarks({("t", 0): 9}, newer)
    logs.write_high_watermarks({("t", 0): 4}, older)  # a late write of older values
    assert read_partition_offsets(tmp_path / "replication-offset-checkpoint") == {("t", 0): 9}
    logs.write_high_watermarks({("t", 0): 10})  # a write without a time is taken now
    assert read_partition_offsets(tmp_path / "replication-offset-checkpoint") == {("t", 0): 10}


def test_a_leader_and_isr_needs_the_configs_of_the_topics_it_starts_hosting_only(tmp_path):
    """Kafka reads a topic's config when it creates the partition; a hosted partition has its
    configs (AlterConfigs reaches it through apply_topic_config), so a new controller's full
    LeaderAndIsr of hosted partitions reads nothing from the store."""

    async def run():
        manager = ReplicaManager(BrokerConfig(broker_id=1), tmp_path / "data", tmp_path)
        hosted = PartitionState("t", 0, 1, 1, 0, (1, 2), 0, (1, 2))
        assert manager.topics_to_configure([hosted]) == {"t"}
        manager.lead_or_follow(1, [hosted], {})
        new = PartitionState("u", 0, 1, 2, 0, (2, 1), 0, (2, 1))
        again = PartitionState("t", 0, 2, 1, 0, (1, 2), 0, (1, 2))
        assert manager.topics_to_configure([again, new]) == {"u"}
        manager.close()

    asyncio.run(run())


def test_a_moved_log_start_is_written_on_the_thread_and_delete_records_waits_for_it(tmp_path):
    """A follower takes its leader's start from every fetch answer that moves it (under
    retention, several times a second); each write fsyncs on the broker's disk, which blocked
    the event loop 7-35 ms a time until Dec 2026. Moves during a write are covered by one more
    write after it; `log_starts_written` (DeleteRecords' answer) waits until they are on disk."""

    async def run():
        manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
        lg = manager.log_manager.get_or_create(("t", 0))
        lg.append(encode_batch([Record(b"v") for _ in range(10)]), leader_epoch=0)
        write = manager.log_manager.write_log_start_offsets
        writes: list[tuple[str, dict]] = []
        entered, gate = threading.Event(), threading.Event()

        def slow_write(starts, taken):
            writes.append((threading.current_thread().name, dict(starts)))
            entered.set()
            assert gate.wait(DEADLINE_S)  # a write stuck in fsync
            write(starts, taken)

        manager.log_manager.write_log_start_offsets = slow_write
        manager.execute(r.Ready(log_actions=[r.IncrementLogStartOffset(("t", 0), 2)]))
        assert await asyncio.to_thread(entered.wait, DEADLINE_S)  # the loop went on
        for offset in (4, 6):  # two more moves while the first write waits
            manager.execute(r.Ready(log_actions=[r.IncrementLogStartOffset(("t", 0), offset)]))
        written = asyncio.ensure_future(manager.log_starts_written())
        await asyncio.sleep(0)
        assert not written.done()
        gate.set()
        await asyncio.wait_for(written, DEADLINE_S)
        assert [(name.startswith("hw-checkpoint"), starts) for name, starts in writes] == [
            (True, {("t", 0): 2}), (True, {("t", 0): 6})]  # fmt: skip
        assert read_partition_offsets(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 6}
        await manager.log_starts_written()  # nothing moved since: at once
        manager.close()

    asyncio.run(run())


def test_a_failed_log_start_write_reaches_its_waiter_and_the_next_wait_writes_again(tmp_path):
    """DeleteRecords answers KAFKA_STORAGE_ERROR then, rather than a deletion a kill -9 undoes."""

    async def run():
        manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
        lg = manager.log_manager.get_or_create(("t", 0))
        lg.append(encode_batch([Record(b"v") for _ in range(10)]), leader_epoch=0)
        write = manager.log_manager.write_log_start_offsets
        failures = [OSError(28, "No space left on device")]
        gate = threading.Event()

        def failing_once(starts, taken):
            assert gate.wait(DEADLINE_S)
            if failures:
                raise failures.pop()
            write(starts, taken)

        manager.log_manager.write_log_start_offsets = failing_once
        manager.execute(r.Ready(log_actions=[r.IncrementLogStartOffset(("t", 0), 3)]))
        waiting = asyncio.ensure_future(manager.log_starts_written())
        await asyncio.sleep(0)  # it waits for the write under way
        gate.set()
        with pytest.raises(OSError, match="No space left"):
            await asyncio.wait_for(waiting, DEADLINE_S)
        await asyncio.wait_for(manager.log_starts_written(), DEADLINE_S)  # written again
        assert read_partition_offsets(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 3}
        manager.close()

    asyncio.run(run())
