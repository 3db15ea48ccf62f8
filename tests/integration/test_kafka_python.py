"""kafka-python (3.x, pure Python, its own version negotiation) against a real broker process:
KafkaProducer and KafkaConsumer with assign() round trip; offsets; the admin client.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import InvalidReplicationFactorError, TopicAlreadyExistsError

from tests.brokers import BrokerSet

# kafka-python loads its schemas with importlib.resources' legacy calls.
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cluster = tmp_path_factory.mktemp("cluster")
    started = BrokerSet(cluster)
    try:
        yield started.start(1)
    finally:
        started.cleanup()


@pytest.fixture(scope="module")
def admin(broker):
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    try:
        yield client
    finally:
        client.close()


def create_topic(admin, name: str, partitions: int) -> None:
    admin.create_topics([NewTopic(name, partitions, 1)], timeout_ms=10_000)


def new_consumer(broker) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False,
                         request_timeout_ms=11_000, fetch_max_wait_ms=100)  # fmt: skip


def poll_exactly(consumer: KafkaConsumer, count: int, timeout_s: float = 20) -> list:
    out = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        assert time.monotonic() < deadline, (
            f"only {len(out)} of {count} records within {timeout_s} s"
        )
        for records in consumer.poll(timeout_ms=200).values():
            out.extend(records)
    assert len(out) == count, f"{len(out) - count} records more than were produced"
    return out


def test_producer_and_assigned_consumer_round_trip(broker, admin):
    topic = "kp-round-trip"
    create_topic(admin, topic, 3)
    # kafka-python 3's default producer is idempotent (InitProducerId, sequence numbers).
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5,
                             request_timeout_ms=10_000, retries=5)  # fmt: skip
    try:
        sent, futures = [], []
        for i in range(45):
            record = {"topic": topic, "partition": i % 3,
                      "key": None if i % 5 == 0 else b"key-%d" % i,
                      "value": b"value-%d-" % i + bytes(range(i % 256)),
                      "headers": [("h", b"%d" % i), ("empty", b"")][: i % 3],
                      "timestamp_ms": 1_600_000_000_000 + i * 1000}  # fmt: skip
            sent.append(record)
            futures.append(producer.send(**record))
        producer.flush(timeout=20)
        metadata = [f.get(timeout=20) for f in futures]
    finally:
        producer.close(timeout=5)
    assert [(m.partition, m.offset) for m in metadata] == [(i % 3, i // 3) for i in range(45)]

    consumer = new_consumer(broker)
    try:
        partitions = [TopicPartition(topic, p) for p in range(3)]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        received = poll_exactly(consumer, 45)
        assert {tp: consumer.position(tp) for tp in partitions} == {tp: 15 for tp in partitions}
    finally:
        consumer.close()

    def expected(i, r):
        return (r["partition"], i // 3, r["key"], r["value"], list(r["headers"]), r["timestamp_ms"])

    def got(r):
        return (r.partition, r.offset, r.key, r.value, list(r.headers), r.timestamp)

    assert sorted(map(got, received)) == sorted(expected(i, r) for i, r in enumerate(sent))


def test_consumer_seek_offsets_and_times(broker, admin):
    topic = "kp-offsets"
    create_topic(admin, topic, 1)
    tp = TopicPartition(topic, 0)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks=1, request_timeout_ms=10_000)
    try:
        for i in range(10):
            producer.send(topic, b"v%d" % i, partition=0, timestamp_ms=(i + 1) * 10_000)
        producer.flush(timeout=20)
    finally:
        producer.close(timeout=5)
    consumer = new_consumer(broker)
    try:
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        found = consumer.offsets_for_times({tp: 35_000})[tp]
        assert (found.offset, found.timestamp) == (3, 40_000)
        assert consumer.offsets_for_times({tp: 10**12})[tp] is None
        consumer.assign([tp])
        consumer.seek(tp, 7)
        assert [(r.offset, r.value) for r in poll_exactly(consumer, 3)] == [
            (7, b"v7"),
            (8, b"v8"),
            (9, b"v9"),
        ]
        assert consumer.position(tp) == 10
    finally:
        consumer.close()


def test_admin_errors(admin):
    create_topic(admin, "kp-exists", 1)
    with pytest.raises(TopicAlreadyExistsError):
        create_topic(admin, "kp-exists", 1)
    with pytest.raises(InvalidReplicationFactorError):
        admin.create_topics([NewTopic("kp-rf", 1, 2)], timeout_ms=10_000)
    assert "kp-exists" in admin.list_topics() and "kp-rf" not in admin.list_topics()
