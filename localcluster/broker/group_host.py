"""GroupHost: the group coordinator shards a broker hosts, without an event loop. What the
broker runtime (group_coordinator.py) and the simulator's broker (tests/sim/broker.py) share,
as both share ReplicaHost for the replica core.

As in Kafka's ZooKeeper mode, the coordinator of a group is the leader of its offsets partition:
- after every LeaderAndIsr and StopReplica, `on_replicas_changed` loads each offsets partition
  the replica host now leads (its shard answers COORDINATOR_LOAD_IN_PROGRESS until the replay
  of the local log ends) and unloads each it no longer leads (parked requests: NOT_COORDINATOR);
- a request goes to the shard of `partition_for(group_id)` with the runtime's reply token; a
  shard that is not loaded here answers NOT_COORDINATOR itself;
- a shard's appends go to the replica host's leader append with acks=all, in order; the replies
  that wait for them are sent once the HW passes them (the produce answer of the append).

What differs between runtimes are the hooks below: the clock, how a load is scheduled (the
runtime yields between chunks of the replay), delivering a reply, the token a commit is
answered on, and timers for the deadlines each shard reports. Rules: nothing here decides (the
shards do), waits, sleeps or sends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from localcluster.broker.config import BrokerConfig
from localcluster.broker.replica_host import ReplicaHost
from localcluster.group import GroupConfig, GroupCoordinatorShard, Result, partition_for
from localcluster.group.coordinator import Append
from localcluster.metadata_types import OFFSETS_TOPIC
from localcluster.replication import errors
from localcluster.storage import OffsetOutOfRangeError
from localcluster.storage import record_batch as rb

log = logging.getLogger(__name__)

LOAD_CHUNK_BYTES = 1 << 20  # one read of the log while loading; the runtime yields between reads


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


@dataclass(frozen=True, slots=True)
class CommitWait:
    """An append of a shard waiting for the HW: the runtime answers it with `on_commit_answered`."""

    shard: GroupCoordinatorShard
    append_id: int
    last_offset: int


class GroupHost:
    def __init__(self, replicas: ReplicaHost, group_config: GroupConfig,
                 commit_timeout_ms: int, num_partitions: int | None = None):  # fmt: skip
        """`num_partitions`: the offsets topic's partition count, None until the runtime reads it."""
        self.replicas = replicas
        self.group_config = group_config
        self.commit_timeout_ms = commit_timeout_ms
        self.num_partitions = num_partitions
        self.shards: dict[int, GroupCoordinatorShard] = {}
        self.loads: dict[int, object] = {}  # partition -> the runtime's handle of a load running
        self.deadlines: dict[int, int] = {}  # partition -> when to tick its shard
        self.new_uuid: Callable[[], str] | None = None  # the shards' member ids (None: uuid4)

    # -- the runtime's hooks -------------------------------------------------------------------

    def now_ms(self) -> int:
        return self.replicas.now_ms()

    def start_load(self, partition: int, epoch: int) -> object:
        """Run `load(partition, epoch)` to its end (yielding to requests between its steps);
        a handle of the load if it is still running when this returns."""
        raise NotImplementedError

    def cancel_load(self, handle: object) -> None:
        pass

    def deliver(self, reply_to: object, response: object) -> None:
        raise NotImplementedError

    def commit_key(self, wait: CommitWait) -> object:
        """The key the replica host's produce answer comes with; the runtime routes that answer
        to `on_commit_answered(wait, error)`."""
        return wait

    def on_deadline(self, partition: int, deadline_ms: int | None) -> None:
        """The shard's next deadline changed (None: none): `tick_partition` then."""

    # -- leadership of the offsets partitions --------------------------------------------------

    def led_partitions(self) -> dict[int, int]:
        """The offsets partitions led here, with their leader epochs."""
        return {tp[1]: hosted.state.leader_epoch
                for tp, hosted in self.replicas.partitions.items()
                if tp[0] == OFFSETS_TOPIC and hosted.state.is_leader}  # fmt: skip

    def on_replicas_changed(self) -> None:
        """Load the offsets partitions led here, unload those no longer led."""
        led = self.led_partitions()
        for partition in set(self.shards) | set(self.loads):
            if partition not in led:
                self.unload(partition)
        for partition, epoch in sorted(led.items()):
            shard = self.shards.get(partition)
            if shard is None and partition not in self.loads:
                if self.num_partitions is not None:  # loading from now on, as Kafka marks it
                    self.begin_loading(partition, epoch)
                self.replicas.note(logging.INFO, f"loading {OFFSETS_TOPIC}-{partition} "
                                   f"(coordinator epoch {epoch})")  # fmt: skip
                handle = self.start_load(partition, epoch)
                if handle is not None:
                    self.loads[partition] = handle
            elif shard is not None and epoch > shard.coordinator_epoch:
                shard.coordinator_epoch = epoch  # re-elected here: the state is still ours

    def begin_loading(self, partition: int, epoch: int) -> GroupCoordinatorShard | None:
        assert self.num_partitions is not None
        if not 0 <= partition < self.num_partitions:
            log.error("%s-%d is led here but the topic has %d partitions; not loading it",
                      OFFSETS_TOPIC, partition, self.num_partitions)  # fmt: skip
            return None
        shard = GroupCoordinatorShard(partition, self.num_partitions, self.group_config,
                                      self.new_uuid)  # fmt: skip
        shard.begin_loading(epoch)
        self.shards[partition] = shard
        return shard

    def load(self, partition: int, epoch: int) -> Iterator[None]:
        """Replay the local log of the partition into its shard, one chunk per step (the
        runtime answers requests between steps), then complete the loading."""
        started_ms = self.now_ms()
        shard = self.shards.get(partition) or self.begin_loading(partition, epoch)
        if shard is None:
            return
        tp, offset, batches = (OFFSETS_TOPIC, partition), None, 0
        while (lg := self.replicas.log_manager.logs.get(tp)) is not None:
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
            yield
            if self.shards.get(partition) is not shard:
                return  # unloaded while loading
        if self.shards.get(partition) is not shard:
            return
        self.execute(partition, shard.complete_loading(self.now_ms()))
        # at INFO for a partition that holds anything: 50 empty ones would drown the log
        self.replicas.note(logging.INFO if batches else logging.DEBUG,
                           f"coordinator of {OFFSETS_TOPIC}-{partition}: {len(shard.groups)} "
                           f"group(s) loaded",
                           f"epoch {epoch}, {batches} batches replayed in "
                           f"{self.now_ms() - started_ms} ms")  # fmt: skip

    def unload(self, partition: int) -> None:
        if partition in self.shards:
            self.replicas.note(logging.INFO, f"unloading {OFFSETS_TOPIC}-{partition}")
        handle = self.loads.pop(partition, None)
        if handle is not None:
            self.cancel_load(handle)
        if self.deadlines.pop(partition, None) is not None:
            self.on_deadline(partition, None)
        shard = self.shards.pop(partition, None)
        if shard is not None:
            self._answer(shard.unload())

    def close(self) -> None:
        for partition in list(self.shards) + list(self.loads):
            self.unload(partition)

    # -- requests ------------------------------------------------------------------------------

    @property
    def loading_before_count(self) -> bool:
        """Offsets partitions are led here but their count is not read yet: every group
        request is answered COORDINATOR_LOAD_IN_PROGRESS meanwhile."""
        return self.num_partitions is None and bool(self.loads)

    def shard_for(self, group_id: str) -> GroupCoordinatorShard | None:
        """The shard that owns `group_id` if it is hosted here (loading or loaded)."""
        if self.num_partitions is None:
            return None
        return self.shards.get(partition_for(group_id, self.num_partitions))

    def serving_shard(self, group_id: str) -> GroupCoordinatorShard:
        """The shard owning `group_id` here, or a stand-in that answers by the same rules:
        NOT_COORDINATOR (or INVALID_GROUP_ID), COORDINATOR_LOAD_IN_PROGRESS while this broker
        leads offsets partitions it has not counted yet."""
        shard = self.shard_for(group_id)
        if shard is not None:
            return shard
        n = self.num_partitions or 1
        placeholder = GroupCoordinatorShard(partition_for(group_id, n), n)
        if self.loading_before_count:
            placeholder.begin_loading()  # answers COORDINATOR_LOAD_IN_PROGRESS
        return placeholder

    def loaded_shards(self) -> list[GroupCoordinatorShard]:
        return [s for _, s in sorted(self.shards.items())]

    def submit(self, shard: GroupCoordinatorShard, request, reply_to: object) -> None:
        """Hand `request` to `shard`; its answer is delivered to `reply_to`, now or later."""
        self.execute(shard.partition, shard.handle(request, self.now_ms(), reply_to))

    def tick_partition(self, partition: int) -> None:
        """The shard's deadline is due (the runtime's timer fired)."""
        shard = self.shards.get(partition)
        if shard is not None:
            self.deadlines.pop(partition, None)
            self.execute(partition, shard.tick(self.now_ms()))

    def tick_due(self, now_ms: int) -> None:
        """For a runtime that polls: tick every shard whose deadline is due."""
        for partition, deadline_ms in sorted(self.deadlines.items()):
            if deadline_ms <= now_ms:
                self.tick_partition(partition)

    # -- carrying out a shard's Result ---------------------------------------------------------

    def execute(self, partition: int, result: Result) -> None:
        self._answer(result)
        shard = self.shards.get(partition)
        if shard is None:
            return
        for append in result.appends:
            self._append(shard, append)
        self._arm(partition, result.next_deadline_ms)

    def _answer(self, result: Result) -> None:
        for reply in result.replies:
            self.deliver(reply.reply_to, reply.response)

    def _arm(self, partition: int, deadline_ms: int | None) -> None:
        if self.deadlines.get(partition) == deadline_ms:
            return
        if deadline_ms is None:
            del self.deadlines[partition]
        else:
            self.deadlines[partition] = deadline_ms
        self.on_deadline(partition, deadline_ms)

    def _append(self, shard: GroupCoordinatorShard, append: Append) -> None:
        records = [rb.Record(value=r.value, key=r.key, timestamp=append.timestamp_ms)
                   for r in append.records]  # fmt: skip
        batch = rb.encode_batch(records, rb.BatchSpec(base_timestamp=append.timestamp_ms))

        def key_for(first_offset: int) -> object:
            # in the log now: the shard learns where, before any answer can come back
            last_offset = first_offset + len(records) - 1
            shard.on_appended(append.append_id, last_offset)
            return self.commit_key(CommitWait(shard, append.append_id, last_offset))

        result = self.replicas.append_to_leader((OFFSETS_TOPIC, shard.partition),
                                                memoryview(batch), -1, self.commit_timeout_ms,
                                                key_for)  # fmt: skip
        if result.error != errors.NONE:
            self.execute(shard.partition,
                         shard.on_append_failed(append.append_id, result.error, self.now_ms()))  # fmt: skip
        elif not result.waiting:  # committed at once (the ISR is the leader alone)
            last_offset = result.first_offset + len(records) - 1
            self.execute(shard.partition, shard.on_committed(last_offset + 1, self.now_ms()))

    def on_commit_answered(self, wait: CommitWait, error: int) -> None:
        """The replica host answered a waiting append: committed (NONE), or failed."""
        shard = wait.shard
        if self.shards.get(shard.partition) is not shard:
            return  # unloaded meanwhile: its requests were answered NOT_COORDINATOR
        result = (shard.on_committed(wait.last_offset + 1, self.now_ms()) if not error
                  else shard.on_append_failed(wait.append_id, error, self.now_ms()))  # fmt: skip
        self.execute(shard.partition, result)
