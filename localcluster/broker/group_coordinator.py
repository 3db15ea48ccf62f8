"""GroupCoordinator: the asyncio runtime of the group coordinator shards this broker hosts.

Everything between the shards (localcluster/group/) and the replica host is GroupHost's
(group_host.py, shared with the simulator's broker): which offsets partitions to load and
unload, the replay of the local log, carrying out a shard's Result. This module adds what only
the event loop has: a load runs as a task that yields to the loop between chunks (requests are
answered COORDINATOR_LOAD_IN_PROGRESS meanwhile) and awaits the offsets topic's partition count
from the store first; a request waits on a future; a commit is answered on the produce future
ReplicaManager completes once the HW passes the records; deadlines are `call_later` timers.
Time is the wall clock in ms (commit timestamps and offsets retention are wall-clock in Kafka).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from localcluster.broker.config import BrokerConfig
from localcluster.broker.group_host import OFFSETS_TOPIC, CommitWait, GroupHost, group_config

log = logging.getLogger(__name__)

__all__ = ["OFFSETS_TOPIC", "GroupCoordinator", "group_config"]


class GroupCoordinator(GroupHost):
    def __init__(self, replica_manager, config: BrokerConfig,
                 partition_count: Callable[[], object]):  # fmt: skip
        """`partition_count()` is awaited for the number of offsets partitions (from the store)."""
        super().__init__(replica_manager, group_config(config), config.offsets_commit_timeout_ms)
        self.replica_manager = replica_manager
        self.config = config
        self.partition_count = partition_count
        self._timers: dict[int, asyncio.TimerHandle] = {}

    @staticmethod
    def now_ms() -> int:
        return int(time.time() * 1000)

    # -- GroupHost's hooks ---------------------------------------------------------------------

    def start_load(self, partition: int, epoch: int) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._load(partition, epoch))
        task.add_done_callback(lambda _t, p=partition: self._load_done(p, task))
        return task

    def _load_done(self, partition: int, task: asyncio.Task) -> None:
        if self.loads.get(partition) is task:
            del self.loads[partition]

    async def _load(self, partition: int, epoch: int) -> None:
        if self.num_partitions is None:
            self.num_partitions = await self.partition_count()
        for _ in self.load(partition, epoch):
            await asyncio.sleep(0)  # requests are answered (COORDINATOR_LOAD_IN_PROGRESS) meanwhile

    def cancel_load(self, handle: object) -> None:
        handle.cancel()

    def deliver(self, reply_to: object, response: object) -> None:
        if isinstance(reply_to, asyncio.Future) and not reply_to.done():
            reply_to.set_result(response)  # a cancelled one: its client left

    def commit_key(self, wait: CommitWait) -> asyncio.Future:
        """ReplicaManager answers a waiting produce by setting its key's result (an error code)."""
        future = asyncio.get_running_loop().create_future()
        future.add_done_callback(
            lambda f: None if f.cancelled() else self.on_commit_answered(wait, f.result())
        )
        return future

    def on_deadline(self, partition: int, deadline_ms: int | None) -> None:
        timer = self._timers.pop(partition, None)
        if timer is not None:
            timer.cancel()
        if deadline_ms is None:
            return
        delay_s = max(deadline_ms - self.now_ms(), 0) / 1000 + 0.001
        self._timers[partition] = asyncio.get_running_loop().call_later(
            delay_s, self._tick, partition)  # fmt: skip

    def _tick(self, partition: int) -> None:
        self._timers.pop(partition, None)
        self.tick_partition(partition)

    # -- requests ------------------------------------------------------------------------------

    async def handle(self, shard, request) -> object:
        """Hand `request` to `shard`; the response comes when the shard answers it."""
        future = asyncio.get_running_loop().create_future()
        self.submit(shard, request, future)
        return await future

    def close(self) -> None:
        super().close()
        for task in list(self.loads.values()):
            task.cancel()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
