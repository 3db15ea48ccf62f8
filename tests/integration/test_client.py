"""localcluster's own client against real broker processes, and against confluent-kafka.

Produce with acks 0/1/all and read back exactly; batching visible in the stored batches and in
the number of Produce requests; a producer riding out a broker kill -9 and restart; consumer
seek, position, partial batches and OFFSET_OUT_OF_RANGE; admin create and describe; records
crossing between our client and librdkafka in both directions. No sleeps: waits are on
conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition

from localcluster.client import (
    Admin,
    AsyncProducer,
    BrokerConnection,
    Consumer,
    KafkaError,
    OffsetOutOfRangeError,
    Producer,
    Record,
    partition_for_key,
)
from localcluster.client.connection import Address
from localcluster.protocol import fetch
from localcluster.protocol.api import ApiKey
from localcluster.protocol.wire import Reader
from localcluster.storage.record_batch import iter_batches
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

T0 = 1_700_000_000_000


def expected_records(n: int, tag: str = "r"):
    return [(None if i % 7 == 3 else f"{tag}-{i}".encode() * (1 + i % 3),
             None if i % 5 == 0 else f"k{i}".encode(),
             (("idx", str(i).encode()), ("empty", None)) if i % 2 else (), T0 + i)
            for i in range(n)]  # fmt: skip


def consume_exactly(consumer: Consumer, count: int, timeout_s: float = 15.0):
    out = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        assert time.monotonic() < deadline, f"only {len(out)} of {count} records came back"
        out += consumer.poll(500)
    assert len(out) == count, f"{len(out)} records came back, expected {count}"
    return out


def stored_batches(socket_path, topic: str, partition: int = 0):
    """The batch headers the broker holds, fetched raw from offset 0 (iterating the log)."""

    async def go():
        c = await BrokerConnection.open(Address(unix_socket=str(socket_path)))
        try:
            out, offset = [], 0
            while True:
                req = fetch.FetchRequest(
                    -1,
                    0,
                    1,
                    1 << 24,
                    0,
                    [(topic, [fetch.FetchPartition(partition, offset, 1 << 24)])],
                )
                frame, pos = await c.send(
                    ApiKey.FETCH, lambda v, req=req: fetch.write_fetch_request(req, v)
                )
                _, responses = fetch.read_fetch_response(
                    Reader(frame, pos), c.version(ApiKey.FETCH)
                )
                p = responses[0][1][0]
                assert p.error_code == 0, p.error_code
                if not p.records:
                    return out
                headers = [h for _, h in iter_batches(bytes(p.records[0]))]
                out += headers
                offset = headers[-1].next_offset
        finally:
            c.close()

    return asyncio.run(go())


@pytest.fixture
def broker(brokers):
    return brokers.start(1)


# -- produce and read back ---------------------------------------------------------------------


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_produce_with_acks_and_read_back_exactly(brokers, broker, acks):
    cluster = str(brokers.cluster_dir)
    with Admin(cluster_dir=cluster) as admin:
        admin.create_topic("acks", 1, 1)
        admin.wait_for_leaders("acks")
    wanted = expected_records(300)
    with Producer(cluster_dir=cluster, acks=acks, linger_ms=2) as producer:
        futures = [
            producer.send("acks", v, key=k, headers=h, timestamp_ms=ts) for v, k, h, ts in wanted
        ]
        producer.flush(20)
        results = [f.result(0) for f in futures]
    if acks == 0:
        assert results == [(0, -1)] * len(wanted)  # Kafka: no offsets without acknowledgements
    else:
        assert results == [(0, i) for i in range(len(wanted))]
    with Consumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([("acks", 0)])
        got = consume_exactly(consumer, len(wanted))
    assert [(r.value, r.key, r.headers, r.timestamp) for r in got] == wanted
    assert [r.offset for r in got] == list(range(len(wanted)))
    assert {(r.topic, r.partition, r.timestamp_type) for r in got} == {("acks", 0, 0)}


def test_async_producer_over_tcp_with_keys_spread_by_murmur2(broker):
    async def go():
        async with AsyncProducer(bootstrap_servers=broker.bootstrap) as producer:
            with Admin(bootstrap_servers=broker.bootstrap) as admin:
                admin.create_topic("keyed", 4, 1)
                admin.wait_for_leaders("keyed")
            futures = [
                await producer.send("keyed", b"v", key=f"key-{i}".encode()) for i in range(200)
            ]
            return [await f for f in futures]

    results = asyncio.run(go())
    for i, (partition, _) in enumerate(results):
        assert partition == partition_for_key(f"key-{i}".encode(), 4)
    for p in range(4):  # offsets per partition are dense and in send order
        offsets = [o for q, o in results if q == p]
        assert offsets == list(range(len(offsets)))


def test_batching_batches(brokers, broker):
    cluster = str(brokers.cluster_dir)
    n, size = 2000, 100
    with Producer(cluster_dir=cluster, linger_ms=1000, batch_size=16384) as producer:
        futures = [producer.send("batched", b"x" * size, partition=0) for _ in range(n)]
        producer.flush(20)
        assert [f.result(0)[1] for f in futures] == list(range(n))
        requests = producer.requests_sent
        with pytest.raises(KafkaError, match="partition 9 of 'batched' does not exist"):
            producer.send("batched", b"x", partition=9).result(10)  # the error is the future's
    batches = stored_batches(broker.socket_path, "batched")
    assert sum(b.records_count for b in batches) == n
    payload = n * (size + 8)
    assert len(batches) <= payload // 16384 + 2, [b.records_count for b in batches]
    assert all(b.size <= 16384 + 200 for b in batches)
    assert requests == len(batches)  # one batch per partition per request, one partition here

    # send_batch: one prebuilt batch is one stored batch, whatever it holds
    with Producer(cluster_dir=cluster) as producer:
        partition, base = producer.send_batch(
            "batched", 0, [Record(b"a"), Record(b"b", key=b"k")]
        ).result(20)
    assert (partition, base) == (0, n)
    assert stored_batches(broker.socket_path, "batched")[-1].records_count == 2


def test_producer_and_consumer_keep_working_across_a_broker_restart(brokers, broker):
    cluster = str(brokers.cluster_dir)
    expected = ([f"before-{i}".encode() for i in range(50)]
                + [f"during-{i}".encode() for i in range(50)] + [b"after"])  # fmt: skip
    with (
        Producer(cluster_dir=cluster, linger_ms=0, retry_backoff_ms=20) as producer,
        Consumer(
            cluster_dir=cluster, auto_offset_reset="earliest", retry_backoff_ms=20
        ) as consumer,
    ):
        before = [producer.send("restart", f"before-{i}".encode(), partition=0) for i in range(50)]
        producer.flush(20)
        assert [f.result(0)[1] for f in before] == list(range(50))
        consumer.assign([("restart", 0)])
        got = consume_exactly(consumer, 50)
        broker.kill()
        during = [producer.send("restart", f"during-{i}".encode(), partition=0) for i in range(50)]
        assert consumer.poll(100) == []  # the broker is gone: nothing, and no error
        assert not during[-1].done()
        brokers.restart(broker)
        producer.flush(30)
        assert [f.result(0) for f in during] == [(0, 50 + i) for i in range(50)]
        assert producer.send("restart", b"after", partition=0).result(20) == (0, 100)
        got += consume_exactly(consumer, 51)
    assert [r.value for r in got] == expected
    assert [r.offset for r in got] == list(range(101))


@pytest.mark.skipif(
    importlib.util.find_spec("localcluster.controller.controller") is None,
    reason="needs the controller to elect a new leader",
)
def test_producer_and_consumer_follow_the_leader_after_it_is_killed(brokers):
    started = {i: brokers.start(i) for i in (1, 2)}
    cluster = str(brokers.cluster_dir)
    with (
        Admin(cluster_dir=cluster) as admin,
        Producer(cluster_dir=cluster, acks="all", linger_ms=1, retry_backoff_ms=20) as producer,
        Consumer(
            cluster_dir=cluster, auto_offset_reset="earliest", retry_backoff_ms=20
        ) as consumer,
    ):
        admin.create_topic("failover", 1, 2)
        wait_until(lambda: len(admin.wait_for_leaders("failover").partitions[0].isr) == 2, 10)
        before = [producer.send("failover", f"a{i}".encode()) for i in range(100)]
        producer.flush(20)
        assert [f.result(0) for f in before] == [(0, i) for i in range(100)]
        consumer.assign([("failover", 0)])
        got = consume_exactly(consumer, 100)
        old = admin.describe_topic("failover").partitions[0]
        started[old.leader].kill()
        after = [producer.send("failover", f"b{i}".encode()) for i in range(100)]
        producer.flush(30)
        assert [f.result(0) for f in after] == [(0, 100 + i) for i in range(100)]
        new = admin.describe_topic("failover").partitions[0]
        assert new.leader != old.leader and new.leader_epoch > old.leader_epoch
        got += consume_exactly(consumer, 100)
    assert [r.value for r in got] == [f"a{i}".encode() for i in range(100)] + [
        f"b{i}".encode() for i in range(100)]  # fmt: skip
    assert [r.offset for r in got] == list(range(200))


def test_unreachable_cluster_is_a_clear_error(tmp_path):
    with pytest.raises(KafkaError, match="no broker reachable|cannot connect"):
        Producer(bootstrap_servers=f"unix:{tmp_path}/none.sock")


# -- consumer ----------------------------------------------------------------------------------


def test_consumer_seek_position_and_partial_batches(brokers, broker):
    cluster = str(brokers.cluster_dir)
    with Producer(cluster_dir=cluster) as producer:
        for b in range(10):  # 10 batches of 10 records, ~1.1 KB each
            records = [
                Record(f"{b}-{i}".encode() * 20, timestamp=T0 + b * 10 + i) for i in range(10)
            ]
            producer.send_batch("seek", 0, records).result(20)
    values = [f"{b}-{i}".encode() * 20 for b in range(10) for i in range(10)]
    # 1500 bytes per partition fetch, about one batch: many small fetches. (This broker answers
    # whole batches only; the partial batch a Kafka broker may end with is tested against a
    # fake broker in tests/unit/test_client_consumer.py.)
    with Consumer(cluster_dir=cluster, max_partition_fetch_bytes=1500, max_poll_records=7,
                  auto_offset_reset="none") as consumer:  # fmt: skip
        tp = ("seek", 0)
        consumer.assign([tp])
        with pytest.raises(KafkaError, match="no position"):
            consumer.position(tp)
        consumer.seek_to_beginning([tp])
        assert consumer.position(tp) == 0
        got = consume_exactly(consumer, 100)
        assert [r.offset for r in got] == list(range(100))
        assert [r.value for r in got] == values
        assert max(len(consumer.poll(0)) for _ in range(2)) == 0
        assert consumer.position(tp) == 100

        consumer.seek(tp, 45)  # mid-batch: the batch starts at 40
        first = consumer.poll(5000)
        assert first[0].offset == 45 and len(first) <= 7
        assert consumer.position(tp) == 45 + len(first)

        consumer.seek_to_end([tp])
        assert consumer.position(tp) == 100
        assert consumer.poll(50) == []
        assert consumer.end_offsets([tp]) == {tp: 100}
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.offsets_for_times({tp: T0 + 55})[tp] == (55, T0 + 55)
        assert consumer.offsets_for_times({tp: T0 + 10**6})[tp] == (-1, -1)  # none that late

        consumer.seek(tp, 1000)
        with pytest.raises(OffsetOutOfRangeError, match="out of range"):
            consume_exactly(consumer, 1, timeout_s=10)

    with Consumer(cluster_dir=cluster, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 1000)  # out of range: reset to the earliest by policy
        assert consume_exactly(consumer, 100)[0].offset == 0

    with Consumer(cluster_dir=cluster) as consumer:  # latest, Kafka's default
        consumer.assign([tp])
        assert consumer.position(tp) == 100

    with Consumer(cluster_dir=cluster, allow_auto_create_topics=False) as consumer:
        consumer.assign([("missing", 0)])
        started = time.monotonic()
        assert consumer.poll(300) == []  # no leader to ask: poll still keeps its timeout
        assert time.monotonic() - started < 5


# -- admin -------------------------------------------------------------------------------------


def test_admin_create_describe_list(brokers, broker):
    with Admin(cluster_dir=str(brokers.cluster_dir)) as admin:
        cluster = admin.describe_cluster()
        assert [b.node_id for b in cluster.brokers] == [1]
        assert cluster.brokers[0].port == broker.port
        assert cluster.controller_id == 1 and cluster.cluster_id
        admin.create_topic("described", 3, 1, {"retention.ms": "60000"})
        topic = admin.wait_for_leaders("described")
        assert [p.partition for p in topic.partitions] == [0, 1, 2]
        for p in topic.partitions:
            assert (p.leader, p.replicas, p.isr) == (1, (1,), (1,))
            assert p.leader_epoch >= 0
        assert "described" in admin.list_topics()
        with pytest.raises(KafkaError, match="TOPIC_ALREADY_EXISTS") as exists:
            admin.create_topic("described", 1, 1)
        assert exists.value.code == 36
        with pytest.raises(KafkaError, match="INVALID_REPLICATION_FACTOR"):
            admin.create_topic("too-many-replicas", 1, 3)
        admin.create_topic("only-validated", 2, 1, validate_only=True)
        admin.create_topic("assigned", replica_assignment={0: [1], 1: [1]})
        assert [p.replicas for p in admin.wait_for_leaders("assigned").partitions] == [(1,), (1,)]
        with pytest.raises(KafkaError, match="UNKNOWN_TOPIC_OR_PARTITION"):
            admin.describe_topic("only-validated")
        with pytest.raises(KafkaError, match="UNKNOWN_TOPIC_OR_PARTITION"):
            admin.describe_topic("never-created")
        assert "never-created" not in admin.list_topics()  # describing did not auto-create it


# -- interop with librdkafka -------------------------------------------------------------------


def test_our_records_read_by_confluent_kafka(broker):
    wanted = expected_records(200, "ours")
    with Producer(
        {"bootstrap.servers": broker.bootstrap, "acks": "all"}
    ) as producer:  # Kafka style
        futures = [producer.send("to-rd", v, key=k, headers=h, timestamp_ms=ts, partition=0)
                   for v, k, h, ts in wanted]  # fmt: skip
        producer.flush(20)
        assert [f.result(0)[1] for f in futures] == list(range(200))
    consumer = RdConsumer({"bootstrap.servers": broker.bootstrap, "group.id": "interop",
                           "enable.auto.commit": False})  # fmt: skip
    got = []
    try:
        consumer.assign([RdTopicPartition("to-rd", 0, 0)])
        deadline = time.monotonic() + 20
        while len(got) < len(wanted):
            assert time.monotonic() < deadline, f"confluent-kafka read {len(got)} records"
            m = consumer.poll(1)
            if m is None:
                continue
            assert not m.error(), m.error()
            got.append(m)
    finally:
        consumer.close()
    assert [m.offset() for m in got] == list(range(200))
    for m, (v, k, h, ts) in zip(got, wanted, strict=True):
        assert (m.value(), m.key(), m.timestamp()[1]) == (v, k, ts)
        assert tuple(m.headers() or ()) == h


def test_confluent_kafka_records_read_by_our_consumer(broker):
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topic("from-rd", 4, 1)
        admin.wait_for_leaders("from-rd")
    wanted = expected_records(200, "rd")
    producer = RdProducer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5,
                           "partitioner": "murmur2_random"})  # Java's default partitioner  # fmt: skip
    delivered, failures = [], []

    def on_delivery(err, msg):
        (failures if err else delivered).append(err or (msg.key(), msg.partition(), msg.offset()))

    for v, k, h, ts in wanted:
        producer.produce(
            "from-rd", v, key=k, headers=list(h), timestamp=ts, on_delivery=on_delivery
        )
    assert producer.flush(20) == 0 and not failures
    with Consumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([("from-rd", p) for p in range(4)])
        got = consume_exactly(consumer, 200)
    placed = {(k, p, o) for k, p, o in delivered}
    assert {(r.key, r.partition, r.offset) for r in got} == placed
    # murmur2 keys land where our partitioner puts them
    for key, partition, _ in delivered:
        if key is not None:
            assert partition == partition_for_key(key, 4)
    by_timestamp = {r.timestamp: r for r in got}  # timestamps are unique here
    for v, k, h, ts in wanted:
        r = by_timestamp[ts]
        assert (r.value, r.key, r.headers) == (v, k, h)


def test_a_flush_that_times_out_leaves_the_records_in_flight(brokers, broker):
    """Producer.flush(timeout) once cancelled every record still in flight when it timed out
    (so chaos counted written records as failed); now they are delivered once the broker
    answers, as Kafka's flush(timeout) leaves them."""
    import os
    import signal

    from localcluster import cluster

    producer = Producer(bootstrap_servers=broker.bootstrap, acks="all",
                        request_timeout_ms=30_000, delivery_timeout_ms=120_000)  # fmt: skip
    try:
        producer.send("paused", b"warm").result(30)
        assert cluster.stop_and_wait(broker.pid)
        try:
            futures = [producer.send("paused", b"v%d" % i) for i in range(10)]
            with pytest.raises(TimeoutError):
                producer.flush(0.5)
            assert not any(f.cancelled() for f in futures), "a timed-out flush cancelled records"
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        producer.flush(30)
        assert sorted(f.result(1)[1] for f in futures) == list(range(1, 11))  # (partition, offset)
    finally:
        producer.close(5)
