"""protocol.wire: Reader's bounds (any bad input is MalformedRequestError, never IndexError or
struct.error) and Writer/Reader round trips of Kafka's primitive types."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.protocol.wire import MAX_ARRAY_LENGTH, MalformedRequestError, Reader, Writer

FAST = settings(max_examples=300, deadline=None)

READS = ["int8", "int16", "int32", "int64", "uvarint", "string", "nullable_string",
         "compact_nullable_string", "nullable_bytes", "array_length", "int32_array",
         "skip_tagged_fields"]  # fmt: skip


@pytest.mark.parametrize("method, size", [("int8", 1), ("int16", 2), ("int32", 4), ("int64", 8)])
def test_fixed_width_reads_past_the_end_are_malformed(method, size):
    for available in range(size):
        reader = Reader(b"\x01" * available)
        with pytest.raises(MalformedRequestError):
            getattr(reader, method)()
        assert reader.pos == 0, "a failed read must not move the position"
    reader = Reader(b"\x01" * size)
    getattr(reader, method)()
    assert reader.remaining() == 0


def test_a_string_longer_than_the_frame_is_malformed():
    with pytest.raises(MalformedRequestError, match="runs past"):
        Reader(struct.pack(">h", 10) + b"abc").string()


def test_a_null_string_where_one_is_required_is_malformed():
    with pytest.raises(MalformedRequestError, match="null"):
        Reader(struct.pack(">h", -1)).string()
    assert Reader(struct.pack(">h", -1)).nullable_string() is None


def test_invalid_utf8_is_malformed_not_unicode_error():
    with pytest.raises(MalformedRequestError, match="UTF-8"):
        Reader(struct.pack(">h", 2) + b"\xff\xfe").string()
    with pytest.raises(MalformedRequestError, match="UTF-8"):
        Reader(b"\x03\xc3\x28").compact_nullable_string()


def test_bytes_longer_than_the_frame_and_negative_raw_lengths_are_malformed():
    with pytest.raises(MalformedRequestError):
        Reader(struct.pack(">i", 5) + b"abcd").nullable_bytes()
    with pytest.raises(MalformedRequestError):
        Reader(b"abcd").raw(-1)
    assert Reader(struct.pack(">i", -1)).nullable_bytes() is None
    assert bytes(Reader(struct.pack(">i", 0)).nullable_bytes()) == b""


def test_array_lengths_must_fit_the_frame():
    # Every element takes at least one byte, so a count above the bytes left is a lie.
    with pytest.raises(MalformedRequestError, match="cannot fit"):
        Reader(struct.pack(">i", 5) + b"\x00" * 4).array_length()
    with pytest.raises(MalformedRequestError):
        Reader(
            struct.pack(">i", MAX_ARRAY_LENGTH + 1) + b"\x00" * (MAX_ARRAY_LENGTH + 1)
        ).array_length()
    assert Reader(struct.pack(">i", 3) + b"\x00" * 3).array_length() == 3
    assert Reader(struct.pack(">i", -1)).array_length() == 0  # a null array reads as empty


def test_an_int32_array_must_fit_the_frame_whole():
    # 3 elements pass array_length's one-byte-each check, but need 12 bytes
    with pytest.raises(MalformedRequestError, match="array of 3 int32 at 4 runs past the frame"):
        Reader(struct.pack(">i", 3) + b"\x00" * 5).int32_array()
    assert Reader(struct.pack(">3i", 2, -1, 7)).int32_array() == (-1, 7)
    assert Reader(struct.pack(">i", -1)).int32_array() == ()


def test_uvarints_longer_than_five_bytes_or_cut_short_are_malformed():
    with pytest.raises(MalformedRequestError, match="longer than 5"):
        Reader(b"\x80" * 6 + b"\x01").uvarint()
    with pytest.raises(MalformedRequestError, match="past the end"):
        Reader(b"\x80\x80").uvarint()
    assert Reader(b"\xff\xff\xff\xff\x0f").uvarint() == 2**32 - 1


def test_tagged_fields_are_skipped_and_bounded():
    w = Writer().uvarint(2).uvarint(0).uvarint(3).bytes(b"abc").uvarint(7).uvarint(0).int8(42)
    reader = Reader(w.getvalue())
    reader.skip_tagged_fields()
    assert reader.int8() == 42
    with pytest.raises(MalformedRequestError):
        Reader(
            Writer().uvarint(1).uvarint(0).uvarint(50).bytes(b"short").getvalue()
        ).skip_tagged_fields()


@FAST
@given(data=st.binary(max_size=64), reads=st.lists(st.sampled_from(READS), min_size=1, max_size=12))
def test_any_sequence_of_reads_over_any_bytes_fails_only_as_malformed(data, reads):
    reader = Reader(data)
    for name in reads:
        before = reader.pos
        try:
            getattr(reader, name)()
        except MalformedRequestError:
            return
        assert before <= reader.pos <= len(data)


values = st.one_of(
    st.tuples(st.just("int8"), st.integers(-(2**7), 2**7 - 1)),
    st.tuples(st.just("int16"), st.integers(-(2**15), 2**15 - 1)),
    st.tuples(st.just("int32"), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just("int64"), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("uvarint"), st.integers(0, 2**32 - 1)),
    st.tuples(st.just("string"), st.text(max_size=40)),
    st.tuples(st.just("nullable_string"), st.none() | st.text(max_size=40)),
    st.tuples(
        st.just("int32_array"), st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8).map(tuple)
    ),
)


@FAST
@given(items=st.lists(values, max_size=20))
def test_writer_then_reader_round_trips(items):
    w = Writer()
    for kind, value in items:
        getattr(w, kind)(value)
    reader = Reader(w.getvalue())
    assert [(kind, getattr(reader, kind)()) for kind, _ in items] == items
    assert reader.remaining() == 0


def test_writer_uint32_and_big_endianness():
    assert Writer().uint32(0xDEADBEEF).int16(-2).getvalue() == b"\xde\xad\xbe\xef\xff\xfe"
    assert Writer().uvarint(300).getvalue() == b"\xac\x02"
