"""Real clients' idempotent producers across a leader failover: kafka-python 3 with its
defaults (idempotent since 3.0), confluent-kafka with enable.idempotence=true, aiokafka with
enable_idempotence=True. Three brokers, RF 3, min.insync.replicas 2; the leader is killed -9
mid-stream and the client keeps producing. Read back, every acknowledged record is in the log
exactly once, in send order, and the batches carry the client's producer id."""

from __future__ import annotations

import asyncio
import threading

import pytest

from localcluster.client import Admin
from localcluster.client.connection import Address, BrokerConnection, LoopThread
from localcluster.protocol import fetch
from localcluster.protocol.api import ApiKey
from localcluster.protocol.wire import Reader
from localcluster.storage.record_batch import LOG_OVERHEAD, iter_records, validate_batch
from tests.helpers import wait_until

TOPIC = "idem"
RECORDS_BEFORE, RECORDS_AFTER = 3000, 2000


def start_cluster(brokers):
    started = [brokers.start(b, replica_lag_time_max_ms="3000") for b in (1, 2, 3)]
    admin = Admin(bootstrap_servers=started[0].bootstrap)
    try:
        admin.create_topic(TOPIC, 1, 3, {"min.insync.replicas": "2"})
    finally:
        admin.close()
    return started


def leader_of(started) -> int:
    admin = Admin(bootstrap_servers=",".join(b.bootstrap for b in started if b.is_alive()))
    try:
        return admin.describe_topic(TOPIC).partitions[0].leader
    finally:
        admin.close()


def read_log(address: str) -> list[tuple[int, int, bytes]]:
    """(offset, producer id, value) of every committed record, fetched as a consumer."""
    loop = LoopThread("read-log")

    async def read():
        connection = await BrokerConnection.open(Address.parse(address))
        out, offset = [], 0
        try:
            for _ in range(10_000):
                request = fetch.FetchRequest(-1, 0, 0, 8 << 20, 0,
                                             [(TOPIC, [fetch.FetchPartition(0, offset, 8 << 20)])])  # fmt: skip
                frame, start = await connection.send(
                    ApiKey.FETCH, lambda v, request=request: fetch.write_fetch_request(request, v)
                )
                version = connection.version(ApiKey.FETCH)
                _, responses = fetch.read_fetch_response(Reader(frame, start), version)
                p = responses[0][1][0]
                assert p.error_code == 0, f"fetch from {address} answered error {p.error_code}"
                data = memoryview(bytes(b"".join(bytes(r) for r in p.records)))
                position, before = 0, offset
                while position + LOG_OVERHEAD <= len(data):
                    header = validate_batch(data, position)
                    batch = data[position : position + header.size]
                    for i, record in enumerate(iter_records(batch)):
                        out.append((header.base_offset + i, header.producer_id, record.value))
                    offset = header.next_offset
                    position += header.size
                if offset == before or offset >= p.high_watermark:
                    return out
            raise AssertionError("the log did not end")
        finally:
            connection.close()

    try:
        return loop.run(read(), 60)
    finally:
        loop.stop()


def produce_kafka_python(bootstrap: str, values: list[bytes], kill) -> list[bytes]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)  # its defaults: idempotent, acks=all
    try:
        futures = [producer.send(TOPIC, v) for v in values[:RECORDS_BEFORE]]
        kill()
        futures += [producer.send(TOPIC, v) for v in values[RECORDS_BEFORE:]]
        producer.flush(60)
        return [v for v, f in zip(values, futures, strict=True) if f.succeeded()]
    finally:
        producer.close(5)


def produce_confluent(bootstrap: str, values: list[bytes], kill) -> list[bytes]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    acked: list[bytes] = []
    lock = threading.Lock()

    def delivered(error, message):
        if error is None:
            with lock:
                acked.append(message.value())

    for i, value in enumerate(values):
        if i == RECORDS_BEFORE:
            kill()
        while True:
            try:
                producer.produce(TOPIC, value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    assert producer.flush(60) == 0
    order = {v: i for i, v in enumerate(values)}
    return sorted(acked, key=order.__getitem__)


def produce_aiokafka(bootstrap: str, values: list[bytes], kill) -> list[bytes]:
    from aiokafka import AIOKafkaProducer

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            futures = [await producer.send(TOPIC, v) for v in values[:RECORDS_BEFORE]]
            await asyncio.to_thread(kill)
            futures += [await producer.send(TOPIC, v) for v in values[RECORDS_BEFORE:]]
            await producer.flush()
            done = await asyncio.gather(*futures, return_exceptions=True)
            return [v for v, d in zip(values, done, strict=True) if not isinstance(d, Exception)]
        finally:
            await producer.stop()

    return asyncio.run(run())


CLIENTS = {"kafka-python": produce_kafka_python, "confluent-kafka": produce_confluent,
           "aiokafka": produce_aiokafka}  # fmt: skip


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_every_acknowledged_record_once_in_order_across_a_leader_kill(brokers, client):
    started = start_cluster(brokers)
    bootstrap = ",".join(b.bootstrap for b in started)
    victim = next(b for b in started if b.broker_id == leader_of(started))

    def kill():
        victim.kill()

    values = [f"{client}-{i:06d}".encode() for i in range(RECORDS_BEFORE + RECORDS_AFTER)]
    acked = CLIENTS[client](bootstrap, values, kill)
    assert len(acked) == len(values), f"{len(values) - len(acked)} records failed"
    wait_until(lambda: leader_of(started) not in (-1, victim.broker_id), timeout_s=30)
    leader = next(b for b in started if b.broker_id == leader_of(started))
    records = read_log(leader.bootstrap)  # a consumer's fetch is served by the leader only
    logged = [value for _, _, value in records]
    assert len(logged) == len(set(logged)), (
        f"{len(logged) - len(set(logged))} records are in the log twice")  # fmt: skip
    assert [v for v in logged if v in set(acked)] == acked, "not in send order"
    assert set(acked) <= set(logged), "an acknowledged record is missing"
    producer_ids = {pid for _, pid, _ in records}
    assert producer_ids and -1 not in producer_ids, f"not idempotent batches: {producer_ids}"
