"""parse_records: partial batches, batches starting before the position, control batches;
and the consumer's fetch loop against a fake broker that cuts responses mid-batch, as Kafka's
brokers do (the real one here returns whole batches only)."""

from __future__ import annotations

import asyncio

import pytest

from localcluster.client import AsyncConsumer, OffsetOutOfRangeError
from localcluster.client.consumer import parse_records
from localcluster.protocol import fetch, messages
from localcluster.protocol.api import SUPPORTED, ApiKey
from localcluster.storage.record_batch import CONTROL_FLAG, BatchSpec, Record, encode_batch
from tests.unit.test_client_connection import FakeBroker

TP = ("t", 0)


def batch(base: int, values: list[bytes], attributes: int = 0, ts: int = 1000) -> bytes:
    records = [
        Record(v, key=b"k" + v, headers=(("h", v),), timestamp=ts + i) for i, v in enumerate(values)
    ]
    return encode_batch(records, BatchSpec(base_offset=base, attributes=attributes))


def test_whole_batches_with_keys_headers_timestamps():
    data = batch(0, [b"a", b"b"]) + batch(2, [b"c"])
    records, next_offset = parse_records(TP, data, 0)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in records] == [
        (0, b"ka", b"a", (("h", b"a"),), 1000),
        (1, b"kb", b"b", (("h", b"b"),), 1001),
        (2, b"kc", b"c", (("h", b"c"),), 1000),
    ]
    assert next_offset == 3
    assert {(r.topic, r.partition) for r in records} == {TP}


@pytest.mark.parametrize("cut", [1, 11, 12, 40, 61, 70])
def test_a_partial_batch_at_the_end_is_left_for_the_next_fetch(cut):
    first, second = batch(0, [b"a", b"b"]), batch(2, [b"c", b"d"])
    records, next_offset = parse_records(TP, first + second[: len(second) - cut], 0)
    assert [r.offset for r in records] == [0, 1]
    assert next_offset == 2


def test_only_a_partial_batch_yields_nothing():
    records, next_offset = parse_records(TP, batch(0, [b"a"])[:30], 0)
    assert records == [] and next_offset is None


def test_records_before_the_fetch_offset_are_skipped():
    records, next_offset = parse_records(TP, batch(5, [b"a", b"b", b"c"]), 6)
    assert [r.offset for r in records] == [6, 7] and next_offset == 8


def test_control_batches_advance_without_records():
    data = batch(0, [b"a"]) + batch(1, [b"marker"], attributes=CONTROL_FLAG)
    records, next_offset = parse_records(TP, data, 0)
    assert [r.value for r in records] == [b"a"] and next_offset == 2


def test_compressed_batches_are_decoded():
    data = batch(0, [b"a", b"b"], attributes=1) + batch(2, [b"c"], attributes=4)  # gzip, zstd
    records, next_offset = parse_records(TP, data, 1)
    assert [(r.offset, r.value) for r in records] == [(1, b"b"), (2, b"c")] and next_offset == 3


def test_a_corrupt_batch_raises():
    data = bytearray(batch(0, [b"abc"]))
    data[-1] ^= 0xFF
    with pytest.raises(ValueError, match="CRC"):
        parse_records(TP, bytes(data), 0)


class CuttingBroker:
    """Leads t-0, whose log is `batches`; a Fetch answer is the log from the batch holding the
    fetch offset, cut at partition_max_bytes wherever that falls."""

    def __init__(self, batches: list[bytes]):
        self.log = b"".join(batches)
        self.starts = []  # (base offset, byte position) per batch
        position = 0
        for b in batches:
            self.starts.append((int.from_bytes(b[:8], "big"), position))
            position += len(b)
        self.end_offset = sum(int.from_bytes(b[57:61], "big") for b in batches)
        self.fetches: list[tuple[int, int]] = []  # (fetch offset, bytes answered)
        self.broker = FakeBroker({k: (r.min, r.max) for k, r in SUPPORTED.items()}, self.on_request)

    async def on_request(self, broker, writer, header, body):
        v = header.api_version
        if header.api_key == ApiKey.METADATA:
            data = {"brokers": [{"node_id": 1, "host": "127.0.0.1", "port": self.port}],
                    "topics": [{"name": "t", "partitions": [{"partition_index": 0, "leader_id": 1,
                                                             "replica_nodes": [1], "isr_nodes": [1]}]}]}  # fmt: skip
            broker.send(writer, header, messages.encode_response(ApiKey.METADATA, v, data))
        elif header.api_key == ApiKey.LIST_OFFSETS:
            request = messages.decode_request(ApiKey.LIST_OFFSETS, v, body.buf, body.pos)
            ts = request.topics[0].partitions[0].timestamp
            offset = 0 if ts == -2 else self.end_offset
            data = {
                "topics": [{"name": "t", "partitions": [{"partition_index": 0, "offset": offset}]}]
            }
            broker.send(writer, header, messages.encode_response(ApiKey.LIST_OFFSETS, v, data))
        elif header.api_key == ApiKey.FETCH:
            request = fetch.read_fetch_request(body, v)
            p = request.topics[0][1][0]
            if p.fetch_offset > self.end_offset:
                answer = fetch.FetchPartitionResponse(0, 1)  # OFFSET_OUT_OF_RANGE
            else:
                start = (
                    max(pos for base, pos in self.starts if base <= p.fetch_offset)
                    if (p.fetch_offset < self.end_offset)
                    else len(self.log)
                )
                chunk = self.log[start : start + p.partition_max_bytes]
                self.fetches.append((p.fetch_offset, len(chunk)))
                answer = fetch.FetchPartitionResponse(0, 0, self.end_offset, self.end_offset, 0,
                                                      [chunk] if chunk else [])  # fmt: skip
            broker.send(
                writer,
                header,
                b"".join(bytes(x) for x in fetch.write_fetch_response([("t", [answer])], v)),
            )


def run_consumer(batches, body, **settings):
    async def main():
        fake = CuttingBroker(batches)
        address = await fake.broker.serve_tcp()
        fake.port = address.port
        consumer = await AsyncConsumer(bootstrap_servers=str(address), **settings).start()
        try:
            return fake, await asyncio.wait_for(body(consumer), 20)
        finally:
            await consumer.close()
            await fake.broker.close()

    return asyncio.run(main())


def test_poll_refetches_the_partial_batch_a_response_ends_with():
    batches = [batch(10 * i, [f"{i}-{j}".encode() * 10 for j in range(10)]) for i in range(6)]
    size = len(batches[0])

    async def body(consumer):
        await consumer.assign([TP])
        await consumer.seek_to_beginning()
        out = []
        while len(out) < 60:
            out += await consumer.poll(1000)
        return out, await consumer.position(TP)

    fake, (records, position) = run_consumer(batches, body, max_partition_fetch_bytes=size + size // 2,
                                             fetch_max_wait_ms=0)  # fmt: skip
    assert [r.offset for r in records] == list(range(60)) and position == 60
    assert [r.value for r in records] == [
        f"{i}-{j}".encode() * 10 for i in range(6) for j in range(10)
    ]
    assert all(n == size + size // 2 for _, n in fake.fetches[:5])  # each answer ends mid-batch
    assert [o for o, _ in fake.fetches[:6]] == [0, 10, 20, 30, 40, 50]


def test_a_batch_larger_than_the_fetch_size_raises_nothing_and_returns_nothing():
    async def body(consumer):
        await consumer.assign([TP])
        consumer.seek(TP, 0)
        return await consumer.poll(200)

    _, records = run_consumer([batch(0, [b"x" * 500])], body, max_partition_fetch_bytes=100,
                              fetch_max_wait_ms=0)  # fmt: skip
    assert records == []  # (a real broker returns the first batch whole, whatever the limit)


def test_offset_out_of_range_raises_with_policy_none():
    async def body(consumer):
        await consumer.assign([TP])
        consumer.seek(TP, 99)
        with pytest.raises(OffsetOutOfRangeError, match="offset 99 is out of range"):
            await consumer.poll(2000)
        assert await consumer.position(TP) == 99  # the position stays where it was

    run_consumer([batch(0, [b"a"])], body, auto_offset_reset="none", fetch_max_wait_ms=0)
