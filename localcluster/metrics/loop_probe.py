"""LoopProbe: opt-in measurement of how late a process's asyncio event loop runs, and why.

Set `LOCALCLUSTER_LOOP_PROBE=<directory>` and every broker (and every `bench.load` / `perf
produce` load process) started with it writes `<directory>/<label>-<pid>.json` once a second
(write a temp file, rename: a process killed with SIGKILL leaves its last second), appends each
stall to `<label>-<pid>.stalls.jsonl` (both from the watchdog thread, never the loop) and logs it
as one WARNING line. Unset, nothing is imported or started.

How: a timer every `interval_ms` records how late it fired into a log-linear histogram. A tick
later than `stall_ms` is a stall, and its interval is split with counters that do not depend on
how busy the machine is: the loop thread's own CPU time and the time it waited on a run queue
(both from /proc/self/task/<tid>/schedstat: a long callback, or no free core: other processes),
the time it slept beyond the timer's own wait although due (`blocked`: a blocking system call, or
the GIL held by another thread of the process, whose CPU meanwhile is `threads_cpu`), and the
garbage collections that ran (`gc.callbacks`, any thread). A watchdog thread looks at the loop
thread's stack while a stall lasts (it needs the GIL for that, so a C call that keeps the GIL is
seen right after it returns), and the stall keeps the stacks it saw and, from per-thread
schedstat read only while it lasts, the process's other threads that ran or waited for a core
meanwhile (a GIL holder that the kernel preempted leaves the loop `blocked`).

Bounds: the histograms are fixed-size; MAX_STALLS stalls are kept in memory (the latest), each
with at most MAX_STACKS distinct stacks. Cost: one timer callback, one /proc read per tick and the
watchdog's wake-up every `stall_ms / 2`: about 2% of a core per process on the shared 2-core box
(an idle loop, load average 15).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "LOCALCLUSTER_LOOP_PROBE"
INTERVAL_MS = 10
STALL_MS = 20
MAX_STALLS = 200
MAX_STACKS = 4
STACK_FRAMES = 8
DUMP_EVERY_S = 1.0
PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99, 100.0)


class Histogram:
    """Microseconds in log-linear buckets (SUB_BUCKETS per power of two, so within 1/8 of the
    value): recording is a bit_length and a list add, a summary walks ~200 buckets. (hdrh's
    pure-Python percentile iteration took 150 ms per summary, itself a stall.)"""

    SUB_BITS = 3
    BUCKETS = (64 - SUB_BITS) << SUB_BITS

    def __init__(self) -> None:
        self.counts = [0] * self.BUCKETS
        self.total = 0
        self.sum_us = 0
        self.max_us = 0

    @classmethod
    def index(cls, value_us: int) -> int:
        if value_us < (1 << cls.SUB_BITS):
            return value_us
        shift = value_us.bit_length() - 1 - cls.SUB_BITS
        return ((shift + 1) << cls.SUB_BITS) + (value_us >> shift) - (1 << cls.SUB_BITS)

    @classmethod
    def upper_us(cls, index: int) -> int:
        """The largest value in bucket `index`."""
        if index < (1 << cls.SUB_BITS):
            return index
        shift = (index >> cls.SUB_BITS) - 1
        mantissa = (index & ((1 << cls.SUB_BITS) - 1)) + (1 << cls.SUB_BITS)
        return ((mantissa + 1) << shift) - 1

    def record(self, value_us: int) -> None:
        value_us = max(int(value_us), 0)
        self.counts[self.index(value_us)] += 1
        self.total += 1
        self.sum_us += value_us
        self.max_us = max(self.max_us, value_us)

    def percentile_us(self, q: float) -> int:
        """The bucket's upper bound at percentile q (the exact maximum for q = 100)."""
        if not self.total:
            return 0
        if q >= 100:
            return self.max_us
        rank = max(1, -(-self.total * q // 100))
        seen = 0
        for i, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(self.upper_us(i), self.max_us)
        return self.max_us

    def summary(self) -> dict:
        out: dict = {"count": self.total}
        if self.total:
            for q in PERCENTILES:
                out[f"p{q:g}_ms"] = self.percentile_us(q) / 1000
            out["mean_ms"] = round(self.sum_us / self.total / 1000, 4)
        return out

    def sparse(self) -> dict[int, int]:
        """{bucket upper bound µs: count} of the non-empty buckets."""
        return {self.upper_us(i): c for i, c in enumerate(self.counts) if c}


class _SchedStat:
    """One thread's (on-CPU ns, run-queue wait ns) from /proc; (0, 0) where there is none."""

    def __init__(self, native_id: int):
        try:
            self._fd = os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> tuple[int, int]:
        if self._fd is None:
            return 0, 0
        fields = os.pread(self._fd, 128, 0).split()
        return int(fields[0]), int(fields[1])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _threads_schedstat() -> dict[str, tuple[int, int]]:
    """Every thread of the process: name -> (on-CPU ns, run-queue ns). Read only while a stall
    lasts (the watchdog, when it sees one) and when it ends, to tell which threads ran or waited
    for a core meanwhile: a thread preempted while it holds the GIL leaves the loop `blocked`."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                fields = f.read().split()
        except OSError:
            continue
        out[names.get(int(tid), f"tid {tid}")] = (int(fields[0]), int(fields[1]))
    return out


def _thread_deltas(before: dict, after: dict) -> dict[str, dict]:
    """{name: {"cpu_ms", "run_queue_ms"}} of the threads that ran or waited between the two."""
    out = {}
    for name, (cpu, queue) in after.items():
        cpu0, queue0 = before.get(name, (cpu, queue))
        if cpu > cpu0 or queue > queue0:
            out[name] = {"cpu_ms": round((cpu - cpu0) / 1e6, 2),
                         "run_queue_ms": round((queue - queue0) / 1e6, 2)}  # fmt: skip
    return out


def probe_directory() -> Path | None:
    value = os.environ.get(ENV)
    return Path(value) if value else None


def start_from_env(label: str) -> LoopProbe | None:
    """A started probe when LOCALCLUSTER_LOOP_PROBE names a directory, else None. Call from
    inside the running loop."""
    directory = probe_directory()
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    probe = LoopProbe(directory / f"{label}-{os.getpid()}.json", label)
    probe.start(asyncio.get_running_loop())
    return probe


class LoopProbe:
    def __init__(self, path: Path | None, label: str, interval_ms: float = INTERVAL_MS,
                 stall_ms: float = STALL_MS):  # fmt: skip
        self.path = path
        self.label = label
        self.interval_s = interval_ms / 1000
        self.stall_s = stall_ms / 1000
        self.lag = Histogram()  # µs late, every tick
        self.gc_pause = Histogram()  # µs per collection
        self.stalls: collections.deque[dict] = collections.deque(maxlen=MAX_STALLS)
        self.totals = {"stalls": 0, "stalled_ms": 0.0, "cpu_ms": 0.0, "run_queue_ms": 0.0,
                       "blocked_ms": 0.0, "threads_cpu_ms": 0.0, "gc_ms": 0.0}  # fmt: skip
        self.gc_by_generation = [0, 0, 0]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._sched: _SchedStat | None = None
        self._loop_thread_id = 0
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        # Written by the loop thread, read by the watchdog (plain attributes: the GIL orders them).
        self._due = 0.0
        self._tick_seen = 0  # ticks run; the watchdog's stacks belong to the tick not yet run
        self._stacks: collections.Counter[str] = collections.Counter()
        self._stacks_tick = -1
        self._threads_at_detection: dict[str, tuple[int, int]] = {}
        self._gc_started = 0.0
        self._gc_in_interval = 0.0
        self._gc_count_in_interval = 0
        self._previous = (0.0, 0, 0, 0)  # monotonic, cpu ns, run-queue ns, process cpu ns
        self._next_dump = 0.0
        self._first = (0, 0)
        self.cpu_ns = self.run_queue_ns = 0  # the loop thread's, since start
        self.started = 0.0
        self._stall_file = None
        self._unwritten: collections.deque[dict] = collections.deque(maxlen=MAX_STALLS)

    # -- life ---------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread_id = threading.get_ident()
        self._sched = _SchedStat(threading.get_native_id())
        gc.callbacks.append(self._on_gc)
        self.started = time.monotonic()
        self._first = self._sched.read()
        self._previous = (self.started, *self._first, time.process_time_ns())
        self._next_dump = self.started + DUMP_EVERY_S
        self._schedule(self.started)
        self._watchdog = threading.Thread(target=self._watch, name="loop-probe", daemon=True)
        self._watchdog.start()
        log.info("loop probe on (%s): a tick every %g ms, stalls over %g ms, figures in %s",
                 self.label, self.interval_s * 1000, self.stall_s * 1000, self.path)  # fmt: skip

    def stop(self) -> None:
        """Stop ticking and watching; write the figures once more."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._stop.set()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._watchdog is not None:
            self._watchdog.join(1)
        self._next_dump = 0.0
        self._write_out()
        if self._sched is not None:
            self._sched.close()
        if self._stall_file is not None:
            self._stall_file.close()
            self._stall_file = None
        self._unwritten: collections.deque[dict] = collections.deque(maxlen=MAX_STALLS)

    # -- the loop thread ----------------------------------------------------------------------

    def _schedule(self, now: float) -> None:
        self._due = now + self.interval_s
        self._handle = self._loop.call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        now = time.monotonic()
        late = max(now - self._due, 0.0)
        self.lag.record(int(late * 1e6))
        cpu_ns, queue_ns = self._sched.read()
        process_ns = time.process_time_ns()
        if late >= self.stall_s:
            self._record_stall(now, late, cpu_ns, queue_ns, process_ns)
        self.cpu_ns, self.run_queue_ns = cpu_ns - self._first[0], queue_ns - self._first[1]
        self._previous = (now, cpu_ns, queue_ns, process_ns)
        self._gc_in_interval, self._gc_count_in_interval = 0.0, 0
        self._tick_seen += 1
        self._schedule(now)

    def _record_stall(self, now: float, late: float, cpu_ns: int, queue_ns: int,
                      process_ns: int) -> None:  # fmt: skip
        then, cpu0, queue0, process0 = self._previous
        interval = now - then
        cpu = (cpu_ns - cpu0) / 1e9
        queue = (queue_ns - queue0) / 1e9
        # Asleep beyond the timer's own wait although due: a blocking system call, or the GIL
        # held by another thread of the process (their CPU meanwhile is `threads_cpu_ms`).
        blocked = max(interval - self.interval_s - cpu - queue, 0.0)
        threads_cpu = max((process_ns - process0) / 1e9 - cpu, 0.0)
        seen = self._stacks_tick == self._tick_seen
        stacks = dict(self._stacks) if seen else {}
        threads = _thread_deltas(self._threads_at_detection, _threads_schedstat()) if seen else {}
        stall = {"at_s": round(then - self.started, 4), "wall_time": time.time() - interval,
                 "late_ms": round(late * 1000, 2), "interval_ms": round(interval * 1000, 2),
                 "cpu_ms": round(cpu * 1000, 2), "run_queue_ms": round(queue * 1000, 2),
                 "blocked_ms": round(blocked * 1000, 2),
                 "threads_cpu_ms": round(threads_cpu * 1000, 2),
                 "gc_ms": round(self._gc_in_interval * 1000, 2),
                 "gc_count": self._gc_count_in_interval, "stacks": stacks,
                 "threads": threads}  # fmt: skip
        self.stalls.append(stall)
        self._unwritten.append(stall)  # the watchdog thread writes it: no file I/O on the loop
        t = self.totals
        t["stalls"] += 1
        t["stalled_ms"] += late * 1000
        t["cpu_ms"] += stall["cpu_ms"]
        t["run_queue_ms"] += stall["run_queue_ms"]
        t["blocked_ms"] += stall["blocked_ms"]
        t["threads_cpu_ms"] += stall["threads_cpu_ms"]
        t["gc_ms"] += stall["gc_ms"]
        top = max(stacks, key=stacks.get) if stacks else "(no stack seen)"
        log.warning("%s: event loop %.1f ms late (interval %.1f ms: cpu %.1f, run queue %.1f, "
                    "blocked %.1f; other threads' cpu %.1f; gc %.1f ms in %d); stack: %s",
                    self.label, stall["late_ms"], stall["interval_ms"], stall["cpu_ms"],
                    stall["run_queue_ms"], stall["blocked_ms"], stall["threads_cpu_ms"],
                    stall["gc_ms"], stall["gc_count"], top)  # fmt: skip

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        took = time.perf_counter() - self._gc_started
        self.gc_pause.record(int(took * 1e6))
        self.gc_by_generation[min(info.get("generation", 0), 2)] += 1
        self._gc_in_interval += took
        self._gc_count_in_interval += 1

    # -- the watchdog thread ------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(self.stall_s / 2):
            self._write_out()
            if time.monotonic() - self._due < self.stall_s:
                continue
            frame = sys._current_frames().get(self._loop_thread_id)
            if frame is None:
                continue
            text = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in
                               reversed(traceback.extract_stack(frame, STACK_FRAMES)))  # fmt: skip
            del frame
            if self._stacks_tick != self._tick_seen:
                self._stacks = collections.Counter()
                self._threads_at_detection = _threads_schedstat()
                self._stacks_tick = self._tick_seen
            if text in self._stacks or len(self._stacks) < MAX_STACKS:
                self._stacks[text] += 1

    # -- figures ------------------------------------------------------------------------------

    def figures(self) -> dict:
        return {"label": self.label, "pid": os.getpid(), "interval_ms": self.interval_s * 1000,
                "stall_ms": self.stall_s * 1000,
                "seconds": round(time.monotonic() - self.started, 3),
                "loop_thread": {"cpu_s": self.cpu_ns / 1e9, "run_queue_s": self.run_queue_ns / 1e9},
                "lag": self.lag.summary(), "gc": self.gc_pause.summary() | {
                    "by_generation": list(self.gc_by_generation)},
                "totals": {k: round(v, 2) for k, v in self.totals.items()},
                "lag_histogram_us": self.lag.sparse()}  # fmt: skip

    def _write_out(self) -> None:
        """On the watchdog thread: new stalls, and the summary once a second (a file write can
        block on a busy disk, which on the loop would itself be a stall)."""
        while self._unwritten:
            self._write_stall(self._unwritten.popleft())
        now = time.monotonic()
        if now >= self._next_dump:
            self._next_dump = now + DUMP_EVERY_S
            self.dump()

    def _write_stall(self, stall: dict) -> None:
        if self.path is None:
            return
        try:
            if self._stall_file is None:
                self._stall_file = open(self.path.with_suffix(".stalls.jsonl"), "a", buffering=1)
            self._stall_file.write(json.dumps(stall) + "\n")
        except OSError as e:
            log.debug("loop probe: cannot write a stall: %s", e)

    def dump(self) -> None:
        """The summary (small: no stalls, which go to the .stalls.jsonl file as they happen)."""
        if self.path is None:
            return
        temp = self.path.with_suffix(".tmp")
        try:
            temp.write_text(json.dumps(self.figures()))
            os.replace(temp, self.path)
        except OSError as e:
            log.debug("loop probe: cannot write %s: %s", self.path, e)
