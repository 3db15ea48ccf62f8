"""ReplicaManager: the partitions this broker hosts, as leader or follower, and their logs.

Each hosted partition pairs a sans-I/O `Partition` (leader, epoch, ISR, high watermark) with its
storage `Log`. Every request that touches a partition comes through here:
- LeaderAndIsr -> `become_leader_or_follower`, fenced by controller epoch and leader epoch;
  a follower is truncated (by `replication.protocol`) by its fetcher, then fetches.
- Produce -> append on the leader; acks=all waits in the ProducePurgatory until the HW passes.
- Fetch from a consumer reads up to the HW; from a follower up to the log end, and tells the
  Partition the follower's log end offset (which may move the HW or expand the ISR).
- ISR changes are conditional writes of the partition state znode, through `IsrWriter`.
Long-polling fetches wait on `AppendNotifier`, which appends and HW moves wake.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from kio.schema.errors import ErrorCode

from localcluster.broker.config import BrokerConfig
from localcluster.metrics.board import NullMetricsWriter
from localcluster.protocol.controller_requests import (
    LeaderAndIsrRequest,
    PartitionErrors,
    PartitionState,
    StopReplicaRequest,
)
from localcluster.protocol.fetch import FetchPartitionResponse, FetchRequest
from localcluster.protocol.produce import ProducePartitionResponse
from localcluster.replication.delayed_produce import ProducePurgatory, ProducePurgatoryFullError
from localcluster.replication.partition import IsrUpdate, Partition
from localcluster.storage import (
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CorruptRecordError,
    Log,
    LogConfig,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
    read_partition_offsets,
    write_partition_offsets,
)
from localcluster.storage import record_batch as rb

log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
TopicPartition = tuple[str, int]
ISR_WRITE_RETRY_S = 0.5
# Writes `IsrUpdate` to the store: (succeeded, zk_version now) with None when fenced.
IsrWriter = Callable[[IsrUpdate], Awaitable[tuple[bool, int | None]]]


@dataclass(slots=True)
class HostedPartition:
    state: Partition
    log: Log
    topic_config: dict[str, str] = field(default_factory=dict)

    def min_insync_replicas(self, default: int) -> int:
        return int(self.topic_config.get("min.insync.replicas", default))


class AppendNotifier:
    """Wakes every waiting fetch when any hosted partition grows or its HW moves.

    Waiters re-check their own condition; one broadcast keeps the bookkeeping trivial and the
    number of waiters is bounded by the number of open connections.
    """

    def __init__(self):
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            pass


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> TopicPartition | None:
    topic, sep, number = name.rpartition("-")
    return (topic, int(number)) if sep and topic and number.isdigit() else None


def complete_batches(records) -> memoryview:
    """The prefix of `records` made of whole batches (a fetch may end mid-batch)."""
    view = memoryview(records)
    position = 0
    while position + rb.LOG_OVERHEAD <= len(view):
        size = rb._OFFSET_AND_LENGTH.unpack_from(view, position)[1] + rb.LOG_OVERHEAD
        if size < rb.HEADER_SIZE or position + size > len(view):
            break
        position += size
    return view[:position]


class ReplicaManager:
    def __init__(self, config: BrokerConfig, data_dir: Path, checkpoint_dir: Path):
        self.config = config
        self.broker_id = config.broker_id
        self.data_dir = data_dir
        self.checkpoint_dir = checkpoint_dir
        self.partitions: dict[TopicPartition, HostedPartition] = {}
        self.notifier = AppendNotifier()
        self.purgatory = ProducePurgatory()
        self.controller_epoch = -1
        self.isr_writer: IsrWriter | None = None
        self.fetchers = None  # ReplicaFetcherManager, set by the server
        self.metrics = NullMetricsWriter()  # the shared-memory board's writer, set by the server
        self._logs: dict[TopicPartition, Log] = {}
        self._checkpointed_hw: dict[TopicPartition, int] = {}
        self._isr_tasks: set[asyncio.Task] = set()

    def now_ms(self) -> int:
        return int(asyncio.get_running_loop().time() * 1000)

    # -- startup and shutdown -----------------------------------------------------------------

    def log_config(self, overrides: dict[str, str] | None = None) -> LogConfig:
        c = self.config
        values = {"segment_bytes": c.log_segment_bytes,
                  "segment_index_bytes": c.log_index_size_max_bytes,
                  "retention_bytes": c.log_retention_bytes, "retention_ms": c.log_retention_ms}  # fmt: skip
        names = {"segment.bytes": "segment_bytes", "retention.bytes": "retention_bytes",
                 "retention.ms": "retention_ms"}  # fmt: skip
        for key, value in (overrides or {}).items():
            if key in names:
                values[names[key]] = int(value)
        return LogConfig(**values)

    def open_logs(self) -> None:
        """Open (and recover) every partition log in the data dir."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        recovery_points = read_partition_offsets(
            self.checkpoint_dir / RECOVERY_POINT_OFFSET_CHECKPOINT
        )
        self._checkpointed_hw = read_partition_offsets(
            self.checkpoint_dir / REPLICATION_OFFSET_CHECKPOINT
        )
        for path in sorted(self.data_dir.iterdir()):
            tp = parse_partition_dir(path.name) if path.is_dir() else None
            if tp is None:
                continue
            opened = Log.open(path, self.log_config(), recovery_point=recovery_points.get(tp, 0))
            self._logs[tp] = opened
            log.info("opened log %s-%d: offsets [%d, %d), checkpointed HW %s%s", tp[0], tp[1],
                     opened.log_start_offset, opened.log_end_offset, self._checkpointed_hw.get(tp),
                     f", recovery cut {sum(c.bytes_cut for c in opened.cuts)} bytes"
                     if opened.cuts else "")  # fmt: skip

    def get_or_create_log(
        self, tp: TopicPartition, topic_config: dict[str, str] | None = None
    ) -> Log:
        existing = self._logs.get(tp)
        if existing is None:
            existing = Log.open(
                self.data_dir / partition_dir_name(*tp), self.log_config(topic_config)
            )
            self._logs[tp] = existing
        return existing

    def checkpoint_high_watermarks(self) -> None:
        self._checkpointed_hw.update(
            {tp: h.state.high_watermark for tp, h in self.partitions.items()}
        )
        write_partition_offsets(self.checkpoint_dir / REPLICATION_OFFSET_CHECKPOINT,
                                self._checkpointed_hw)  # fmt: skip

    def checkpoint(self) -> None:
        """Flush every log, then write recovery points and high watermarks."""
        recovery_points = {tp: lg.flush() for tp, lg in self._logs.items()}
        write_partition_offsets(self.checkpoint_dir / RECOVERY_POINT_OFFSET_CHECKPOINT,
                                recovery_points)  # fmt: skip
        self.checkpoint_high_watermarks()

    def close(self) -> None:
        self.checkpoint()
        for lg in self._logs.values():
            lg.close()
        self._logs.clear()
        self.partitions.clear()

    def publish_replicas(self) -> None:
        """Put every hosted replica's offsets on the metrics board (for `status`)."""
        self.metrics.update_replicas(
            (tp[0], tp[1], h.state.is_leader, h.log.log_end_offset, h.state.high_watermark)
            for tp, h in sorted(self.partitions.items()))  # fmt: skip

    # -- LeaderAndIsr and StopReplica --------------------------------------------------------

    def become_leader_or_follower(self, request: LeaderAndIsrRequest,
                                  topic_configs: dict[str, dict[str, str]] | None = None) -> PartitionErrors:  # fmt: skip
        if request.controller_epoch < self.controller_epoch:
            log.warning("rejected LeaderAndIsr from controller %d in epoch %d: controller epoch "
                        "%d is current", request.controller_id, request.controller_epoch,
                        self.controller_epoch)  # fmt: skip
            return PartitionErrors(ErrorCode.stale_controller_epoch, ())
        self.controller_epoch = request.controller_epoch
        results = []
        for state in request.partitions:
            config = (topic_configs or {}).get(state.topic)
            results.append(
                (state.topic, state.partition, self._apply_partition_state(state, config))
            )
        return PartitionErrors(ErrorCode.none, tuple(results))

    def _apply_partition_state(self, state: PartitionState, topic_config=None) -> int:
        tp = (state.topic, state.partition)
        hosted = self.partitions.get(tp)
        if hosted is not None and not hosted.state.is_newer_state(
            state.leader_epoch, state.zk_version
        ):
            log.info("ignoring LeaderAndIsr for %s-%d in leader epoch %d: epoch %d is current",
                     *tp, state.leader_epoch, hosted.state.leader_epoch)  # fmt: skip
            return ErrorCode.stale_controller_epoch
        if self.broker_id not in state.replicas:
            return ErrorCode.unknown_topic_or_partition
        if state.leader == self.broker_id:
            self.make_leader(state, topic_config)
        else:
            self.make_follower(state, topic_config)
        return ErrorCode.none

    def _hosted(self, tp: TopicPartition, topic_config) -> HostedPartition:
        hosted = self.partitions.get(tp)
        if hosted is None:
            lg = self.get_or_create_log(tp, topic_config)
            hosted = HostedPartition(
                Partition(tp[0], tp[1], self.broker_id), lg, dict(topic_config or {})
            )
            hosted.state.high_watermark = max(lg.log_start_offset,
                                              min(self._checkpointed_hw.get(tp, 0), lg.log_end_offset))  # fmt: skip
            hosted.state.log_start_offset = lg.log_start_offset
            hosted.state.log_end_offset = lg.log_end_offset
            self.partitions[tp] = hosted
        elif topic_config:
            hosted.topic_config = dict(topic_config)
        return hosted

    def make_leader(self, state: PartitionState, topic_config=None) -> None:
        tp = (state.topic, state.partition)
        hosted = self._hosted(tp, topic_config)
        if self.fetchers is not None:
            self.fetchers.remove_partition(tp)
        lg = hosted.log
        if state.leader_epoch > lg.leader_epoch_cache.latest_epoch:
            lg.leader_epoch_cache.assign(state.leader_epoch, lg.log_end_offset)
        moved = hosted.state.make_leader(state.leader_epoch, state.isr, state.replicas,
                                         state.zk_version, lg.log_start_offset, lg.log_end_offset,
                                         hosted.state.high_watermark, self.now_ms(),
                                         state.controller_epoch)  # fmt: skip
        log.info("leading %s-%d in epoch %d, ISR %s, offsets [%d, %d), HW %d", *tp,
                 state.leader_epoch, sorted(hosted.state.isr), lg.log_start_offset,
                 lg.log_end_offset, hosted.state.high_watermark)  # fmt: skip
        if moved:
            self._on_high_watermark_moved(tp)
        self.notifier.notify()

    def make_follower(self, state: PartitionState, topic_config=None) -> None:
        tp = (state.topic, state.partition)
        hosted = self._hosted(tp, topic_config)
        self._complete(self.purgatory.on_leadership_lost(tp))
        lg = hosted.log
        hosted.state.make_follower(state.leader, state.leader_epoch, state.isr, state.replicas,
                                   state.zk_version, lg.log_start_offset, lg.log_end_offset,
                                   hosted.state.high_watermark, state.controller_epoch)  # fmt: skip
        if self.config.replication_protocol == "hw-truncation":
            # The 0.8 design: cut to the local HW now (KIP-101 shows what this loses).
            self.truncate_follower(tp, hosted.state.high_watermark)
        log.info("following %s-%d: leader %d in epoch %d, offsets [%d, %d), HW %d", *tp,
                 state.leader, state.leader_epoch, lg.log_start_offset, lg.log_end_offset,
                 hosted.state.high_watermark)  # fmt: skip
        if self.fetchers is not None:
            self.fetchers.add_partition(tp, state.leader, state.leader_epoch,
                                        truncate=self.config.replication_protocol == "leader-epoch")  # fmt: skip
        self.notifier.notify()

    def stop_replicas(self, request: StopReplicaRequest) -> PartitionErrors:
        if request.controller_epoch < self.controller_epoch:
            return PartitionErrors(ErrorCode.stale_controller_epoch, ())
        self.controller_epoch = request.controller_epoch
        results = []
        for tp in request.partitions:
            if self.fetchers is not None:
                self.fetchers.remove_partition(tp)
            self._complete(self.purgatory.on_leadership_lost(tp))
            self.partitions.pop(tp, None)
            lg = self._logs.pop(tp, None) if request.delete_partitions else None
            if lg is not None:
                lg.delete()
                self._checkpointed_hw.pop(tp, None)
            log.info("stopped replica %s-%d%s", *tp, " and deleted its log" if lg else "")
            results.append((tp[0], tp[1], ErrorCode.none))
        self.notifier.notify()
        return PartitionErrors(ErrorCode.none, tuple(results))

    # -- follower side ------------------------------------------------------------------------

    def truncate_follower(self, tp: TopicPartition, offset: int) -> None:
        hosted = self.partitions[tp]
        lg = hosted.log
        if offset < lg.log_start_offset:
            lg.truncate_fully_and_start_at(offset)
        elif offset < lg.log_end_offset:
            removed = lg.truncate_to(offset)
            log.info("follower %s-%d truncated to %d (%d bytes removed)", *tp, lg.log_end_offset,
                     removed)  # fmt: skip
        hosted.state.on_follower_truncated(lg.log_start_offset, lg.log_end_offset)

    def append_as_follower(self, tp: TopicPartition, records, leader_high_watermark: int,
                           leader_log_start_offset: int) -> int:  # fmt: skip
        """Append fetched batches (whole ones); returns bytes appended."""
        hosted = self.partitions.get(tp)
        if hosted is None or hosted.state.is_leader:
            return 0
        whole = complete_batches(records)
        if len(whole):
            hosted.log.append_as_follower(whole)
        hosted.state.on_follower_append(hosted.log.log_end_offset, leader_high_watermark)
        self.notifier.notify()
        return len(whole)

    # -- produce ------------------------------------------------------------------------------

    async def append_records(self, acks: int, timeout_ms: int,
                             entries: list[tuple[TopicPartition, object]]) -> list[ProducePartitionResponse]:  # fmt: skip
        responses: list[ProducePartitionResponse] = []
        waiting: dict[asyncio.Future, ProducePartitionResponse] = {}
        loop = asyncio.get_running_loop()
        started = loop.time()
        appended = []
        for tp, records in entries:
            response, required, info = self._append_to_leader(tp, records, acks)
            responses.append(response)
            if info is not None:
                appended.append((response, info))
            if required is None:
                continue
            future = loop.create_future()
            try:
                self.purgatory.park(future, tp, required, self.now_ms() + max(timeout_ms, 0))
            except ProducePurgatoryFullError as e:
                response.error_code = ErrorCode.request_timed_out
                response.error_message = str(e)
                continue
            waiting[future] = response
            loop.call_later(max(timeout_ms, 0) / 1000 + 0.001, self._expire_produces)
        if waiting:
            await asyncio.wait(list(waiting))
            for future, response in waiting.items():
                response.error_code = future.result()
        latency_us = int((loop.time() - started) * 1e6)
        for response, info in appended:
            if response.error_code == ErrorCode.none:
                self.metrics.record_produce(info.valid_bytes, info.records_count, latency_us)
        return responses

    def _expire_produces(self) -> None:
        self._complete(self.purgatory.expire(self.now_ms()))

    def _complete(self, completions) -> None:
        for future, error in completions:
            if not future.done():
                future.set_result(error)

    def _append_to_leader(self, tp: TopicPartition, records, acks: int):
        """(response, offset the HW must reach before answering or None, AppendInfo or None)."""
        hosted = self.partitions.get(tp)
        partition = tp[1]
        if hosted is None:
            return (
                ProducePartitionResponse(partition, ErrorCode.unknown_topic_or_partition),
                None,
                None,
            )
        state = hosted.state
        if not state.is_leader:
            return ProducePartitionResponse(partition, ErrorCode.not_leader_or_follower), None, None
        if records is None or not len(records):
            return ProducePartitionResponse(partition, ErrorCode.corrupt_message,
                                            error_message="no records"), None, None  # fmt: skip
        too_large = self._first_batch_over(records, self.config.message_max_bytes)
        if too_large is not None:
            return ProducePartitionResponse(partition, ErrorCode.message_too_large,
                                            error_message=too_large), None, None  # fmt: skip
        min_isr = hosted.min_insync_replicas(self.config.min_insync_replicas)
        if acks == -1 and state.in_sync_count() < min_isr:
            return ProducePartitionResponse(
                partition, ErrorCode.not_enough_replicas,
                error_message=f"ISR {sorted(state.isr)} has fewer than min.insync.replicas={min_isr}"), None, None  # fmt: skip
        try:
            info = hosted.log.append(records, state.leader_epoch)
        except CorruptRecordError as e:
            log.info("rejected a corrupt batch for %s-%d: %s", *tp, e)
            return ProducePartitionResponse(partition, ErrorCode.corrupt_message,
                                            error_message=str(e)), None, None  # fmt: skip
        except RecordBatchTooLargeError as e:
            return ProducePartitionResponse(partition, ErrorCode.message_too_large,
                                            error_message=str(e)), None, None  # fmt: skip
        if state.on_local_append(hosted.log.log_end_offset):
            self._on_high_watermark_moved(tp)
        self.notifier.notify()
        response = ProducePartitionResponse(partition, ErrorCode.none, info.first_offset, -1,
                                            hosted.log.log_start_offset)  # fmt: skip
        required = info.last_offset + 1
        if acks == -1 and state.high_watermark < required:
            return response, required, info
        return response, None, info

    @staticmethod
    def _first_batch_over(records, limit: int) -> str | None:
        view = memoryview(records)
        position = 0
        while position + rb.LOG_OVERHEAD <= len(view):
            size = rb._OFFSET_AND_LENGTH.unpack_from(view, position)[1] + rb.LOG_OVERHEAD
            if size > limit:
                return f"batch of {size} bytes exceeds message.max.bytes={limit}"
            position += max(size, rb.LOG_OVERHEAD)
        return None

    def _on_high_watermark_moved(self, tp: TopicPartition) -> None:
        hosted = self.partitions[tp]
        min_isr = hosted.min_insync_replicas(self.config.min_insync_replicas)
        self._complete(self.purgatory.on_high_watermark(tp, hosted.state.high_watermark,
                                                        hosted.state.in_sync_count(), min_isr))  # fmt: skip
        self.notifier.notify()

    # -- ISR ----------------------------------------------------------------------------------

    def maybe_shrink_isr(self) -> None:
        now = self.now_ms()
        for hosted in list(self.partitions.values()):
            update = hosted.state.maybe_shrink_isr(now, self.config.replica_lag_time_max_ms)
            if update is not None:
                self._write_isr(update)

    def _write_isr(self, update: IsrUpdate) -> None:
        if self.isr_writer is None:
            return
        log.info("%s-%d: ISR %s -> %s (%s)", update.topic, update.partition,
                 sorted(self.partitions[(update.topic, update.partition)].state.isr),
                 list(update.isr), update.reason)  # fmt: skip
        task = asyncio.get_running_loop().create_task(self._apply_isr_write(update))
        self._isr_tasks.add(task)
        task.add_done_callback(self._isr_tasks.discard)

    async def _apply_isr_write(self, update: IsrUpdate) -> None:
        tp = (update.topic, update.partition)
        try:
            ok, version = await self.isr_writer(update)
        except Exception as e:
            # The outcome is unknown (the write and its read-back both failed). Keep the
            # proposal pending, so the HW keeps counting any member it adds, and ask again:
            # the same conditional write either lands now or finds that it had landed.
            log.warning("%s-%d: ISR %s may or may not be written (%s); checking again in %.1f s",
                        *tp, list(update.isr), e, ISR_WRITE_RETRY_S)  # fmt: skip
            asyncio.get_running_loop().call_later(ISR_WRITE_RETRY_S, self._retry_isr_write, update)
            return
        hosted = self.partitions.get(tp)
        if hosted is None or hosted.state.leader_epoch != update.leader_epoch:
            return
        if ok:
            self.metrics.record_isr_change(shrink=len(update.isr) < len(hosted.state.isr))
            if hosted.state.on_isr_update_succeeded(update.isr, version):
                self._on_high_watermark_moved(tp)
        else:
            hosted.state.on_isr_update_failed(version)

    def _retry_isr_write(self, update: IsrUpdate) -> None:
        hosted = self.partitions.get((update.topic, update.partition))
        if hosted is not None and hosted.state.pending_isr == update.isr and (
                hosted.state.leader_epoch == update.leader_epoch):  # fmt: skip
            self._write_isr(update)

    # -- fetch --------------------------------------------------------------------------------

    async def fetch(self, request: FetchRequest) -> list[tuple[str, list[FetchPartitionResponse]]]:
        """Read, and if fewer than min_bytes are there, wait for appends up to max_wait_ms."""
        follower = request.replica_id >= 0
        if follower:
            self._record_follower_fetch(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.max_wait_ms, 0) / 1000
        while True:
            responses, total, errors = self._read_all(request, follower)
            remaining = deadline - loop.time()
            if errors or total >= max(request.min_bytes, 1) or remaining <= 0:
                return responses
            await self.notifier.wait(remaining)

    def _record_follower_fetch(self, request: FetchRequest) -> None:
        now = self.now_ms()
        for topic, partitions in request.topics:
            for p in partitions:
                hosted = self.partitions.get((topic, p.partition))
                if hosted is None or not hosted.state.is_leader:
                    continue
                if p.current_leader_epoch != hosted.state.leader_epoch:
                    continue
                moved, update = hosted.state.update_follower_fetch_state(request.replica_id,
                                                                         p.fetch_offset, now)  # fmt: skip
                if update is not None:
                    self._write_isr(update)
                if moved:
                    self._on_high_watermark_moved((topic, p.partition))

    def _read_all(self, request: FetchRequest, follower: bool):
        budget = request.max_bytes if request.max_bytes > 0 else 1 << 30
        out, total, errors = [], 0, False
        for topic, partitions in request.topics:
            results = []
            for p in partitions:
                r = self._read_partition((topic, p.partition), p.fetch_offset,
                                         min(p.partition_max_bytes, budget), follower,
                                         p.current_leader_epoch, first=(total == 0))  # fmt: skip
                errors |= r.error_code != ErrorCode.none
                size = r.records_size
                total += size
                budget = max(budget - size, 0)
                results.append(r)
            out.append((topic, results))
        return out, total, errors

    def _read_partition(self, tp, fetch_offset, max_bytes, follower: bool, current_leader_epoch,
                        first: bool) -> FetchPartitionResponse:  # fmt: skip
        hosted = self.partitions.get(tp)
        if hosted is None:
            return FetchPartitionResponse(tp[1], ErrorCode.unknown_topic_or_partition)
        state = hosted.state
        if not state.is_leader:
            return FetchPartitionResponse(tp[1], ErrorCode.not_leader_or_follower)
        if current_leader_epoch >= 0 and current_leader_epoch != state.leader_epoch:
            error = (ErrorCode.fenced_leader_epoch if current_leader_epoch < state.leader_epoch
                     else ErrorCode.unknown_leader_epoch)  # fmt: skip
            return FetchPartitionResponse(tp[1], error)
        lg = hosted.log
        response = FetchPartitionResponse(tp[1], ErrorCode.none, state.high_watermark,
                                          state.high_watermark, lg.log_start_offset)  # fmt: skip
        if max_bytes <= 0 and not first:
            return response
        try:
            result = lg.read(fetch_offset, max(max_bytes, 1),
                             max_offset=None if follower else state.high_watermark,
                             min_one_batch=first)  # fmt: skip
        except OffsetOutOfRangeError:
            response.error_code = ErrorCode.offset_out_of_range
            return response
        response.records = list(result.slices)
        return response

    # -- offsets ------------------------------------------------------------------------------

    def list_offset(
        self, tp: TopicPartition, timestamp: int, consumer: bool
    ) -> tuple[int, int, int]:
        """(error code, timestamp, offset) as ListOffsets answers them."""
        hosted = self.partitions.get(tp)
        if hosted is None:
            return ErrorCode.unknown_topic_or_partition, -1, -1
        if not hosted.state.is_leader:
            return ErrorCode.not_leader_or_follower, -1, -1
        lg = hosted.log
        if timestamp == EARLIEST_TIMESTAMP:
            return ErrorCode.none, -1, lg.log_start_offset
        if timestamp == LATEST_TIMESTAMP:
            end = hosted.state.high_watermark if consumer else lg.log_end_offset
            return ErrorCode.none, -1, end
        found = lg.offset_for_timestamp(timestamp)
        if found is None or (consumer and found[0] >= hosted.state.high_watermark):
            return ErrorCode.none, -1, -1
        return ErrorCode.none, found[1], found[0]

    def end_offset_for_epoch(self, tp: TopicPartition, current_leader_epoch: int,
                             leader_epoch: int) -> tuple[int, int, int]:  # fmt: skip
        """OffsetForLeaderEpoch: (error code, epoch, end offset), answered by the leader."""
        hosted = self.partitions.get(tp)
        if hosted is None:
            return ErrorCode.unknown_topic_or_partition, -1, -1
        state = hosted.state
        if not state.is_leader:
            return ErrorCode.not_leader_or_follower, -1, -1
        if current_leader_epoch >= 0 and current_leader_epoch != state.leader_epoch:
            error = (ErrorCode.fenced_leader_epoch if current_leader_epoch < state.leader_epoch
                     else ErrorCode.unknown_leader_epoch)  # fmt: skip
            return error, -1, -1
        epoch, end = hosted.log.end_offset_for_epoch(leader_epoch)
        return ErrorCode.none, epoch, end
