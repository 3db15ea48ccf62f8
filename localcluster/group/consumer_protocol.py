"""The consumer protocol's embedded bytes: ConsumerProtocolSubscription and ConsumerProtocolAssignment.

Groups whose protocol type is "consumer" carry these opaque to the coordinator, in JoinGroup's
protocol metadata and SyncGroup's assignments (clients/src/main/resources/common/message/
ConsumerProtocol{Subscription,Assignment}.json, v0-v3, never flexible, an int16 version first).
The coordinator reads only the subscribed topics, for OffsetDelete's GROUP_SUBSCRIBED_TO_TOPIC and
for offsets retention, and it reads them as Kafka does: with the v0 layout, which prefixes every
later version, so a newer client's subscription still parses. Malformed bytes raise
ConsumerProtocolError; the caller then treats the topics as unknown.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

CONSUMER_PROTOCOL_TYPE = "consumer"
HIGHEST_VERSION = 3

_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")


class ConsumerProtocolError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Subscription:
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[tuple[str, tuple[int, ...]], ...] = ()  # v1+
    generation_id: int = -1  # v2+
    rack_id: str | None = None  # v3+
    version: int = HIGHEST_VERSION


@dataclass(frozen=True, slots=True)
class Assignment:
    assigned_partitions: tuple[tuple[str, tuple[int, ...]], ...]
    user_data: bytes | None = None
    version: int = HIGHEST_VERSION


class _Reader:
    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise ConsumerProtocolError(f"truncated at byte {self.pos}")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int16(self) -> int:
        return _I16.unpack(self.take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self.take(4))[0]

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n < 0:
            return None
        try:
            return bytes(self.take(n)).decode()
        except UnicodeDecodeError as e:
            raise ConsumerProtocolError("a string is not UTF-8") from e

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise ConsumerProtocolError("null in a non-nullable string")
        return value

    def nullable_bytes(self) -> bytes | None:
        n = self.int32()
        return None if n < 0 else bytes(self.take(n))

    def count(self) -> int:
        n = self.int32()
        if n < 0 or n > len(self.data) - self.pos:  # each element is at least one byte
            raise ConsumerProtocolError(f"bad array length {n}")
        return n

    def topic_partitions(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        result = []
        for _ in range(self.count()):
            topic = self.string()
            result.append((topic, tuple(self.int32() for _ in range(self.count()))))
        return tuple(result)


def decode_subscription(data: bytes) -> Subscription:
    r = _Reader(data)
    version = r.int16()
    if version < 0:
        raise ConsumerProtocolError(f"negative subscription version {version}")
    topics = tuple(r.string() for _ in range(r.count()))
    user_data = r.nullable_bytes()
    # a version above ours parses as ours: later versions only append fields
    owned = r.topic_partitions() if version >= 1 else ()
    generation_id = r.int32() if version >= 2 else -1
    rack_id = r.nullable_string() if version >= 3 else None
    return Subscription(topics, user_data, owned, generation_id, rack_id, version)


def subscribed_topics(data: bytes) -> frozenset[str]:
    """The topics of a subscription read with the v0 layout (Kafka's computeSubscribedTopics)."""
    r = _Reader(data)
    r.int16()
    return frozenset(r.string() for _ in range(r.count()))


def decode_assignment(data: bytes) -> Assignment:
    r = _Reader(data)
    version = r.int16()
    if version < 0:
        raise ConsumerProtocolError(f"negative assignment version {version}")
    return Assignment(r.topic_partitions(), r.nullable_bytes(), version)


def encode_subscription(subscription: Subscription) -> bytes:
    v = min(subscription.version, HIGHEST_VERSION)
    out = bytearray(_I16.pack(v))
    out += _I32.pack(len(subscription.topics))
    for topic in subscription.topics:
        _string(out, topic)
    _nullable_bytes(out, subscription.user_data)
    if v >= 1:
        _topic_partitions(out, subscription.owned_partitions)
    if v >= 2:
        out += _I32.pack(subscription.generation_id)
    if v >= 3:
        _string(out, subscription.rack_id)
    return bytes(out)


def encode_assignment(assignment: Assignment) -> bytes:
    out = bytearray(_I16.pack(min(assignment.version, HIGHEST_VERSION)))
    _topic_partitions(out, assignment.assigned_partitions)
    _nullable_bytes(out, assignment.user_data)
    return bytes(out)


def describe_subscription(data: bytes) -> str | None:
    try:
        return "topics=[" + ",".join(decode_subscription(data).topics) + "]"
    except ConsumerProtocolError:
        return None


def describe_assignment(data: bytes) -> str | None:
    if not data:
        return None
    try:
        parts = decode_assignment(data).assigned_partitions
    except ConsumerProtocolError:
        return None
    return "{" + ", ".join(f"{t}: {list(p)}" for t, p in parts) + "}"


def _string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += _I16.pack(-1)
        return
    data = value.encode()
    out += _I16.pack(len(data)) + data


def _nullable_bytes(out: bytearray, value: bytes | None) -> None:
    out += _I32.pack(-1 if value is None else len(value))
    if value is not None:
        out += value


def _topic_partitions(out: bytearray, parts: tuple[tuple[str, tuple[int, ...]], ...]) -> None:
    out += _I32.pack(len(parts))
    for topic, partitions in parts:
        _string(out, topic)
        out += _I32.pack(len(partitions))
        for p in partitions:
            out += _I32.pack(p)
