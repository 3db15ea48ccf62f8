"""ReplicaManager: the partitions this broker hosts, their logs, appends, fetches, offsets.

Each hosted partition pairs a sans-I/O `Partition` (leader, epoch, ISR, high watermark) with its
storage `Log`. Produce and Fetch go through here, never to a Log directly, so replication (the
ISR, the commit path, follower fetchers) extends this class rather than the request handlers.
Long-polling fetches wait on an `AppendNotifier` that every append and every high watermark
move wakes. High watermarks and recovery points are checkpointed to the broker's checkpoint
directory on a timer and at clean shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from kio.schema.errors import ErrorCode

from localcluster.broker.config import BrokerConfig
from localcluster.protocol.fetch import (
    CONSUMER_REPLICA_ID,
    FetchPartitionResponse,
    FetchRequest,
)
from localcluster.protocol.produce import ProducePartitionResponse
from localcluster.replication.partition import Partition
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


@dataclass(slots=True)
class HostedPartition:
    state: Partition
    log: Log


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
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> TopicPartition | None:
    topic, sep, number = name.rpartition("-")
    return (topic, int(number)) if sep and topic and number.isdigit() else None


class ReplicaManager:
    def __init__(self, config: BrokerConfig, data_dir: Path, checkpoint_dir: Path):
        self.config = config
        self.broker_id = config.broker_id
        self.data_dir = data_dir
        self.checkpoint_dir = checkpoint_dir
        self.partitions: dict[TopicPartition, HostedPartition] = {}
        self.notifier = AppendNotifier()
        self._logs: dict[TopicPartition, Log] = {}
        self._checkpointed_hw: dict[TopicPartition, int] = {}

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
        recovery_points = read_partition_offsets(self.checkpoint_dir / RECOVERY_POINT_OFFSET_CHECKPOINT)
        self._checkpointed_hw = read_partition_offsets(self.checkpoint_dir / REPLICATION_OFFSET_CHECKPOINT)
        for path in sorted(self.data_dir.iterdir()):
            tp = parse_partition_dir(path.name) if path.is_dir() else None
            if tp is None:
                continue
            opened = Log.open(path, self.log_config(), recovery_point=recovery_points.get(tp, 0))
            self._logs[tp] = opened
            log.info("opened log %s-%d: offsets [%d, %d)%s", tp[0], tp[1],
                     opened.log_start_offset, opened.log_end_offset,
                     f", recovery cut {sum(c.bytes_cut for c in opened.cuts)} bytes"
                     if opened.cuts else "")  # fmt: skip

    def get_or_create_log(self, tp: TopicPartition, topic_config: dict[str, str] | None = None) -> Log:
        existing = self._logs.get(tp)
        if existing is None:
            existing = Log.open(self.data_dir / partition_dir_name(*tp), self.log_config(topic_config))
            self._logs[tp] = existing
        return existing

    def checkpoint(self) -> None:
        """Write high watermarks and recovery points (flushing logs first)."""
        hws = {tp: hosted.state.high_watermark for tp, hosted in self.partitions.items()}
        recovery_points = {tp: lg.flush() for tp, lg in self._logs.items()}
        write_partition_offsets(self.checkpoint_dir / REPLICATION_OFFSET_CHECKPOINT,
                                {**self._checkpointed_hw, **hws})  # fmt: skip
        write_partition_offsets(self.checkpoint_dir / RECOVERY_POINT_OFFSET_CHECKPOINT,
                                recovery_points)  # fmt: skip

    def checkpoint_high_watermarks(self) -> None:
        hws = {tp: hosted.state.high_watermark for tp, hosted in self.partitions.items()}
        self._checkpointed_hw.update(hws)
        write_partition_offsets(self.checkpoint_dir / REPLICATION_OFFSET_CHECKPOINT,
                                self._checkpointed_hw)  # fmt: skip

    def close(self) -> None:
        self.checkpoint()
        for lg in self._logs.values():
            lg.close()
        self._logs.clear()
        self.partitions.clear()

    # -- leadership ---------------------------------------------------------------------------

    def make_leader(self, tp: TopicPartition, leader_epoch: int, isr: tuple[int, ...],
                    assignment: tuple[int, ...], now_ms: int,
                    topic_config: dict[str, str] | None = None) -> None:  # fmt: skip
        lg = self.get_or_create_log(tp, topic_config)
        hosted = self.partitions.get(tp)
        if hosted is None:
            hosted = HostedPartition(Partition(tp[0], tp[1], self.broker_id), lg)
            self.partitions[tp] = hosted
        elif leader_epoch < hosted.state.leader_epoch:
            log.warning("ignoring stale leadership of %s-%d in epoch %d (at %d)", *tp,
                        leader_epoch, hosted.state.leader_epoch)  # fmt: skip
            return
        if leader_epoch > lg.leader_epoch_cache.latest_epoch:
            lg.leader_epoch_cache.assign(leader_epoch, lg.log_end_offset)
        hw = self._checkpointed_hw.get(tp, 0)
        hosted.state.make_leader(leader_epoch, frozenset(isr), assignment, lg.log_start_offset,
                                 lg.log_end_offset, hw, now_ms)  # fmt: skip
        log.info("leading %s-%d in epoch %d, ISR %s, offsets [%d, %d), HW %d", *tp, leader_epoch,
                 sorted(hosted.state.isr), lg.log_start_offset, lg.log_end_offset,
                 hosted.state.high_watermark)  # fmt: skip
        self.notifier.notify()

    # -- produce ------------------------------------------------------------------------------

    def append_to_leader(self, tp: TopicPartition, records, acks: int) -> ProducePartitionResponse:
        hosted = self.partitions.get(tp)
        partition = tp[1]
        if hosted is None:
            return ProducePartitionResponse(partition, ErrorCode.unknown_topic_or_partition)
        if not hosted.state.is_leader:
            return ProducePartitionResponse(partition, ErrorCode.not_leader_or_follower)
        if records is None or not len(records):
            return ProducePartitionResponse(partition, ErrorCode.corrupt_message,
                                            error_message="no records")  # fmt: skip
        too_large = self._first_batch_over(records, self.config.message_max_bytes)
        if too_large is not None:
            return ProducePartitionResponse(partition, ErrorCode.message_too_large,
                                            error_message=too_large)  # fmt: skip
        try:
            info = hosted.log.append(records, hosted.state.leader_epoch)
        except CorruptRecordError as e:
            log.info("rejected a corrupt batch for %s-%d: %s", *tp, e)
            return ProducePartitionResponse(partition, ErrorCode.corrupt_message, error_message=str(e))
        except RecordBatchTooLargeError as e:
            return ProducePartitionResponse(partition, ErrorCode.message_too_large, error_message=str(e))
        hosted.state.on_local_append(hosted.log.log_end_offset)
        self.notifier.notify()
        return ProducePartitionResponse(partition, ErrorCode.none, info.first_offset, -1,
                                        hosted.log.log_start_offset)  # fmt: skip

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

    # -- fetch --------------------------------------------------------------------------------

    async def fetch(self, request: FetchRequest) -> list[tuple[str, list[FetchPartitionResponse]]]:
        """Read, and if fewer than min_bytes are there, wait for appends up to max_wait_ms."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.max_wait_ms, 0) / 1000
        while True:
            responses, total, errors = self._read_all(request)
            remaining = deadline - loop.time()
            if errors or total >= max(request.min_bytes, 1) or remaining <= 0:
                return responses
            await self.notifier.wait(remaining)

    def _read_all(self, request: FetchRequest):
        consumer = request.replica_id == CONSUMER_REPLICA_ID or request.replica_id < 0
        budget = request.max_bytes if request.max_bytes > 0 else 1 << 30
        out, total, errors = [], 0, False
        for topic, partitions in request.topics:
            results = []
            for p in partitions:
                r = self._read_partition((topic, p.partition), p.fetch_offset,
                                         min(p.partition_max_bytes, budget), consumer,
                                         first=(total == 0))  # fmt: skip
                errors |= r.error_code != ErrorCode.none
                size = r.records_size
                total += size
                budget = max(budget - size, 0)
                results.append(r)
            out.append((topic, results))
        return out, total, errors

    def _read_partition(self, tp, fetch_offset, max_bytes, consumer: bool, first: bool):
        hosted = self.partitions.get(tp)
        if hosted is None:
            return FetchPartitionResponse(tp[1], ErrorCode.unknown_topic_or_partition)
        state = hosted.state
        if not state.is_leader:
            return FetchPartitionResponse(tp[1], ErrorCode.not_leader_or_follower)
        lg = hosted.log
        response = FetchPartitionResponse(tp[1], ErrorCode.none, state.high_watermark,
                                          state.high_watermark, lg.log_start_offset)  # fmt: skip
        limit = state.high_watermark if consumer else None
        if max_bytes <= 0 and not first:
            return response
        try:
            result = lg.read(fetch_offset, max(max_bytes, 1), max_offset=limit, min_one_batch=first)
        except OffsetOutOfRangeError:
            response.error_code = ErrorCode.offset_out_of_range
            return response
        response.records = list(result.slices)
        return response

    # -- list offsets -------------------------------------------------------------------------

    def list_offset(self, tp: TopicPartition, timestamp: int, consumer: bool) -> tuple[int, int, int]:
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
