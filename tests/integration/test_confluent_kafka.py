"""confluent-kafka (librdkafka) against a real broker process: exact round trips, the admin
API's errors, offsets by time and watermarks, and long-polling fetches.

One broker serves the module; every test uses its own topics.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time

import pytest
from confluent_kafka import (
    OFFSET_END,
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from localcluster.protocol import fetch
from localcluster.protocol.api import ApiKey, RequestHeader, write_request_header
from localcluster.protocol.wire import Reader, Writer
from localcluster.storage import iter_batches, iter_records
from tests.brokers import BrokerSet
from tests.helpers import wait_until

QUIET = {"log_level": 3}  # librdkafka: errors only (connection refused noise at teardown)


def records_of(partition) -> list:
    """Every record of a fetched partition, across all its batches."""
    data = b"".join(bytes(part) for part in partition.records)
    return [r for position, header in iter_batches(data)
            for r in iter_records(data[position : position + header.size])]  # fmt: skip


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cluster = tmp_path_factory.mktemp("cluster")
    started = BrokerSet(cluster)
    try:
        yield started.start(1)
    finally:
        started.cleanup()


def admin(broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET})


def create_topic(broker, name: str, partitions: int) -> None:
    client = admin(broker)  # kept alive until the result: a destroyed handle fails its futures
    futures = client.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)
    assert futures[name].result(20) is None
    # CreateTopics answers once the topic is in the store; the leader takes the partitions up
    # just after (librdkafka retries meanwhile; the raw fetches below do not).
    for partition in range(partitions):
        wait_until(lambda partition=partition: led(broker, name, partition), timeout_s=10,
                   message=f"broker 1 leads {name}-{partition}")  # fmt: skip


def led(broker, topic: str, partition: int) -> bool:
    fetcher = RawFetcher(broker.port)
    try:
        fetcher.send_fetch(topic, 0, max_wait_ms=0, min_bytes=0, partition=partition)
        return fetcher.recv_fetch().error_code == 0
    finally:
        fetcher.close()


def producer(broker, **extra) -> Producer:
    return Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5,
                     "enable.idempotence": False, **QUIET, **extra})  # fmt: skip


def consumer(broker, **extra) -> Consumer:
    return Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused-with-assign",
                     "enable.auto.commit": False, "enable.partition.eof": True, **QUIET,
                     **extra})  # fmt: skip


def produce_all(p: Producer, messages: list[dict]) -> list:
    """Produce and flush; the delivery reports (in delivery order), every one a success."""
    delivered, failed = [], []

    def report(error, message):
        (failed if error else delivered).append(error or message)

    for m in messages:
        p.produce(on_delivery=report, **m)
    assert p.flush(20) == 0, "messages still queued after 20 s"
    assert not failed, failed
    return delivered


def consume_until_eof(
    c: Consumer, partitions: set[int], timeout_s: float = 20
) -> tuple[list, dict]:
    """Every message until each of `partitions` reported EOF; (messages, {partition: eof offset})."""
    out, eof = [], {}
    deadline = time.monotonic() + timeout_s
    while set(eof) != partitions:
        assert time.monotonic() < deadline, f"EOF only on {sorted(eof)} after {timeout_s} s"
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
            eof[m.partition()] = m.offset()
            continue
        out.append(m)
    return out, eof


def test_producer_acks_all_and_assigned_consumer_round_trip_exactly(broker):
    topic = "round-trip"
    create_topic(broker, topic, 3)
    base_ts = 1_700_000_000_000
    sent = []
    for i in range(60):
        partition = i % 3
        sent.append({
            "topic": topic, "partition": partition,
            "key": None if i % 7 == 0 else b"key-%d" % i,
            "value": b"" if i % 11 == 0 else bytes([i]) * (i * 13 % 200) + b"\x00\xff-%d" % i,
            "headers": [("h", b"v%d" % i), ("dup", b"1"), ("dup", b"2"), ("empty", b"")][: i % 5],
            "timestamp": base_ts + 1000 * i - (i % 4) * 7,  # not monotonic within a partition
        })  # fmt: skip
    delivered = produce_all(producer(broker), sent)
    by_partition = {
        p: sorted(m.offset() for m in delivered if m.partition() == p) for p in range(3)
    }
    assert by_partition == {p: list(range(20)) for p in range(3)}

    c = consumer(broker)
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(3)])
        received, eof = consume_until_eof(c, {0, 1, 2})
    finally:
        c.close()
    assert eof == {0: 20, 1: 20, 2: 20}

    def expected(i, m):
        return (m["partition"], i // 3, m["key"], m["value"], m["headers"] or None,
                (TIMESTAMP_CREATE_TIME, m["timestamp"]))  # fmt: skip

    def got(m):
        return (m.partition(), m.offset(), m.key(), m.value(), m.headers(), m.timestamp())

    assert sorted(map(got, received)) == sorted(expected(i, m) for i, m in enumerate(sent))
    # Within a partition, records come back in offset order.
    for p in range(3):
        offsets = [m.offset() for m in received if m.partition() == p]
        assert offsets == sorted(offsets)


def test_consumer_assigned_mid_log_starts_exactly_there(broker):
    topic = "mid-log"
    create_topic(broker, topic, 1)
    produce_all(producer(broker, **{"linger.ms": 0}),
                [{"topic": topic, "partition": 0, "value": b"%d" % i} for i in range(30)])  # fmt: skip
    c = consumer(broker)
    try:
        c.assign([TopicPartition(topic, 0, 17)])
        received, eof = consume_until_eof(c, {0})
    finally:
        c.close()
    assert [(m.offset(), m.value()) for m in received] == [(i, b"%d" % i) for i in range(17, 30)]
    assert eof == {0: 30}


def test_admin_create_topics_and_its_errors(broker):
    a = admin(broker)
    futures = a.create_topics([NewTopic("admin-ok", 4, 1)], operation_timeout=10)
    assert futures["admin-ok"].result(20) is None
    described = a.list_topics("admin-ok", timeout=10)
    assert sorted(described.topics["admin-ok"].partitions) == [0, 1, 2, 3]
    assert all(p.leader == 1 for p in described.topics["admin-ok"].partitions.values())
    assert list(described.brokers) == [1]

    cases = {
        "admin-ok": (NewTopic("admin-ok", 4, 1), KafkaError.TOPIC_ALREADY_EXISTS),
        "bad name!": (NewTopic("bad name!", 1, 1), KafkaError.TOPIC_EXCEPTION),
        "..": (NewTopic("..", 1, 1), KafkaError.TOPIC_EXCEPTION),
        "too-many-replicas": (NewTopic("too-many-replicas", 1, 3), KafkaError.INVALID_REPLICATION_FACTOR),
    }  # fmt: skip
    futures = a.create_topics([new for new, _ in cases.values()], operation_timeout=10)
    for name, (_, code) in cases.items():
        with pytest.raises(KafkaException) as raised:
            futures[name].result(20)
        assert raised.value.args[0].code() == code, (name, raised.value.args[0])
    listed = a.list_topics(timeout=10).topics
    assert "too-many-replicas" not in listed and "bad name!" not in listed

    # A manual assignment: librdkafka wants the partition count, but sends -1 (as Kafka requires).
    manual = a.create_topics([NewTopic("admin-manual", 3, replica_assignment=[[1], [1], [1]])],
                             operation_timeout=10)  # fmt: skip
    assert manual["admin-manual"].result(20) is None
    described = a.list_topics("admin-manual", timeout=10).topics["admin-manual"]
    assert {p: list(m.replicas) for p, m in described.partitions.items()} == {
        0: [1],
        1: [1],
        2: [1],
    }
    uneven = a.create_topics([NewTopic("admin-uneven", 2, replica_assignment=[[1], [1, 1]])],
                             operation_timeout=10)  # fmt: skip
    with pytest.raises(KafkaException) as raised:
        uneven["admin-uneven"].result(20)
    assert raised.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT


def test_offsets_for_times_and_watermarks(broker):
    topic = "by-time"
    create_topic(broker, topic, 2)
    timestamps = [10_000, 20_000, 20_000, 30_000, 40_000]
    produce_all(producer(broker, **{"linger.ms": 0}),
                [{"topic": topic, "partition": 1, "value": b"t%d" % ts, "timestamp": ts}
                 for ts in timestamps])  # fmt: skip
    c = consumer(broker)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 1), timeout=10, cached=False) == (0, 5)
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False) == (0, 0)
        queries = {
            5_000: 0,
            10_000: 0,
            15_000: 1,
            20_000: 1,
            25_000: 3,
            40_000: 4,
            40_001: OFFSET_END,
        }
        for ts, offset in queries.items():
            (found,) = c.offsets_for_times([TopicPartition(topic, 1, ts)], timeout=10)
            assert (found.partition, found.offset, found.error) == (1, offset, None), ts
        (empty,) = c.offsets_for_times([TopicPartition(topic, 0, 0)], timeout=10)
        assert empty.offset == OFFSET_END
    finally:
        c.close()


def test_consumers_read_up_to_the_high_watermark_and_no_further(broker):
    topic = "watermark"
    create_topic(broker, topic, 1)
    produce_all(
        producer(broker), [{"topic": topic, "partition": 0, "value": b"w%d" % i} for i in range(25)]
    )
    c = consumer(broker)
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
        assert (low, high) == (0, 25)
        c.assign([TopicPartition(topic, 0, 0)])
        received, eof = consume_until_eof(c, {0})
        assert [m.offset() for m in received] == list(range(25)) and eof == {0: high}
        # At the high watermark the consumer sees nothing more (and no error).
        assert c.poll(0.3) is None
    finally:
        c.close()


def test_a_waiting_consumer_gets_a_later_record_without_busy_polling(broker):
    topic = "long-poll"
    create_topic(broker, topic, 1)
    stats: list[dict] = []
    c = consumer(broker, **{"fetch.wait.max.ms": 10_000, "fetch.min.bytes": 1,
                            "statistics.interval.ms": 100, "enable.partition.eof": False,
                            "stats_cb": lambda s: stats.append(json.loads(s))})  # fmt: skip

    def fetches_sent() -> int:
        return sum(b["req"].get("Fetch", 0) for b in stats[-1]["brokers"].values()) if stats else 0

    try:
        c.assign([TopicPartition(topic, 0, 0)])
        # Wait (polling the client, which serves its callbacks) until a fetch is out.
        wait_until(lambda: c.poll(0.05) is None and fetches_sent() >= 1, timeout_s=10,
                   message="the consumer sent its first fetch")  # fmt: skip
        idle_started, fetches_before = time.monotonic(), fetches_sent()
        # The consumer idles at the end for a while (each poll returns nothing).
        while time.monotonic() - idle_started < 1.0:
            assert c.poll(0.1) is None
        idle_fetches = fetches_sent() - fetches_before
        p = producer(broker, **{"linger.ms": 0})
        produced_at = time.monotonic()
        produce_all(p, [{"topic": topic, "partition": 0, "value": b"late"}])
        message = None
        while message is None and time.monotonic() - produced_at < 10:
            message = c.poll(0.05)
        received_at = time.monotonic()
    finally:
        c.close()
    assert message is not None and not message.error() and message.value() == b"late"
    # Delivered by the produce waking the parked fetch, not by fetch.wait.max.ms running out.
    assert received_at - produced_at < 3.0, received_at - produced_at
    # A broker answering empty fetches at once would see hundreds in that second.
    assert idle_fetches <= 3, idle_fetches


# -- the same long-poll, observed on the wire -------------------------------------------------


class RawFetcher:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)

    def send_fetch(self, topic: str, offset: int, max_wait_ms: int, min_bytes: int,
                   version: int = 11, partition: int = 0):  # fmt: skip
        body = fetch.write_fetch_request(fetch.FetchRequest(
            -1, max_wait_ms, min_bytes, 1 << 20, 0,
            [(topic, [fetch.FetchPartition(partition, offset, 1 << 20)])]), version)  # fmt: skip
        w = Writer()
        write_request_header(w, RequestHeader(ApiKey.FETCH, version, 1, "raw-long-poll"))
        w.bytes(body)
        self.sock.sendall(struct.pack(">i", len(w.buf)) + bytes(w.buf))

    def answered_within(self, seconds: float) -> bool:
        return bool(select.select([self.sock], [], [], seconds)[0])

    def recv_fetch(self, version: int = 11) -> fetch.FetchPartitionResponse:
        head = self._exactly(4)
        reader = Reader(self._exactly(struct.unpack(">i", head)[0]))
        assert reader.int32() == 1
        _, ((_, (partition,)),) = fetch.read_fetch_response(reader, version)
        return partition

    def _exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "the broker closed the connection"
            buf += chunk
        return bytes(buf)

    def close(self):
        self.sock.close()


def test_a_parked_fetch_returns_when_a_produce_arrives_not_at_max_wait(broker):
    topic = "raw-long-poll"
    create_topic(broker, topic, 1)
    p = producer(broker, **{"linger.ms": 0})
    fetcher = RawFetcher(broker.port)
    try:
        fetcher.send_fetch(topic, 0, max_wait_ms=15_000, min_bytes=1)
        assert not fetcher.answered_within(0.5), "an empty fetch must wait, not answer at once"
        produced_at = time.monotonic()
        produce_all(p, [{"topic": topic, "partition": 0, "value": b"wake-up", "key": b"k"}])
        assert fetcher.answered_within(5.0), "the produce did not wake the parked fetch"
        answered_after = time.monotonic() - produced_at
        partition = fetcher.recv_fetch()
    finally:
        fetcher.close()
    assert answered_after < 5.0
    assert partition.error_code == 0 and partition.high_watermark == 1
    (record,) = records_of(partition)
    assert (record.offset, record.key, record.value) == (0, b"k", b"wake-up")


def test_min_bytes_holds_the_fetch_until_enough_has_arrived(broker):
    topic = "min-bytes"
    create_topic(broker, topic, 1)
    p = producer(broker, **{"linger.ms": 0})
    fetcher = RawFetcher(broker.port)
    try:
        fetcher.send_fetch(topic, 0, max_wait_ms=15_000, min_bytes=4000)
        produce_all(p, [{"topic": topic, "partition": 0, "value": b"s" * 100}])
        assert not fetcher.answered_within(0.5), "answered with ~170 bytes though min_bytes is 4000"
        produce_all(p, [{"topic": topic, "partition": 0, "value": b"L" * 5000}])
        assert fetcher.answered_within(5.0), "min_bytes was reached but the fetch stayed parked"
        partition = fetcher.recv_fetch()
    finally:
        fetcher.close()
    records = records_of(partition)
    assert [r.value for r in records] == [b"s" * 100, b"L" * 5000]


def test_an_empty_fetch_returns_after_max_wait(broker):
    topic = "max-wait"
    create_topic(broker, topic, 1)
    fetcher = RawFetcher(broker.port)
    try:
        started = time.monotonic()
        fetcher.send_fetch(topic, 0, max_wait_ms=400, min_bytes=1)
        assert fetcher.answered_within(10.0)
        waited = time.monotonic() - started
        partition = fetcher.recv_fetch()
    finally:
        fetcher.close()
    assert partition.error_code == 0 and partition.records == [] and partition.high_watermark == 0
    assert 0.38 <= waited < 5.0, waited


def test_parked_fetches_on_many_connections_all_wake(broker):
    """Every waiter wakes on one append (the notifier is a broadcast)."""
    topic = "many-waiters"
    create_topic(broker, topic, 1)
    fetchers = [RawFetcher(broker.port) for _ in range(8)]
    try:
        for f in fetchers:
            f.send_fetch(topic, 0, max_wait_ms=15_000, min_bytes=1)
        produce_all(
            producer(broker, **{"linger.ms": 0}),
            [{"topic": topic, "partition": 0, "value": b"all"}],
        )
        results: list = []
        threads = [threading.Thread(target=lambda f=f: results.append(f.answered_within(5.0) and f.recv_fetch()))
                   for f in fetchers]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        for f in fetchers:
            f.close()
    assert len(results) == 8 and all(r and r.high_watermark == 1 for r in results), results


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_are_stored_verbatim_and_read_back(broker, codec):
    topic = f"compressed-{codec}"
    create_topic(broker, topic, 1)
    values = [b"%s-%d-" % (codec.encode(), i) + b"abc" * (i % 50) for i in range(200)]
    produce_all(producer(broker, **{"compression.type": codec, "linger.ms": 20}),
                [{"topic": topic, "partition": 0, "value": v, "key": b"%d" % i}
                 for i, v in enumerate(values)])  # fmt: skip
    c = consumer(broker)
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        received, eof = consume_until_eof(c, {0})
    finally:
        c.close()
    assert [(m.offset(), m.key(), m.value()) for m in received] == [
        (i, b"%d" % i, v) for i, v in enumerate(values)
    ]
    assert eof == {0: 200}


@pytest.mark.parametrize("acks", ["0", "1"])
def test_acks_0_and_1_round_trip(broker, acks):
    topic = f"acks-{acks}"
    create_topic(broker, topic, 2)
    values = [b"acks-%s-%d" % (acks.encode(), i) for i in range(50)]
    produce_all(producer(broker, acks=acks),
                [{"topic": topic, "partition": i % 2, "value": v} for i, v in enumerate(values)])  # fmt: skip
    c = consumer(broker)
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(2)])
        received, eof = consume_until_eof(c, {0, 1})
    finally:
        c.close()
    assert sorted(m.value() for m in received) == sorted(values)
    assert eof == {0: 25, 1: 25}


def test_records_larger_than_the_consumers_fetch_sizes_still_arrive(broker):
    """KIP-74: the first batch of a fetch is returned whole even over max.partition.fetch.bytes,
    so a consumer with small fetch sizes makes progress; batches beyond the limit may be cut
    (a partial batch at the end), which clients drop and fetch again."""
    topic = "small-fetches"
    create_topic(broker, topic, 1)
    values = [bytes([65 + i % 26]) * (3000 + i) for i in range(12)]
    produce_all(producer(broker, **{"linger.ms": 0}),
                [{"topic": topic, "partition": 0, "value": v} for v in values])  # fmt: skip
    c = consumer(broker, **{"max.partition.fetch.bytes": 1000, "fetch.max.bytes": 1000,
                            "message.max.bytes": 1000})  # fmt: skip
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        received, eof = consume_until_eof(c, {0})
    finally:
        c.close()
    assert [(m.offset(), m.value()) for m in received] == list(enumerate(values))
