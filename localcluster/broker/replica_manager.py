"""ReplicaManager: the runtime of the replica core for this broker's partitions and their logs.

Every replication decision is `ReplicaCore`'s (replication/replica_core.py); this module owns
what the core may not touch: the logs on disk, the checkpoint files, the event loop's timers
and futures, the store writes, and the wire types. Its loop is always the same:
event (a request, an answer, a timer) -> core step -> Ready -> `execute` -> outcomes reported
back as the next step (an append's offsets, an ISR write's result).
- LeaderAndIsr / StopReplica: open the logs the core will host, then the core's step.
- Produce: the core checks, the log appends, the core parks acks=all until the HW passes.
- Fetch from a consumer reads up to the HW; from a follower up to the log end, after the core
  recorded the follower's position (which may move the HW or expand the ISR). Long polls wait
  on `AppendNotifier`, which the Ready's `wake_fetches` wakes.
- ISR writes go to the store through `IsrWriter`; follower fetching is replica_fetcher.py's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from kio.schema.errors import ErrorCode

from localcluster.broker.config import BrokerConfig
from localcluster.broker.log_manager import LogManager
from localcluster.broker.state_change_log import log_state_change
from localcluster.metrics.board import NullMetricsWriter
from localcluster.protocol.controller_requests import (
    LeaderAndIsrRequest,
    PartitionErrors,
    StopReplicaRequest,
)
from localcluster.protocol.fetch import FetchPartitionResponse, FetchRequest
from localcluster.protocol.produce import ProducePartitionResponse
from localcluster.replication import ready as r
from localcluster.replication.partition import IsrUpdate
from localcluster.replication.replica_core import (
    HostedReplica,
    ReplicaConfig,
    ReplicaCore,
    fetch_answerable,
)
from localcluster.storage import (
    CorruptRecordError,
    Log,
    LogConfig,
    LogDirectoryFullError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
)
from localcluster.storage.producer_state import DuplicateBatch, RejectedAppend

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# Writes `IsrUpdate` to the store: (succeeded, zk_version now) with None when fenced.
IsrWriter = Callable[[IsrUpdate], Awaitable[tuple[bool, int | None]]]


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


def replica_config(config: BrokerConfig) -> ReplicaConfig:
    return ReplicaConfig(config.replication_protocol, config.min_insync_replicas,
                         config.replica_lag_time_max_ms, config.replica_fetch_wait_max_ms,
                         message_max_bytes=config.message_max_bytes)  # fmt: skip


class ReplicaManager:
    def __init__(self, config: BrokerConfig, data_dir: Path, checkpoint_dir: Path):
        self.config = config
        self.broker_id = config.broker_id
        self.data_dir = data_dir
        self.checkpoint_dir = checkpoint_dir
        self.core = ReplicaCore(config.broker_id, replica_config(config))
        self.notifier = AppendNotifier()
        self.isr_writer: IsrWriter | None = None
        self.fetchers = None  # ReplicaFetcherManager, set by the server
        self.metrics = NullMetricsWriter()  # the shared-memory board's writer, set by the server
        self.log_manager = LogManager(data_dir, checkpoint_dir, self.log_config,
                                      lambda: int(time.time() * 1000),
                                      config.producer_id_expiration_ms)  # fmt: skip
        self._isr_tasks: set[asyncio.Task] = set()

    @property
    def partitions(self) -> dict[TopicPartition, HostedReplica]:
        return self.core.partitions

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
        checkpointed_hw = self.log_manager.open_logs()
        self.core.open_logs(self.log_manager.logs, checkpointed_hw)

    def get_or_create_log(
        self, tp: TopicPartition, topic_config: dict[str, str] | None = None
    ) -> Log:
        lg = self.log_manager.get_or_create(tp, topic_config)
        self.core.add_log(tp, lg)
        return lg

    def checkpoint_high_watermarks(self) -> None:
        self.log_manager.write_high_watermarks(self.core.checkpoint_high_watermarks())

    def checkpoint(self) -> None:
        """Flush every log, then write recovery points and high watermarks."""
        self.log_manager.checkpoint_recovery_points()
        self.checkpoint_high_watermarks()

    def close(self) -> None:
        self.log_manager.close(self.core.checkpoint_high_watermarks())
        self.partitions.clear()

    def publish_replicas(self) -> None:
        """Put every hosted replica's offsets on the metrics board (for `status`)."""
        self.metrics.update_replicas(
            (tp[0], tp[1], h.state.is_leader, h.log.log_end_offset, h.state.high_watermark)
            for tp, h in sorted(self.partitions.items()))  # fmt: skip

    def retention(self, now_ms: int) -> None:
        """Delete old segments below the HW (log.retention.*); the log start moves."""
        hws = {tp: h.state.high_watermark for tp, h in self.partitions.items()}
        for tp in self.log_manager.delete_old_segments(now_ms, hws):
            self.core.on_log_start_offset(tp)
        self.log_manager.expire_producers()

    # -- carrying out the core's Ready ---------------------------------------------------------

    def execute(self, ready: r.Ready) -> None:
        if ready is r.EMPTY:
            return
        for action in ready.log_actions:
            self.log_manager.apply(action)
        for append in ready.follower_appends:
            failure = self.log_manager.append_as_follower(append)
            self.execute(self.core.on_follower_append_failed(append.tp, failure, self.now_ms())
                         if failure else
                         self.core.on_follower_appended(append.tp, append.leader_high_watermark))  # fmt: skip
        for change in ready.state_changes:
            log_state_change(change)
            if isinstance(change, r.IsrChanged):
                self.metrics.record_isr_change(shrink=len(change.isr) < len(change.previous_isr))
        for update in ready.isr_writes:
            self._write_isr(update)
        for future, error in ready.produce_answers:
            if not future.done():
                future.set_result(error)
        if ready.wake_fetches:
            self.notifier.notify()
        if self.fetchers is not None and (ready.fetch_sessions or ready.abandoned):
            self.fetchers.on_sessions(ready.fetch_sessions, ready.abandoned)
        if ready.wakeup_at_ms is not None:
            delay_s = max(ready.wakeup_at_ms - self.now_ms(), 0) / 1000 + 0.001
            asyncio.get_running_loop().call_later(delay_s, self._tick)

    def _tick(self) -> None:
        """A produce's deadline or an ISR retry is due."""
        now = self.now_ms()
        self.execute(self.core.expire_produces(now))
        self.execute(self.core.retry_isr_writes(now))

    # -- LeaderAndIsr and StopReplica --------------------------------------------------------

    def become_leader_or_follower(self, request: LeaderAndIsrRequest,
                                  topic_configs: dict[str, dict[str, str]] | None = None) -> PartitionErrors:  # fmt: skip
        configs = topic_configs or {}
        for tp in self.core.missing_logs(request.controller_epoch, request.partitions):
            self.get_or_create_log(tp, configs.get(tp[0]))
        min_isr = {topic: int(config.get("min.insync.replicas", self.config.min_insync_replicas))
                   for topic, config in configs.items() if config}  # fmt: skip
        ready = self.core.become_leader_or_follower(request.controller_epoch, request.partitions,
                                                    self.now_ms(), min_isr)  # fmt: skip
        self.execute(ready)
        return self._partition_errors(ready.response)

    def stop_replicas(self, request: StopReplicaRequest) -> PartitionErrors:
        ready = self.core.stop_replicas(request.controller_epoch, request.partitions,
                                        request.delete_partitions, self.now_ms())  # fmt: skip
        self.execute(ready)
        return self._partition_errors(ready.response)

    @staticmethod
    def _partition_errors(result: r.LeaderAndIsrResult) -> PartitionErrors:
        return PartitionErrors(result.error, tuple((tp[0], tp[1], error)
                                                   for tp, error in result.partition_errors))  # fmt: skip

    # -- produce ------------------------------------------------------------------------------

    async def append_records(self, acks: int, timeout_ms: int,
                             entries: list[tuple[TopicPartition, object]]) -> list[ProducePartitionResponse]:  # fmt: skip
        responses: list[ProducePartitionResponse] = []
        waiting: dict[asyncio.Future, ProducePartitionResponse] = {}
        loop = asyncio.get_running_loop()
        started = loop.time()
        appended = []
        for tp, records in entries:
            response, info, future = self._append_to_leader(tp, records, acks, timeout_ms)
            responses.append(response)
            if info is not None:
                appended.append((response, info))
            if future is not None:
                waiting[future] = response
        if waiting:
            await asyncio.wait(list(waiting))
            for future, response in waiting.items():
                response.error_code = future.result()
        latency_us = int((loop.time() - started) * 1e6)
        for response, info in appended:
            if response.error_code == ErrorCode.none:
                self.metrics.record_produce(info.valid_bytes, info.records_count, latency_us)
        return responses

    def append_to_internal_topic(self, tp: TopicPartition, records, timeout_ms: int
                                 ) -> tuple[ProducePartitionResponse, asyncio.Future | None]:  # fmt: skip
        """The group coordinator's acks=all append, done before this returns (so appends keep
        their order): the response (an error, or the base offset) and the future that the
        commit is answered on (its result an error code), None when already committed."""
        response, _info, future = self._append_to_leader(tp, records, -1, timeout_ms)
        return response, future

    def _append_to_leader(self, tp: TopicPartition, records, acks: int, timeout_ms: int):
        """(response, AppendInfo or None, the future a parked produce is answered on or None)."""
        partition = tp[1]
        append = self.core.prepare_leader_append(tp, acks, records)
        if isinstance(append, r.ProduceAnswer):
            return ProducePartitionResponse(partition, append.error,
                                            error_message=append.message), None, None  # fmt: skip
        lg = self.log_manager.logs[tp]
        try:
            info = self.log_manager.append_as_leader(tp, records, append.leader_epoch)
        except CorruptRecordError as e:
            log.info("rejected a corrupt batch for %s-%d: %s", *tp, e)
            return ProducePartitionResponse(partition, ErrorCode.corrupt_message,
                                            error_message=str(e)), None, None  # fmt: skip
        except RecordBatchTooLargeError as e:
            return ProducePartitionResponse(partition, ErrorCode.message_too_large,
                                            error_message=str(e)), None, None  # fmt: skip
        except LogDirectoryFullError as e:
            return ProducePartitionResponse(partition, ErrorCode.kafka_storage_error,
                                            error_message=str(e)), None, None  # fmt: skip
        if isinstance(info, RejectedAppend):
            return ProducePartitionResponse(partition, info.error_code,
                                            error_message=info.message), None, None  # fmt: skip
        appended = None if isinstance(info, DuplicateBatch) else info
        if appended is None:
            # A retry of one of the producer's last 5 batches: nothing appended, answered with
            # the offsets it got the first time (with acks=all once those are committed).
            log.debug("%s-%d: producer %d resent the batch at %d; answered as a duplicate",
                      *tp, info.producer_id, info.first_offset)  # fmt: skip
        response = ProducePartitionResponse(partition, ErrorCode.none, info.first_offset, -1,
                                            lg.log_start_offset)  # fmt: skip
        future = asyncio.get_running_loop().create_future()
        ready = self.core.on_leader_appended(append, acks, info.last_offset, future,
                                             self.now_ms() + max(timeout_ms, 0))  # fmt: skip
        self.execute(ready)
        if ready.response is None:
            return response, appended, future
        response.error_code = ready.response.error
        response.error_message = ready.response.message
        return response, appended, None

    # -- ISR ----------------------------------------------------------------------------------

    def maybe_shrink_isr(self) -> None:
        self.execute(self.core.maybe_shrink_isr(self.now_ms()))

    def _write_isr(self, update: IsrUpdate) -> None:
        if self.isr_writer is None:
            return
        task = asyncio.get_running_loop().create_task(self._apply_isr_write(update))
        self._isr_tasks.add(task)
        task.add_done_callback(self._isr_tasks.discard)

    async def _apply_isr_write(self, update: IsrUpdate) -> None:
        try:
            ok, version = await self.isr_writer(update)
        except Exception as e:
            log.warning("%s-%d: ISR %s may or may not be written (%s); checking again in %.1f s",
                        update.topic, update.partition, list(update.isr), e,
                        self.core.config.isr_write_retry_ms / 1000)  # fmt: skip
            self.execute(self.core.on_isr_write_unknown(update, self.now_ms()))
            return
        self.execute(self.core.on_isr_write_result(update, ok, version))

    # -- fetch --------------------------------------------------------------------------------

    async def fetch(self, request: FetchRequest) -> list[tuple[str, list[FetchPartitionResponse]]]:
        """Read, and if fewer than min_bytes are there, wait for appends up to max_wait_ms."""
        follower = request.replica_id >= 0
        if follower:
            positions = (((topic, p.partition), p.fetch_offset, p.current_leader_epoch)
                         for topic, partitions in request.topics for p in partitions)  # fmt: skip
            self.execute(self.core.record_follower_fetch(request.replica_id, positions,
                                                         self.now_ms()))  # fmt: skip
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.max_wait_ms, 0) / 1000
        while True:
            responses, total, errors = self._read_all(request, follower)
            remaining = deadline - loop.time()
            if fetch_answerable(errors, total, request.min_bytes) or remaining <= 0:
                return responses
            await self.notifier.wait(remaining)

    def _read_all(self, request: FetchRequest, follower: bool):
        budget = request.max_bytes if request.max_bytes > 0 else 1 << 30
        out, total, errors = [], 0, False
        for topic, partitions in request.topics:
            results = []
            for p in partitions:
                r_ = self._read_partition((topic, p.partition), p.fetch_offset,
                                          min(p.partition_max_bytes, budget), follower,
                                          p.current_leader_epoch, first=(total == 0))  # fmt: skip
                errors |= r_.error_code != ErrorCode.none
                size = r_.records_size
                total += size
                budget = max(budget - size, 0)
                results.append(r_)
            out.append((topic, results))
        return out, total, errors

    def _read_partition(self, tp, fetch_offset, max_bytes, follower: bool, current_leader_epoch,
                        first: bool) -> FetchPartitionResponse:  # fmt: skip
        error, hosted = self.core.leader_for(tp, current_leader_epoch)
        if hosted is None:
            return FetchPartitionResponse(tp[1], error)
        state, lg = hosted.state, self.log_manager.logs[tp]
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
        return self.core.list_offset(tp, timestamp, consumer)

    def end_offset_for_epoch(self, tp: TopicPartition, current_leader_epoch: int,
                             leader_epoch: int) -> tuple[int, int, int]:  # fmt: skip
        """OffsetForLeaderEpoch: (error code, epoch, end offset), answered by the leader."""
        return self.core.end_offset_for_epoch(tp, current_leader_epoch, leader_epoch)
