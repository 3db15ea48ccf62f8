"""Our idempotent producer (the default) against three real brokers, RF 3, min.insync.replicas 2,
acks=all: the leader is killed -9 while records are in flight and the producer keeps going.
Read back from offset 0, every acknowledged record is in the log once, at the offset it was
acknowledged with, in send order per partition, and every batch carries the producer's id with
sequences contiguous within an epoch (a new epoch starting at 0).

"Once" needs the broker to answer a retried batch it already holds with its first offsets. A
probe tells whether the brokers do: if they do not yet, that assertion is an xfail naming the
missing piece, and everything else is still asserted.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading

import pytest

from localcluster.client import Admin, Producer
from localcluster.client.connection import Address, BrokerConnection
from localcluster.protocol import fetch, messages, produce
from localcluster.protocol.api import ApiKey
from localcluster.protocol.wire import Reader
from localcluster.storage.record_batch import (
    LOG_OVERHEAD,
    BatchSpec,
    Record,
    encode_batch,
    iter_records,
    validate_batch,
)
from tests.helpers import wait_until

TOPIC = "idempotence"
PARTITIONS = 3
OUTSTANDING = 1500  # records the load keeps unacknowledged: batches in flight at the kill
VALUE_BYTES = 1000  # about 16 records a batch (batch.size 16384): many batches in flight
MAX_RECORDS = 200_000  # the load's bound; it stops long before


class Load(threading.Thread):
    """Sends records to partition i % PARTITIONS, values "p:i:...", keeping OUTSTANDING of them
    unacknowledged, until stopped."""

    def __init__(self, producer: Producer):
        super().__init__(name="idempotence-load", daemon=True)
        self.producer = producer
        self.sent: list[tuple[int, bytes, concurrent.futures.Future]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        for i in range(MAX_RECORDS):
            if self.stop.is_set():
                return
            partition = i % PARTITIONS
            value = f"{partition}:{i}:".encode().ljust(VALUE_BYTES, b".")
            self.sent.append(
                (partition, value, self.producer.send(TOPIC, value, partition=partition))
            )
            if i >= OUTSTANDING:  # fmt: skip
                concurrent.futures.wait([self.sent[i - OUTSTANDING][2]], timeout=150)

    def acknowledged(self, since: int = 0) -> int:
        return sum(1 for _, _, f in self.sent[since:] if f.done() and f.exception() is None)


def read_partition(socket_path, partition: int) -> list[tuple]:
    """[(header, [record values])] of every batch up to the high watermark, fetched raw."""

    async def go():
        connection = await BrokerConnection.open(Address(unix_socket=str(socket_path)))
        try:
            out, offset = [], 0
            while True:
                request = fetch.FetchRequest(fetch.CONSUMER_REPLICA_ID, 0, 1, 1 << 24, 0,
                                             [(TOPIC, [fetch.FetchPartition(partition, offset, 1 << 24)])])  # fmt: skip
                frame, position = await connection.send(
                    ApiKey.FETCH, lambda v, request=request: fetch.write_fetch_request(request, v)
                )
                _, ((_, (answer,)),) = fetch.read_fetch_response(
                    Reader(frame, position), connection.version(ApiKey.FETCH)
                )
                assert answer.error_code == 0, answer.error_code
                if not answer.records:
                    return out
                data, at = bytes(answer.records[0]), 0
                while len(data) - at >= LOG_OVERHEAD:
                    header = validate_batch(data, at)  # raises on a partial batch: none here
                    batch = data[at : at + header.size]
                    out.append((header, [r.value for r in iter_records(batch)]))
                    offset, at = header.next_offset, at + header.size
        finally:
            connection.close()

    return asyncio.run(go())


def broker_dedupes(socket_path) -> bool:
    """Whether the broker answers the same idempotent batch, sent twice, with the first's
    offset and appends it once (a partition of its own topic, led by that broker)."""

    async def go():
        connection = await BrokerConnection.open(Address(unix_socket=str(socket_path)))
        try:
            frame, at = await connection.send(ApiKey.INIT_PRODUCER_ID, lambda v: messages.encode_request(
                ApiKey.INIT_PRODUCER_ID, v, {"transactional_id": None, "transaction_timeout": 60_000,
                                             "producer_id": -1, "producer_epoch": -1}))  # fmt: skip
            answer = messages.decode_response(
                ApiKey.INIT_PRODUCER_ID, connection.version(ApiKey.INIT_PRODUCER_ID), frame, at
            )
            spec = BatchSpec(producer_id=int(answer.producer_id), producer_epoch=0, base_sequence=0)
            batch = encode_batch([Record(b"probe")], spec)
            request = produce.ProduceRequest(None, -1, 10_000, [("probe", [produce.ProducePartition(0, batch)])])  # fmt: skip
            offsets = []
            for _ in range(2):
                frame, at = await connection.send(
                    ApiKey.PRODUCE, lambda v: produce.write_produce_request(request, v)
                )
                ((_, (result,)),) = produce.read_produce_response(
                    Reader(frame, at), connection.version(ApiKey.PRODUCE)
                )
                assert result.error_code == 0, result.error_code
                offsets.append(result.base_offset)
            return offsets[0] == offsets[1]
        finally:
            connection.close()

    return asyncio.run(go())


def test_a_killed_leader_leaves_every_acknowledged_record_once_in_order(brokers):
    started = {i: brokers.start(i) for i in (1, 2, 3)}
    cluster = str(brokers.cluster_dir)
    with Admin(cluster_dir=cluster) as admin, Producer(cluster_dir=cluster) as producer:
        assert producer.idempotent
        admin.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
        admin.create_topic("probe", 1, 3, {"min.insync.replicas": "2"})
        wait_until(lambda: all(len(p.isr) == 3 for p in admin.wait_for_leaders(TOPIC).partitions),
                   30, message="full ISRs")  # fmt: skip
        load = Load(producer)
        load.start()
        try:
            wait_until(lambda: load.acknowledged() >= 2000, 60, 0.01, "records before the kill")
            victim = admin.describe_topic(TOPIC).partitions[0].leader
            killed_at = len(load.sent)
            started[victim].kill()
            wait_until(lambda: load.acknowledged(killed_at) >= 3000, 120, 0.01,
                       "records acknowledged after the kill")  # fmt: skip
        finally:
            load.stop.set()
            load.join(160)
        assert not load.is_alive()
        producer.flush(150)
        producer_id, epoch = producer.producer_id_and_epoch
        assert producer_id >= 0
        leaders = {p.partition: p.leader for p in admin.wait_for_leaders(TOPIC, 30).partitions}
        assert victim not in leaders.values()
        probe_leader = admin.wait_for_leaders("probe", 30).partitions[0].leader

    acknowledged: dict[int, list[tuple[bytes, int]]] = collections.defaultdict(list)
    failed = []
    for partition, value, future in load.sent:
        error = future.exception(timeout=0)
        if error is None:
            result = future.result()
            assert result[0] == partition
            acknowledged[partition].append((value, result[1]))
        else:
            failed.append((value, error))
    assert not failed, f"{len(failed)} records failed, the first: {failed[0]}"

    logs, duplicates = {}, []
    for partition, leader in leaders.items():
        batches = read_partition(started[leader].socket_path, partition)
        values = [v for _, vs in batches for v in vs]
        logs[partition] = (batches, values)
        # Every batch is ours: this producer's id, the epoch it has now or an earlier one.
        assert {h.producer_id for h, _ in batches} == {producer_id}
        assert all(0 <= h.producer_epoch <= epoch for h, _ in batches)
        # Every acknowledged record is there, at its offset, in send order.
        first_offset = {}
        for offset, value in enumerate(values):
            first_offset.setdefault(value, offset)
        acked = acknowledged[partition]
        for value, offset in acked:
            assert values[offset] == value, (partition, offset, value)
        assert [first_offset[v] for v, _ in acked] == sorted(first_offset[v] for v, _ in acked)
        duplicates += [(partition, v[: v.index(b":.")]) for v, n in collections.Counter(values).items()
                       if n > 1]  # fmt: skip

    if duplicates and not broker_dedupes(started[probe_leader].socket_path):
        pytest.xfail(f"{len(duplicates)} records written twice, e.g. {duplicates[:3]}: the broker "
                     "does not answer a retried idempotent batch as a duplicate yet (the producer "
                     "state checks in the leader's append path, issue 14's broker part)")  # fmt: skip
    assert not duplicates, f"{len(duplicates)} records written twice, e.g. {duplicates[:3]}"
    for partition, (batches, values) in logs.items():
        assert len(values) == len(acknowledged[partition])  # nothing but the acknowledged
        epochs = [h.producer_epoch for h, _ in batches]
        assert epochs == sorted(epochs)
        expected: dict[int, int] = {}  # epoch -> the next sequence
        for header, _ in batches:
            assert header.base_sequence == expected.get(header.producer_epoch, 0), (
                partition,
                header,
            )
            expected[header.producer_epoch] = header.base_sequence + header.records_count  # fmt: skip
