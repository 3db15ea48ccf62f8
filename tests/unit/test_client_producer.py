"""The producer: Kafka's murmur2 and key partitioner; the sender against a fake broker
(retries, metadata refresh after NOT_LEADER_OR_FOLLOWER, exhausted retries, acks=0).

`FakeLeader` is a tiny broker: it answers InitProducerId and checks idempotent batches'
sequences as a broker does (the idempotence tests in test_client_idempotence.py use it)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2
from kio.schema.errors import ErrorCode

from localcluster.client import AsyncProducer, KafkaError
from localcluster.client.producer import murmur2, partition_for_key
from localcluster.protocol import messages, produce
from localcluster.protocol.api import SUPPORTED, ApiKey
from localcluster.storage.record_batch import BatchHeader, iter_batches, iter_records
from tests.unit.test_client_connection import FakeBroker

# Kafka's own UtilsTest.testMurmur2 vectors.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_matches_kafkas_vectors():
    for data, expected in KAFKA_VECTORS.items():
        assert murmur2(data) == expected, data


@given(st.binary(max_size=64))
def test_murmur2_matches_kafka_python(data):
    assert murmur2(data) & 0xFFFFFFFF == kafka_python_murmur2(data)


@given(st.binary(max_size=32), st.integers(1, 1000))
def test_partition_for_key_is_in_range_and_positive(key, n):
    p = partition_for_key(key, n)
    assert 0 <= p < n
    assert p == (murmur2(key) & 0x7FFFFFFF) % n


# -- the sender against a fake broker -----------------------------------------------------------


LOSE_ANSWER = "lose the answer"  # in `errors`: append, then close the connection unanswered
SEQUENCES = 2**31


class FakeLeader:
    """Broker 1 leading topic t (partitions 0 and 1). Each partition's produce answer pops
    `errors` first: an error code (nothing appended), 0 (as usual) or LOSE_ANSWER. Batches must
    have a valid CRC; with a producer id their sequences are checked as a broker does: a lower
    epoch is INVALID_PRODUCER_EPOCH, a new epoch starts at 0, a sequence must follow the last
    (wrapping at Int.MaxValue), and one of the producer's last 5 batches is a duplicate,
    answered with its first offset and not appended. `hold = n` holds the answers back until
    n produce requests have come, to have several in flight at once."""

    def __init__(self, errors: list, *, offer_init_producer_id: bool = True):
        self.errors = list(errors)
        self.metadata_requests = 0
        self.produce_requests: list[list[tuple[int, int]]] = []  # [(partition, records)]
        self.log: dict[int, list[bytes]] = {0: [], 1: []}
        self.batches: dict[int, list[BatchHeader]] = {0: [], 1: []}  # every attempt received
        self.raw: dict[int, list[bytes]] = {0: [], 1: []}  # their bytes
        self.answers: dict[int, list[int]] = {0: [], 1: []}  # the error code of each
        self.hold = 0
        self.held: list[tuple] = []
        self.appended: dict[int, list[BatchHeader]] = {0: [], 1: []}  # the batches in the log
        # (partition, producer id) -> [epoch, [(first sequence, last sequence, base offset)]]
        self.producers: dict[tuple[int, int], list] = {}
        self.producer_ids = itertools.count(1000)
        versions = {k: (r.min, r.max) for k, r in SUPPORTED.items()}
        if not offer_init_producer_id:
            del versions[ApiKey.INIT_PRODUCER_ID]
        self.broker = FakeBroker(versions, self.on_request)

    async def start(self) -> str:
        address = await self.broker.serve_tcp()
        self.port = address.port
        return str(address)

    async def on_request(self, broker, writer, header, body):
        if header.api_key == ApiKey.METADATA:
            self.metadata_requests += 1
            partitions = [{"partition_index": p, "leader_id": 1, "replica_nodes": [1], "isr_nodes": [1]}
                          for p in (0, 1)]  # fmt: skip
            data = {"brokers": [{"node_id": 1, "host": "127.0.0.1", "port": self.port}],
                    "controller_id": 1,
                    "topics": [{"name": "t", "error_code": 0, "partitions": partitions}]}  # fmt: skip
            broker.send(
                writer, header, messages.encode_response(ApiKey.METADATA, header.api_version, data)
            )
        elif header.api_key == ApiKey.INIT_PRODUCER_ID:
            answer = {"error_code": 0, "producer_id": next(self.producer_ids), "producer_epoch": 0}
            broker.send(writer, header, messages.encode_response(header.api_key, header.api_version,
                                                                 answer))  # fmt: skip
        elif header.api_key == ApiKey.PRODUCE:
            request = produce.read_produce_request(body, header.api_version)
            results, seen, lose = [], [], False
            for topic, partitions in request.topics:
                out = []
                for p in partitions:
                    raw = bytes(p.records)
                    batch = [h for _, h in iter_batches(raw, check_crc=True)]
                    assert len(batch) == 1, "one batch per partition"
                    seen.append((p.partition, batch[0].records_count))
                    self.batches[p.partition].append(batch[0])
                    self.raw[p.partition].append(raw)
                    error = self.errors.pop(0) if self.errors else 0
                    lose = lose or error == LOSE_ANSWER
                    if error and error != LOSE_ANSWER:
                        out.append(produce.ProducePartitionResponse(p.partition, error))
                    else:
                        out.append(self.append(p.partition, raw, batch[0]))
                    self.answers[p.partition].append(out[-1].error_code)
                results.append((topic, out))
            self.produce_requests.append(seen)
            if lose:
                writer.close()
            elif request.acks != 0:
                body = produce.write_produce_response(results, header.api_version)
                self.held.append((writer, header, body))
                if len(self.held) >= self.hold:
                    for held in self.held:
                        broker.send(*held)
                    self.held, self.hold = [], 0

    def append(self, partition: int, raw: bytes, header: BatchHeader):
        verdict = self.check_sequence(partition, header)
        if verdict is not None:
            return verdict
        base = len(self.log[partition])
        self.log[partition] += [r.value for r in iter_records(raw)]
        self.appended[partition].append(header)
        if header.producer_id >= 0:
            last = (header.base_sequence + header.records_count - 1) % SEQUENCES
            entry = self.producers.setdefault(
                (partition, header.producer_id), [header.producer_epoch, []]
            )
            if entry[0] != header.producer_epoch:
                entry[:] = [header.producer_epoch, []]
            entry[1] = [*entry[1][-4:], (header.base_sequence, last, base)]
        return produce.ProducePartitionResponse(partition, 0, base)

    def check_sequence(self, partition: int, header: BatchHeader):
        entry = self.producers.get((partition, header.producer_id))
        if header.producer_id < 0 or entry is None:
            return None  # not idempotent, or a producer the partition has no state of
        epoch, recent = entry
        last = (header.base_sequence + header.records_count - 1) % SEQUENCES
        if header.producer_epoch < epoch:
            return produce.ProducePartitionResponse(partition, ErrorCode.invalid_producer_epoch)
        if header.producer_epoch == epoch:
            for first_sequence, last_sequence, base in recent:
                if (first_sequence, last_sequence) == (header.base_sequence, last):
                    return produce.ProducePartitionResponse(partition, 0, base)  # a duplicate
            expected = (recent[-1][1] + 1) % SEQUENCES
        else:
            expected = 0
        if header.base_sequence != expected:
            return produce.ProducePartitionResponse(
                partition, ErrorCode.out_of_order_sequence_number
            )
        return None


def run_with_fake(errors, body, *, offer_init_producer_id: bool = True, pass_fake: bool = False,
                  **settings):  # fmt: skip
    """Run body(producer) (body(producer, fake) with pass_fake) against a FakeLeader; returns
    (the fake, what body returned)."""

    async def main():
        fake = FakeLeader(errors, offer_init_producer_id=offer_init_producer_id)
        bootstrap = await fake.start()
        producer = AsyncProducer(bootstrap_servers=bootstrap, retry_backoff_ms=1, **settings)
        await producer.start()
        try:
            running = body(producer, fake) if pass_fake else body(producer)
            return fake, await asyncio.wait_for(running, 20)
        finally:
            await producer.close()
            await fake.broker.close()

    return asyncio.run(main())


def test_not_leader_refreshes_metadata_and_retries():
    async def body(producer):
        futures = [await producer.send("t", f"v{i}".encode(), partition=0) for i in range(3)]
        return [await f for f in futures]

    errors = [ErrorCode.not_leader_or_follower, ErrorCode.not_enough_replicas]
    fake, results = run_with_fake(errors, body, linger_ms=50)
    assert results == [(0, 0), (0, 1), (0, 2)]
    assert fake.log[0] == [b"v0", b"v1", b"v2"]  # the same batch, sent three times
    assert fake.produce_requests == [[(0, 3)]] * 3
    assert fake.metadata_requests >= 2  # bootstrap, topic lookup, then after NOT_LEADER


def test_retries_exhausted_fail_the_records_with_the_brokers_error():
    async def body(producer):
        future = await producer.send("t", b"v", partition=1)
        with pytest.raises(KafkaError, match="NOT_ENOUGH_REPLICAS") as error:
            await future
        return error.value

    fake, error = run_with_fake([ErrorCode.not_enough_replicas] * 10, body, retries=2, linger_ms=0)
    assert error.retriable and error.code == ErrorCode.not_enough_replicas
    assert len(fake.produce_requests) == 3  # the first attempt and two retries


def test_a_non_retriable_error_fails_at_once():
    async def body(producer):
        future = await producer.send("t", b"v", partition=0)
        with pytest.raises(KafkaError, match="MESSAGE_TOO_LARGE"):
            await future

    fake, _ = run_with_fake([ErrorCode.message_too_large], body, linger_ms=0)
    assert len(fake.produce_requests) == 1


def test_acks_0_expects_no_response_and_partitions_by_key():
    async def body(producer):
        futures = [await producer.send("t", b"v", key=f"k{i}".encode()) for i in range(20)]
        return [await f for f in futures]

    fake, results = run_with_fake([], body, acks=0, linger_ms=0)
    assert [p for p, _ in results] == [partition_for_key(f"k{i}".encode(), 2) for i in range(20)]
    assert {o for _, o in results} == {-1}


def test_buffer_memory_bounds_unsent_bytes_and_is_given_back():
    async def body(producer):
        futures = []
        for i in range(200):  # 200 x ~112 bytes through a 1000-byte buffer: send waits for room
            futures.append(await producer.send("t", b"x" * 100, partition=i % 2))
            assert producer._buffered <= 1000
        results = [await f for f in futures]
        with pytest.raises(KafkaError, match="partition 7 of 't' does not exist"):
            await producer.send("t", b"x", partition=7)
        assert producer._buffered == 0
        return results

    fake, results = run_with_fake([], body, buffer_memory=1000, batch_size=500, linger_ms=1)
    assert sorted(results) == [(p, o) for p in (0, 1) for o in range(100)]
    assert len(fake.log[0]) == len(fake.log[1]) == 100


def test_null_keys_stick_to_one_partition_per_batch():
    async def body(producer):
        first = [await producer.send("t", b"v") for _ in range(10)]
        first = [await f for f in first]
        second = [await producer.send("t", b"v") for _ in range(10)]
        return first, [await f for f in second]

    fake, (first, second) = run_with_fake([], body, linger_ms=20)
    assert len({p for p, _ in first}) == 1 and len({p for p, _ in second}) == 1
    assert first[0][0] != second[0][0]  # the batch closed: the next one goes elsewhere
    assert fake.produce_requests == [[(first[0][0], 10)], [(second[0][0], 10)]]
