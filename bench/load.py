"""Producer load for the commit-path benchmarks: a pool of load processes, our client or librdkafka.

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
  once, about 64 KiB) round robin over the given partitions, a bounded number of batches
  outstanding per process. Latency is per batch (every record of a batch is acknowledged at the
  same moment).
- `confluent`: confluent-kafka (librdkafka) `produce()` per record, librdkafka's partitioner and
  batching (`linger.ms` 5, `batch.size` 64 KiB), a delivery callback on every record. Latency is
  per record.
Both take `client_config`, client properties by librdkafka's names passed to the client as they
are (e.g. `security.protocol=SASL_PLAINTEXT` and `sasl.*` for a SASL listener); each process
connects (and authenticates) before the clock starts.

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
import queue
import threading
import time
from dataclasses import asdict, dataclass, field

from bench.broker import CpuMeter, _cpu, _use_uvloop, build_batch, kill_workers, spawn_context
from bench.common import MB

CLIENTS = ("own", "confluent")
PERCENTILES = (50.0, 95.0, 99.0, 99.9)
BATCH_BYTES = 64 << 10  # our client's prebuilt batch, about linger-free librdkafka's batch.size
HISTOGRAM_MAX_US = 120_000_000
START_DELAY_S = 0.1  # from "every process is ready" to the agreed start (the queue's trip)


def batch_records_for(record_size: int, batch_bytes: int = BATCH_BYTES) -> int:
    """Records of `record_size` value bytes that fit a batch of about `batch_bytes`."""
    per_record = record_size + 10  # v2 record framing: length, attributes, deltas, key, headers
    return max(1, (batch_bytes - 61) // per_record)


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


class Schedule:
    """Open-loop pacing from now for `seconds`: item i is due at start + i x interval
    (interval 0: each item is due when it is sent, i.e. full speed)."""

    def __init__(self, seconds: float, interval: float):
        self.start = time.monotonic()
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
    self-pipe (`call_soon_threadsafe`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="pacer", daemon=True).start()

    def _run(self) -> None:
        while True:
            due, future = self.requests.get()
            while (left := due - time.monotonic()) > 0:
                time.sleep(left)
            self.loop.call_soon_threadsafe(_resolve, future)

    def until(self, due: float) -> asyncio.Future:
        future = self.loop.create_future()
        self.requests.put((due, future))
        return future


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


# -- inside a load process ----------------------------------------------------------------------


def histogram():
    """An HdrHistogram of microseconds, 1 µs .. 120 s, 3 significant digits (every benchmark's)."""
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(1, HISTOGRAM_MAX_US, 3)


async def _run_own(job: Job, ready) -> dict:
    from localcluster.client import AsyncProducer

    batch_records = batch_records_for(job.record_size)
    batch = build_batch(batch_records, job.record_size)
    hist = histogram()
    state = {"acked": 0, "errors": 0, "last": 0.0, "first_error": None}
    room = asyncio.Semaphore(job.outstanding)

    def done(future, due: float) -> None:
        now = time.monotonic()
        room.release()
        if future.cancelled() or future.exception() is not None:
            state["errors"] += 1
            state["first_error"] = state["first_error"] or repr(future.exception())
            return
        state["acked"] += batch_records
        state["last"] = now
        hist.record_value(max(1, int((now - due) * 1e6)))

    async with AsyncProducer(job.client_config, bootstrap_servers=job.bootstrap, acks=job.acks, linger_ms=0,
                             buffer_memory=max(32 << 20, 4 * job.outstanding * len(batch)),
                             request_timeout_ms=30_000) as producer:  # fmt: skip
        for partition in job.partitions:  # connect to every leader before the clock starts
            await (await producer.send_batch(job.topic, partition, batch))
        start_at = await asyncio.to_thread(ready)
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        cpu0 = _cpu()
        pacer = Pacer(asyncio.get_running_loop())
        schedule = Schedule(job.seconds, batch_records / job.rate if job.rate > 0 else 0.0)
        start = schedule.start
        sent = 0
        while (now := time.monotonic()) < schedule.stop:
            due = schedule.due(sent, now)
            if due > now:
                await pacer.until(due)
            await room.acquire()
            due = schedule.latency_start(due)
            partition = job.partitions[sent % len(job.partitions)]
            future = await producer.send_batch(job.topic, partition, batch)
            future.add_done_callback(lambda f, d=due: done(f, d))
            sent += 1
        await producer.flush(60)
        cpu_s = _cpu() - cpu0
    return {"start": start, "last_ack": state["last"], "acked": state["acked"],
            "sent": sent * batch_records, "errors": state["errors"], "first_error": state["first_error"],
            "cpu_s": cpu_s, "batch_records": batch_records, "histogram": hist.encode()}  # fmt: skip


def _run_confluent(job: Job, ready) -> dict:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": job.bootstrap, "acks": str(job.acks),
                         "linger.ms": 5, "batch.size": BATCH_BYTES, "enable.idempotence": False,
                         "queue.buffering.max.messages": 1_000_000,
                         "queue.buffering.max.kbytes": 256 << 10, "message.timeout.ms": 60_000,
                         **job.client_config})  # fmt: skip
    hist = histogram()
    state = {"acked": 0, "errors": 0, "last": 0.0, "first_error": None}
    value = b"v" * job.record_size
    single = {"partition": job.partitions[0]} if len(job.partitions) == 1 else {}
    pending: list[int] = []  # latencies in µs, folded into the histogram after the run

    def delivered(due: float, error, message) -> None:
        now = time.monotonic()
        if error is not None:
            state["errors"] += 1
            state["first_error"] = state["first_error"] or str(error)
            return
        state["acked"] += 1
        state["last"] = now
        pending.append(int((now - due) * 1e6))

    producer.list_topics(job.topic, timeout=10)  # connect before the clock starts
    produce, poll = producer.produce, producer.poll
    time.sleep(max(0.0, ready() - time.monotonic()))
    cpu0 = _cpu()
    schedule = Schedule(job.seconds, 1.0 / job.rate if job.rate > 0 else 0.0)
    start = schedule.start
    sent = 0
    while (now := time.monotonic()) < schedule.stop:
        due = schedule.due(sent, now)
        while (now := time.monotonic()) < due:
            poll(due - now)  # serve callbacks while pacing (poll returns early when it served one)
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
    left = producer.flush(60)
    cpu_s = _cpu() - cpu0
    if left:
        state["errors"] += left
        state["first_error"] = state["first_error"] or f"{left} records undelivered after 60 s"
    import numpy as np

    if pending:
        micros = np.clip(np.asarray(pending, dtype=np.int64), 1, HISTOGRAM_MAX_US)
        values, counts = np.unique(micros, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            hist.record_value(v, c)
    return {"start": start, "last_ack": state["last"], "acked": state["acked"], "sent": sent,
            "errors": state["errors"], "first_error": state["first_error"], "cpu_s": cpu_s,
            "batch_records": 1, "histogram": hist.encode()}  # fmt: skip


def worker_main(index: int, jobs, starts, results) -> None:
    """A load process: run jobs until None arrives. Per job it puts {"ready": index} on
    `results` once connected, waits for the start instant on `starts`, and puts its result or
    error (with "worker": index) on `results`."""
    _use_uvloop()

    def ready() -> float:
        results.put({"ready": index})
        return starts.get()

    while True:
        job = jobs.get()
        if job is None:
            return
        job = Job(**job)
        try:
            if job.client == "own":
                result = asyncio.run(_run_own(job, ready))
            else:
                result = _run_confluent(job, ready)
        except Exception as e:  # noqa: BLE001 (the parent reports it)
            result = {"failed": f"{type(e).__name__}: {e}"}
        results.put(result | {"worker": index})


# -- the parent's side --------------------------------------------------------------------------


class LoadPool:
    """`with LoadPool(2) as pool: pool.measure(...)`: N persistent load processes."""

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

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for jobs in self._jobs:
            with contextlib.suppress(Exception):
                jobs.put(None)
        for worker in self.workers:
            worker.join(5)
        kill_workers(self.workers)

    def _next_result(self, deadline: float, what: str, ready: set, finals: dict) -> dict:
        try:
            return self._results.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"load processes: {len(ready)} ready and {len(finals)} results of "
                               f"{len(self.workers)} processes before the deadline for {what}") from None  # fmt: skip

    def measure(self, *, client: str, bootstrap: str, topic: str, partitions: list[int], acks,
                record_size: int, seconds: float, rate: float = 0.0, outstanding: int = 16,
                cpu_of: dict[str, int] | None = None, timeout_s: float = 180.0,
                client_config: dict[str, str] | None = None) -> dict:  # fmt: skip
        """One timed load by every process together at `rate` records/s in all (0: full speed).

        `cpu_of` names other processes (label -> pid) whose CPU is reported in cores;
        `client_config` goes to every process's client as is (security.protocol, sasl.*).
        """
        from hdrh.histogram import HdrHistogram

        assert client in CLIENTS, client
        acks = -1 if str(acks) in ("all", "-1") else int(acks)
        for jobs in self._jobs:
            job = Job(client, bootstrap, topic, tuple(partitions), acks, record_size, seconds,
                      rate / len(self._jobs), outstanding, dict(client_config or {}))  # fmt: skip
            jobs.put(asdict(job))
        meter = CpuMeter(
            dict(cpu_of or {}) | {f"load {i}": w.pid for i, w in enumerate(self.workers)}
        )
        ready: set[int] = set()
        finals: dict[int, dict] = {}  # a process that failed before it was ready is final too
        ready_by = time.monotonic() + timeout_s
        while len(ready) + len(finals) < len(self.workers):
            message = self._next_result(ready_by, "ready", ready, finals)
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
            message = self._next_result(deadline, "results", ready, finals)
            finals[message["worker"]] = message
        meter.stop()
        got = [finals[i] for i in range(len(self.workers))]
        failed = [r["failed"] for r in got if "failed" in r]
        if failed:
            raise RuntimeError(f"a load process failed: {failed[0]}")
        hist = histogram()
        for result in got:
            hist.add(HdrHistogram.decode(result.pop("histogram")))
        acked = sum(r["acked"] for r in got)
        window = max(r["last_ack"] for r in got) - min(r["start"] for r in got)
        seconds_run = window if acked and window > 0 else float("nan")
        cores = meter.cores()
        return {
            "client": client, "acks": "all" if acks == -1 else acks, "record_size": record_size,
            "partitions": len(partitions), "target_records_per_s": rate or None,
            "records": acked, "seconds": seconds_run,
            "records_per_s": acked / seconds_run if acked else 0.0,
            "mb_per_s": acked * record_size / seconds_run / MB if acked else 0.0,
            "errors": sum(r["errors"] for r in got),
            "first_error": next((r["first_error"] for r in got if r["first_error"]), None),
            "latency_ms": latency_summary(hist), "curve_ms": curve(hist),
            "batch_records": got[0]["batch_records"], "load_processes": len(got),
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
