"""Producer load, one engine for `localcluster perf produce` and the benchmarks (bench.matrix,
bench.commit): a pool of load processes, our client or librdkafka; the pacer and the latency
histogram every load here and in bench uses.

A `LoadPool` keeps N spawned processes alive across measurements (spawning and importing one
costs about a second, more than a short measurement). `pool.measure(...)` gives each process an
equal share of the target rate; each connects (metadata, every leader, SASL if configured) and
reports ready; once all are ready the parent names a CLOCK_MONOTONIC instant shortly ahead and
they start together then, run for the given seconds, and report their counts, their CPU
seconds and an HdrHistogram of latencies (µs), which are merged here. (A start instant fixed
when the jobs went out let a process that was slow to import and connect on a busy machine
start up to 0.7 s after the other, which stretched the window and cost the first run of a
pool up to a fifth of its records/s.)

Clients:
- `own`: localcluster's AsyncProducer, `send_batch` of one prebuilt batch (`encode_batch`, built
  once, about 64 KiB, each send dated then) round robin over the given partitions, a bounded
  number of batches outstanding per process. Latency is per batch (every record of a batch is acknowledged at the same moment), or with
  `per_record_latency` counted once for each record of the batch.
- `confluent`: confluent-kafka (librdkafka) `produce()` per record, librdkafka's partitioner and
  batching (`linger.ms` 5, `batch.size` 64 KiB), a delivery callback on every record. Latency is
  per record.
Both take `client_config`, client properties by librdkafka's names passed to the client as they
are (e.g. `security.protocol=SASL_PLAINTEXT` and `sasl.*` for a SASL listener); each process
connects (and authenticates) before the clock starts (our client by sending one record to each
partition, which the figures do not count).

A load runs for `seconds` or, with `records`, until that many records are sent (the share of
each process; the last batch holds the rest). `measure` reports progress (acknowledged records,
every PROGRESS_EVERY_S) to a callback and calls `watch` as often, which gives up by raising
(perf's ClusterWatch: the cluster went away): the load processes are killed at once then.

Latency starts when the batch or record was due: rate-limited (open loop), at its slot on the
schedule (start + i x interval), so a stall of the sender is counted, not hidden (coordinated
omission); at full speed, at the send call. Nothing is sent before it is due: our client is
paced by `Pacer` (a nanosleep thread; event-loop timers fire up to 1 ms early), librdkafka by
polling until the slot. records/s counts acknowledged records over the
timed window (first send to last acknowledgement). With acks=0 nothing is acknowledged by the
broker: a record counts when the client has written it to the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from localcluster.tasks import wake

CLIENTS = ("own", "confluent")
PERCENTILES = (50.0, 95.0, 99.0, 99.9)
# Our client's prebuilt batch unless the job's client_config names batch.size (Kafka's name: the
# bytes a producer puts in one batch; the Java client's default is 16 KiB, librdkafka's 1,000,000).
BATCH_BYTES = 64 << 10
HISTOGRAM_MAX_US = 3_600_000_000  # one hour: anything longer is clamped (and the run is broken)
START_DELAY_S = 0.1  # from "every process is ready" to the agreed start (the queue's trip)
PROGRESS_EVERY_S = 0.1
MB = 1_000_000  # rates are in decimal MB/s, as `dd` and most tools print them
# librdkafka's poll() takes whole milliseconds: a paced wait shorter than that was poll(0) in a
# loop, a busy wait that took 0.3 cores per load process at 16k records/s on the 2-core box
# (the brokers' cores: the confluent curve's p50 was 35-85 ms at 25-75% load).
POLL_MIN_S = 0.001
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# -- processes and CPU --------------------------------------------------------------------------


def spawn_context():
    """Worker processes start fresh (spawn): nothing of the parent's threads or clients."""
    return multiprocessing.get_context("spawn")


def kill_workers(workers) -> None:
    for worker in workers:
        if worker.is_alive():
            worker.kill()
        worker.join(5)


def prepare_load_process() -> None:
    """What every load and benchmark process (not the brokers) sets first: uvloop as the
    event loop, and the heap settings of heap.py, so our client's large produce frames and a
    consumer's large fetch answers reuse freed memory instead of fresh pages (one 1 MB batch
    paid 1.6 ms of page faults in the client without them)."""
    from localcluster.heap import keep_freed_memory

    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    keep_freed_memory()


def own_cpu_seconds() -> float:
    """This process's user + system CPU seconds (all threads)."""
    times = os.times()
    return times.user + times.system


def cpu_seconds(pid: int) -> float | None:
    """user + system CPU seconds of a process (all its threads) from /proc/<pid>/stat."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14, 15)


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (everything but idle and iowait), /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / CLOCK_TICKS


class CpuMeter:
    """CPU seconds used by a set of pids between `start()` and `stop()` (from /proc), and by
    the whole machine (`machine_cores`): the difference is other people's work, which on a
    shared 2-core box is what most often skews a figure."""

    def __init__(self, pids: dict[str, int]):
        self.pids = dict(pids)
        self.before: dict[str, float | None] = {}
        self.used: dict[str, float | None] = {}

    def start(self) -> None:
        self.before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._machine0 = machine_busy_seconds()
        self._t0 = time.perf_counter()

    def stop(self) -> dict[str, float | None]:
        self.wall_s = time.perf_counter() - self._t0
        self.machine_cores = (machine_busy_seconds() - self._machine0) / self.wall_s
        for name, pid in self.pids.items():
            now, then = cpu_seconds(pid), self.before.get(name)
            self.used[name] = None if now is None or then is None else now - then
        return self.used

    def cores(self) -> dict[str, float | None]:
        """CPU seconds per wall second (1.0 = one core busy the whole time)."""
        return {k: (None if v is None else v / self.wall_s) for k, v in self.used.items()}


def build_batch(records: int, value_bytes: int = 100) -> bytes:
    from localcluster.storage import Record, encode_batch

    return encode_batch([Record(value=b"v" * value_bytes)] * records)


def now_ms() -> int:
    return int(time.time() * 1000)


def load_batch_bytes(client_config: dict[str, str]) -> int:
    """The bytes of one prebuilt batch of our client's load: client_config's batch.size, else
    BATCH_BYTES."""
    value = client_config.get("batch.size", BATCH_BYTES)
    try:
        size = int(value)
    except ValueError:
        raise ValueError(f"batch.size {value!r} is not a whole number of bytes") from None
    if size < 1:
        raise ValueError(f"batch.size {size} is below 1 byte")
    return size


def batch_records_for(record_size: int, batch_bytes: int = BATCH_BYTES) -> int:
    """The most records of `record_size` value bytes (as `build_batch` makes them) in a batch
    of at most `batch_bytes`, as Kafka's producer never fills a batch past batch.size; at
    least one. A record grows by a byte where its offset delta's varint does (64, 8192, ...):
    at 1 MiB a flat 110 bytes a record overshot by 1,170 bytes, past message.max.bytes."""
    from localcluster.storage import Record
    from localcluster.storage.record_batch import HEADER_SIZE, encode_record

    record = Record(value=b"v" * record_size)
    room, count = batch_bytes - HEADER_SIZE, 0
    for varint_grows_at in (64, 8192, 1 << 20, 1 << 27, 1 << 34):
        size = len(encode_record(record, count, 0))  # the same for every delta below the bound
        fitting = min(varint_grows_at - count, max(room, 0) // size)
        count, room = count + fitting, room - fitting * size
        if count < varint_grows_at:
            break
    return max(1, count)


@dataclass(frozen=True)
class Job:
    client: str
    bootstrap: str
    topic: str
    partitions: tuple[int, ...]
    acks: int  # 0, 1 or -1
    record_size: int
    seconds: float
    rate: float  # records/s for this process; 0: as fast as the window allows
    outstanding: int
    client_config: dict[str, str] = field(default_factory=dict)  # e.g. security.protocol
    records: int = 0  # > 0: stop after this many records (seconds then only bounds the run)
    cluster_dir: str | None = None  # our client: reach the cluster through its dir (Unix sockets)
    per_record_latency: bool = False  # our client: a batch's latency counts once per record
    progress: bool = False  # report acknowledged records every PROGRESS_EVERY_S
    phase: float = 0.0  # paced: the schedule starts this fraction of an interval late


def split_job(whole: Job, n: int) -> list[Job]:
    """`whole` shared by n processes: each a 1/n of the rate and of the records, and paced
    ones in phases 0, 1/n, ... so that their items are due evenly spaced (Schedule)."""
    shares = [whole.records // n + (1 if i < whole.records % n else 0) for i in range(n)]
    out = []
    for i, share in enumerate(shares):
        job = replace(whole, rate=whole.rate / n, records=share, phase=i / n)
        if whole.records and not share:
            job = replace(job, seconds=0.0)  # nothing to send
        out.append(job)
    return out


class Schedule:
    """Open-loop pacing from now for `seconds`: item i is due at start + i x interval
    (interval 0: each item is due when it is sent, i.e. full speed). `phase`: the start is
    that fraction of an interval later. Process i of n paced load processes takes i/n, so
    their items are due evenly spaced at the whole rate, as one producer's would be; in step,
    n batches arrived together every n intervals and each waited for the ones before it."""

    def __init__(self, seconds: float, interval: float, phase: float = 0.0):
        self.start = time.monotonic() + phase * interval
        self.stop = self.start + seconds
        self.interval = interval

    def due(self, sent: int, now: float) -> float:
        return self.start + sent * self.interval if self.interval else now

    def latency_start(self, due: float) -> float:
        """Where an item's latency starts, called right before it is sent (never before it
        is due): paced, its due time, so waiting for room in the window counts; at full
        speed, the send."""
        return due if self.interval else time.monotonic()


class Pacer:
    """`await pacer.until(t)`: resumes at t (time.monotonic()) within ~0.1 ms, never before.

    Event-loop timers have 1 ms resolution (epoll's timeout is in ms; uvloop also rounds to the
    nearest ms and so fires up to 1 ms early): `asyncio.sleep` paced sends went out early or
    ~0.8 ms late. A thread sleeps with nanosleep instead and wakes the loop through its
    self-pipe (`call_soon_threadsafe`). The thread asks for 1 ns of timer slack (Linux lets a
    sleep of a normal thread end up to 50 µs late, to batch wake-ups): the loop then resumed
    91-110 µs after the due time at p50 instead of 127-143 µs (bench/README.md)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="pacer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        least_timer_slack()
        while True:
            due, future = self.requests.get()
            while (left := due - time.monotonic()) > 0:
                time.sleep(left)
            self.loop.call_soon_threadsafe(wake, future)

    def until(self, due: float) -> asyncio.Future:
        future = self.loop.create_future()
        self.requests.put((due, future))
        return future


PR_SET_TIMERSLACK = 29  # linux/prctl.h


def least_timer_slack() -> None:
    """This thread's sleeps end as close to their time as the kernel can (1 ns of slack);
    nothing where prctl is not there."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# -- inside a load process ----------------------------------------------------------------------


def histogram():
    """An HdrHistogram of microseconds, 1 µs .. 1 h, 3 significant digits (every load's)."""
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(1, HISTOGRAM_MAX_US, 3)


class Latency:
    """A `histogram()` fed on the hot path: `record_ns` costs a list append, samples are folded
    in as (value, count) pairs every FOLD_EVERY samples and before any read."""

    FOLD_EVERY = 65_536

    def __init__(self) -> None:
        self.histogram = histogram()
        self._pending: list[int] = []

    def record_ns(self, nanoseconds: int) -> None:
        self._pending.append(nanoseconds)
        if len(self._pending) >= self.FOLD_EVERY:
            self.fold()

    def record_us(self, microseconds: int, count: int = 1) -> None:
        self.histogram.record_value(min(max(1, microseconds), HISTOGRAM_MAX_US), count)

    def fold(self) -> None:
        import numpy as np

        if not self._pending:
            return
        micros = np.clip(np.asarray(self._pending, dtype=np.int64) // 1000, 1, HISTOGRAM_MAX_US)
        self._pending.clear()
        values, counts = np.unique(micros, return_counts=True)
        for value, count in zip(values.tolist(), counts.tolist(), strict=True):
            self.histogram.record_value(value, count)

    def encode(self) -> bytes:
        self.fold()
        return self.histogram.encode()

    def summary(self) -> dict:
        self.fold()
        return latency_summary(self.histogram)


async def _run_own(job: Job, ready, report) -> dict:
    from localcluster.client import AsyncProducer

    batch_records = batch_records_for(job.record_size, load_batch_bytes(job.client_config))
    if job.records:
        batch_records = min(batch_records, job.records)
    batch = build_batch(batch_records, job.record_size)
    # With a record count: `full` whole batches, then one of the remaining records.
    full, rest = divmod(job.records, batch_records) if job.records else (math.inf, 0)
    last = build_batch(rest, job.record_size) if rest else None
    batches = full + (1 if rest else 0)
    hist = Latency()
    state = {"acked": 0, "errors": 0, "last": 0.0, "first_error": None}
    room = asyncio.Semaphore(job.outstanding)

    def done(future, due: float, count: int) -> None:
        now = time.monotonic()
        room.release()
        error = "cancelled" if future.cancelled() else future.exception()
        if error is not None:
            state["errors"] += count
            state["first_error"] = state["first_error"] or repr(error)
            return
        state["acked"] += count
        state["last"] = now
        hist.record_us(int((now - due) * 1e6), count if job.per_record_latency else 1)

    config = {"linger.ms": 0, "request.timeout.ms": 30_000,
              "buffer.memory": max(32 << 20, 4 * job.outstanding * len(batch)), **job.client_config}  # fmt: skip
    where = (
        {"cluster_dir": job.cluster_dir}
        if job.cluster_dir
        else {"bootstrap_servers": job.bootstrap}
    )
    from localcluster.metrics import loop_probe

    probe = loop_probe.start_from_env("load")  # opt-in: LOCALCLUSTER_LOOP_PROBE
    async with AsyncProducer(config, acks=job.acks, **where) as producer:
        warmup = build_batch(1, job.record_size)
        # Connect to every leader before the clock starts: one record per partition, all in
        # flight together (one at a time, 3,000 partitions outlasted the ready deadline).
        warmed = [await producer.send_batch(job.topic, partition, warmup, timestamp_ms=now_ms())
                  for partition in job.partitions]  # fmt: skip
        await asyncio.gather(*warmed)
        start_at = await asyncio.to_thread(ready)
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        cpu0 = own_cpu_seconds()
        pacer = Pacer(asyncio.get_running_loop())
        schedule = Schedule(job.seconds, batch_records / job.rate if job.rate > 0 else 0.0,
                            job.phase)  # fmt: skip
        start = schedule.start
        sent = sent_records = 0
        next_report = start + PROGRESS_EVERY_S
        while sent < batches and (now := time.monotonic()) < schedule.stop:
            due = schedule.due(sent, now)
            if due > now:
                await pacer.until(due)
            await room.acquire()
            due = schedule.latency_start(due)
            partition = job.partitions[sent % len(job.partitions)]
            this, count = (last, rest) if sent == full else (batch, batch_records)
            future = await producer.send_batch(job.topic, partition, this, timestamp_ms=now_ms())
            future.add_done_callback(lambda f, d=due, n=count: done(f, d, n))
            sent += 1
            sent_records += count
            if report is not None and now >= next_report:
                report(state["acked"])
                next_report = now + PROGRESS_EVERY_S
        await producer.flush(60)
        cpu_s = own_cpu_seconds() - cpu0
    if probe is not None:
        probe.stop()
    return {"start": start, "last_ack": state["last"], "acked": state["acked"],
            "sent": sent_records, "errors": state["errors"], "first_error": state["first_error"],
            "cpu_s": cpu_s, "batch_records": batch_records, "warmup_records": len(job.partitions),
            "histogram": hist.encode()}  # fmt: skip


def pacing_wait_s(due: float, now: float) -> float:
    """How long a paced librdkafka load polls before the next record is due: at least a
    millisecond (records due meanwhile go out together; each one's latency still counts from
    its own due time), never a poll(0) spin."""
    return max(due - now, POLL_MIN_S)


def _run_confluent(job: Job, ready, report) -> dict:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": job.bootstrap, "acks": str(job.acks),
                         "linger.ms": 5, "batch.size": BATCH_BYTES, "enable.idempotence": False,
                         "queue.buffering.max.messages": 1_000_000,
                         "queue.buffering.max.kbytes": 256 << 10, "message.timeout.ms": 60_000,
                         **job.client_config})  # fmt: skip
    hist = Latency()
    state = {"acked": 0, "errors": 0, "last": 0.0, "first_error": None}
    value = b"v" * job.record_size
    single = {"partition": job.partitions[0]} if len(job.partitions) == 1 else {}
    records = job.records or math.inf

    def delivered(due: float, error, message) -> None:
        now = time.monotonic()
        if error is not None:
            state["errors"] += 1
            state["first_error"] = state["first_error"] or str(error)
            return
        state["acked"] += 1
        state["last"] = now
        hist.record_ns(int((now - due) * 1e9))

    producer.list_topics(job.topic, timeout=10)  # connect before the clock starts
    produce, poll = producer.produce, producer.poll
    time.sleep(max(0.0, ready() - time.monotonic()))
    cpu0 = own_cpu_seconds()
    schedule = Schedule(job.seconds, 1.0 / job.rate if job.rate > 0 else 0.0, job.phase)
    start = schedule.start
    sent = 0
    next_report = start + PROGRESS_EVERY_S
    while sent < records and (now := time.monotonic()) < schedule.stop:
        due = schedule.due(sent, now)
        while (now := time.monotonic()) < due:
            poll(pacing_wait_s(due, now))  # serve callbacks while pacing (returns early then)
        due = schedule.latency_start(due)
        while True:
            try:
                produce(
                    job.topic, value, on_delivery=lambda e, m, d=due: delivered(d, e, m), **single
                )
                break
            except BufferError:  # librdkafka's queue is full: serve callbacks, then retry
                poll(0.001)
        sent += 1
        if sent % 256 == 0:
            poll(0)
            if report is not None and now >= next_report:
                report(state["acked"])
                next_report = now + PROGRESS_EVERY_S
    left = producer.flush(60)
    cpu_s = own_cpu_seconds() - cpu0
    if left:
        state["errors"] += left
        state["first_error"] = state["first_error"] or f"{left} records undelivered after 60 s"
    return {"start": start, "last_ack": state["last"], "acked": state["acked"], "sent": sent,
            "errors": state["errors"], "first_error": state["first_error"], "cpu_s": cpu_s,
            "batch_records": 1, "warmup_records": 0, "histogram": hist.encode()}  # fmt: skip


def worker_main(index: int, jobs, starts, results) -> None:
    """A load process: run jobs until None arrives. Per job it puts {"ready": index} on
    `results` once connected, waits for the start instant on `starts`, and puts its result or
    error (with "worker": index) on `results`; with `job.progress`, {"progress": index,
    "acked": n} as it goes."""
    prepare_load_process()

    def ready() -> float:
        results.put({"ready": index})
        return starts.get()

    def report(acked: int) -> None:
        results.put({"progress": index, "acked": acked})

    while True:
        job = jobs.get()
        if job is None:
            return
        job = Job(**job)
        reporter = report if job.progress else None
        try:
            if job.client == "own":
                result = asyncio.run(_run_own(job, ready, reporter))
            else:
                result = _run_confluent(job, ready, reporter)
        except Exception as e:  # noqa: BLE001 (the parent reports it)
            result = {"failed": f"{type(e).__name__}: {e}"}
        results.put(result | {"worker": index})


# -- the parent's side --------------------------------------------------------------------------


class LoadPool:
    """`with LoadPool(2) as pool: pool.measure(...)`: N persistent load processes. Leaving the
    block on an exception kills them at once (a load given up on is not waited for)."""

    def __init__(self, processes: int):
        ctx = spawn_context()
        self._jobs = [ctx.Queue() for _ in range(processes)]
        self._starts = [ctx.Queue() for _ in range(processes)]
        self._results = ctx.Queue()
        self.workers = [ctx.Process(target=worker_main, args=(i, jobs, starts, self._results), daemon=True)
                        for i, (jobs, starts) in enumerate(zip(self._jobs, self._starts, strict=True))]  # fmt: skip

    def start(self) -> LoadPool:
        for worker in self.workers:
            worker.start()
        return self

    def __enter__(self) -> LoadPool:
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            kill_workers(self.workers)
        self.close()

    def close(self) -> None:
        for jobs in self._jobs:
            with contextlib.suppress(Exception):
                jobs.put(None)
        for worker in self.workers:
            worker.join(5)
        kill_workers(self.workers)

    def _next_result(self, deadline: float, what: str, ready: set, finals: dict,
                     on_tick: Callable[[dict | None], None]) -> dict:  # fmt: skip
        """The next ready or final message; progress messages and every PROGRESS_EVERY_S
        without a message go to on_tick (which may raise to give up)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"load processes: {len(ready)} ready and {len(finals)} results of "
                                   f"{len(self.workers)} processes before the deadline for {what}")  # fmt: skip
            try:
                message = self._results.get(timeout=min(PROGRESS_EVERY_S, left))
            except queue.Empty:
                on_tick(None)
                continue
            if "progress" in message:
                on_tick(message)
                continue
            return message

    def measure(self, *, client: str, bootstrap: str, topic: str, partitions: list[int], acks,
                record_size: int, seconds: float, rate: float = 0.0, outstanding: int = 16,
                cpu_of: dict[str, int] | None = None, timeout_s: float = 180.0,
                client_config: dict[str, str] | None = None, records: int = 0,
                cluster_dir: str | None = None, per_record_latency: bool = False,
                progress: Callable[[int], None] | None = None,
                watch: Callable[[], None] | None = None) -> dict:  # fmt: skip
        """One timed load by every process together at `rate` records/s in all (0: full speed),
        for `seconds` or, with `records`, until that many are sent (seconds=math.inf: bounded
        by the clients' delivery timeouts and by `watch`).

        `cpu_of` names other processes (label -> pid) whose CPU is reported in cores;
        `client_config` goes to every process's client as is (security.protocol, sasl.*);
        `progress(acknowledged records)` and `watch()` are called every PROGRESS_EVERY_S.
        """
        assert client in CLIENTS, client
        acks = -1 if str(acks) in ("all", "-1") else int(acks)
        whole = Job(client, bootstrap, topic, tuple(partitions), acks, record_size, seconds,
                    rate, outstanding, dict(client_config or {}), records, cluster_dir,
                    per_record_latency, progress is not None)  # fmt: skip
        for jobs, job in zip(self._jobs, split_job(whole, len(self._jobs)), strict=True):
            jobs.put(asdict(job))
        meter = CpuMeter(
            dict(cpu_of or {}) | {f"load {i}": w.pid for i, w in enumerate(self.workers)}
        )
        acked_by: dict[int, int] = {}

        def on_tick(message: dict | None) -> None:
            if message is not None:
                acked_by[message["progress"]] = message["acked"]
            if progress is not None:
                progress(sum(acked_by.values()))
            if watch is not None:
                watch()

        ready: set[int] = set()
        finals: dict[int, dict] = {}  # a process that failed before it was ready is final too
        ready_by = time.monotonic() + timeout_s
        while len(ready) + len(finals) < len(self.workers):
            message = self._next_result(ready_by, "ready", ready, finals, on_tick)
            if "ready" in message:
                ready.add(message["ready"])
            else:
                finals[message["worker"]] = message
        # Every ready process waits for its start; each gets it, also when another failed.
        start_at = time.monotonic() + START_DELAY_S
        for index in ready:
            self._starts[index].put(start_at)
        time.sleep(max(0.0, start_at - time.monotonic()))
        meter.start()
        deadline = time.monotonic() + seconds + timeout_s
        while len(finals) < len(self.workers):
            message = self._next_result(deadline, "results", ready, finals, on_tick)
            finals[message["worker"]] = message
        meter.stop()
        got = [finals[i] for i in range(len(self.workers))]
        failed = [r["failed"] for r in got if "failed" in r]
        if failed:
            raise RuntimeError(f"a load process failed: {failed[0]}")
        return _merge(got, meter, client=client, acks=acks, record_size=record_size,
                      partitions=len(partitions), rate=rate)  # fmt: skip


def _merge(got: list[dict], meter: CpuMeter, *, client: str, acks: int, record_size: int,
           partitions: int, rate: float) -> dict:  # fmt: skip
    """The processes' results as one: counts summed, histograms added, the window from the
    first start to the last acknowledgement."""
    from hdrh.histogram import HdrHistogram

    hist = histogram()
    for result in got:
        hist.add(HdrHistogram.decode(result.pop("histogram")))
    acked = sum(r["acked"] for r in got)
    window = max(r["last_ack"] for r in got) - min(r["start"] for r in got)
    seconds_run = window if acked and window > 0 else float("nan")
    cores = meter.cores()
    return {
        "client": client, "acks": "all" if acks == -1 else acks, "record_size": record_size,
        "partitions": partitions, "target_records_per_s": rate or None,
        "records": acked, "seconds": seconds_run, "sent": sum(r["sent"] for r in got),
        "records_per_s": acked / seconds_run if acked else 0.0,
        "mb_per_s": acked * record_size / seconds_run / MB if acked else 0.0,
        "errors": sum(r["errors"] for r in got),
        "first_error": next((r["first_error"] for r in got if r["first_error"]), None),
        "latency_ms": latency_summary(hist), "curve_ms": curve(hist),
        "batch_records": got[0]["batch_records"], "load_processes": len(got),
        "warmup_records": sum(r.get("warmup_records", 0) for r in got),
        "other_cores": {k: v for k, v in cores.items() if not k.startswith("load ")},
        "machine_busy_cores": meter.machine_cores,
        "load_cores": {f"load {i}": r["cpu_s"] / seconds_run for i, r in enumerate(got)}
        if acked else {},
        "workers": got,
    }  # fmt: skip


def latency_summary(hist) -> dict:
    """p50, p95, p99, p99.9, min, max, mean (ms) and the count of an HdrHistogram of µs."""
    count = hist.get_total_count()
    if not count:
        return {
            "count": 0,
            **{f"p{p:g}": None for p in PERCENTILES},
            "min": None,
            "max": None,
            "mean": None,
        }
    return {"count": count, **{f"p{p:g}": hist.get_value_at_percentile(p) / 1000 for p in PERCENTILES},
            "min": hist.get_min_value() / 1000, "max": hist.get_max_value() / 1000,
            "mean": hist.get_mean_value() / 1000}  # fmt: skip


def curve(hist) -> list[tuple[float, float]]:
    """(percentile, ms) points for a percentile plot, denser towards the tail."""
    if not hist.get_total_count():
        return []
    points = []
    for nines in range(0, 50):
        percentile = 100.0 - 100.0 / (10 ** (nines / 10))
        if percentile > 99.999:
            break
        points.append((percentile, hist.get_value_at_percentile(percentile) / 1000))
    points.append((100.0, hist.get_max_value() / 1000))
    return points
