"""Broker benchmark: one broker (RF 1), produce and fetch throughput beside the storage limit.

What is measured, in one run, 100-byte record values:
- storage append limit: `Log.append(batch, leader_epoch=0)` of the very batches the clients
  send, into a fresh `Log` on /dev/shm, in this process (no network, no broker): what the
  broker's log could take if the broker did nothing else.
- produce, confluent-kafka (librdkafka), acks=1: one producer process calling `produce()` per
  record (librdkafka builds the batches: `batch.size` and `linger.ms` below); timed from the
  first `produce()` to `flush()` returning; the partition's end offset is checked afterwards.
- produce, our client, acks=1: one process sending prebuilt batches (`encode_batch`, built once)
  with `AsyncProducer.send_batch`, up to `max.in.flight.requests.per.connection` requests out;
  timed from the first send to the last acknowledgement.
- fetch, confluent-kafka and our client: one consumer process reading the whole partition
  from offset 0 (the records the produce runs wrote), timed from the first record to the last.
- storage read limit: `Log.read` + `os.sendfile` of a log of the same batches to a Unix
  socket drained by another process (bench.storage's reader), the bytes a fetch serves.

The broker runs as a real process (`python -m localcluster.broker`, data on a temporary
/dev/shm directory), the clients in other processes; on a 2-core machine the broker and the
client each get about one core. Figures are the best of --repeats runs. Every process started
is killed by process group at the end and every temporary directory is removed, also on
Ctrl-C/SIGTERM.

This module also holds the small process helpers bench.commit and bench.failover use (broker
processes by process group, a temporary cluster, CPU time from /proc, pacing).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    MB,
    median,
    print_note,
    print_table,
    write_results,
)
from localcluster.broker.process import BrokerProcess
from localcluster.tools.load import (  # noqa: F401 (the process and CPU helpers, re-exported)
    CpuMeter,
    batch_records_for,
    build_batch,
    cpu_seconds,
    kill_workers,
    machine_busy_seconds,
    prepare_load_process,
    spawn_context,
)
from localcluster.tools.load import own_cpu_seconds as _cpu
from localcluster.waiting import wait_until

RECORD_VALUE_BYTES = 100


# == shared helpers (bench.commit and bench.failover import these) ===========================
# Brokers are localcluster.broker.process.BrokerProcess, the same class the tests use.


# Listeners (Kafka's settings) for the transport rows of bench.commit. PLAINTEXT stays the first
# listener, so a broker's "ready on" line, `Cluster.bootstrap` and the admin helpers below keep
# using it; the SASL listeners come after it and are found in the brokers' registrations.
SASL_CLIENT_LISTENER = "SASL_PLAINTEXT"
BROKER_LISTENER = "BROKER"
# PLAIN's users: the broker's own credential (inter-broker) and one client's.
JAAS_TEXT = """KafkaServer {
  org.apache.kafka.common.security.plain.PlainLoginModule required
    username="broker" password="broker-secret" user_broker="broker-secret" user_client="client-secret";
};
"""
CLIENT_SASL = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
               "sasl.username": "client", "sasl.password": "client-secret"}  # fmt: skip
REPLICATION_PATHS = ("unix", "tcp")
ROUTE = re.compile(r"broker (\d+) reaches broker (\d+) over (\S+) (.*)$")


def listener_settings(jaas_path: Path, replication: str, sasl_clients: bool) -> dict[str, str]:
    """Broker settings for replication over the Unix sockets ("unix", the default on one host)
    or over TCP loopback with SASL PLAIN ("tcp": ours refuses a PLAINTEXT inter-broker
    listener), with or without a SASL_PLAINTEXT client listener beside PLAINTEXT."""
    assert replication in REPLICATION_PATHS, replication
    listeners = ["PLAINTEXT://127.0.0.1:0"]
    protocols = ["PLAINTEXT:PLAINTEXT"]
    if sasl_clients:
        listeners.append(f"{SASL_CLIENT_LISTENER}://127.0.0.1:0")
        protocols.append(f"{SASL_CLIENT_LISTENER}:SASL_PLAINTEXT")
    out: dict[str, str] = {}
    if replication == "tcp":
        listeners.append(f"{BROKER_LISTENER}://127.0.0.1:0")
        protocols.append(f"{BROKER_LISTENER}:SASL_PLAINTEXT")
        out |= {"inter.broker.listener.name": BROKER_LISTENER,
                "inter.broker.unix.socket.enable": "false",
                "sasl.mechanism.inter.broker.protocol": "PLAIN"}  # fmt: skip
    if replication == "tcp" or sasl_clients:
        out |= {"listeners": ",".join(listeners),
                "listener.security.protocol.map": ",".join(protocols),
                "java.security.auth.login.config": str(jaas_path), "super.users": "User:broker"}  # fmt: skip
    return out


class Cluster:
    """Brokers in a temporary cluster dir (on disk) with data dirs on a temporary /dev/shm dir.

    `replication="tcp"` makes the brokers replicate over TCP loopback with SASL PLAIN instead of
    their Unix sockets; `sasl_clients=True` adds a SASL_PLAINTEXT client listener (connect with
    `client_bootstrap(SASL_CLIENT_LISTENER)` and CLIENT_SASL). The JAAS file they need is
    written into the cluster dir. `close()` kills every broker by process group and removes
    both directories.
    """

    def __init__(self, settings: dict[str, str] | None = None, data_root: str = "/dev/shm",
                 replication: str = "unix", sasl_clients: bool = False,
                 broker_tree: Path | None = None):  # fmt: skip
        self.broker_tree = broker_tree  # run the brokers from this checkout (None: this one)
        self.cluster_dir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
        self.replication = replication
        self.settings = listener_settings(self.cluster_dir / "jaas.conf", replication, sasl_clients)
        if self.settings:
            (self.cluster_dir / "jaas.conf").write_text(JAAS_TEXT)
        self.settings |= dict(settings or {})
        self.data_root = Path(tempfile.mkdtemp(prefix="bench-data-", dir=data_root))
        self.brokers: dict[int, BrokerProcess] = {}
        self._zk = None

    def start(self, broker_ids, **extra: str) -> list[BrokerProcess]:
        started = []
        for broker_id in broker_ids:
            broker = BrokerProcess(broker_id, self.cluster_dir, {**self.settings, **extra},
                                   data_dir=self.data_root / f"broker-{broker_id}",
                                   source_tree=self.broker_tree)  # fmt: skip
            self.brokers[broker_id] = broker
            started.append(broker.start())
        return started

    @property
    def bootstrap(self) -> str:
        """The live brokers' PLAINTEXT listeners (the first, named by "ready on")."""
        return ",".join(b.bootstrap for b in self.brokers.values() if b.is_alive())

    def client_bootstrap(self, listener: str) -> str:
        """The live brokers' `listener` endpoints, from their registrations in the store."""
        found = []
        for broker_id, broker in self.brokers.items():
            registration = self.zk().broker(broker_id) if broker.is_alive() else None
            endpoint = registration.endpoint(listener) if registration else None
            if endpoint is not None:
                found.append(f"{endpoint.host}:{endpoint.port}")
        if not found:
            raise RuntimeError(f"no live broker advertises a {listener} listener")
        return ",".join(found)

    def routes(self) -> list[tuple[int, int, str, str]]:
        """How each broker reached each other (controller requests and follower fetches alike),
        from the brokers' "broker N reaches broker M over ..." log lines: (from, to, "unix" or
        "tcp", the rest of the line), in log order; a broker logs a route when it changes."""
        out = []
        for broker in self.brokers.values():
            for line in list(broker.output):
                match = ROUTE.search(line.rstrip())
                if match:
                    out.append((int(match.group(1)), int(match.group(2)), match.group(3),
                                match.group(4)))  # fmt: skip
        return out

    def zk(self):
        """A KafkaZkClient on the cluster's store (one coordination session, kept)."""
        if self._zk is None:
            from localcluster.coord import connect
            from localcluster.coord.kafka_zk import KafkaZkClient

            self._zk = KafkaZkClient(connect(str(self.cluster_dir / "store")))
        return self._zk

    def wait_until(self, predicate, timeout_s: float, what: str, poll_s: float = 0.01):
        value = wait_until(predicate, timeout_s, poll_s)
        if not value:
            raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")
        return value

    def partition_state(self, topic: str, partition: int):
        found = self.zk().partition_state(topic, partition)
        return None if found is None else found[0]

    def controller_id(self) -> int | None:
        return self.zk().controller_id()

    def stop(self) -> None:
        """Kill the brokers and keep their files (close() removes them): freeing GBs of /dev/shm
        in the middle of a benchmark has this VM report the memory to its host during the runs
        after it (bench/README.md, "bench.commit's memory bounded by retention")."""
        for broker in self.brokers.values():
            broker.kill()
        if self._zk is not None:
            try:
                self._zk.coord.close() if hasattr(self._zk, "coord") else None
            except Exception:  # noqa: BLE001 (best effort at teardown)
                pass
            self._zk = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.cluster_dir, ignore_errors=True)
        shutil.rmtree(self.data_root, ignore_errors=True)


# Runs that write GBs (bench.commit, bench.e2e): every byte lands on three brokers' /dev/shm,
# and this VM backs fresh pages 7x slower once a few GB have been written (bench/README.md,
# "bench.commit's memory bounded by retention"). Such a topic keeps RETAINED_BYTES a partition
# in SEGMENT_BYTES segments, the brokers check retention every RETENTION_CHECK_MS, and new
# segments reuse the deleted ones' files: about 3.4 GB on the machine for 3 partitions of RF 3,
# however long the run, as in a long-running cluster with retention.bytes.
SEGMENT_BYTES = 64 << 20
RETAINED_BYTES = 256 << 20
RETENTION_CHECK_MS = 250
BOUNDED_TOPIC_CONFIG = {"segment.bytes": str(SEGMENT_BYTES), "retention.bytes": str(RETAINED_BYTES)}
BOUNDED_BROKER_SETTINGS = {"log.retention.check.interval.ms": str(RETENTION_CHECK_MS)}
# What each partition of such a topic must have written before every roll reuses a deleted
# segment's file (the steady state): the retained bytes, the active segment and one deleted.
FILL_BYTES = RETAINED_BYTES + 2 * SEGMENT_BYTES
FILL_BATCH_BYTES = 1_000_000


def fill_past_retention(pool, bootstrap: str, topic: str, partitions: int,
                        cpu_of: dict[str, int] | None = None) -> dict:  # fmt: skip
    """Untimed, before the runs on a fresh cluster: acks=all from our client (a LoadPool) in
    1 MB batches until each partition of a BOUNDED_TOPIC_CONFIG topic wrote FILL_BYTES, then
    until the high watermarks settled and retention deleted from every partition. From then on
    each roll reuses a deleted segment's file, and no run writes into memory the machine has
    not touched yet. Returns the load's result."""
    batches = partitions * (-(-FILL_BYTES // FILL_BATCH_BYTES) + 1)
    result = pool.measure(client="own", bootstrap=bootstrap, topic=topic,
                          partitions=list(range(partitions)), acks="all", record_size=RECORD_VALUE_BYTES,
                          seconds=300, records=batches * batch_records_for(RECORD_VALUE_BYTES, FILL_BATCH_BYTES),
                          client_config={"batch.size": str(FILL_BATCH_BYTES)}, cpu_of=cpu_of)  # fmt: skip
    settled_end_offsets(bootstrap=bootstrap, topic=topic, partitions=partitions, timeout_s=120)
    wait_log_starts_moved(bootstrap, topic, partitions, timeout_s=30)
    return result


def wait_log_starts_moved(
    bootstrap: str, topic: str, partitions: int, timeout_s: float
) -> list[int]:
    """Until retention has deleted from every partition (ListOffsets earliest > 0, our client:
    see end_offsets); the log start offsets, or RuntimeError naming the partitions it has not
    reached."""
    from localcluster.client import Consumer

    consumer = Consumer(bootstrap_servers=bootstrap)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            found = consumer.beginning_offsets([(topic, p) for p in range(partitions)])
            starts = [found[(topic, p)] for p in range(partitions)]
            if all(start > 0 for start in starts):
                return starts
            if time.monotonic() > deadline:
                raise RuntimeError(f"retention did not delete from partitions "
                                   f"{[p for p, s in enumerate(starts) if s == 0]} of {topic} "
                                   f"within {timeout_s:g} s (log starts {starts}): does the topic "
                                   f"have BOUNDED_TOPIC_CONFIG and the brokers BOUNDED_BROKER_SETTINGS?")  # fmt: skip
            time.sleep(0.1)
    finally:
        consumer.close()


def create_topic(bootstrap: str, topic: str, partitions: int, replication_factor: int,
                 config: dict[str, str] | None = None, timeout_s: float = 20.0) -> None:  # fmt: skip
    """CreateTopics through confluent-kafka's AdminClient, then wait until every partition
    has a leader in the metadata."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, replication_factor, config=config or {})],
                                  operation_timeout=timeout_s)  # fmt: skip
    futures[topic].result(timeout_s)

    def led() -> bool:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        return bool(meta and meta.error is None and len(meta.partitions) == partitions
                    and all(p.leader >= 0 for p in meta.partitions.values()))  # fmt: skip

    if not wait_until(led, timeout_s, 0.05):
        raise RuntimeError(f"topic {topic}: not every partition has a leader after {timeout_s} s")


def install_sigterm() -> None:
    """SIGTERM behaves as Ctrl-C, so `finally` blocks kill brokers and remove directories."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


# == the benchmark ===========================================================================


@dataclass(frozen=True)
class Scale:
    records: int  # produced per produce run
    repeats: int


FULL = Scale(records=2_000_000, repeats=3)
QUICK = Scale(records=300_000, repeats=1)
TOPIC = "bench-broker"
# Our client: records per prebuilt batch (~64 KiB); confluent-kafka: librdkafka's batch.size
# in bytes, about the same, with linger so batches fill.
BATCH_RECORDS = 580
CK_PRODUCER = {"linger.ms": 10, "batch.size": 65536, "queue.buffering.max.messages": 1_000_000,
               "queue.buffering.max.kbytes": 262144, "enable.idempotence": False,
               "compression.type": "none"}  # fmt: skip


def storage_append_limit(batch: bytes, records_per_batch: int, total_records: int) -> dict:
    """Log.append of `batch` into a fresh Log on /dev/shm until total_records; one timing."""
    from localcluster.storage import Log

    directory = Path(tempfile.mkdtemp(prefix="bench-broker-log-", dir="/dev/shm"))
    batches = max(1, total_records // records_per_batch)
    try:
        log = Log.open(directory)
        try:
            append = log.append
            start = time.perf_counter()
            for _ in range(batches):
                append(batch, leader_epoch=0)
            seconds = time.perf_counter() - start
        finally:
            log.delete()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "seconds": seconds,
        "records": batches * records_per_batch,
        "bytes": batches * len(batch),
    }


def storage_read_limit(batch: bytes, records_per_batch: int, total_records: int) -> dict:
    """Log.read + sendfile of a log of `batch` to a socket drained by another process."""
    from bench.storage import Reader, Workload, send_log
    from localcluster.storage import Log

    directory = Path(tempfile.mkdtemp(prefix="bench-broker-read-", dir="/dev/shm"))
    work = Workload("fetch", batch, records_per_batch, max(1, total_records // records_per_batch))
    reader = Reader()
    try:
        log = Log.open(directory)
        try:
            for _ in range(work.batches):
                log.append(batch, leader_epoch=0)
            seconds = reader.time_send(
                work.total_bytes, lambda out: send_log(log, work, 1 << 20, out)
            )
        finally:
            log.delete()
    finally:
        reader.close()
        shutil.rmtree(directory, ignore_errors=True)
    return {"seconds": seconds, "records": work.total_records, "bytes": work.total_bytes}


def ck_produce_worker(bootstrap: str, topic: str, partition: int, records: int, acks: str,
                      config: dict, results) -> None:  # fmt: skip
    """confluent-kafka producer: `records` 100-byte values, one produce() call per record."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, **config})
    value = b"v" * RECORD_VALUE_BYTES
    produce, poll = producer.produce, producer.poll
    producer.list_topics(topic, timeout=10)  # connect before timing
    cpu0 = _cpu()
    start = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                produce(topic, value, partition=partition)
                break
            except BufferError:
                poll(0.0005)
    producer.flush(60)
    seconds = time.perf_counter() - start
    results.put({"seconds": seconds, "records": records, "cpu_s": _cpu() - cpu0})


def our_produce_worker(bootstrap: str, topic: str, partition: int, records: int, acks: int,
                       batch_records: int, results) -> None:  # fmt: skip
    """Our client: prebuilt batches through AsyncProducer.send_batch."""

    async def run():
        from localcluster.client import AsyncProducer

        batch = build_batch(batch_records)
        batches = max(1, records // batch_records)
        async with AsyncProducer(bootstrap_servers=bootstrap, acks=acks, linger_ms=0,
                                 buffer_memory=64 << 20) as producer:  # fmt: skip
            await (await producer.send_batch(topic, partition, batch))  # connect and warm up
            cpu0 = _cpu()
            start = time.perf_counter()
            pending = [await producer.send_batch(topic, partition, batch) for _ in range(batches)]
            await asyncio.gather(*pending)
            seconds = time.perf_counter() - start
        return {
            "seconds": seconds,
            "records": batches * batch_records,
            "warmup_records": batch_records,
            "cpu_s": _cpu() - cpu0,
        }

    prepare_load_process()
    results.put(asyncio.run(run()))


def ck_fetch_worker(bootstrap: str, topic: str, partition: int, end_offset: int, results) -> None:
    """confluent-kafka consumer: read [0, end_offset) with consume() in batches."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-broker",
                         "enable.auto.commit": False, "fetch.max.bytes": 52428800,
                         "max.partition.fetch.bytes": 1048576 * 4,
                         "queued.max.messages.kbytes": 262144, "queued.min.messages": 1_000_000,
                         "fetch.queue.backoff.ms": 1})  # fmt: skip
    consumer.assign([TopicPartition(topic, partition, 0)])
    count, nbytes, start, last = 0, 0, None, -1
    deadline = time.monotonic() + 120
    while last < end_offset - 1 and time.monotonic() < deadline:
        # consume() waits until it has num_messages or the timeout passed: never ask for more
        # than remain, or the last call idles for the whole timeout
        for message in consumer.consume(max(1, min(10000, end_offset - 1 - last)), 1.0):
            if message.error():
                continue
            if start is None:
                start, cpu0 = time.perf_counter(), _cpu()
            count += 1
            nbytes += len(message.value())
            last = message.offset()
    seconds = time.perf_counter() - start if start else float("nan")
    cpu_s = _cpu() - cpu0 if start else float("nan")
    consumer.close()
    results.put({"seconds": seconds, "records": count, "value_bytes": nbytes, "last_offset": last,
                 "cpu_s": cpu_s})  # fmt: skip


def our_fetch_worker(bootstrap: str, topic: str, partition: int, end_offset: int, results) -> None:
    """Our AsyncConsumer: poll the partition from offset 0 to end_offset."""

    async def run():
        from localcluster.client import AsyncConsumer

        async with AsyncConsumer(bootstrap_servers=bootstrap, max_poll_records=100_000,
                                 max_partition_fetch_bytes=4 << 20,
                                 fetch_max_bytes=50 << 20) as consumer:  # fmt: skip
            tp = (topic, partition)
            await consumer.assign([tp])
            consumer.seek(tp, 0)
            count, nbytes, start, last = 0, 0, None, -1
            deadline = time.monotonic() + 120
            while last < end_offset - 1 and time.monotonic() < deadline:
                for record in await consumer.poll(1000):
                    if start is None:
                        start, cpu0 = time.perf_counter(), _cpu()
                    count += 1
                    nbytes += len(record.value)
                    last = record.offset
            seconds = time.perf_counter() - start if start else float("nan")
            cpu_s = _cpu() - cpu0 if start else float("nan")
        return {
            "seconds": seconds,
            "records": count,
            "value_bytes": nbytes,
            "last_offset": last,
            "cpu_s": cpu_s,
        }

    prepare_load_process()
    results.put(asyncio.run(run()))


def run_worker(target, *args, timeout_s: float = 300.0) -> dict:
    """Run `target(*args, queue)` in a spawned process; its result dict (raises on failure)."""
    ctx = spawn_context()
    results = ctx.Queue()
    worker = ctx.Process(target=target, args=(*args, results), daemon=True)
    worker.start()
    try:
        return results.get(timeout=timeout_s)
    except Exception as e:
        raise RuntimeError(
            f"{target.__name__} produced no result (exit code {worker.exitcode})"
        ) from e
    finally:
        worker.join(10)
        kill_workers([worker])


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """Each partition's end offset as consumers see it (its high watermark). Our client's
    ListOffsets, with no group: a confluent-kafka Consumer needs a group.id, and librdkafka
    looks up its coordinator at once, which creates __consumer_offsets (50 partitions that the
    followers then fetch in every request: the runs after the first measured half the rate)."""
    from localcluster.client import Consumer

    consumer = Consumer(bootstrap_servers=bootstrap)
    try:
        ends = consumer.end_offsets([(topic, p) for p in range(partitions)])
        return [ends[(topic, p)] for p in range(partitions)]
    finally:
        consumer.close()


def settled_end_offsets(bootstrap: str, topic: str, partitions: int, acknowledged: float = float("inf"),
                        timeout_s: float = 15.0) -> tuple[int, float]:  # fmt: skip
    """The sum of the partitions' high watermarks once it reaches `acknowledged` or stops
    growing for a second, and the seconds that took. With acks=0 and acks=1 the high watermark
    trails the acknowledgements by the followers' backlog (not loss); a run that starts before
    they caught up measures their catching up too."""
    started = time.monotonic()
    stored, changed = -1, started
    while True:
        now_stored = sum(end_offsets(bootstrap, topic, partitions))
        now = time.monotonic()
        if now_stored != stored:
            stored, changed = now_stored, now
        if stored >= acknowledged or now - changed >= 1.0 or now - started >= timeout_s:
            return stored, round(now - started, 3)
        time.sleep(0.05)


def rate_row(
    name: str, samples: list[dict], limit_seconds_per_record: float | None, where: str
) -> dict:
    """One table/JSON row from worker results: best run's records/s and MB/s (value bytes)."""
    rates = [s["records"] / s["seconds"] for s in samples]
    top = max(rates)
    row = {
        "variant": name, "where": where, "runs": samples,
        "records_per_s": top, "records_per_s_median": median(rates),
        "mb_per_s": top * RECORD_VALUE_BYTES / MB,
    }  # fmt: skip
    if limit_seconds_per_record:
        row["ratio_vs_storage"] = top * limit_seconds_per_record
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.broker", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds, rougher figures")
    parser.add_argument("--json", action="store_true", help="also print the JSON to stdout")
    parser.add_argument("--records", type=int, help="records per produce run")
    parser.add_argument("--repeats", type=int, help="runs per figure (the best is reported)")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    records = args.records or scale.records
    repeats = args.repeats or scale.repeats
    if args.json:
        from bench.common import console

        console(stderr=True)
    install_sigterm()

    batch = build_batch(BATCH_RECORDS)
    load_before = os.getloadavg()
    if load_before[0] > 1.0:
        print_note(f"[yellow]load average {load_before[0]:.2f} before the run on {os.cpu_count()} cores: "
                   f"other work competes for the CPU and the figures will be low[/]")  # fmt: skip
    cluster = Cluster({"auto.create.topics.enable": "false"})
    rows: list[dict] = []
    try:
        t0 = time.perf_counter()
        (broker,) = cluster.start([0])
        create_topic(broker.bootstrap, TOPIC, 1, 1)
        boot = broker.bootstrap
        limits, ck_runs, our_runs = [], [], []

        def measured(target, *worker_args) -> dict:
            """The worker's result plus the broker's CPU seconds over the worker's life (the
            broker is idle while the worker starts, so per timed second it is the broker's
            load) and the whole machine's busy cores over the same span."""
            meter = CpuMeter({"broker": broker.pid})
            meter.start()
            result = run_worker(target, *worker_args)
            meter.stop()
            result["broker_cpu_s"] = meter.used["broker"]
            result["machine_cores_whole_worker"] = meter.machine_cores
            return result

        for _run in range(repeats):
            limits.append(storage_append_limit(batch, BATCH_RECORDS, records))
            ck_runs.append(measured(ck_produce_worker, boot, TOPIC, 0, records, "1", CK_PRODUCER))
            our_runs.append(measured(our_produce_worker, boot, TOPIC, 0, records, 1, BATCH_RECORDS))
        (produced,) = end_offsets(boot, TOPIC, 1)
        expected = sum(r["records"] + r.get("warmup_records", 0) for r in ck_runs + our_runs)
        fetched = min(produced, records)  # offsets [0, fetched): one produce run's worth
        read_limits, ck_fetch, our_fetch = [], [], []
        for _run in range(min(repeats, 2)):
            read_limits.append(storage_read_limit(batch, BATCH_RECORDS, fetched))
            ck_fetch.append(measured(ck_fetch_worker, boot, TOPIC, 0, fetched))
            our_fetch.append(measured(our_fetch_worker, boot, TOPIC, 0, fetched))
        elapsed = time.perf_counter() - t0
    finally:
        cluster.close()

    append_spr = min(s["seconds"] / s["records"] for s in limits)  # seconds per record, best
    read_spr = min(s["seconds"] / s["records"] for s in read_limits)
    where_broker = "broker process (1 core), client process"
    rows.append(rate_row("storage: Log.append (in-process)", [dict(s) for s in limits], append_spr,
                         "this process, /dev/shm"))  # fmt: skip
    rows.append(rate_row("produce acks=1: confluent-kafka", ck_runs, append_spr, where_broker))
    rows.append(
        rate_row("produce acks=1: our client send_batch", our_runs, append_spr, where_broker)
    )
    rows.append(rate_row("storage: Log.read + sendfile", [dict(s) for s in read_limits], read_spr,
                         "this process + reader process"))  # fmt: skip
    rows.append(rate_row("fetch: confluent-kafka consumer", ck_fetch, read_spr, where_broker))
    rows.append(rate_row("fetch: our client AsyncConsumer", our_fetch, read_spr, where_broker))

    table = []
    for i, row in enumerate(rows):
        if i == 3:
            table.append(None)
        cpu_cells = ["", "", ""]
        runs = row["runs"]
        if "cpu_s" in runs[0]:
            fastest = max(runs, key=lambda r: r["records"] / r["seconds"])
            cpu_cells = [f"{fastest['cpu_s'] / fastest['seconds']:.2f}",
                         f"{fastest['broker_cpu_s'] / fastest['seconds']:.2f}",
                         f"{fastest['machine_cores_whole_worker']:.2f}"]  # fmt: skip
        table.append((row["variant"], f"{row['records_per_s']:,.0f}", f"{row['mb_per_s']:,.1f}",
                      f"{row.get('ratio_vs_storage', 1):.0%}", *cpu_cells))  # fmt: skip
    print_table(
        f"One broker, RF 1, {RECORD_VALUE_BYTES}-byte records, best of {repeats} ({records:,} records per produce run)",
        ["variant", "records/s", "MB/s", "vs storage", "client CPU", "broker CPU", "machine CPU"],
        table,
        note=(f"Produce rows are compared with the Log.append row, fetch rows with the Log.read + sendfile "
              f"row, all from this run. Our client sends prebuilt {BATCH_RECORDS}-record batches "
              f"({len(batch):,} bytes); confluent-kafka: {CK_PRODUCER['batch.size']}-byte batch.size, "
              f"linger.ms {CK_PRODUCER['linger.ms']}. CPU in cores (1.00 = one core busy): 'client' the "
              f"client process over its timed run (os.times), 'broker' the broker's CPU seconds (/proc) "
              f"over the worker's life per timed second, 'machine' every process on the box (/proc/stat) "
              f"over the worker's life, start-up included: what is not ours is other people's work. "
              f"{os.cpu_count()} cores: broker and client process share them; the storage rows run "
              f"in this process. Fetch rows read offsets [0, {fetched:,}); partition end offset "
              f"{produced:,} (expected {expected:,})."),
    )  # fmt: skip
    path = write_results("broker", {
        "config": {"records_per_run": records, "repeats": repeats, "record_value_bytes": RECORD_VALUE_BYTES,
                   "our_batch_records": BATCH_RECORDS, "our_batch_bytes": len(batch),
                   "confluent_kafka_producer": CK_PRODUCER, "elapsed_s": elapsed},
        "rows": rows, "fetched_records": fetched, "load_average_before": load_before,
        "end_offset": produced, "expected_end_offset": expected,
    }, to_stdout=args.json)  # fmt: skip
    print_note(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
