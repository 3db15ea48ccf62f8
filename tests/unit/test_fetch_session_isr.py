"""A leader counts a fetch of an idle partition only from the follower session holding it
(replication/partition.py, FollowerFetchSession): a follower's partitions stay in the ISR
while it fetches on, however its full fetches arrive. Real ReplicaManager (core, logs and
KIP-227 cache) as the leader; the follower's end is the real FetchSessionHandler."""

from __future__ import annotations

import asyncio

from localcluster.broker.config import BrokerConfig
from localcluster.broker.replica_manager import ReplicaManager
from localcluster.protocol.controller_requests import LeaderAndIsrRequest, PartitionState
from localcluster.protocol.fetch import FetchPartition, FetchRequest
from localcluster.protocol.incremental_fetch import FetchSessionHandler

LAG_MS = 100
FOLLOWER = 2


def lead(manager: ReplicaManager, partitions: int) -> None:
    manager.become_leader_or_follower(LeaderAndIsrRequest(0, 1, tuple(PartitionState(
        "t", p, 1, leader=1, leader_epoch=1, isr=(1, FOLLOWER), zk_version=0,
        replicas=(1, FOLLOWER), is_new=True) for p in range(partitions))))  # fmt: skip


def test_a_full_fetch_read_after_the_one_that_replaced_it_keeps_no_partition_from_the_follower(
    tmp_path,
):
    config = BrokerConfig(broker_id=1, replica_lag_time_max_ms=LAG_MS,
                          replica_fetch_wait_max_ms=LAG_MS)  # fmt: skip
    manager = ReplicaManager(config, tmp_path / "data", tmp_path)
    proposed = []
    manager.write_isr = proposed.append
    handler = FetchSessionHandler()
    wanted = [("t", FetchPartition(p, 0, 1 << 20, 1, 0)) for p in range(3)]

    async def fetch(session_request) -> tuple[int, int]:
        request = FetchRequest(FOLLOWER, 5, 1, 1 << 20, 0, session_request.to_send,
                               session_request.session_id, session_request.session_epoch,
                               forgotten=session_request.forgotten)  # fmt: skip
        context = manager.fetch_session_cache.context(request, True, manager.now_ms())
        if not context.error:
            await manager.fetch(context)
        return context.error, context.session_id

    async def run():
        lead(manager, 3)
        # The follower hangs up on a full fetch (a partition joined its session) and sends
        # another; the leader reads the second first and the first only later, from its
        # closed socket, once the follower's new session holds the partitions idle.
        first, second = handler.build(wanted), handler.build(wanted)
        handler.on_response(second, *await fetch(second))
        for _ in range(3):
            session_request = handler.build(wanted)
            handler.on_response(session_request, *await fetch(session_request))
        await fetch(first)  # its answer is lost with the connection
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 4 * LAG_MS / 1000
        rounds = 0
        while loop.time() < deadline and rounds < 1000:  # the follower fetches on, all idle
            session_request = handler.build(wanted)
            handler.on_response(session_request, *await fetch(session_request))
            manager.maybe_shrink_isr()
            rounds += 1
        return rounds

    rounds = asyncio.run(run())
    manager.close()
    assert rounds > 10
    assert proposed == [], f"an idle follower that fetched on was dropped: {proposed}"
