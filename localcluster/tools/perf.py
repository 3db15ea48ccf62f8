"""The engine of `localcluster perf`: produce load, end-to-end latency and failover windows.

Three measurements, each a function that returns a plain result dict (JSON-ready, the same
document `--json` prints) so the bench modules can call them too:

- `produce`: N records of B bytes as fast as possible or at a target rate (records/s), in the
  spirit of kafka-producer-perf-test, run by the benchmarks' engine (tools/load.py: two load
  processes as bench.matrix; our client sends prebuilt batches of about 64 KiB with
  `send_batch`, librdkafka one record at a time). Latency counts from when a batch or record was due (at full speed:
  sent) to its acknowledgement, once per record, in the engine's HdrHistogram. records/s and
  MB/s count acknowledged records from the first send to the last acknowledgement. The load
  processes' CPU is reported: one near a core means the client, not the cluster, is the
  bottleneck.
- `e2e`: the same load, each value carrying its send time (wall-clock ns) and sequence number;
  a consumer assigned to every partition of the topic measures receive time - send time. Every
  acknowledged record must arrive (missing and duplicated records are counted).
- `failover`: an acks=all producer on one partition at a steady rate; K times: wait for a full
  ISR, SIGKILL the partition leader's broker (or the controller's), measure the window from the
  kill to the first acknowledgement of a record sent after the kill, restart the broker (same
  id, same data) and wait for the full ISR again. At the end every record of the run is
  consumed back: an acknowledged record that is not there is lost (the run fails).

Rules: waits have deadlines and say what they waited for; operating faults raise
cluster.ClusterError with one line saying what is wrong and what to do; nothing here prints
(progress goes to the `progress` and `say` callbacks). A broker this module killed is started
again before it returns, also on errors and Ctrl-C; it is a broker of the cluster, which
`localcluster down` stops. Clocks: time.perf_counter_ns for latencies measured in this process,
time.time_ns inside e2e records (the same clock in any process on the host).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import random
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localcluster import cluster
from localcluster.tools.load import Latency, LoadPool, Pacer

FLUSH_TIMEOUT_S = 120.0
STOPPED_FLUSH_TIMEOUT_S = 1.0
E2E_DRAIN_TIMEOUT_S = 30.0
E2E_JOIN_TIMEOUT_S = 30.0  # e2e --group: the consumer's group stable with every partition
FAILOVER_WINDOW_TIMEOUT_S = 60.0
RECOVER_TIMEOUT_S = 90.0
CONSUME_TIMEOUT_S = 60.0
YIELD_EVERY = 256  # records between yields to the event loop (the sender must run)
E2E_HEADER = struct.Struct("<4sqq")  # run id, sequence, send time (time.time_ns)
FAILOVER_DEFAULT_CONFIG = {"linger.ms": 1, "retry.backoff.ms": 20, "request.timeout.ms": 3000,
                           "delivery.timeout.ms": 300_000, "max.block.ms": 300_000}  # fmt: skip
CLIENTS = ("own", "confluent")
TARGETS = ("leader", "controller")
PRODUCE_PROCESSES = (
    2  # load processes of `perf produce`, as bench.matrix: twice the requests in flight
)
PRODUCE_OUTSTANDING = 16  # our client's batches in flight, as bench.matrix's cells
CLIENT_BOUND_CORES = 0.9  # a load process this busy is the bottleneck

Progress = Callable[[int], None]  # completed records (or kills) so far


# -- latency ------------------------------------------------------------------------------------


def latency_of(values_ms) -> dict:
    latency = Latency()
    for value in values_ms:
        latency.record_ns(int(value * 1_000_000))
    return latency.summary()


# -- the cluster and the topic ------------------------------------------------------------------


@dataclass
class Target:
    """A running cluster: where our client and Kafka clients reach it."""

    cluster_dir: Path
    spec: cluster.ClusterSpec
    registrations: dict

    @property
    def tcp_bootstrap(self) -> str:
        return cluster.bootstrap_servers(self.registrations)

    def client_kwargs(self) -> dict:
        """How our client connects: the cluster dir (Unix sockets) for a file store, else TCP."""
        if (self.cluster_dir / "store").is_dir():
            return {"cluster_dir": self.cluster_dir}
        return {"bootstrap_servers": self.tcp_bootstrap}


def open_target(cluster_dir: Path | str | None) -> Target:
    cluster_dir = cluster.resolve_dir(cluster_dir)
    spec = cluster.load_spec(cluster_dir)
    if not cluster.live_brokers(cluster_dir, spec):
        raise cluster.ClusterError(f"no broker of the cluster in {cluster_dir} is running; start it with "
                                   f"`localcluster up --dir {cluster_dir}`")  # fmt: skip
    with cluster.store(spec) as client:
        regs = cluster.registrations(client)
    if not regs:
        raise cluster.ClusterError(f"no broker of the cluster in {cluster_dir} is registered yet; "
                                   "wait a moment or see `localcluster status`")  # fmt: skip
    return Target(cluster_dir, spec, regs)


async def ensure_topic(target: Target, topic: str, partitions: int | None, replication_factor: int | None,
                       config: dict[str, str] | None = None) -> list:  # fmt: skip
    """The topic's partitions (PartitionInfo), creating it when missing: `partitions` (default 1),
    `replication_factor` (default min(3, registered brokers))."""
    from localcluster.client import AsyncAdmin, KafkaError

    async with AsyncAdmin(**target.client_kwargs()) as admin:
        try:
            return list((await admin.describe_topic(topic)).partitions)
        except KafkaError as e:
            if e.code != 3:  # UNKNOWN_TOPIC_OR_PARTITION: create it below
                raise cluster.ClusterError(f"cannot describe topic {topic!r}: {e}") from None
        rf = replication_factor or min(3, len(target.registrations))
        try:
            await admin.create_topic(topic, partitions or 1, rf, config or {})
        except KafkaError as e:
            if e.code != 36:  # TOPIC_ALREADY_EXISTS: someone created it meanwhile
                raise cluster.ClusterError(f"cannot create topic {topic!r} ({partitions or 1} partitions, "
                                           f"replication factor {rf}): {e}") from None  # fmt: skip
        try:
            return list((await admin.wait_for_leaders(topic, 30)).partitions)
        except KafkaError as e:
            raise cluster.ClusterError(
                f"topic {topic!r} has no leaders: {e}; see `localcluster status`"
            ) from None


# -- the load: N records at a rate, per-record acknowledgement latency ---------------------------


@dataclass
class Load:
    """What a producer did; `make_value(sequence)` is called right before each send."""

    topic: str
    num_records: int
    throughput: float  # records/s; <= 0: no cap
    make_value: Callable[[int], bytes]
    partition: int | None = None  # None: the client's partitioner
    latency: Latency = field(default_factory=Latency)
    sent: int = 0
    acked: int = 0
    errors: int = 0
    first_error: str | None = None
    started_ns: int = 0
    last_ack_ns: int = 0
    on_ack: Callable | None = None  # (sequence, partition, offset, sent_ns, ack_ns)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def completed(self) -> int:
        return self.acked + self.errors

    def due_ns(self, sequence: int) -> int:
        return self.started_ns + int(sequence * 1e9 / self.throughput)

    def done(self, sequence: int, sent_ns: int, error, result) -> None:
        now = time.perf_counter_ns()
        if error is not None:
            self.errors += 1
            self.first_error = self.first_error or str(error)
            return
        self.acked += 1
        self.last_ack_ns = now
        self.latency.record_ns(now - sent_ns)
        if self.on_ack is not None:
            self.on_ack(sequence, result[0], result[1], sent_ns, now)

    def result(self) -> dict:
        elapsed_s = max(self.last_ack_ns - self.started_ns, 1) / 1e9 if self.acked else 0.0
        return {"records_sent": self.sent, "records_acked": self.acked, "errors": self.errors,
                "first_error": self.first_error, "elapsed_s": round(elapsed_s, 4),
                "records_per_s": round(self.acked / elapsed_s, 1) if elapsed_s else 0.0,
                "latency_ms": self.latency.summary()}  # fmt: skip


def _own_done(load: Load, sequence: int, sent_ns: int, future) -> None:
    if future.cancelled():
        load.done(sequence, sent_ns, "cancelled", None)
    elif future.exception() is not None:
        load.done(sequence, sent_ns, future.exception(), None)
    else:
        load.done(sequence, sent_ns, None, future.result())


async def run_own(load: Load, target: Target, config: dict) -> None:
    """Send with localcluster's AsyncProducer on the running event loop; returns when every
    record is acknowledged or failed (or FLUSH_TIMEOUT_S after the last send)."""
    from localcluster.client import AsyncProducer

    producer = AsyncProducer(dict(config), **target.client_kwargs())
    await producer.start()
    pacer = Pacer(asyncio.get_running_loop())
    try:
        load.started_ns = time.perf_counter_ns()
        for sequence in range(load.num_records):
            if load.stop.is_set():
                break
            if load.throughput > 0:
                ahead_ns = load.due_ns(sequence) - time.perf_counter_ns()
                if ahead_ns > 0:
                    await pacer.until(time.monotonic() + ahead_ns / 1e9)  # pacing the load
            if sequence % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            value = load.make_value(sequence)
            sent_ns = time.perf_counter_ns()
            try:
                future = await producer.send(load.topic, value, partition=load.partition)
            except Exception as e:  # noqa: BLE001 (counted as a failed record)
                load.sent += 1
                load.done(sequence, sent_ns, e, None)
                continue
            load.sent += 1
            future.add_done_callback(functools.partial(_own_done, load, sequence, sent_ns))
        with contextlib.suppress(TimeoutError):
            await producer.flush(FLUSH_TIMEOUT_S)
    finally:
        await producer.close(5)


def run_confluent(load: Load, target: Target, config: dict) -> None:
    """Send with confluent-kafka (librdkafka) over TCP; blocking (run it in a thread)."""
    from confluent_kafka import KafkaException
    from confluent_kafka import Producer as ConfluentProducer

    settings = {"bootstrap.servers": target.tcp_bootstrap, "linger.ms": 5, **config}
    try:
        producer = ConfluentProducer(settings)
    except KafkaException as e:
        raise cluster.ClusterError(f"confluent-kafka refused the producer config: {e}") from None

    def delivered(sequence, sent_ns, error, message):
        result = None if error is not None else (message.partition(), message.offset())
        load.done(sequence, sent_ns, error, result)

    load.started_ns = time.perf_counter_ns()
    extra = {} if load.partition is None else {"partition": load.partition}
    for sequence in range(load.num_records):
        if load.stop.is_set():
            break
        if load.throughput > 0:
            ahead_ns = load.due_ns(sequence) - time.perf_counter_ns()
            if ahead_ns > 0:
                producer.poll(ahead_ns / 1e9)  # serve callbacks while pacing
        value = load.make_value(sequence)
        sent_ns = time.perf_counter_ns()
        callback = functools.partial(delivered, sequence, sent_ns)
        while not load.stop.is_set():
            try:
                producer.produce(load.topic, value, on_delivery=callback, **extra)
                load.sent += 1
                break
            except BufferError:  # librdkafka's queue is full: serve callbacks, then retry
                producer.poll(0.005)
        if sequence % 64 == 0:
            producer.poll(0)
    # A stopped run (Ctrl-C, the cluster gone) does not wait out the flush timeout.
    producer.flush(STOPPED_FLUSH_TIMEOUT_S if load.stop.is_set() else FLUSH_TIMEOUT_S)


CLUSTER_GONE_AFTER_S = 5.0  # no broker of the cluster alive this long: the run is over


class ClusterWatch:
    """Notices that the cluster a run drives went away (`down`, `down --purge`, its dir
    deleted, every broker dead): a perf or chaos run must end with one line then, not wait out
    a delivery timeout. `problem()` reads only the spec file and the pid files: call it often."""

    def __init__(self, cluster_dir: Path, spec: cluster.ClusterSpec):
        self.cluster_dir, self.spec = cluster_dir, spec
        self.since_alive = time.monotonic()

    def problem(self) -> str | None:
        directory = self.cluster_dir
        if not cluster.spec_path(directory).exists():
            return (f"the cluster in {directory} is gone (its {cluster.SPEC_FILE} was removed, "
                    "e.g. by `localcluster down --purge`); stopping")  # fmt: skip
        if cluster.stopping(directory):
            return (f"the cluster in {directory} is gone (`localcluster down` is stopping it); "
                    "stopping")  # fmt: skip
        if cluster.live_brokers(directory, self.spec):
            self.since_alive = time.monotonic()
        elif time.monotonic() - self.since_alive > CLUSTER_GONE_AFTER_S:
            return (f"no broker of the cluster in {directory} has run for "
                    f"{CLUSTER_GONE_AFTER_S:.0f} s (`localcluster down`?); stopping")  # fmt: skip
        return None

    def problem_behind(self, failure: str) -> str:
        """The message for a load that failed with `failure`: the cluster's going away when
        that is the cause. `down --purge` stops the brokers before it removes the directory,
        so a client can fail ("no broker is registered") a moment before problem() sees it;
        wait for it, at most as long as problem() itself waits for a dead cluster."""
        deadline = time.monotonic() + CLUSTER_GONE_AFTER_S + 1.0
        while True:
            problem = self.problem()
            if problem is not None:
                return problem
            if time.monotonic() > deadline:
                return failure
            time.sleep(0.1)


async def drive(
    load: Load, target: Target, client: str, config: dict, progress: Progress | None
) -> None:
    """Run `load` with the chosen client while reporting progress every 100 ms; give up with
    a ClusterError when the cluster goes away."""
    if client == "own":
        task = asyncio.ensure_future(run_own(load, target, config))
    else:
        task = asyncio.ensure_future(asyncio.to_thread(run_confluent, load, target, config))
    watch = ClusterWatch(target.cluster_dir, target.spec)
    try:
        while not task.done():
            if progress is not None:
                progress(load.completed)
            await asyncio.wait({task}, timeout=0.1)
            gone = watch.problem()
            if gone is not None:
                raise cluster.ClusterError(gone)
        await task
    finally:
        load.stop.set()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    if progress is not None:
        progress(load.completed)


def producer_config(client: str, acks: str, extra: dict[str, str] | None) -> dict:
    """--acks then --producer-config (which wins), checked against the client's names."""
    config = {"acks": "all" if str(acks) in ("all", "-1") else str(acks), **(extra or {})}
    if client == "own":
        from localcluster.client.producer import DEFAULTS

        unknown = sorted(
            k for k in config if k not in DEFAULTS and k not in ("acks", "bootstrap.servers")
        )
        if unknown:
            raise ValueError(f"unknown producer setting {', '.join(unknown)} for --client own; known: "
                             f"{', '.join(sorted(DEFAULTS))} (or use --client confluent)")  # fmt: skip
    return config


def _run(coroutine):
    """Run on uvloop when installed. SIGTERM (in the main thread) stops the run as Ctrl-C does:
    the coroutine is cancelled, its cleanups run (killed brokers are started again), and
    KeyboardInterrupt is raised."""
    terminated = []

    async def main():
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def on_sigterm():
            terminated.append(True)
            task.cancel()

        with contextlib.suppress(
            ValueError, RuntimeError, NotImplementedError
        ):  # not the main thread
            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await coroutine
        except asyncio.CancelledError:
            if terminated:
                raise KeyboardInterrupt from None
            raise
        finally:
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.remove_signal_handler(signal.SIGTERM)

    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


def _payload(record_size: int) -> bytes:
    return random.Random(record_size).randbytes(record_size)


# -- perf produce -------------------------------------------------------------------------------


def produce(cluster_dir: Path | str | None, topic: str, num_records: int, record_size: int, *,
            throughput: float = -1, acks: str = "all", config: dict[str, str] | None = None,
            client: str = "own", partitions: int | None = None, replication_factor: int | None = None,
            progress: Progress | None = None) -> dict:  # fmt: skip
    """Produce `num_records` records of `record_size` bytes with the load engine; the result
    document. Gives up with a ClusterError when the cluster goes away (ClusterWatch)."""
    assert client in CLIENTS and num_records > 0 and record_size >= 0
    settings = producer_config(client, acks, config)
    target = open_target(cluster_dir)
    infos = _run(ensure_topic(target, topic, partitions, replication_factor))
    watch = ClusterWatch(target.cluster_dir, target.spec)

    def give_up() -> None:
        problem = watch.problem()
        if problem is not None:
            raise cluster.ClusterError(problem)

    own_via_dir = client == "own" and "cluster_dir" in target.client_kwargs()
    with _sigterm_as_interrupt(), LoadPool(PRODUCE_PROCESSES) as pool:
        try:
            r = pool.measure(client=client, bootstrap=target.tcp_bootstrap, topic=topic,
                             partitions=[p.partition for p in infos], acks=settings["acks"],
                             record_size=record_size, seconds=math.inf, rate=max(throughput, 0.0),
                             outstanding=PRODUCE_OUTSTANDING, records=num_records,
                             client_config={k: v for k, v in settings.items() if k != "acks"},
                             cluster_dir=str(target.cluster_dir) if own_via_dir else None,
                             per_record_latency=True, progress=progress, watch=give_up)  # fmt: skip
        except RuntimeError as e:  # a load process failed or did not answer
            raise cluster.ClusterError(watch.problem_behind(str(e))) from None
    if progress is not None:
        progress(r["records"] + r["errors"])
    elapsed_s = r["seconds"] if r["records"] else 0.0
    client_cores = max(r["load_cores"].values(), default=0.0)
    out = {"command": "produce", "client": client, "topic": topic, "partitions": len(infos),
           "replication_factor": len(infos[0].replicas) if infos else None, "acks": settings["acks"],
           "record_size": record_size, "num_records": num_records, "target_throughput": throughput,
           "producer_config": settings, "records_sent": r["sent"], "records_acked": r["records"],
           "errors": r["errors"], "first_error": r["first_error"], "elapsed_s": round(elapsed_s, 4),
           "records_per_s": round(r["records_per_s"], 1), "latency_ms": r["latency_ms"],
           "batch_records": r["batch_records"], "load_processes": r["load_processes"],
           "warmup_records": r["warmup_records"], "client_cpu_cores": round(client_cores, 3),
           "client_bound": client_cores >= CLIENT_BOUND_CORES,
           "machine_busy_cores": round(r["machine_busy_cores"], 3)}  # fmt: skip
    out["mb_per_s"] = round(out["records_per_s"] * record_size / 1e6, 3)
    out["ok"] = r["errors"] == 0 and r["records"] == num_records
    return out


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises KeyboardInterrupt while the load runs (in the main thread), so the load
    processes are killed on the way out as on Ctrl-C."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- perf e2e -----------------------------------------------------------------------------------


def e2e(cluster_dir: Path | str | None, topic: str, num_records: int, record_size: int, *,
        throughput: float = 1000, acks: str = "all", config: dict[str, str] | None = None,
        client: str = "own", partitions: int | None = None, replication_factor: int | None = None,
        progress: Progress | None = None, group: str | None = None,
        assignor: str | None = None) -> dict:  # fmt: skip
    """Produce-to-consume latency of `num_records` records (each at least E2E_HEADER.size bytes).
    With `group` the consumer subscribes as a member of that consumer group (our group
    consumer, `assignor` its partition.assignment.strategy) instead of assigning itself every
    partition; the load starts once the group is stable with every partition."""
    assert client in CLIENTS and num_records > 0 and record_size >= E2E_HEADER.size
    settings = producer_config(client, acks, config)
    target = open_target(cluster_dir)
    run_id = os.urandom(4)
    padding = _payload(record_size - E2E_HEADER.size)

    def make_value(sequence: int) -> bytes:
        return E2E_HEADER.pack(run_id, sequence, time.time_ns()) + padding

    load = Load(topic, num_records, throughput, make_value)
    acked_sequences: set[int] = set()
    load.on_ack = lambda sequence, *_: acked_sequences.add(sequence)
    e2e_latency = Latency()
    seen: dict[int, int] = {}  # sequence -> times received

    async def consume(consumer, enough: asyncio.Event):
        while not enough.is_set():
            records = await consumer.poll(100)
            now = time.time_ns()
            for record in records:
                value = record.value
                if value is None or len(value) < E2E_HEADER.size:
                    continue
                rid, sequence, sent_ns = E2E_HEADER.unpack_from(value)
                if rid != run_id:
                    continue
                seen[sequence] = seen.get(sequence, 0) + 1
                if seen[sequence] == 1:
                    e2e_latency.record_ns(now - sent_ns)

    async def main():
        from localcluster.client import AsyncConsumer

        infos = await ensure_topic(target, topic, partitions, replication_factor)
        tps = [(topic, p.partition) for p in infos]
        group_settings = {"group.id": group} if group else {}
        if group and assignor:
            group_settings["partition.assignment.strategy"] = assignor
        async with AsyncConsumer(group_settings, **target.client_kwargs(), auto_offset_reset="latest",
                                 fetch_max_wait_ms=100) as consumer:  # fmt: skip
            if group:
                await _join_group(consumer, topic, tps)
            else:
                await consumer.assign(tps)
                await consumer.seek_to_end(tps)
            for tp in tps:
                await consumer.position(tp)
            enough = asyncio.Event()
            reader = asyncio.ensure_future(consume(consumer, enough))
            try:
                await drive(load, target, client, settings, progress)
                deadline = time.monotonic() + E2E_DRAIN_TIMEOUT_S
                while (
                    not acked_sequences.issubset(seen)
                    and time.monotonic() < deadline
                    and not reader.done()
                ):
                    await asyncio.wait({reader}, timeout=0.05)
            finally:
                enough.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader, 5)
                if not reader.done():
                    reader.cancel()
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                raise cluster.ClusterError(f"the consumer failed: {reader.exception()}")
        return infos

    infos = _run(main())
    missing = len(acked_sequences - seen.keys())
    out = {"command": "e2e", "client": client, "topic": topic, "group": group, "partitions": len(infos),
           "replication_factor": len(infos[0].replicas) if infos else None, "acks": settings["acks"],
           "record_size": record_size, "num_records": num_records, "target_throughput": throughput,
           "producer_config": settings, **load.result(),
           "records_received": len(seen), "missing": missing,
           "duplicates": sum(n - 1 for n in seen.values()), "e2e_latency_ms": e2e_latency.summary()}  # fmt: skip
    out["produce_latency_ms"] = out.pop("latency_ms")
    out["mb_per_s"] = round(out["records_per_s"] * record_size / 1e6, 3)
    out["ok"] = load.errors == 0 and missing == 0 and load.acked == num_records
    return out


async def _join_group(consumer, topic: str, tps: list) -> None:
    """Subscribe and poll until the group gave this consumer every partition (records of
    earlier runs read meanwhile are not this run's)."""
    from localcluster.client.group_consumer import MemberState

    consumer.subscribe([topic])
    deadline = time.monotonic() + E2E_JOIN_TIMEOUT_S
    while True:
        await consumer.poll(100)
        member = consumer.coordinator
        if (
            member.state is MemberState.STABLE
            and not member.rejoin_needed
            and set(consumer.assignment()) == set(tps)
        ):
            return
        if time.monotonic() > deadline:
            raise cluster.ClusterError(
                f"group {member.group_id}: this consumer did not get every partition of {topic} "
                f"within {E2E_JOIN_TIMEOUT_S:.0f} s (has {sorted(consumer.assignment())}); "
                "are other members in the group?")  # fmt: skip


# -- perf failover ------------------------------------------------------------------------------


class _Store:
    """Blocking reads of the store (partition state, controller, registrations), one session."""

    def __init__(self, spec: cluster.ClusterSpec):
        from localcluster.coord import connect
        from localcluster.coord.kafka_zk import KafkaZkClient

        self.zk = KafkaZkClient(connect(spec.coordination))

    def state(self, topic: str, partition: int):
        found = self.zk.partition_state(topic, partition)
        return found[0] if found else None

    def replicas(self, topic: str, partition: int) -> tuple[int, ...]:
        assignment = self.zk.assignment(topic)
        return tuple(assignment.partitions[partition]) if assignment else ()

    def controller(self) -> int | None:
        return self.zk.controller_id()

    def registered_pid(self, broker: int) -> int | None:
        registration = self.zk.live_brokers().get(broker)
        return registration.pid if registration else None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.zk.coord.stop()


async def _poll(check, timeout_s: float, what: str, interval_s: float = 0.005):
    """check() (blocking, run in a thread) until truthy; ClusterError at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        if time.monotonic() > deadline:
            raise cluster.ClusterError(
                f"{what} did not happen within {timeout_s:.0f} s; see `localcluster status`"
            )
        await asyncio.sleep(interval_s)


@dataclass
class _Failover:
    target: Target
    topic: str
    partition: int
    aim: str  # leader | controller
    store: _Store
    load: Load
    say: Callable[[str], None]
    kill_ns: int | None = None  # armed: the next ack of a record sent after this closes the window
    window_end_ns: int | None = None
    dead: dict = field(default_factory=dict)  # broker -> pid killed and not yet restarted
    children: list = field(default_factory=list)

    def on_ack(self, sequence, partition, offset, sent_ns, ack_ns) -> None:
        if self.kill_ns is not None and self.window_end_ns is None and sent_ns >= self.kill_ns:
            self.window_end_ns = ack_ns

    def isr_full(self):
        state = self.store.state(self.topic, self.partition)
        replicas = self.store.replicas(self.topic, self.partition)
        return state is not None and state.leader >= 0 and set(state.isr) == set(replicas) and state

    def victim(self) -> int | None:
        if self.aim == "controller":
            return self.store.controller()
        state = self.store.state(self.topic, self.partition)
        return state.leader if state is not None and state.leader >= 0 else None

    async def one(self, number: int) -> dict:
        await _poll(
            self.isr_full, RECOVER_TIMEOUT_S, f"a full ISR of {self.topic}-{self.partition}"
        )
        acked = self.load.acked
        await _poll(lambda: self.load.acked > acked or self.load.stop.is_set(), RECOVER_TIMEOUT_S,
                    "an acknowledgement before the kill")  # fmt: skip
        before = await asyncio.to_thread(self.store.state, self.topic, self.partition)
        controller_before = await asyncio.to_thread(self.store.controller)
        broker = await asyncio.to_thread(self.victim)
        pid = cluster.broker_pid(self.target.cluster_dir, broker) if broker is not None else None
        if pid is None:
            raise cluster.ClusterError(f"the {self.aim} of {self.topic}-{self.partition} (broker {broker}) "
                                       "has no running process; see `localcluster status`")  # fmt: skip
        self.window_end_ns = None
        self.kill_ns = time.perf_counter_ns()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # brokers lead their own process group
        cluster.send_signal(pid, signal.SIGKILL)
        self.dead[broker] = pid
        kill_ns = self.kill_ns
        self.say(f"kill {number}: SIGKILL broker {broker} (pid {pid}, {self.aim}; leader {before.leader} "
                 f"epoch {before.leader_epoch}, controller {controller_before})")  # fmt: skip
        new_leader = new_controller = None
        expect_leader, expect_controller = broker == before.leader, broker == controller_before
        deadline = time.monotonic() + FAILOVER_WINDOW_TIMEOUT_S
        while time.monotonic() < deadline:
            if new_leader is None:
                state = await asyncio.to_thread(self.store.state, self.topic, self.partition)
                if (
                    state is not None
                    and state.leader >= 0
                    and state.leader_epoch > before.leader_epoch
                ):
                    new_leader = (
                        time.perf_counter_ns() - kill_ns,
                        state.leader,
                        state.leader_epoch,
                    )
            if new_controller is None:
                controller = await asyncio.to_thread(self.store.controller)
                if controller is not None and controller != controller_before:
                    new_controller = (time.perf_counter_ns() - kill_ns, controller)
            if (self.window_end_ns is not None and (new_leader or not expect_leader)
                    and (new_controller or not expect_controller)):  # fmt: skip
                break
            await asyncio.sleep(0.002)
        window_ns = None if self.window_end_ns is None else self.window_end_ns - kill_ns
        self.kill_ns = None
        await self.restart(broker)
        restarted_ns = time.perf_counter_ns()
        await _poll(
            self.isr_full,
            RECOVER_TIMEOUT_S,
            f"a full ISR of {self.topic}-{self.partition} after the restart",
        )
        row = {"kill": number, "target": self.aim, "broker": broker, "pid": pid,
               "leader_before": before.leader, "leader_epoch_before": before.leader_epoch,
               "controller_before": controller_before,
               "window_ms": None if window_ns is None else round(window_ns / 1e6, 3),
               "new_leader": new_leader[1] if new_leader else None,
               "new_leader_epoch": new_leader[2] if new_leader else None,
               "leader_elected_ms": round(new_leader[0] / 1e6, 3) if new_leader else None,
               "new_controller": new_controller[1] if new_controller else None,
               "controller_elected_ms": round(new_controller[0] / 1e6, 3) if new_controller else None,
               "isr_full_after_restart_ms": round((time.perf_counter_ns() - restarted_ns) / 1e6, 3)}  # fmt: skip
        if window_ns is None:
            self.say(
                f"kill {number}: no acknowledgement within {FAILOVER_WINDOW_TIMEOUT_S:.0f} s of the kill"
            )
        else:
            self.say(f"kill {number}: unavailable for {window_ns / 1e6:.1f} ms; "
                     + (f"leader {new_leader[1]} elected after {new_leader[0] / 1e6:.1f} ms; " if new_leader else "")
                     + (f"controller {new_controller[1]} after {new_controller[0] / 1e6:.1f} ms; "
                        if new_controller else "")
                     + f"ISR full {row['isr_full_after_restart_ms']:.0f} ms after the restart")  # fmt: skip
        return row

    async def restart(self, broker: int) -> None:
        pid = self.dead[broker]
        await asyncio.to_thread(cluster.wait_gone, [pid], 10.0)
        if cluster.broker_pid(self.target.cluster_dir, broker) is None:
            process = await asyncio.to_thread(
                cluster.spawn_broker, self.target.cluster_dir, self.target.spec, broker
            )
            self.children.append(process)
            await _poll(lambda: self.store.registered_pid(broker) == process.pid or process.poll() is not None,
                        RECOVER_TIMEOUT_S, f"broker {broker}'s registration after the restart")  # fmt: skip
            if process.poll() is not None:
                raise cluster.ClusterError(f"broker {broker} exited while restarting: "
                                           f"{cluster.tail(cluster.log_file(self.target.cluster_dir, broker), 1)}")  # fmt: skip
        self.dead.pop(broker, None)

    def restart_all_blocking(self) -> None:
        """The finally path (errors, Ctrl-C): start every broker we killed again."""
        for broker in list(self.dead):
            with contextlib.suppress(Exception):
                cluster.wait_gone([self.dead[broker]], 10.0)
                if cluster.broker_pid(self.target.cluster_dir, broker) is None:
                    self.children.append(
                        cluster.spawn_broker(self.target.cluster_dir, self.target.spec, broker)
                    )
            self.dead.pop(broker, None)


async def _consume_all(target: Target, topic: str, partition: int, prefix: bytes) -> dict[int, int]:
    """{sequence: times present} of this run's records in the partition, read to its end."""
    from localcluster.client import AsyncConsumer

    tp = (topic, partition)
    seen: dict[int, int] = {}
    async with AsyncConsumer(**target.client_kwargs(), auto_offset_reset="earliest") as consumer:
        await consumer.assign([tp])
        await consumer.seek_to_beginning([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while await consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise cluster.ClusterError(f"could not read {topic}-{partition} to offset {end} within "
                                           f"{CONSUME_TIMEOUT_S:.0f} s; see `localcluster status`")  # fmt: skip
            for record in await consumer.poll(500):
                value = record.value or b""
                if value.startswith(prefix):
                    sequence = int(value[len(prefix) : len(prefix) + 10])
                    seen[sequence] = seen.get(sequence, 0) + 1
    return seen


def failover(cluster_dir: Path | str | None, topic: str, *, kills: int = 3, aim: str = "leader",
             partition: int = 0, throughput: float = 1000, record_size: int = 100,
             config: dict[str, str] | None = None, partitions: int | None = None,
             replication_factor: int | None = None, progress: Progress | None = None,
             say: Callable[[str], None] = lambda line: None) -> dict:  # fmt: skip
    """Kill the partition's leader (or the controller) `kills` times under acks=all load."""
    assert aim in TARGETS and kills >= 1 and throughput > 0
    settings = {**FAILOVER_DEFAULT_CONFIG, **producer_config("own", "all", config), "acks": "all"}
    target = open_target(cluster_dir)
    run_id = os.urandom(4).hex().encode()
    prefix = b"failover-" + run_id + b":"
    padding = b"." * max(0, record_size - len(prefix) - 10)
    load = Load(topic, 1 << 62, throughput, lambda sequence: prefix + b"%010d" % sequence + padding,
                partition=partition)  # fmt: skip
    acked: set[int] = set()
    store = _Store(target.spec)
    engine = _Failover(target, topic, partition, aim, store, load, say)

    def on_ack(sequence, *args) -> None:
        acked.add(sequence)
        engine.on_ack(sequence, *args)

    load.on_ack = on_ack
    rows: list[dict] = []

    async def main():
        # a kill must leave enough replicas to acknowledge: min.insync.replicas 2 of 3 or more
        rf = replication_factor or min(3, len(target.registrations))
        config_ = {"min.insync.replicas": "2"} if rf >= 3 else {}
        infos = await ensure_topic(target, topic, partitions, replication_factor, config_)
        if not 0 <= partition < len(infos):
            raise cluster.ClusterError(
                f"{topic} has no partition {partition} (it has {len(infos)})"
            )
        if len(infos[partition].replicas) < 2:
            raise cluster.ClusterError(f"{topic}-{partition} has one replica: a kill leaves it offline until the "
                                       "restart; use a topic with replication factor >= 2")  # fmt: skip
        task = asyncio.ensure_future(drive(load, target, "own", settings, None))
        try:
            for number in range(1, kills + 1):
                if task.done():
                    break
                rows.append(await engine.one(number))
                if progress is not None:
                    progress(number)
        finally:
            load.stop.set()
            engine.restart_all_blocking()
            await task  # flushes what is in flight (acknowledged or failed)
        seen = await _consume_all(target, topic, partition, prefix)
        return infos, seen

    try:
        infos, seen = _run(main())
    finally:
        engine.restart_all_blocking()
        store.close()
    windows = [r["window_ms"] for r in rows if r["window_ms"] is not None]
    lost = sorted(acked - seen.keys())
    out = {"command": "failover", "topic": topic, "partition": partition, "target": aim,
           "partitions": len(infos), "replicas": list(infos[partition].replicas), "kills": kills,
           "record_size": record_size, "target_throughput": throughput, "producer_config": settings,
           **load.result(), "kill_results": rows, "windows_ms": windows, "window_ms": latency_of(windows),
           "unclosed_windows": sum(1 for r in rows if r["window_ms"] is None),
           "records_consumed": len(seen), "lost": len(lost), "lost_sequences": lost[:50],
           "duplicates": sum(n - 1 for n in seen.values()),
           "unacknowledged_present": len(seen.keys() - acked)}  # fmt: skip
    out["produce_latency_ms"] = out.pop("latency_ms")
    out["ok"] = not lost and not out["unclosed_windows"] and len(rows) == kills
    return out
