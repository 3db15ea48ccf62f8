"""ReplicaManager: the runtime of the replica core for this broker's partitions and their logs.

Every replication decision is `ReplicaCore`'s (replication/replica_core.py), and what happens
between the core and the logs is `ReplicaHost`'s (replica_host.py, shared with the simulator);
this module adds what only the runtime has: the event loop's timers and futures, the store
writes, and the wire types. Its loop is always the same: event (a request, an answer, a timer)
-> core step -> Ready -> `execute` -> outcomes reported back as the next step.
- LeaderAndIsr / StopReplica: open the logs the core will host, then the core's step.
- Produce: the core checks, the log appends, the core parks acks=all until the HW passes.
- Fetch from a consumer reads up to the HW; from a follower up to the log end, after the core
  recorded the follower's position (which may move the HW or expand the ISR). A fetch of an
  incremental session (KIP-227, the cache is here) reads only the partitions its follower
  named or that moved since (the Ready's `wake_fetches` names them), and its long poll wakes
  only for those: as Kafka's DelayedFetch, watched per partition, an append does not make
  every waiting follower read all it follows. Sessionless long polls wait on
  `AppendNotifier`, which any change wakes.
- ISR writes go to the store through `IsrWriter`; follower fetching is replica_fetcher.py's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from kio.schema.errors import ErrorCode

from localcluster.broker.config import BrokerConfig
from localcluster.broker.log_manager import LogManager, run_flushes
from localcluster.broker.replica_host import (
    ISR_WRITE,
    FetchPosition,
    ReplicaHost,
    log_config,
    replica_config,
)
from localcluster.broker.state_change_log import log_state_change, log_state_changes
from localcluster.metrics.board import NullMetricsWriter
from localcluster.protocol.controller_requests import (
    LeaderAndIsrRequest,
    PartitionErrors,
    StopReplicaRequest,
)
from localcluster.protocol.fetch import FetchPartitionResponse, FetchRequest
from localcluster.protocol.incremental_fetch import FetchContext, FetchSession, FetchSessionCache
from localcluster.protocol.produce import ProducePartitionResponse
from localcluster.replication import ready as r
from localcluster.replication.partition import FollowerFetchSession, IsrUpdate
from localcluster.storage import LogConfig, LogFlush
from localcluster.tasks import wait_woken, wake
from localcluster.topic_config import TopicConfig, resolve_broker_defaults

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# Carries out one step of an ISR write (replica_host.ISR_WRITE or ISR_READ_BACK) in the store:
# (succeeded, zk_version now) with None when fenced; raises when the store does not answer.
IsrWriter = Callable[[list[IsrUpdate], str], Awaitable[list[tuple[bool, int | None]]]]


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


class ReplicaManager(ReplicaHost):
    def __init__(self, config: BrokerConfig, data_dir: Path, checkpoint_dir: Path):
        self.config = config
        self.broker_topic_defaults = resolve_broker_defaults(config)
        self.data_dir = data_dir
        self.checkpoint_dir = checkpoint_dir
        self._request_changes: list | None = None  # a controller request's, while applied
        super().__init__(config.broker_id, replica_config(config),
                         LogManager(data_dir, checkpoint_dir, self.log_config,
                                    lambda: int(time.time() * 1000),
                                    config.producer_id_expiration_ms))  # fmt: skip
        self.notifier = AppendNotifier()  # sessionless long polls and DeleteRecords
        # KIP-227's sessions; a partition that leaves a follower's stops counting its fetches
        self.fetch_session_cache = FetchSessionCache(
            config.max_incremental_fetch_session_cache_slots,
            config.min_incremental_fetch_session_eviction_ms,
            lambda: random.randint(1, 2**31 - 1),
            on_partitions_left=self._on_session_partitions_left)  # fmt: skip
        self._session_wakers: dict[int, asyncio.Future] = {}  # a session's waiting fetch
        self.isr_writer: IsrWriter | None = None
        self.fetchers = None  # ReplicaFetcherManager, set by the server
        self.metrics = NullMetricsWriter()  # the shared-memory board's writer, set by the server
        self._isr_tasks: set[asyncio.Task] = set()  # read-backs of writes whose answer was lost
        self._isr_queue: list[IsrUpdate] = []  # ISR writes for the next batch
        self._isr_drain: asyncio.Task | None = None  # writes the queue, batch by batch
        self._tick_timer: asyncio.TimerHandle | None = None  # wake_at's one timer
        self._tick_at_ms = 0
        # The periodic checkpoints are written (write, fsync, rename, fsync the directory) on
        # this thread: on the shared machine's disk one write blocked 20-60 ms, which on the
        # event loop stalled every request of the broker (the HW checkpoint: every 5 s).
        self._checkpoints = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="hw-checkpoint"
        )
        self._hw_checkpoint: concurrent.futures.Future | None = None
        # the round under way: its sync (an asyncio future), then its write
        self._recovery_checkpoint: asyncio.Future | concurrent.futures.Future | None = None
        # log-start-offset-checkpoint, written whenever a start moves: moves counted, the count
        # the last finished write covers, the write under way, and DeleteRecords' waits
        self._log_start_moves = 0
        self._log_start_moves_written = 0
        self._log_start_write: asyncio.Future | None = None
        self._log_start_waiters: list[tuple[int, asyncio.Future]] = []
        self._closing = False

    def now_ms(self) -> int:
        return int(asyncio.get_running_loop().time() * 1000)

    # -- startup and shutdown -----------------------------------------------------------------

    def log_config(self, config: TopicConfig | None = None) -> LogConfig:
        """A log's settings from its topic's config (None: the broker's defaults)."""
        return log_config(
            config or self.broker_topic_defaults, self.config.log_index_size_max_bytes
        )

    def checkpoint_high_watermarks(self) -> None:
        """The periodic job: the values now (a copy, taken on the loop), written on the
        checkpoint thread. At most one write at a time: while one is still running the round is
        skipped, and the next one writes newer values (LogManager keeps the newest on disk)."""
        if self._hw_checkpoint is not None and not self._hw_checkpoint.done():
            return
        high_watermarks = dict(self.core.checkpoint_high_watermarks())
        self._hw_checkpoint = self._checkpoints.submit(self.log_manager.write_high_watermarks,
                                                       high_watermarks,
                                                       self.log_manager.checkpoint_taken())  # fmt: skip
        self._hw_checkpoint.add_done_callback(_report_checkpoint_failure)

    def checkpoint_recovery_points(self) -> None:
        """The same for the recovery-point and log-start-offset checkpoints, in three steps:
        the files to sync are named on the loop, synced on the thread (fdatasync of a log on a
        disk blocked the loop 0.3-1.6 s every interval, on every broker at once), the points
        moved on the loop (not past a truncation made meanwhile), the files written on the
        thread. One round at a time: while one runs, the next is skipped."""
        if self._recovery_checkpoint is not None and not self._recovery_checkpoint.done():
            return
        flushes = self.log_manager.flush_plans()
        job = self._checkpoints.submit(run_flushes, flushes)
        job.add_done_callback(_report_checkpoint_failure)
        self._recovery_checkpoint = asyncio.wrap_future(job)
        self._recovery_checkpoint.add_done_callback(lambda done: self._flushed(flushes, done))

    def _flushed(self, flushes: list[LogFlush], done: asyncio.Future) -> None:
        if done.cancelled() or done.exception() is not None or self._closing:
            return  # a failed sync moves no recovery point (reported by the thread's future)
        self._recovery_checkpoint = self._checkpoints.submit(
            self.log_manager.write_recovery_points, *self.log_manager.flushed(flushes)
        )
        self._recovery_checkpoint.add_done_callback(_report_checkpoint_failure)

    def checkpoint_log_start_offsets(self) -> None:
        """On the checkpoint thread too. A follower takes its leader's start from every fetch
        answer that moved it: under retention, a few times a second per partition, and each
        write (fsync, rename, fsync the directory) blocked the event loop 7-35 ms on this
        machine's disk. One write at a time; moves during it are covered by one more after it.
        DeleteRecords waits for the write (`log_starts_written`) before it answers."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop (opening the logs at start, a test): write it now
            return super().checkpoint_log_start_offsets()
        self._log_start_moves += 1
        if self._log_start_write is None and not self._closing:
            self._write_log_starts()

    def _write_log_starts(self) -> None:
        covers = self._log_start_moves
        job = self._checkpoints.submit(self.log_manager.write_log_start_offsets,
                                       *self.log_manager.log_start_offsets())  # fmt: skip
        job.add_done_callback(_report_checkpoint_failure)
        self._log_start_write = asyncio.wrap_future(job)
        self._log_start_write.add_done_callback(lambda done: self._log_starts_done(covers, done))

    def _log_starts_done(self, covers: int, done: asyncio.Future) -> None:
        self._log_start_write = None
        error = None if done.cancelled() else done.exception()
        if error is None:
            self._log_start_moves_written = covers
        waiting, self._log_start_waiters = self._log_start_waiters, []
        for moves, waiter in waiting:
            if waiter.done():
                continue
            if error is not None:
                waiter.set_exception(error)
            elif moves <= covers:
                waiter.set_result(None)
            else:
                self._log_start_waiters.append((moves, waiter))
        if self._log_start_moves > covers and not self._closing:
            self._write_log_starts()

    async def log_starts_written(self) -> None:
        """Until every log start moved so far is in log-start-offset-checkpoint; raises the
        write's OSError if it failed."""
        moves = self._log_start_moves
        if self._log_start_moves_written >= moves:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._log_start_waiters.append((moves, waiter))
        if self._log_start_write is None and not self._closing:  # the last one failed: again
            self._write_log_starts()
        await waiter

    def close(self) -> None:
        """A write in progress ends first; then the final checkpoints, on this thread."""
        self._closing = True
        self._checkpoints.shutdown(wait=True)
        super().close()

    def publish_replicas(self) -> None:
        """Put every hosted replica's offsets on the metrics board (for `status`)."""
        self.metrics.update_replicas(
            (tp[0], tp[1], h.state.is_leader, h.log.log_end_offset, h.state.high_watermark)
            for tp, h in sorted(self.partitions.items()))  # fmt: skip

    # -- the Ready's hooks (replica_host.py carries out the rest) ------------------------------

    def on_state_changes(self, changes: list) -> None:
        if self._request_changes is not None:  # logged with the request's others
            self._request_changes.extend(changes)
        elif len(changes) == 1:
            log_state_change(changes[0])
        else:  # e.g. a follower's 2,000 truncations answered by one OffsetForLeaderEpoch
            log_state_changes(changes, "one replication step")
        for change in changes:
            if isinstance(change, r.IsrChanged):
                self.metrics.record_isr_change(shrink=len(change.isr) < len(change.previous_isr))

    def answer_produce(self, future, error: int) -> None:
        if not future.done():
            future.set_result(error)

    def wake_fetches(self, tps) -> None:
        self.notifier.notify()
        for session in self.fetch_session_cache.on_partitions_changed(tps):
            wake(self._session_wakers.get(session.session_id))

    def _on_session_partitions_left(self, session: FetchSession, tps) -> None:
        if isinstance(session.owner, FollowerFetchSession):
            self.core.on_fetch_session_forgot(session.replica_id, tps, session.owner)

    def on_fetch_sessions(self, leaders, abandoned, requests) -> None:
        # A fetcher sends what its own poll planned (`requests`): see replica_fetcher.py.
        if self.fetchers is not None and (leaders or abandoned):
            self.fetchers.on_sessions(leaders, abandoned)

    def wake_at(self, at_ms: int) -> None:
        """One timer for the core's deadlines: re-armed only for an earlier one (every parked
        produce asks for its own; the tick's Ready names the next one still waiting)."""
        if self._tick_timer is not None and self._tick_at_ms <= at_ms:
            return
        if self._tick_timer is not None:
            self._tick_timer.cancel()
        delay_s = max(at_ms - self.now_ms(), 0) / 1000 + 0.001
        self._tick_at_ms = at_ms
        self._tick_timer = asyncio.get_running_loop().call_later(delay_s, self._on_tick_timer)

    def _on_tick_timer(self) -> None:
        self._tick_timer = None
        self.tick(self.now_ms())

    # -- LeaderAndIsr and StopReplica --------------------------------------------------------

    def become_leader_or_follower(self, request: LeaderAndIsrRequest,
                                  topic_configs: dict[str, TopicConfig] | None = None) -> PartitionErrors:  # fmt: skip
        with self._changes_logged_together(f"LeaderAndIsr of controller {request.controller_id} "
                                           f"(controller epoch {request.controller_epoch})"):  # fmt: skip
            result = self.lead_or_follow(
                request.controller_epoch, request.partitions, topic_configs
            )
        return self._partition_errors(result)

    def stop_replicas(self, request: StopReplicaRequest) -> PartitionErrors:
        with self._changes_logged_together(f"StopReplica of controller {request.controller_id} "
                                           f"(controller epoch {request.controller_epoch})"):  # fmt: skip
            result = self.stop(request.controller_epoch, request.partitions,
                               request.delete_partitions)  # fmt: skip
        return self._partition_errors(result)

    @contextlib.contextmanager
    def _changes_logged_together(self, source: str):
        """The state changes made inside are logged at the end, summarized when many
        (state_change_log.log_state_changes)."""
        self._request_changes = []
        try:
            yield
        finally:
            changes, self._request_changes = self._request_changes, None
            log_state_changes(changes, source)

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
            future = loop.create_future()
            result = self.append_to_leader(tp, records, acks, timeout_ms, lambda _, f=future: f)
            response = ProducePartitionResponse(tp[1], result.error, result.first_offset,
                                                result.log_append_time_ms,
                                                result.log_start_offset, error_message=result.message)  # fmt: skip
            responses.append(response)
            if result.appended is not None:
                appended.append((response, result.appended))
            if result.waiting:
                waiting[future] = response
        # Each future is awaited in turn: one already answered is not a loop pass, where
        # asyncio.wait costs two (its callback, then this task) after the last one is.
        for future, response in waiting.items():
            response.error_code = await future
        latency_us = int((loop.time() - started) * 1e6)
        for response, info in appended:
            if response.error_code == ErrorCode.none:
                self.metrics.record_produce(info.valid_bytes, info.records_count, latency_us)
        return responses

    def write_isr(self, update: IsrUpdate) -> None:
        """Queue the write; the writes queued while a batch is in the store go in the next
        one (one store commit for all, not one each). The queue holds at most one write per
        partition this broker leads, as the core has at most one in flight per partition."""
        if self.isr_writer is None:
            return
        self._isr_queue.append(update)
        if self._isr_drain is None or self._isr_drain.done():
            self._isr_drain = asyncio.get_running_loop().create_task(self._drain_isr_writes())

    async def _drain_isr_writes(self) -> None:
        while self._isr_queue:
            updates, self._isr_queue = self._isr_queue, []
            try:
                answers = await self.isr_writer(updates, ISR_WRITE)
            except Exception as e:
                for update in updates:
                    self._start_isr_read_back(
                        update, self.on_isr_write_unanswered(update, ISR_WRITE, e)
                    )
                continue
            for update, (ok, version) in zip(updates, answers, strict=True):
                self.on_isr_write_answered(update, ok, version)

    def _start_isr_read_back(self, update: IsrUpdate, step: str | None) -> None:
        if step is None:
            return
        task = asyncio.get_running_loop().create_task(self._apply_isr_write(update, step))
        self._isr_tasks.add(task)
        task.add_done_callback(self._isr_tasks.discard)

    async def _apply_isr_write(self, update: IsrUpdate, step: str) -> None:
        while step is not None:  # at most the write and one read-back (replica_host.py)
            try:
                ((ok, version),) = await self.isr_writer([update], step)
            except Exception as e:
                step = self.on_isr_write_unanswered(update, step, e)
                continue
            self.on_isr_write_answered(update, ok, version)
            return

    # -- fetch --------------------------------------------------------------------------------

    async def fetch(self, context: FetchContext) -> list[tuple[str, list[FetchPartitionResponse]]]:
        """Read, and if fewer than min_bytes are there, wait for appends up to max_wait_ms; the
        response's partitions as the fetch session (`context`) answers them."""
        request, session = context.read(), context.session
        follower_session = None
        if session is not None and request.replica_id >= 0:
            if session.owner is None:
                session.owner = FollowerFetchSession()
            follower_session = session.owner
        waker = None  # a session's fetch, while it waits: what wake_fetches resolves
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.max_wait_ms, 0) / 1000
        first = True  # the first read records a follower's positions; re-reads do not
        try:
            while True:
                positions = _positions(request)
                read = self.read_fetch(request.replica_id, positions, request.max_bytes, first,
                                       follower_session)  # fmt: skip
                if first:
                    context.first_read_done()
                    first = False
                remaining = deadline - loop.time()
                if read.answerable(request.min_bytes) or remaining <= 0:
                    break
                if session is None:
                    await self.notifier.wait(remaining)
                    continue
                waker = self._session_wakers[session.session_id] = loop.create_future()
                await wait_woken(waker, remaining)
                request = context.read()
        finally:
            if waker is not None and self._session_wakers.get(session.session_id) is waker:
                del self._session_wakers[session.session_id]
        unread = {p.tp for p, r in zip(positions, read.partitions, strict=True) if r.unread}
        return context.respond(self._responses(request, read.partitions), unread)

    @staticmethod
    def _responses(request: FetchRequest, reads: list) -> list[tuple[str, list]]:
        each = iter(reads)
        return [(topic, [FetchPartitionResponse(p.partition, read.error, read.high_watermark,
                                                read.high_watermark, read.log_start_offset,
                                                records=list(read.records))
                         for p, read in zip(partitions, each, strict=False)])
                for topic, partitions in request.topics]  # fmt: skip

    # -- DeleteRecords --------------------------------------------------------------------------

    async def delete_records(self, entries: list[tuple[TopicPartition, int]],
                             timeout_ms: int) -> list[tuple[int, int]]:  # fmt: skip
        """DeleteRecords on the leader: move each log's start, then wait (Kafka's delayed
        delete-records purgatory, over the fetch notifier: a follower's fetch reporting its new
        start wakes it) until the ISR's low watermark reaches it or `timeout_ms` passes.
        (error code, low watermark) per entry; REQUEST_TIMED_OUT if it did not get there."""
        targets: dict[TopicPartition, int] = {}
        results: dict[TopicPartition, tuple[int, int]] = {}
        for tp, offset in entries:
            error, target, ready = self.core.delete_records(tp, offset)
            self.execute(ready)
            if error != ErrorCode.none:
                results[tp] = (error, -1)
            else:
                targets[tp] = target
        try:
            await self.log_starts_written()  # a kill -9 after the answer keeps them deleted
        except OSError as e:
            log.error("DeleteRecords: log-start-offset-checkpoint not written: %s", e)
            for tp in targets:
                results[tp] = (ErrorCode.kafka_storage_error, -1)
            return [results[tp] for tp, _ in entries]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 0) / 1000

        def reached(tp) -> bool:
            low = self.core.low_watermark(tp)
            return low is None or low >= targets[tp]

        while not all(reached(tp) for tp in targets) and loop.time() < deadline:
            await self.notifier.wait(deadline - loop.time())
        for tp, target in targets.items():
            low = self.core.low_watermark(tp)
            if low is None:
                results[tp] = (ErrorCode.not_leader_or_follower, -1)
            else:
                results[tp] = (ErrorCode.none if low >= target else ErrorCode.request_timed_out,
                               low)  # fmt: skip
        return [results[tp] for tp, _ in entries]

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


def _positions(request: FetchRequest) -> list[FetchPosition]:
    return [FetchPosition((topic, p.partition), p.fetch_offset, p.current_leader_epoch,
                          p.log_start_offset, p.partition_max_bytes)
            for topic, partitions in request.topics for p in partitions]  # fmt: skip


def _report_checkpoint_failure(future: concurrent.futures.Future) -> None:
    error = None if future.cancelled() else future.exception()
    if error is not None:
        log.error("periodic checkpoint failed (the next round retries): %s", error)
