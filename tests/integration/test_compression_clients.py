"""Every codec from real clients, read by our tools: confluent-kafka (librdkafka) and
kafka-python produce gzip, snappy, lz4 and zstd batches into a detached three-broker cluster;
`localcluster consume`, `localcluster log dump --records` and the chaos checker's reader
(our consumer) read every record back. Our producer's `compression.type` batches are read
back by confluent-kafka, so what we write is what librdkafka reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from kafka import KafkaProducer

from localcluster import cluster
from localcluster.client import Producer
from localcluster.protocol.api import SUPPORTED
from localcluster.storage import compression, record_batch
from localcluster.tools import chaos_check
from tests.helpers import wait_until
from tests.integration.cli_cluster import detached_cluster

CODECS = ["gzip", "snappy", "lz4", "zstd"]
RECORDS = 200


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    with detached_cluster(tmp_path_factory.mktemp("codecs") / "cluster") as c:
        yield c


def values(client: str, codec: str) -> list[str]:
    # Repetitive enough that every codec shrinks it: the stored batch must be compressed.
    return [f"{client}-{codec}-{i}-" + "abc" * (i % 40) for i in range(RECORDS)]


def create(cli, topic: str) -> None:
    from localcluster.client import Admin

    with Admin(cluster_dir=cli.cluster_dir) as admin:  # in-process: a CLI run costs seconds
        admin.create_topic(topic, 1, 3)
        admin.wait_for_leaders(topic)


_BOOTSTRAP: dict = {}


def bootstrap(cli) -> str:
    if cli.cluster_dir not in _BOOTSTRAP:  # the ports are stable for the module's cluster
        _BOOTSTRAP[cli.cluster_dir] = cli.status()["bootstrap_servers"]
    return _BOOTSTRAP[cli.cluster_dir]


def produce_confluent(cli, topic: str, codec: str, lines: list[str]) -> None:
    producer = ConfluentProducer({"bootstrap.servers": bootstrap(cli), "acks": "all",
                                  "compression.type": codec, "linger.ms": 20, "log_level": 3})  # fmt: skip
    errors = []
    for i, value in enumerate(lines):
        producer.produce(topic, value.encode(), key=b"%d" % i, partition=0,
                         on_delivery=lambda err, msg: err and errors.append(err))  # fmt: skip
    assert producer.flush(30) == 0 and not errors, errors


def produce_kafka_python(cli, topic: str, codec: str, lines: list[str]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap(cli), acks="all", linger_ms=20,
                             compression_type=codec)  # fmt: skip
    try:
        futures = [producer.send(topic, value.encode(), key=b"%d" % i, partition=0)
                   for i, value in enumerate(lines)]  # fmt: skip
        producer.flush(30)
        assert all(f.get(10).offset >= 0 for f in futures)
    finally:
        producer.close(5)


def leader_dir(cli, topic: str):
    described = cli.json("topic", "describe", topic)
    leader = described["partitions"][0]["leader"]
    spec = cluster.load_spec(cli.cluster_dir)
    return cluster.data_dir_of(cli.cluster_dir, spec, leader) / f"{topic}-0"


def stored_codecs(partition_dir) -> set[str]:
    return {record_batch.COMPRESSION_NAMES[h.compression]
            for h, _ in chaos_check.log_batches(partition_dir)}  # fmt: skip


def xerial_framed(partition_dir) -> set[bool]:
    """Per stored batch: does its payload open with snappy-java's framing header?"""
    return {data[record_batch.HEADER_SIZE :].startswith(compression.XERIAL_MAGIC)
            for _, data in chaos_check.log_batches(partition_dir)}  # fmt: skip


def librdkafka_codec(codec: str) -> str:
    """What librdkafka sends for `codec`: it enables lz4 only for brokers that offer
    FindCoordinator (its LZ4 feature is keyed on that API) and sends uncompressed otherwise."""
    find_coordinator = 10
    return "none" if codec == "lz4" and find_coordinator not in SUPPORTED else codec


def check_read_back(cli, topic: str, codec: str, lines: list[str]) -> None:
    """consume, log dump and the chaos checker's reader all see every record."""
    directory = leader_dir(cli, topic)
    wait_until(lambda: stored_codecs(directory) == {codec}, timeout_s=10,
               message=f"{topic}'s leader stores {codec} batches only")  # fmt: skip
    result = cli.run("consume", topic, "--from-beginning", "--max-messages", str(RECORDS),
                     "--timeout-ms", "10000", "--json", check=True)  # fmt: skip
    consumed = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["offset"], r["key"], r["value"]) for r in consumed] == [
        (i, str(i), v) for i, v in enumerate(lines)
    ]
    dumped = subprocess.run([sys.executable, "-m", "localcluster", "log", "dump", str(directory),
                             "--records", "--limit", "0"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "COLUMNS": "250"})  # fmt: skip
    assert dumped.returncode == 0, dumped.stderr
    assert codec in dumped.stdout and "unreadable" not in dumped.stdout
    assert f"{RECORDS - 1}={lines[-1][:30]}" in dumped.stdout.replace("\n", "")
    checked, high_watermarks, log_starts = chaos_check.consume_all(cli.cluster_dir, topic, [0],
                                                                   timeout_s=20)  # fmt: skip
    assert high_watermarks == {0: RECORDS} and log_starts == {0: 0}
    assert [v.decode() for _, v in checked[0]] == lines


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_batches_are_read_by_our_tools(cli, codec):
    topic, lines = f"ck-{codec}", values("ck", codec)
    create(cli, topic)
    produce_confluent(cli, topic, codec, lines)
    check_read_back(cli, topic, librdkafka_codec(codec), lines)
    if codec == "snappy":  # librdkafka writes one raw snappy block per batch
        assert xerial_framed(leader_dir(cli, topic)) == {False}


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches_are_read_by_our_tools(cli, codec):
    topic, lines = f"kp-{codec}", values("kp", codec)
    create(cli, topic)
    produce_kafka_python(cli, topic, codec, lines)
    check_read_back(cli, topic, codec, lines)
    if codec == "snappy":  # kafka-python writes snappy-java's framing, as the Java client does
        assert xerial_framed(leader_dir(cli, topic)) == {True}


@pytest.mark.parametrize("codec", CODECS)
def test_our_compressed_batches_are_read_by_confluent_kafka(cli, codec):
    topic, lines = f"ours-{codec}", values("ours", codec)
    create(cli, topic)
    with Producer(cluster_dir=cli.cluster_dir, compression_type=codec, linger_ms=20) as producer:
        futures = [producer.send(topic, v.encode(), key=b"%d" % i, partition=0)
                   for i, v in enumerate(lines)]  # fmt: skip
        producer.flush(30)
        assert [f.result(10)[1] for f in futures] == list(range(RECORDS))
    consumer = ConfluentConsumer({"bootstrap.servers": bootstrap(cli), "group.id": "codec-check",
                                  "enable.auto.commit": False, "log_level": 3})  # fmt: skip
    try:
        consumer.assign([ConfluentTopicPartition(topic, 0, 0)])
        received = []
        wait_until(lambda: received.extend(consumer.consume(RECORDS, 0.5)) or len(received) >= RECORDS,
                   timeout_s=30, message=f"confluent-kafka reads {topic}")  # fmt: skip
    finally:
        consumer.close()
    assert [(m.offset(), m.value().decode()) for m in received] == list(enumerate(lines))
    assert stored_codecs(leader_dir(cli, topic)) == {codec}
