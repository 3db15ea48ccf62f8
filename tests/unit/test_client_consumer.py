"""parse_records: partial batches, batches starting before the position, control batches."""

from __future__ import annotations

import pytest

from localcluster.client.connection import KafkaError
from localcluster.client.consumer import parse_records
from localcluster.storage.record_batch import CONTROL_FLAG, BatchSpec, Record, encode_batch

TP = ("t", 0)


def batch(base: int, values: list[bytes], attributes: int = 0, ts: int = 1000) -> bytes:
    records = [Record(v, key=b"k" + v, headers=(("h", v),), timestamp=ts + i) for i, v in enumerate(values)]
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


def test_compressed_batches_are_refused_by_name():
    with pytest.raises(KafkaError, match="compressed with gzip"):
        parse_records(TP, batch(0, [b"a"], attributes=1), 0)


def test_a_corrupt_batch_raises():
    data = bytearray(batch(0, [b"abc"]))
    data[-1] ^= 0xFF
    with pytest.raises(ValueError, match="CRC"):
        parse_records(TP, bytes(data), 0)
