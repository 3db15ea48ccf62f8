"""GroupCoordinator: the runtime of the group coordinator shards this broker hosts.

The rules are the sans-I/O `GroupCoordinatorShard`'s (localcluster/group/); this module owns
what a shard may not touch: the partition logs of `__consumer_offsets`, the clock, the timers and
the futures requests wait on. As in Kafka's ZooKeeper mode, the coordinator of a group is the
leader of its offsets partition:
- after every LeaderAndIsr and StopReplica, `on_replicas_changed` loads each offsets partition
  this broker now leads (its shard answers COORDINATOR_LOAD_IN_PROGRESS until the replay of the
  local log ends) and unloads each it no longer leads (parked requests get NOT_COORDINATOR);
- a request goes to the shard of `partition_for(group_id)` with a future as its reply token; a
  shard that is not loaded here answers NOT_COORDINATOR itself;
- a shard's appends go to the local leader with acks=all, in order; its replies wait until the
  records are committed (the produce future completes once the HW passes them).
Time is the wall clock in ms (commit timestamps and offsets retention are wall-clock in Kafka).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from localcluster.broker.config import BrokerConfig
from localcluster.broker.metadata import OFFSETS_TOPIC
from localcluster.group import GroupConfig, GroupCoordinatorShard, Result, partition_for
from localcluster.group.coordinator import Append
from localcluster.storage import OffsetOutOfRangeError
from localcluster.storage import record_batch as rb

log = logging.getLogger(__name__)

LOAD_CHUNK_BYTES = 1 << 20  # one read of the log while loading; the loop runs between reads


def group_config(config: BrokerConfig) -> GroupConfig:
    return GroupConfig(
        group_min_session_timeout_ms=config.group_min_session_timeout_ms,
        group_max_session_timeout_ms=config.group_max_session_timeout_ms,
        group_initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
        group_max_size=config.group_max_size,
        offsets_retention_ms=config.offsets_retention_minutes * 60_000,
        offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms,
        offset_metadata_max_bytes=config.offset_metadata_max_bytes,
        max_append_bytes=config.message_max_bytes,
    )


class GroupCoordinator:
    def __init__(self, replica_manager, config: BrokerConfig,
                 partition_count: Callable[[], object]):  # fmt: skip
        """`partition_count()` is awaited for the number of offsets partitions (from the store)."""
        self.replica_manager = replica_manager
        self.config = config
        self.group_config = group_config(config)
        self.partition_count = partition_count
        self.num_partitions: int | None = None
        self.shards: dict[int, GroupCoordinatorShard] = {}
        self._loads: dict[int, asyncio.Task] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    @staticmethod
    def now_ms() -> int:
        return int(time.time() * 1000)

    # -- leadership of the offsets partitions --------------------------------------------------

    def on_replicas_changed(self) -> None:
        """Load the offsets partitions led here, unload those no longer led."""
        led = {tp[1]: hosted.state.leader_epoch
               for tp, hosted in self.replica_manager.partitions.items()
               if tp[0] == OFFSETS_TOPIC and hosted.state.is_leader}  # fmt: skip
        for partition in set(self.shards) | set(self._loads):
            if partition not in led:
                self._unload(partition)
        for partition, epoch in led.items():
            shard = self.shards.get(partition)
            if shard is None and partition not in self._loads:
                if self.num_partitions is not None:  # loading from now on, as Kafka marks it
                    self._begin_loading(partition, epoch)
                task = asyncio.get_running_loop().create_task(self._load(partition, epoch))
                self._loads[partition] = task
                task.add_done_callback(lambda _t, p=partition: self._loads.pop(p, None))
            elif shard is not None and epoch > shard.coordinator_epoch:
                shard.coordinator_epoch = epoch  # re-elected here: the state is still ours

    @property
    def loading_before_count(self) -> bool:
        """Offsets partitions are led here but their count is not read yet: every group
        request is answered COORDINATOR_LOAD_IN_PROGRESS meanwhile."""
        return self.num_partitions is None and bool(self._loads)

    def _begin_loading(self, partition: int, epoch: int) -> GroupCoordinatorShard | None:
        if not 0 <= partition < self.num_partitions:
            log.error("%s-%d is led here but the topic has %d partitions; not loading it",
                      OFFSETS_TOPIC, partition, self.num_partitions)  # fmt: skip
            return None
        shard = GroupCoordinatorShard(partition, self.num_partitions, self.group_config)
        shard.begin_loading(epoch)
        self.shards[partition] = shard
        return shard

    async def _load(self, partition: int, epoch: int) -> None:
        started = time.monotonic()
        if self.num_partitions is None:
            self.num_partitions = await self.partition_count()
        shard = self.shards.get(partition) or self._begin_loading(partition, epoch)
        if shard is None:
            return
        tp = (OFFSETS_TOPIC, partition)
        offset, batches = None, 0
        while (lg := self.replica_manager.log_manager.logs.get(tp)) is not None:
            offset = lg.log_start_offset if offset is None else max(offset, lg.log_start_offset)
            if offset >= lg.log_end_offset:
                break
            try:
                data = lg.read(offset, LOAD_CHUNK_BYTES).tobytes()
            except OffsetOutOfRangeError:  # retention moved the start: go on from there
                offset = None
                continue
            for position, header in rb.iter_batches(data):
                shard.replay_batch(memoryview(data)[position : position + header.size])
                offset = header.last_offset + 1
                batches += 1
            await asyncio.sleep(0)  # requests are answered (COORDINATOR_LOAD_IN_PROGRESS) meanwhile
        if self.shards.get(partition) is not shard:
            return  # unloaded while loading
        self._execute(partition, shard.complete_loading(self.now_ms()))
        # one line per partition that holds anything: 50 empty ones would drown the log
        (log.info if batches else log.debug)(
            "%s-%d: coordinator of %d group(s) in epoch %d (%d batches replayed in %.0f ms)",
            OFFSETS_TOPIC, partition, len(shard.groups), epoch, batches,
            (time.monotonic() - started) * 1000)  # fmt: skip

    def _unload(self, partition: int) -> None:
        task = self._loads.pop(partition, None)
        if task is not None:
            task.cancel()
        timer = self._timers.pop(partition, None)
        if timer is not None:
            timer.cancel()
        shard = self.shards.pop(partition, None)
        if shard is not None:
            self._answer(shard.unload())

    def close(self) -> None:
        for partition in list(self.shards):
            self._unload(partition)
        for task in list(self._loads.values()):
            task.cancel()

    # -- requests --------------------------------------------------------------------------

    def shard_for(self, group_id: str) -> GroupCoordinatorShard | None:
        """The shard that owns `group_id` if it is hosted here (loading or loaded)."""
        if self.num_partitions is None:
            return None
        return self.shards.get(partition_for(group_id, self.num_partitions))

    def loaded_shards(self) -> list[GroupCoordinatorShard]:
        return [s for _, s in sorted(self.shards.items())]

    async def handle(self, shard: GroupCoordinatorShard, request) -> object:
        """Hand `request` to `shard`; the response comes when the shard answers it."""
        future = asyncio.get_running_loop().create_future()
        self._execute(shard.partition, shard.handle(request, self.now_ms(), future))
        return await future

    # -- carrying out a shard's Result --------------------------------------------------------

    def _execute(self, partition: int, result: Result) -> None:
        self._answer(result)
        shard = self.shards.get(partition)
        if shard is None:
            return
        for append in result.appends:
            self._append(shard, append)
        self._arm(shard, result.next_deadline_ms)

    @staticmethod
    def _answer(result: Result) -> None:
        for reply in result.replies:
            future = reply.reply_to
            if isinstance(future, asyncio.Future) and not future.done():
                future.set_result(reply.response)  # a cancelled one: its client left

    def _arm(self, shard: GroupCoordinatorShard, deadline_ms: int | None) -> None:
        timer = self._timers.pop(shard.partition, None)
        if timer is not None:
            timer.cancel()
        if deadline_ms is None:
            return
        delay_s = max(deadline_ms - self.now_ms(), 0) / 1000 + 0.001
        self._timers[shard.partition] = asyncio.get_running_loop().call_later(
            delay_s, self._tick, shard)  # fmt: skip

    def _tick(self, shard: GroupCoordinatorShard) -> None:
        if self.shards.get(shard.partition) is shard:
            self._timers.pop(shard.partition, None)
            self._execute(shard.partition, shard.tick(self.now_ms()))

    def _append(self, shard: GroupCoordinatorShard, append: Append) -> None:
        records = [rb.Record(value=r.value, key=r.key, timestamp=append.timestamp_ms)
                   for r in append.records]  # fmt: skip
        batch = rb.encode_batch(records, rb.BatchSpec(base_timestamp=append.timestamp_ms))
        tp = (OFFSETS_TOPIC, shard.partition)
        response, committed = self.replica_manager.append_to_internal_topic(
            tp, memoryview(batch), self.config.offsets_commit_timeout_ms)  # fmt: skip
        if response.error_code:
            self._execute(shard.partition,
                          shard.on_append_failed(append.append_id, response.error_code,
                                                 self.now_ms()))  # fmt: skip
            return
        last_offset = response.base_offset + len(records) - 1
        shard.on_appended(append.append_id, last_offset)
        if committed is None:  # committed at once (the ISR is the leader alone)
            self._execute(shard.partition, shard.on_committed(last_offset + 1, self.now_ms()))
            return

        def done(future: asyncio.Future) -> None:
            if self.shards.get(shard.partition) is not shard:
                return  # unloaded meanwhile: its requests were answered NOT_COORDINATOR
            error = future.result()
            result = (shard.on_committed(last_offset + 1, self.now_ms()) if not error
                      else shard.on_append_failed(append.append_id, error, self.now_ms()))  # fmt: skip
            self._execute(shard.partition, result)

        committed.add_done_callback(done)
