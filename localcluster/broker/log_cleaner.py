"""LogCleaner: a broker's background cleaner of its compacted logs (Kafka's LogCleaner, one
cleaner thread), leader and follower replicas alike: each broker compacts its own copy.

Every `log.cleaner.backoff.ms` without work it looks over the logs whose topic has
cleanup.policy=compact and picks the dirtiest one over min.cleanable.dirty.ratio (Kafka's
grabFilthiestCompactedLog); it cleans only below the replica's high watermark.

Where the work runs: planning and committing on the event loop (cheap: segment metadata,
renames, a map of the new segment); the cleaning itself (decoding records, writing the
`.cleaned` files) in a worker process of its own (broker/log_cleaner_worker.py), which reads
segment files with pread, never the live maps. Not a thread: one decoding records would hold
the interpreter lock up to a switch interval (5 ms) each time the event loop wakes (measured
in one process: loop stalls up to 48 ms while a thread cleaned 2000-record batches). The commit checks that the segments read are unchanged, so a
truncation, a retention deletion or a roll during the cleaning only costs a retry. A fetch
holding a slice of a replaced segment keeps reading the old file (its descriptor and map stay
alive until the slice is dropped).

Stopping: the worker is killed (by its pid); the `.cleaned` files of its unfinished cleaning are
removed when the log next opens. It also dies with the broker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from localcluster.broker.log_cleaner_worker import read_frame, write_frame
from localcluster.storage import cleaner
from localcluster.topic_config import TopicConfig

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def settings_of(config: TopicConfig) -> cleaner.CleanerSettings:
    return cleaner.CleanerSettings(config.min_compaction_lag_ms, config.delete_retention_ms,
                                   config.min_cleanable_dirty_ratio)  # fmt: skip


@dataclass(slots=True)
class CleanerStats:
    """Totals since start (for logs and the benchmark)."""

    cleanings: int = 0
    dirty_bytes: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    records_removed: int = 0
    busy_s: float = 0.0


class LogCleaner:
    def __init__(self, replicas, backoff_ms: int,
                 wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)):  # fmt: skip
        self.replicas = replicas  # ReplicaHost: its log manager and hosted partitions (HWs)
        self.log_manager = replicas.log_manager
        self.backoff_ms = backoff_ms
        self.wall_clock_ms = wall_clock_ms
        self.stats = CleanerStats()
        self._stopping = False
        # one thread that waits on the worker's answers (the worker does the work)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="log-cleaner")
        self._worker = CleanerWorker()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._stopping = True
        self._worker.kill()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)

    # -- choosing ----------------------------------------------------------------------------

    def filthiest(self, now_ms: int) -> tuple[TopicPartition, cleaner.CleanPlan] | None:
        """The compacted log with the highest dirty ratio over its topic's minimum."""
        best = None
        for tp, lg in self.log_manager.logs.items():
            config = self.log_manager.topic_configs.get(tp)
            hosted = self.replicas.partitions.get(tp)
            if config is None or not config.compacts or hosted is None:
                continue
            producers = self.log_manager.producer_states[tp].state.producers
            planned = cleaner.plan(lg, self.log_manager.cleaner_checkpoints.get(tp),
                                   settings_of(config), now_ms, hosted.state.high_watermark,
                                   {pid: e.last_data_offset for pid, e in producers.items()})  # fmt: skip
            if planned is None or planned.dirty_ratio <= config.min_cleanable_dirty_ratio:
                continue
            if best is None or planned.dirty_ratio > best[1].dirty_ratio:
                best = (tp, planned)
        return best

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            try:
                cleaned = await self.clean_once()
            except Exception:
                log.exception("log cleaner: cleaning failed; trying again after the backoff")
                cleaned = False
            await asyncio.sleep(0 if cleaned else max(self.backoff_ms, 10) / 1000)

    async def clean_once(self) -> bool:
        """Clean the dirtiest log if one is dirty enough; True when something was cleaned."""
        picked = self.filthiest(self.wall_clock_ms())
        if picked is None:
            return False
        tp, planned = picked
        lg = self.log_manager.logs[tp]
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._executor, self._worker.clean,
                                                planned.detached())  # fmt: skip
        except cleaner.CleaningAborted as e:
            log.info("log cleaner: cleaning of %s-%d abandoned: %s", *tp, e)
            return False
        if self._stopping:
            cleaner.discard(result)
            return False
        if self.log_manager.logs.get(tp) is not lg or not cleaner.commit(lg, planned, result):
            cleaner.discard(result)
            return False
        self.log_manager.cleaner_checkpoints.update(tp, result.end_offset)
        self._account(tp, result, time.monotonic() - started)
        return True

    def _account(self, tp: TopicPartition, result: cleaner.CleanResult, busy_s: float) -> None:
        s = self.stats
        s.cleanings += 1
        s.dirty_bytes += result.dirty_bytes_read
        s.bytes_before += result.bytes_before
        s.bytes_after += result.bytes_after
        s.records_removed += result.records_removed
        s.busy_s += busy_s
        log.info("log cleaner: %s-%d cleaned up to offset %d: %d -> %d bytes, %d records "
                 "removed, %.1f MB of dirty log in %.3f s", *tp, result.end_offset,
                 result.bytes_before, result.bytes_after, result.records_removed,
                 result.dirty_bytes_read / 1e6, busy_s)  # fmt: skip


class CleanerWorker:
    """The worker process, started on first use and again after it died."""

    def __init__(self):
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()  # kill() may come from the event loop mid-clean

    def clean(self, planned: cleaner.CleanPlan) -> cleaner.CleanResult:
        """Blocking (the cleaner's thread): send the plan, wait for the result."""
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None:
                process = self._process = subprocess.Popen(
                    [sys.executable, "-m", "localcluster.broker.log_cleaner_worker"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        try:
            write_frame(process.stdin, planned)
            answer = read_frame(process.stdout)
        except (BrokenPipeError, OSError, ValueError) as e:
            answer = None
            log.info("log cleaner: worker pipe: %s", e)
        if answer is None:
            raise cleaner.CleaningAborted(f"the cleaner worker (pid {process.pid}) exited")
        status, value = answer
        if status != "ok":
            raise RuntimeError(f"cleaner worker: {value}")
        return value

    def kill(self) -> None:
        with self._lock:
            process, self._process = self._process, None
        if process is not None and process.poll() is None:
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        for stream in (process.stdin, process.stdout) if process is not None else ():
            try:
                stream.close()
            except OSError:
                pass
