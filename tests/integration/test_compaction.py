"""Compacted topics on real brokers: the log cleaner runs on every replica (each broker's copy
shrinks), and confluent-kafka, kafka-python, aiokafka and kcat read the compacted topic from the
beginning and see the latest value per key, across the offset gaps. Then a process cleaning a
copy of a log is killed -9 at random moments: the reopened log is valid and every segment in it
is either the old one or the cleaned one, byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localcluster.storage import Log, LogConfig, cleaner, iter_records
from tests.brokers import BrokerSet
from tests.helpers import check_indexes_agree, scan_log, wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = "compacted"
KEYS = 20
ROUNDS = 15
TIMEOUT_S = 30
KCAT = shutil.which("kcat")


def expected_latest() -> dict[bytes, bytes]:
    return {b"key-%02d" % k: b"value-%02d-%02d" % (k, ROUNDS - 1) + b"." * 40 for k in range(KEYS)}


def log_bytes(broker) -> int:
    total = 0
    for path in (broker.data_dir / f"{TOPIC}-0").glob("*.log"):
        with contextlib.suppress(FileNotFoundError):  # the cleaner removed it since the listing
            total += path.stat().st_size
    return total


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = BrokerSet(tmp_path_factory.mktemp("cluster"))
    try:
        # __consumer_offsets in one partition of small segments: commits compact too
        brokers = [started.start(i, log_cleaner_backoff_ms="100", offsets_topic_num_partitions="1",
                                 offsets_topic_segment_bytes="1024") for i in (1, 2, 3)]  # fmt: skip
        boot = brokers[0].bootstrap
        admin = AdminClient({"bootstrap.servers": boot})
        config = {"cleanup.policy": "compact", "segment.bytes": "1024",
                  "min.cleanable.dirty.ratio": "0.01"}  # fmt: skip
        future = admin.create_topics([NewTopic(TOPIC, 1, 3, config=config)],
                                     operation_timeout=10)[TOPIC]  # fmt: skip
        assert future.exception(20) is None
        # one record per batch: a batch larger than segment.bytes is refused (MESSAGE_TOO_LARGE)
        producer = confluent_kafka.Producer({"bootstrap.servers": boot, "acks": "all",
                                             "linger.ms": 0, "batch.num.messages": 1})  # fmt: skip
        failed = []
        for round_ in range(ROUNDS):
            for k in range(KEYS):
                producer.produce(TOPIC, b"value-%02d-%02d" % (k, round_) + b"." * 40,
                                 key=b"key-%02d" % k,
                                 on_delivery=lambda e, m: e and failed.append(e))  # fmt: skip
            producer.flush(TIMEOUT_S)
        assert producer.flush(TIMEOUT_S) == 0 and not failed, failed[:3]
        yield brokers
    finally:
        started.cleanup()


def test_every_replica_compacts_its_own_copy(cluster):
    produced = KEYS * ROUNDS * 60  # at least this many bytes were written to each replica
    wait_until(lambda: all(0 < log_bytes(b) < produced / 3 for b in cluster), timeout_s=TIMEOUT_S,
               message="each broker's log of the compacted topic should shrink: "
                       f"{[log_bytes(b) for b in cluster]} bytes")  # fmt: skip
    for broker in cluster:
        checkpoint = broker.data_dir / cleaner.CLEANER_OFFSET_CHECKPOINT
        assert f"{TOPIC} 0 " in checkpoint.read_text()


def _fold(pairs) -> dict:
    latest = {}
    for key, value in pairs:
        latest[key] = value
    return latest


def _last_offset() -> int:
    return KEYS * ROUNDS - 1


def read_confluent(boot: str):
    consumer = confluent_kafka.Consumer({"bootstrap.servers": boot, "group.id": "c-confluent",
                                         "auto.offset.reset": "earliest",
                                         "enable.auto.commit": False})  # fmt: skip
    consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, confluent_kafka.OFFSET_BEGINNING)])
    got, deadline = [], time.monotonic() + TIMEOUT_S
    try:
        while (not got or got[-1][0] < _last_offset()) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append((message.offset(), message.key(), message.value()))
    finally:
        consumer.close()
    return got


def read_kafka_python(boot: str):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=boot, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=TIMEOUT_S * 1000)  # fmt: skip
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    got = []
    try:
        for message in consumer:
            got.append((message.offset, message.key, message.value))
            if message.offset >= _last_offset():
                break
    finally:
        consumer.close()
    return got


def read_aiokafka(boot: str):
    async def read():
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False,
                                    auto_offset_reset="earliest")  # fmt: skip
        await consumer.start()
        try:
            tp = TopicPartition(TOPIC, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got = []
            while not got or got[-1][0] < _last_offset():
                message = await consumer.getone()
                got.append((message.offset, message.key, message.value))
            return got
        finally:
            await consumer.stop()

    return asyncio.run(asyncio.wait_for(read(), TIMEOUT_S))


def read_kcat(boot: str):
    if KCAT is None:
        pytest.skip("kcat is not installed")
    out = subprocess.run([KCAT, "-b", boot, "-X", "log_level=3", "-C", "-t", TOPIC, "-p", "0",
                          "-o", "beginning", "-e", "-J"], capture_output=True, text=True,
                         timeout=TIMEOUT_S, check=True).stdout  # fmt: skip
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [(m["offset"], m["key"].encode(), m["payload"].encode()) for m in lines]


@pytest.mark.parametrize("read", [read_confluent, read_kafka_python, read_aiokafka, read_kcat])
def test_clients_read_the_latest_value_per_key_from_the_beginning(cluster, read):
    wait_until(lambda: all(log_bytes(b) < KEYS * ROUNDS * 20 for b in cluster), timeout_s=TIMEOUT_S,
               message="the cleaner should have run")  # fmt: skip
    got = read(cluster[0].bootstrap)
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets)) and offsets[-1] == _last_offset()
    assert len(got) < KEYS * ROUNDS  # the gaps are there, and the clients skip them
    assert _fold((k, v) for _, k, v in got) == expected_latest()


def _checkpointed(broker, topic: str) -> bool:
    path = broker.data_dir / cleaner.CLEANER_OFFSET_CHECKPOINT
    return path.exists() and f"\n{topic} 0 " in path.read_text()


def test_a_coordinator_loads_committed_offsets_from_a_compacted_log(cluster):
    """Commits overwrite one key of __consumer_offsets; once every replica is cleaned, the
    coordinator is killed and the next one replays its compacted copy: the last commit."""
    boot = cluster[0].bootstrap
    tp = confluent_kafka.TopicPartition
    consumer = confluent_kafka.Consumer({"bootstrap.servers": boot, "group.id": "compacting",
                                         "enable.auto.commit": False})  # fmt: skip
    try:
        for offset in range(1, 61):
            consumer.commit(offsets=[tp(TOPIC, 0, offset)], asynchronous=False)
    finally:
        consumer.close()
    wait_until(lambda: all(_checkpointed(b, "__consumer_offsets") for b in cluster),
               timeout_s=TIMEOUT_S, message="every replica should clean __consumer_offsets")  # fmt: skip
    metadata = AdminClient({"bootstrap.servers": boot}).list_topics("__consumer_offsets", 10)
    leader = metadata.topics["__consumer_offsets"].partitions[0].leader
    coordinator = next(b for b in cluster if b.broker_id == leader)
    coordinator.kill()
    try:
        alive = next(b for b in cluster if b is not coordinator)
        reader = confluent_kafka.Consumer({"bootstrap.servers": alive.bootstrap,
                                           "group.id": "compacting"})  # fmt: skip
        try:
            committed = reader.committed([tp(TOPIC, 0)], timeout=TIMEOUT_S)
        finally:
            reader.close()
        assert committed[0].offset == 60
    finally:
        coordinator.start()


# -- kill -9 during a cleaning --------------------------------------------------------------------

CONFIG = LogConfig(segment_bytes=64 * 1024, segment_index_bytes=1 << 16)
NOW_MS = 10**13
VICTIM = """
import sys
from localcluster.storage import Log, LogConfig, cleaner
lg = Log.open(sys.argv[1], LogConfig(segment_bytes=64 * 1024, segment_index_bytes=1 << 16))
print("ready", flush=True)
cleaner.clean_log(lg, None, cleaner.CleanerSettings(0, 0, 0.0), int(sys.argv[2]))
print("done", flush=True)
"""


def _segments(directory: Path) -> dict[int, bytes]:
    return {int(p.stem): p.read_bytes() for p in directory.glob("*.log")}


def _write_log(directory: Path) -> None:
    from localcluster.storage import BatchSpec, Record, encode_batch

    lg = Log.open(directory, CONFIG)
    rng = random.Random(7)
    for i in range(3000):
        records = [Record(b"v%d-%d" % (i, j) * 8, key=b"k%d" % rng.randrange(300), timestamp=i)
                   for j in range(rng.randrange(1, 4))]  # fmt: skip
        lg.append(encode_batch(records, BatchSpec()), leader_epoch=0)
    lg.close()


def test_a_kill_during_cleaning_leaves_old_or_new_segments(tmp_path):
    original = tmp_path / "original"
    _write_log(original)
    old = _segments(original)
    done = tmp_path / "done"
    shutil.copytree(original, done)
    lg = Log.open(done, CONFIG)
    assert cleaner.clean_log(lg, None, cleaner.CleanerSettings(0, 0, 0.0), NOW_MS) is not None
    records = [(r.offset, r.key, r.value) for *_, d in scan_log(lg) for r in iter_records(d)]
    lg.close()
    new = _segments(done)
    assert new != old
    rng = random.Random(11)
    outcomes = []
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    victim_s = None
    kills = 6
    # The first run is not killed: it times the victim; the kills then land in strata of that
    # time (and a little past it), so early, middle and late points are all tried.
    for attempt in range(kills + 1):
        victim_dir = tmp_path / f"victim-{attempt}"
        shutil.copytree(original, victim_dir)
        victim = subprocess.Popen([sys.executable, "-c", VICTIM, str(victim_dir), str(NOW_MS)],
                                  stdout=subprocess.PIPE, text=True, env=env,
                                  start_new_session=True)  # fmt: skip
        try:
            assert victim.stdout.readline().strip() == "ready"
            if victim_s is None:
                started = time.monotonic()
                assert victim.stdout.readline().strip() == "done"
                victim_s = time.monotonic() - started
            else:
                # the kill point itself is what varies (not a wait for anything)
                time.sleep(victim_s * 1.1 * (attempt - 1 + rng.random()) / kills)
                os.killpg(victim.pid, signal.SIGKILL)
        finally:
            if victim.poll() is None:
                os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(TIMEOUT_S)
            victim.stdout.close()
        reopened = Log.open(victim_dir, CONFIG)
        check_indexes_agree(reopened)
        got = [(r.offset, r.key, r.value) for *_, d in scan_log(reopened) for r in iter_records(d)]
        reopened.close()
        segments = _segments(victim_dir)
        for base, data in segments.items():
            assert data in (old.get(base), new.get(base)), f"segment {base} is a mix"
        assert set(old) - set(segments) <= set(old) - set(new)  # only emptied ones went
        assert {k: v for _, k, v in got} == {k: v for _, k, v in records}
        outcomes.append(sum(data == new.get(b) != old.get(b) for b, data in segments.items()))
    assert outcomes[0] == sum(new.get(b) != old.get(b) for b in new), outcomes
