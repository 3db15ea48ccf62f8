"""broker/replica_fetcher.py: a follower's fetcher that stops on an unexpected error is logged
with its traceback and started again, and the request it carried no longer holds the core's
session (which plans nothing while a request is in flight). Before, the task died silently and
its partitions fell out of every ISR until the next LeaderAndIsr for that leader.

The broker side is real (ReplicaManager, its replica core and logs); the connection to the
leader is a recording stand-in that never answers, as the leader is not what is under test."""

from __future__ import annotations

import asyncio
import logging

from localcluster.broker import replica_fetcher
from localcluster.broker.config import BrokerConfig
from localcluster.broker.replica_fetcher import ReplicaFetcherManager
from localcluster.broker.replica_manager import ReplicaManager
from localcluster.protocol.api import ApiKey
from localcluster.protocol.controller_requests import LeaderAndIsrRequest, PartitionState

DEADLINE_S = 10.0
LEADER = 2


class SilentLeader:
    """Connections that record each request sent and never answer it."""

    def __init__(self):
        self.opened = 0
        self.sent: list[ApiKey] = []
        self.request_sent = asyncio.Event()

    async def open(self, broker_id, client_id, max_in_flight=1):
        assert broker_id == LEADER
        self.opened += 1
        return SilentConnection(self)


class SilentConnection:
    def __init__(self, leader: SilentLeader):
        self.leader = leader
        self.closed = False

    def close(self):
        self.closed = True

    async def send(self, api_key, encode, *, version, timeout_ms=None):
        self.leader.sent.append(api_key)
        self.leader.request_sent.set()
        await asyncio.Event().wait()  # no answer; the test ends by closing the manager


def follow(manager: ReplicaManager) -> None:
    manager.become_leader_or_follower(LeaderAndIsrRequest(0, 1, (PartitionState(
        "t", 0, 1, leader=LEADER, leader_epoch=1, isr=(LEADER, 1), zk_version=0,
        replicas=(LEADER, 1), is_new=True),)))  # fmt: skip


async def wait_for(condition, what: str) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while not condition():
            await asyncio.sleep(0.01)
    assert condition(), what


def test_a_fetcher_that_raises_is_logged_and_started_again_with_its_request_freed(
    tmp_path, caplog, monkeypatch
):
    monkeypatch.setattr(replica_fetcher, "RESTART_AFTER_S", 0.05)
    manager = ReplicaManager(BrokerConfig(broker_id=1), tmp_path / "data", tmp_path)
    leader = SilentLeader()
    execute = manager.execute
    failures = []

    def execute_failing_once_on_a_request(ready):
        if ready.requests and not failures:
            failures.append(ready.requests[0])
            raise RuntimeError("a bug while carrying out the fetcher's step")
        return execute(ready)

    async def run():
        manager.fetchers = ReplicaFetcherManager(manager, 1, 500, leader)
        manager.execute = execute_failing_once_on_a_request
        try:
            follow(manager)
            first = manager.fetchers.fetchers[LEADER]
            await wait_for(lambda: failures, "the fetcher planned a request")
            await wait_for(lambda: first.task.done(), "the first fetcher stopped")
            # a new fetcher, whose core session plans again (the request in flight was freed)
            await asyncio.wait_for(leader.request_sent.wait(), DEADLINE_S)
            assert manager.fetchers.fetchers[LEADER] is not first
            assert not manager.fetchers.fetchers[LEADER].task.done()
        finally:
            await manager.fetchers.close()

    with caplog.at_level(logging.ERROR, logger=replica_fetcher.__name__):
        asyncio.run(run())
    manager.close()
    assert leader.sent and leader.opened == 2  # the first fetcher's connection was dropped
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "fetcher for leader 2 stopped on an unexpected error" in errors[0].getMessage()
    assert "a bug while carrying out" in str(errors[0].exc_info[1])


def test_a_closed_manager_starts_no_fetcher_again(tmp_path, monkeypatch):
    monkeypatch.setattr(replica_fetcher, "RESTART_AFTER_S", 0.05)
    manager = ReplicaManager(BrokerConfig(broker_id=1), tmp_path / "data", tmp_path)
    leader = SilentLeader()

    async def run():
        manager.fetchers = ReplicaFetcherManager(manager, 1, 500, leader)
        execute = manager.execute
        manager.execute = lambda ready: (_ for _ in ()).throw(RuntimeError("a bug")) if (
            ready.requests) else execute(ready)  # fmt: skip
        follow(manager)
        first = manager.fetchers.fetchers[LEADER]
        await wait_for(lambda: first.task.done(), "the fetcher stopped")
        await manager.fetchers.close()
        await asyncio.sleep(0.2)  # past the restart delay: nothing may start after close
        return manager.fetchers.fetchers

    assert asyncio.run(run()) == {}
    manager.close()
