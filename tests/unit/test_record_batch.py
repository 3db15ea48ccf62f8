"""RecordBatch v2 codec: round trip, validation, in-place rewrites."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localcluster.storage import (
    BatchSpec,
    CorruptRecordError,
    Record,
    encode_batch,
    iter_batches,
    iter_records,
    validate_batch,
)
from localcluster.storage import record_batch as rb

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

maybe_bytes = st.none() | st.binary(max_size=40)
header_names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
timestamps = st.none() | st.integers(min_value=-(2**40), max_value=2**42)
records_st = st.lists(
    st.builds(
        Record,
        value=maybe_bytes,
        key=maybe_bytes,
        headers=st.lists(st.tuples(header_names, maybe_bytes), max_size=3).map(tuple),
        timestamp=timestamps,
    ),
    min_size=1,
    max_size=8,
)
specs = st.builds(
    BatchSpec,
    base_offset=st.integers(0, 2**62),
    partition_leader_epoch=st.integers(-1, 2**31 - 1),
    base_timestamp=st.integers(0, 2**41),
    producer_id=st.integers(-1, 2**62),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(-1, 2**31 - 1),
)


def expected_timestamps(records, spec):
    base = spec.base_timestamp
    if records[0].timestamp is not None and spec.base_timestamp == 0:
        base = records[0].timestamp
    return [base if r.timestamp is None else r.timestamp for r in records]


@FAST
@given(records=records_st, spec=specs)
def test_round_trip(records, spec):
    data = encode_batch(records, spec)
    header = validate_batch(data)
    assert header.size == len(data)
    assert header.base_offset == spec.base_offset
    assert header.partition_leader_epoch == spec.partition_leader_epoch
    assert header.records_count == len(records) == header.last_offset_delta + 1
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        spec.producer_id,
        spec.producer_epoch,
        spec.base_sequence,
    )
    decoded = list(iter_records(data))
    stamps = expected_timestamps(records, spec)
    assert len(decoded) == len(records)
    for i, (got, sent) in enumerate(zip(decoded, records, strict=True)):
        assert got.key == sent.key
        assert got.value == sent.value
        assert got.headers == sent.headers
        assert got.offset == spec.base_offset + i
        assert got.timestamp == stamps[i]


@FAST
@given(records=records_st, spec=specs)
def test_max_timestamp_is_the_largest_record_timestamp(records, spec):
    """maxTimestamp is what the time index and offset_for_timestamp rely on."""
    header = validate_batch(encode_batch(records, spec))
    assert header.max_timestamp == max(
        r.timestamp for r in iter_records(encode_batch(records, spec))
    )


def test_max_timestamp_with_explicit_base_timestamp_above_the_records():
    # Minimal case: a spec base timestamp of 100 and one record stamped 50. The batch's
    # maxTimestamp must be 50 (the only record's), not the base.
    data = encode_batch([Record(b"a", timestamp=50)], BatchSpec(base_timestamp=100))
    assert [r.timestamp for r in iter_records(data)] == [50]
    assert validate_batch(data).max_timestamp == 50


@FAST
@given(records=records_st, spec=specs, data=st.data())
def test_any_flipped_byte_in_crc_range_is_detected(records, spec, data):
    batch = bytearray(encode_batch(records, spec))
    position = data.draw(st.integers(rb.CRC_START, len(batch) - 1), label="position")
    flip = data.draw(st.integers(1, 255), label="xor")
    batch[position] ^= flip
    with pytest.raises(CorruptRecordError):
        validate_batch(bytes(batch))


@FAST
@given(records=records_st, spec=specs, data=st.data())
def test_flipped_crc_field_is_detected(records, spec, data):
    batch = bytearray(encode_batch(records, spec))
    position = data.draw(st.integers(17, 20))
    batch[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptRecordError, match="CRC-32C mismatch"):
        validate_batch(bytes(batch))


@FAST
@given(records=records_st, spec=specs, base_offset=st.integers(0, 2**63 - 1),
       epoch=st.integers(-(2**31), 2**31 - 1))  # fmt: skip
def test_rewriting_base_offset_and_epoch_keeps_the_crc(records, spec, base_offset, epoch):
    batch = bytearray(encode_batch(records, spec))
    crc_before = validate_batch(batch).crc
    rb.set_base_offset(batch, 0, base_offset)
    rb.set_partition_leader_epoch(batch, 0, epoch)
    header = validate_batch(bytes(batch))
    assert header.crc == crc_before
    assert header.base_offset == base_offset
    assert header.partition_leader_epoch == epoch
    assert [r.offset for r in iter_records(bytes(batch))] == [
        base_offset + i for i in range(len(records))
    ]


def test_rewrite_at_a_position_inside_a_larger_buffer():
    first = encode_batch([Record(b"one")])
    second = encode_batch([Record(b"two"), Record(b"three")])
    buf = bytearray(first + second)
    rb.set_base_offset(buf, len(first), 7)
    rb.set_partition_leader_epoch(buf, len(first), 3)
    got = list(iter_batches(bytes(buf)))
    assert [(p, h.base_offset, h.partition_leader_epoch) for p, h in got] == [
        (0, 0, -1),
        (len(first), 7, 3),
    ]


# -- header checks, each with its own message ---------------------------------------------------


def batch(n=2):
    return bytearray(encode_batch([Record(b"v%d" % i, key=b"k") for i in range(n)]))


def test_bad_magic():
    data = batch()
    data[16] = 1
    with pytest.raises(CorruptRecordError, match="magic 1 is not supported"):
        validate_batch(bytes(data))


def test_batch_length_past_the_bytes():
    data = bytes(batch())
    with pytest.raises(CorruptRecordError, match="runs past the"):
        validate_batch(data[:-1])
    longer = bytearray(data)
    struct.pack_into(">i", longer, 8, len(data))  # claims 12 more bytes than there are
    with pytest.raises(CorruptRecordError, match=f"batchLength {len(data)} runs past"):
        validate_batch(bytes(longer))


def test_batch_length_below_the_header():
    data = batch()
    struct.pack_into(">i", data, 8, 20)
    with pytest.raises(CorruptRecordError, match="batchLength 20 is below"):
        validate_batch(bytes(data))


def test_fewer_than_12_bytes():
    with pytest.raises(CorruptRecordError, match="at least 12 bytes"):
        validate_batch(b"\0" * 11)


def test_records_count_disagrees_with_last_offset_delta():
    data = batch(3)
    struct.pack_into(">i", data, 57, 2)  # recordsCount, inside the CRC range: CRC left stale
    with pytest.raises(CorruptRecordError, match=r"recordsCount 2 != lastOffsetDelta 2 \+ 1"):
        validate_batch(bytes(data))


def test_records_count_zero_is_rejected_even_with_consistent_delta():
    spec = BatchSpec()
    data = rb.encode_raw_batch(b"", 0, spec)  # recordsCount 0, lastOffsetDelta -1
    with pytest.raises(CorruptRecordError, match="recordsCount 0"):
        validate_batch(data)


def test_crc_not_checked_when_asked():
    data = batch()
    data[-1] ^= 0xFF
    validate_batch(bytes(data), check_crc=False)
    with pytest.raises(CorruptRecordError, match="CRC"):
        validate_batch(bytes(data))


# -- iteration ----------------------------------------------------------------------------------


@FAST
@given(st.lists(records_st, min_size=1, max_size=5))
def test_iter_batches_walks_concatenated_batches(groups):
    parts = [encode_batch(g) for g in groups]
    data = b"".join(parts)
    positions = [p for p, _ in iter_batches(data)]
    expected, at = [], 0
    for part in parts:
        expected.append(at)
        at += len(part)
    assert positions == expected


def test_iter_batches_raises_at_a_torn_tail():
    data = encode_batch([Record(b"x")]) + encode_batch([Record(b"y")])[:30]
    it = iter_batches(data)
    assert next(it)[0] == 0
    with pytest.raises(CorruptRecordError):
        next(it)


def test_complete_only_ends_at_a_cut_short_batch_but_raises_at_a_bad_whole_one():
    one, two = encode_batch([Record(b"x")]), encode_batch([Record(b"y")])
    for cut in (5, 30, len(two) - 1):  # under 12 bytes, inside the header, inside the records
        assert [p for p, _ in iter_batches(one + two[:cut], complete_only=True)] == [0]
    bad_crc = bytearray(two)
    bad_crc[-1] ^= 0xFF
    walk = iter_batches(one + bytes(bad_crc), complete_only=True)
    assert next(walk)[0] == 0
    with pytest.raises(CorruptRecordError, match="CRC"):
        next(walk)
    too_short = bytearray(two)
    struct.pack_into(">i", too_short, 8, 10)  # a batchLength below the header's
    with pytest.raises(CorruptRecordError, match="below"):
        list(iter_batches(one + bytes(too_short), complete_only=True))


def test_batch_spans_read_lengths_only_and_stop_at_what_is_not_a_whole_batch():
    one, two = encode_batch([Record(b"x")]), encode_batch([Record(b"y" * 50)])
    bad_crc = bytearray(two)
    bad_crc[-1] ^= 0xFF  # not checked: the log validates at append
    data = one + bytes(bad_crc)
    assert list(rb.batch_spans(data)) == [(0, len(one)), (len(one), len(two))]
    assert list(rb.batch_spans(data + two[:20])) == list(rb.batch_spans(data))
    too_short = bytearray(two)
    struct.pack_into(">i", too_short, 8, 10)
    assert list(rb.batch_spans(one + bytes(too_short) + two)) == [(0, len(one))]
    assert list(rb.batch_spans(b"")) == []


def test_compressed_batch_is_validated_by_header_and_its_payload_by_the_codec():
    payload = b"\x01\x02compressed bytes"
    data = rb.encode_raw_batch(payload, 4, BatchSpec(attributes=2, base_timestamp=5),
                               max_timestamp=9)  # fmt: skip
    header = validate_batch(data)
    assert header.compression == 2 and header.records_count == 4 and header.max_timestamp == 9
    with pytest.raises(CorruptRecordError, match="snappy payload of 18 bytes does not decompress"):
        list(iter_records(data))


def test_record_length_inconsistent_with_fields_is_corrupt():
    # Re-encode a batch whose record claims one byte more than its fields use, with a valid CRC.
    body = bytearray(rb.encode_record(Record(b"abc"), 0, 0))
    body[0] += 2  # zig-zag varint: +1 in length
    body += b"\0"
    data = rb.encode_raw_batch(bytes(body), 1, BatchSpec())
    validate_batch(data)
    with pytest.raises(CorruptRecordError, match="record length does not match"):
        list(iter_records(data))


def test_log_append_time_stamps_every_batch_and_its_crc_still_holds():
    from localcluster.storage.record_batch import TIMESTAMP_TYPE_MASK, with_log_append_time

    first = encode_batch([Record(b"a", timestamp=5), Record(b"b", timestamp=6)])
    second = encode_batch([Record(b"c", timestamp=7)])
    stamped = with_log_append_time(first + second, 123_456)
    headers = [h for _, h in iter_batches(stamped)]  # checks each CRC
    assert [h.max_timestamp for h in headers] == [123_456, 123_456]
    assert all(h.attributes & TIMESTAMP_TYPE_MASK for h in headers)
    assert [h.base_timestamp for h in headers] == [5, 7]  # the records' own deltas stay


def test_a_batch_dated_anew_keeps_its_records_and_their_deltas():
    built = encode_batch([Record(b"a", key=b"k", timestamp=5), Record(b"b", timestamp=9)])
    dated = bytearray(built)
    rb.set_create_time(dated, 1_796_000_000_000)
    header = validate_batch(dated, check_crc=False)
    assert (header.base_timestamp, header.max_timestamp) == (1_796_000_000_000, 1_796_000_000_004)
    assert dated[rb.HEADER_SIZE :] == built[rb.HEADER_SIZE :]
    struct.pack_into(">I", dated, 17, rb.crc32c(memoryview(dated)[rb.CRC_START :]))  # the caller's
    assert [(r.key, r.value, r.timestamp) for r in iter_records(dated)] == [
        (b"k", b"a", 1_796_000_000_000), (None, b"b", 1_796_000_000_004)]  # fmt: skip
