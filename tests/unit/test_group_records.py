"""__consumer_offsets records byte for byte against layouts hand-built from Kafka's JSON schemas,
Java's String.hashCode, the consumer protocol, and the error codes against kio's table."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from localcluster.group import errors
from localcluster.group.consumer_protocol import (
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    subscribed_topics,
)
from localcluster.group.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordDecodeError,
    UnknownKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    describe_record,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    java_string_hash,
    kafka_abs,
    partition_for,
)


def s16(text: str | None) -> bytes:  # STRING / NULLABLE_STRING: int16 length + UTF-8
    if text is None:
        return struct.pack(">h", -1)
    return struct.pack(">h", len(text.encode())) + text.encode()


def b32(data: bytes) -> bytes:  # BYTES: int32 length
    return struct.pack(">i", len(data)) + data


def cs(text: str | None) -> bytes:  # COMPACT_(NULLABLE_)STRING: uvarint(length + 1)
    return b"\x00" if text is None else bytes([len(text) + 1]) + text.encode()


# -- keys -------------------------------------------------------------------------------------


def test_offset_commit_key_v1_layout():
    expected = b"\x00\x01" + s16("my-group") + s16("topic") + struct.pack(">i", 7)
    assert encode_offset_commit_key("my-group", "topic", 7) == expected
    assert decode_key(expected) == OffsetCommitKey("my-group", "topic", 7, version=1)
    assert decode_key(b"\x00\x00" + expected[2:]) == OffsetCommitKey(
        "my-group", "topic", 7, version=0
    )


def test_group_metadata_key_v2_layout():
    expected = b"\x00\x02" + s16("my-group")
    assert encode_group_metadata_key("my-group") == expected
    assert decode_key(expected) == GroupMetadataKey("my-group")


def test_other_key_versions_are_unknown():
    assert decode_key(b"\x00\x03" + s16("g")) == UnknownKey(3)  # KIP-848 ConsumerGroupMetadataKey


# -- OffsetCommitValue ------------------------------------------------------------------------


def test_offset_commit_value_v3_layout():
    value = OffsetCommitValue(100, "meta", 1_700_000_000_000, leader_epoch=5, version=3)
    expected = (b"\x00\x03" + struct.pack(">q", 100) + struct.pack(">i", 5) + s16("meta")
                + struct.pack(">q", 1_700_000_000_000))  # fmt: skip
    assert encode_offset_commit_value(value) == expected
    assert decode_offset_commit_value(expected) == value


def test_offset_commit_value_v1_carries_the_expire_timestamp():
    value = OffsetCommitValue(1, "", 10, expire_timestamp=20, version=1)
    expected = (
        b"\x00\x01" + struct.pack(">q", 1) + s16("") + struct.pack(">q", 10) + struct.pack(">q", 20)
    )
    assert encode_offset_commit_value(value) == expected
    assert decode_offset_commit_value(expected) == value


def test_offset_commit_value_v0_and_v2_have_neither_epoch_nor_expiry():
    body = struct.pack(">q", 9) + s16("x") + struct.pack(">q", 33)
    for version in (0, 2):
        decoded = decode_offset_commit_value(struct.pack(">h", version) + body)
        assert (decoded.offset, decoded.metadata, decoded.commit_timestamp) == (9, "x", 33)
        assert (decoded.leader_epoch, decoded.expire_timestamp) == (-1, -1)


def test_offset_commit_value_v4_is_flexible():
    data = (b"\x00\x04" + struct.pack(">q", 9) + struct.pack(">i", 2) + cs("ab")
            + struct.pack(">q", 33) + b"\x01" + b"\x05\x02zz")  # one unknown tagged field  # fmt: skip
    assert decode_offset_commit_value(data) == OffsetCommitValue(9, "ab", 33, 2, -1, 4)


# -- GroupMetadataValue -----------------------------------------------------------------------


MEMBER = MemberMetadataValue("m-1", "client", "/127.0.0.1", 10_000, b"SUB", b"ASSIGN",
                             group_instance_id="i-1", rebalance_timeout=30_000)  # fmt: skip


def test_group_metadata_value_v3_layout():
    value = GroupMetadataValue("consumer", 4, "range", "m-1", (MEMBER,), 1_234, version=3)
    expected = (
        b"\x00\x03" + s16("consumer") + struct.pack(">i", 4) + s16("range") + s16("m-1")
        + struct.pack(">q", 1_234) + struct.pack(">i", 1)
        + s16("m-1") + s16("i-1") + s16("client") + s16("/127.0.0.1")
        + struct.pack(">i", 30_000) + struct.pack(">i", 10_000) + b32(b"SUB") + b32(b"ASSIGN")
    )  # fmt: skip
    assert encode_group_metadata_value(value) == expected
    assert decode_group_metadata_value(expected) == value


def test_empty_group_value_has_null_protocol_and_leader():
    value = GroupMetadataValue("consumer", 5, None, None, (), 99, version=3)
    expected = (
        b"\x00\x03"
        + s16("consumer")
        + struct.pack(">i", 5)
        + s16(None)
        + s16(None)
        + struct.pack(">q", 99)
        + struct.pack(">i", 0)
    )
    assert encode_group_metadata_value(value) == expected
    assert decode_group_metadata_value(expected) == value


def test_group_metadata_value_v0_has_no_timestamp_instance_or_rebalance_timeout():
    data = (b"\x00\x00" + s16("consumer") + struct.pack(">i", 1) + s16("range") + s16("m")
            + struct.pack(">i", 1) + s16("m") + s16("c") + s16("h") + struct.pack(">i", 6_000)
            + b32(b"s") + b32(b"a"))  # fmt: skip
    value = decode_group_metadata_value(data)
    assert value.current_state_timestamp == -1
    assert value.members == (MemberMetadataValue("m", "c", "h", 6_000, b"s", b"a", None, -1),)


def test_group_metadata_value_v4_is_flexible():
    data = (b"\x00\x04" + cs("consumer") + struct.pack(">i", 2) + cs("range") + cs(None)
            + struct.pack(">q", 7) + b"\x02"  # one member
            + cs("m") + cs(None) + cs("c") + cs("h") + struct.pack(">i", 1) + struct.pack(">i", 2)
            + b"\x02s" + b"\x01" + b"\x00"  # subscription "s", empty assignment, no tags
            + b"\x00")  # fmt: skip
    value = decode_group_metadata_value(data)
    assert (value.protocol, value.leader, value.current_state_timestamp) == ("range", None, 7)
    assert value.members == (MemberMetadataValue("m", "c", "h", 2, b"s", b"", None, 1),)


@given(st.sampled_from([0, 1, 2, 3, 4]), st.text(max_size=20), st.integers(-1, 2**31 - 1),
       st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=30)), max_size=3))  # fmt: skip
@settings(max_examples=60, deadline=None)
def test_group_metadata_values_round_trip_in_every_version(
    version, protocol_type, generation, members
):
    value = GroupMetadataValue(
        protocol_type, generation, "p", None,
        tuple(MemberMetadataValue(mid, "c", "h", 1, data, data[::-1],
                                  "i" if version >= 3 else None, 5 if version >= 1 else -1)
              for mid, data in members),
        current_state_timestamp=3 if version >= 2 else -1, version=version,
    )  # fmt: skip
    assert decode_group_metadata_value(encode_group_metadata_value(value)) == value


def test_truncated_and_unknown_versions_raise_decode_errors():
    good = encode_offset_commit_value(OffsetCommitValue(1, "m", 2))
    with pytest.raises(RecordDecodeError):
        decode_offset_commit_value(good[:-3])
    with pytest.raises(RecordDecodeError):
        decode_offset_commit_value(b"\x00\x09" + good[2:])
    with pytest.raises(RecordDecodeError):
        decode_group_metadata_value(b"\x00")


def test_describe_record_for_the_log_dump():
    sub = encode_subscription(Subscription(("orders",)))
    asg = encode_assignment(Assignment((("orders", (0, 1)),)))
    member = MemberMetadataValue("m-1", "c", "/h", 10, sub, asg, None, 20)
    text = describe_record(encode_group_metadata_key("g"),
                           encode_group_metadata_value(GroupMetadataValue("consumer", 3, "range", "m-1", (member,))))  # fmt: skip
    assert "group_metadata key(v2) group='g'" in text and "generation=3" in text
    assert "topics=[orders]" in text and "{orders: [0, 1]}" in text
    offset = describe_record(
        encode_offset_commit_key("g", "t", 0),
        encode_offset_commit_value(OffsetCommitValue(5, "", 7)),
    )
    assert offset == ("offset_commit key(v1) group='g' topic='t' partition=0 -> value(v3) offset=5 "
                      "leader_epoch=-1 metadata='' commit_timestamp=7")  # fmt: skip
    assert describe_record(encode_offset_commit_key("g", "t", 0), None).endswith("-> tombstone")
    assert describe_record(b"\x00", b"").startswith("undecodable")
    assert describe_record(b"\x00\x05xx", b"v").startswith("unknown key version 5")


# -- the group's partition --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", 0),
        ("a", 97),
        ("abc", 96354),
        ("hello", 99162322),
        ("Hello World", -862545276),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -(2**31)),  # Integer.MIN_VALUE
        ("\U0001f600", 55357 * 31 + 56832),  # a surrogate pair: two UTF-16 units
        ("é", 233),
    ],
)
def test_java_string_hash(text, expected):
    assert java_string_hash(text) == expected


def test_partition_for_uses_kafkas_abs():
    assert kafka_abs(-(2**31)) == 0 and kafka_abs(-1) == 2**31 - 1
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("hello", 50) == 99162322 % 50 == 22
    assert partition_for("Hello World", 50) == (-862545276 & 0x7FFFFFFF) % 50 == 22
    # "test-group" by hand: h = sum(c * 31^(n-1-i)) mod 2^32, as a signed int
    h = 0
    for c in "test-group":
        h = (h * 31 + ord(c)) % 2**32
    assert java_string_hash("test-group") == (h - 2**32 if h >= 2**31 else h)
    assert partition_for("test-group", 50) == (h & 0x7FFFFFFF) % 50


# -- the consumer protocol --------------------------------------------------------------------


def test_subscription_v3_layout_and_v0_prefix_parsing():
    sub = Subscription(("a", "b"), b"ud", (("a", (0, 2)),), 7, "rack", version=3)
    expected = (b"\x00\x03" + struct.pack(">i", 2) + s16("a") + s16("b") + b32(b"ud")
                + struct.pack(">i", 1) + s16("a") + struct.pack(">iii", 2, 0, 2)
                + struct.pack(">i", 7) + s16("rack"))  # fmt: skip
    assert encode_subscription(sub) == expected
    assert decode_subscription(expected) == sub
    assert subscribed_topics(expected) == {"a", "b"}
    assert subscribed_topics(b"\x00\x09" + expected[2:] + b"future") == {"a", "b"}
    with pytest.raises(ConsumerProtocolError):
        subscribed_topics(b"\x00\x00\x00\x00\x00\x05")


def test_assignment_round_trip():
    asg = Assignment((("t", (1, 2)), ("u", ())), None, version=0)
    assert decode_assignment(encode_assignment(asg)) == asg


# -- error codes ------------------------------------------------------------------------------


def test_error_codes_are_kafkas():
    for name, code in vars(errors).items():
        if name.isupper() and isinstance(code, int):
            assert ErrorCode[name.lower()].value == code, name


def test_append_error_mappings():
    assert errors.group_append_error(errors.NOT_LEADER_OR_FOLLOWER) == errors.NOT_COORDINATOR
    assert errors.group_append_error(errors.REQUEST_TIMED_OUT) == errors.REBALANCE_IN_PROGRESS
    assert errors.group_append_error(errors.RECORD_LIST_TOO_LARGE) == errors.UNKNOWN_SERVER_ERROR
    assert (
        errors.offset_commit_append_error(errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
        == errors.COORDINATOR_NOT_AVAILABLE
    )
    assert (
        errors.offset_commit_append_error(errors.NETWORK_EXCEPTION)
        == errors.COORDINATOR_LOAD_IN_PROGRESS
    )
    assert (
        errors.operation_append_error(errors.REQUEST_TIMED_OUT) == errors.COORDINATOR_NOT_AVAILABLE
    )
