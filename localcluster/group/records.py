"""The records of `__consumer_offsets`: Kafka's key and value layouts, versioned, big-endian.

A record's key starts with an int16 version that says what the record is (Kafka's
group-coordinator/src/main/resources/common/message/*.json):
- key version 0 or 1: OffsetCommitKey (group, topic, partition) -> OffsetCommitValue v0-v4;
- key version 2: GroupMetadataKey (group) -> GroupMetadataValue v0-v4;
- a null value is a tombstone: the offset, or the whole group, is deleted.
Higher key versions are the new (KIP-848) coordinator's records: decoded as `UnknownKey` and
skipped on replay, as Kafka's ZooKeeper-era loader does.

Written versions are those Kafka 3.x writes (MetadataVersion 3.x): key 1 for offsets, key 2 for
groups, OffsetCommitValue 3 (1 when the commit carries an expire timestamp, OffsetCommit v2-v4's
retention_time_ms) and GroupMetadataValue 3. Every version Kafka may have written is decoded,
including the flexible v4 values (compact strings, tagged fields).

Also here: `partition_for(group_id, n)`, Kafka's `Utils.abs(groupId.hashCode) % n` with Java's
String.hashCode over UTF-16 code units, and `describe_record` for `localcluster log dump`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRE = 1
GROUP_METADATA_VALUE_VERSION = 3
HIGHEST_VALUE_VERSION = 4  # both value schemas: 0-4, flexible from 4
NO_TIMESTAMP = -1
NO_LEADER_EPOCH = -1

_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


class RecordDecodeError(ValueError):
    """Bytes that are not a valid record of __consumer_offsets (truncated, unknown value version)."""


# -- partition of a group ---------------------------------------------------------------------


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: h = 31*h + c over UTF-16 code units, as a signed 32-bit int."""
    units = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_abs(n: int) -> int:
    """Kafka's Utils.abs: n & 0x7fffffff (Int.MinValue maps to 0, not to itself)."""
    return n & 0x7FFFFFFF


def partition_for(group_id: str, num_partitions: int) -> int:
    assert num_partitions > 0
    return kafka_abs(java_string_hash(group_id)) % num_partitions


# -- the records ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int
    version: int = OFFSET_COMMIT_KEY_VERSION


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str
    version: int = GROUP_METADATA_KEY_VERSION


@dataclass(frozen=True, slots=True)
class UnknownKey:
    version: int


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    metadata: str
    commit_timestamp: int
    leader_epoch: int = NO_LEADER_EPOCH  # v3+
    expire_timestamp: int = NO_TIMESTAMP  # v1 only
    version: int = OFFSET_COMMIT_VALUE_VERSION


@dataclass(frozen=True, slots=True)
class MemberMetadataValue:
    member_id: str
    client_id: str
    client_host: str
    session_timeout: int
    subscription: bytes
    assignment: bytes
    group_instance_id: str | None = None  # v3+
    rebalance_timeout: int = -1  # v1+ (v0 readers use the session timeout)


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    members: tuple[MemberMetadataValue, ...] = ()
    current_state_timestamp: int = NO_TIMESTAMP  # v2+
    version: int = GROUP_METADATA_VALUE_VERSION


@dataclass(frozen=True, slots=True)
class CoordinatorRecord:
    """One record for the runtime to append to __consumer_offsets: key and value bytes."""

    key: bytes
    value: bytes | None  # None: a tombstone


# -- primitive writer and reader (classic and flexible encodings) ------------------------------


class _Writer:
    def __init__(self, flexible: bool):
        self.out = bytearray()
        self.flexible = flexible

    def int16(self, v: int) -> None:
        self.out += _I16.pack(v)

    def int32(self, v: int) -> None:
        self.out += _I32.pack(v)

    def int64(self, v: int) -> None:
        self.out += _I64.pack(v)

    def uvarint(self, v: int) -> None:
        while v >= 0x80:
            self.out.append(v & 0x7F | 0x80)
            v >>= 7
        self.out.append(v)

    def _length(self, n: int, classic: struct.Struct) -> None:
        # flexible versions write length + 1 as an unsigned varint (0 is null)
        if self.flexible:
            self.uvarint(n + 1)
        else:
            self.out += classic.pack(n)

    def string(self, v: str | None) -> None:
        if v is None:
            self._length(-1, _I16)
            return
        data = v.encode()
        assert len(data) <= 0x7FFF, "a Kafka string holds at most 32767 bytes"
        self._length(len(data), _I16)
        self.out += data

    def bytes_(self, v: bytes) -> None:
        self._length(len(v), _I32)
        self.out += v

    def array_length(self, n: int) -> None:
        self._length(n, _I32)

    def tagged_fields(self) -> None:
        if self.flexible:
            self.uvarint(0)


class _Reader:
    def __init__(self, buf: bytes, flexible: bool, what: str):
        self.buf = memoryview(buf)
        self.pos = 0
        self.flexible = flexible
        self.what = what

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise RecordDecodeError(f"{self.what}: truncated at byte {self.pos}")
        chunk = self.buf[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _I64.unpack(self._take(8))[0]

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise RecordDecodeError(f"{self.what}: varint too long at byte {self.pos}")

    def nullable_string(self) -> str | None:
        n = self.uvarint() - 1 if self.flexible else self.int16()
        if n < 0:
            return None
        try:
            return bytes(self._take(n)).decode()
        except UnicodeDecodeError as e:
            raise RecordDecodeError(f"{self.what}: string is not UTF-8") from e

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise RecordDecodeError(f"{self.what}: null in a non-nullable string")
        return value

    def bytes_(self) -> bytes:
        n = self.uvarint() - 1 if self.flexible else self.int32()
        if n < 0:
            raise RecordDecodeError(f"{self.what}: null in a non-nullable bytes field")
        return bytes(self._take(n))

    def array_length(self) -> int:
        n = self.uvarint() - 1 if self.flexible else self.int32()
        if n < 0 or n > len(self.buf) - self.pos:  # every element takes at least one byte
            raise RecordDecodeError(f"{self.what}: bad array length {n}")
        return n

    def tagged_fields(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()  # tag
                self._take(self.uvarint())


# -- keys -------------------------------------------------------------------------------------


def encode_offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    w = _Writer(flexible=False)
    w.int16(OFFSET_COMMIT_KEY_VERSION)
    w.string(group)
    w.string(topic)
    w.int32(partition)
    return bytes(w.out)


def encode_group_metadata_key(group: str) -> bytes:
    w = _Writer(flexible=False)
    w.int16(GROUP_METADATA_KEY_VERSION)
    w.string(group)
    return bytes(w.out)


def decode_key(key: bytes) -> OffsetCommitKey | GroupMetadataKey | UnknownKey:
    r = _Reader(key, flexible=False, what="record key")
    version = r.int16()
    if version in (0, 1):
        return OffsetCommitKey(r.string(), r.string(), r.int32(), version)
    if version == 2:
        return GroupMetadataKey(r.string(), version)
    return UnknownKey(version)


# -- OffsetCommitValue ------------------------------------------------------------------------


def encode_offset_commit_value(value: OffsetCommitValue) -> bytes:
    v = value.version
    assert 0 <= v <= HIGHEST_VALUE_VERSION, v
    w = _Writer(flexible=v >= 4)
    w.int16(v)
    w.int64(value.offset)
    if v >= 3:
        w.int32(value.leader_epoch)
    w.string(value.metadata)
    w.int64(value.commit_timestamp)
    if v == 1:
        w.int64(value.expire_timestamp)
    w.tagged_fields()
    return bytes(w.out)


def decode_offset_commit_value(data: bytes) -> OffsetCommitValue:
    version = _value_version(data, "OffsetCommitValue")
    r = _Reader(data, flexible=version >= 4, what=f"OffsetCommitValue v{version}")
    r.pos = 2
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else NO_LEADER_EPOCH
    metadata = r.string()
    commit_timestamp = r.int64()
    expire_timestamp = r.int64() if version == 1 else NO_TIMESTAMP
    r.tagged_fields()
    return OffsetCommitValue(
        offset, metadata, commit_timestamp, leader_epoch, expire_timestamp, version
    )


# -- GroupMetadataValue -----------------------------------------------------------------------


def encode_group_metadata_value(value: GroupMetadataValue) -> bytes:
    v = value.version
    assert 0 <= v <= HIGHEST_VALUE_VERSION, v
    w = _Writer(flexible=v >= 4)
    w.int16(v)
    w.string(value.protocol_type)
    w.int32(value.generation)
    w.string(value.protocol)
    w.string(value.leader)
    if v >= 2:
        w.int64(value.current_state_timestamp)
    w.array_length(len(value.members))
    for member in value.members:
        w.string(member.member_id)
        if v >= 3:
            w.string(member.group_instance_id)
        w.string(member.client_id)
        w.string(member.client_host)
        if v >= 1:
            w.int32(member.rebalance_timeout)
        w.int32(member.session_timeout)
        w.bytes_(member.subscription)
        w.bytes_(member.assignment)
        w.tagged_fields()
    w.tagged_fields()
    return bytes(w.out)


def decode_group_metadata_value(data: bytes) -> GroupMetadataValue:
    version = _value_version(data, "GroupMetadataValue")
    r = _Reader(data, flexible=version >= 4, what=f"GroupMetadataValue v{version}")
    r.pos = 2
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    current_state_timestamp = r.int64() if version >= 2 else NO_TIMESTAMP
    members = tuple(_decode_member(r, version) for _ in range(r.array_length()))
    r.tagged_fields()
    return GroupMetadataValue(
        protocol_type, generation, protocol, leader, members, current_state_timestamp, version
    )


def _decode_member(r: _Reader, version: int) -> MemberMetadataValue:
    member_id = r.string()
    group_instance_id = r.nullable_string() if version >= 3 else None
    client_id = r.string()
    client_host = r.string()
    rebalance_timeout = r.int32() if version >= 1 else -1
    session_timeout = r.int32()
    subscription = r.bytes_()
    assignment = r.bytes_()
    r.tagged_fields()
    return MemberMetadataValue(
        member_id,
        client_id,
        client_host,
        session_timeout,
        subscription,
        assignment,
        group_instance_id,
        rebalance_timeout,
    )


def _value_version(data: bytes, what: str) -> int:
    if len(data) < 2:
        raise RecordDecodeError(f"{what}: {len(data)} bytes, no version")
    version = _I16.unpack_from(data)[0]
    if not 0 <= version <= HIGHEST_VALUE_VERSION:
        raise RecordDecodeError(f"{what}: unknown version {version}")
    return version


# -- building the coordinator's records --------------------------------------------------------


def offset_commit_record(
    group: str, topic: str, partition: int, value: OffsetCommitValue
) -> CoordinatorRecord:
    return CoordinatorRecord(
        encode_offset_commit_key(group, topic, partition), encode_offset_commit_value(value)
    )


def offset_commit_tombstone(group: str, topic: str, partition: int) -> CoordinatorRecord:
    return CoordinatorRecord(encode_offset_commit_key(group, topic, partition), None)


def group_metadata_record(group: str, value: GroupMetadataValue) -> CoordinatorRecord:
    return CoordinatorRecord(encode_group_metadata_key(group), encode_group_metadata_value(value))


def group_metadata_tombstone(group: str) -> CoordinatorRecord:
    return CoordinatorRecord(encode_group_metadata_key(group), None)


# -- decoding whole records, for replay and for the log dump -----------------------------------

DecodedValue = OffsetCommitValue | GroupMetadataValue | None


def decode_record(
    key: bytes | None, value: bytes | None
) -> tuple[OffsetCommitKey | GroupMetadataKey | UnknownKey, DecodedValue]:
    """The key and value of one record; the value is None for a tombstone or an unknown key."""
    if key is None:
        raise RecordDecodeError("a __consumer_offsets record without a key")
    decoded_key = decode_key(key)
    if value is None or isinstance(decoded_key, UnknownKey):
        return decoded_key, None
    if isinstance(decoded_key, OffsetCommitKey):
        return decoded_key, decode_offset_commit_value(value)
    return decoded_key, decode_group_metadata_value(value)


def describe_record(key: bytes | None, value: bytes | None) -> str:
    """One line for a log dump; never raises (a bad record is described as such)."""
    try:
        decoded_key, decoded_value = decode_record(key, value)
    except RecordDecodeError as e:
        return f"undecodable __consumer_offsets record: {e}"
    if isinstance(decoded_key, UnknownKey):
        return f"unknown key version {decoded_key.version} (not a classic group record)"
    if isinstance(decoded_key, OffsetCommitKey):
        head = (
            f"offset_commit key(v{decoded_key.version}) group={decoded_key.group!r} "
            f"topic={decoded_key.topic!r} partition={decoded_key.partition}"
        )
    else:
        head = f"group_metadata key(v{decoded_key.version}) group={decoded_key.group!r}"
    if value is None:
        return f"{head} -> tombstone"
    if isinstance(decoded_value, OffsetCommitValue):
        return f"{head} -> {_describe_offset(decoded_value)}"
    assert isinstance(decoded_value, GroupMetadataValue)
    return f"{head} -> {_describe_group(decoded_value)}"


def _describe_offset(v: OffsetCommitValue) -> str:
    text = (
        f"value(v{v.version}) offset={v.offset} leader_epoch={v.leader_epoch} "
        f"metadata={v.metadata!r} commit_timestamp={v.commit_timestamp}"
    )
    if v.expire_timestamp != NO_TIMESTAMP:
        text += f" expire_timestamp={v.expire_timestamp}"
    return text


def _describe_group(v: GroupMetadataValue) -> str:
    from localcluster.group.consumer_protocol import describe_assignment, describe_subscription

    consumer = v.protocol_type == "consumer"
    members = []
    for m in v.members:
        subscription = describe_subscription(m.subscription) if consumer else None
        assignment = describe_assignment(m.assignment) if consumer else None
        members.append(
            f"{{member_id={m.member_id!r} group_instance_id={m.group_instance_id!r} "
            f"client_id={m.client_id!r} client_host={m.client_host!r} "
            f"rebalance_timeout={m.rebalance_timeout} session_timeout={m.session_timeout} "
            f"subscription={subscription or f'{len(m.subscription)}B'} "
            f"assignment={assignment or f'{len(m.assignment)}B'}}}"
        )
    return (
        f"value(v{v.version}) protocol_type={v.protocol_type!r} generation={v.generation} "
        f"protocol={v.protocol!r} leader={v.leader!r} "
        f"current_state_timestamp={v.current_state_timestamp} members=[{', '.join(members)}]"
    )
