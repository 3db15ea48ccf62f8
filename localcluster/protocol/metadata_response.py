"""Metadata responses written directly, for the versions the broker serves (0-8).

The same bytes as kio's generic writer (messages.encode_response) for the same dict, with the
same defaults for what the dict leaves out; tests/unit/test_metadata_response.py holds them
equal for every version. Why a writer of its own: the generic one builds a dataclass per
partition and writes it field by field, about 10 us a partition, so one answer for a topic of
10,000 partitions took 70-120 ms of a broker's event loop, and clients (and bench.scaling's
failover poll) ask again while a failover runs. This one packs each partition with struct.

Layout (Kafka's MetadataResponse.json, non-flexible versions):
    [throttle_time_ms int32 (v3+)]
    brokers [node_id int32, host string, port int32, rack nullable_string (v1+)]
    [cluster_id nullable_string (v2+)] [controller_id int32 (v1+)]
    topics [error_code int16, name string, is_internal bool (v1+),
            partitions [error_code int16, partition_index int32, leader_id int32,
                        leader_epoch int32 (v7+), replica_nodes [int32], isr_nodes [int32],
                        offline_replicas [int32] (v5+)],
            topic_authorized_operations int32 (v8+)]
    [cluster_authorized_operations int32 (v8+)]
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

MAX_VERSION = 8
AUTHORIZED_OPERATIONS_UNKNOWN = -(1 << 31)  # Kafka's default: not asked for

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">hii")  # error_code, partition_index, leader_id
_ARRAYS: dict[int, struct.Struct] = {}  # an int32 array of n elements, with its length


def _int32_array(values: Sequence[int]) -> bytes:
    n = len(values)
    packer = _ARRAYS.get(n)
    if packer is None:
        packer = _ARRAYS[n] = struct.Struct(f">i{n}i")
    return packer.pack(n, *values)


def _string(out: bytearray, value: str) -> None:
    raw = value.encode()
    out += _INT16.pack(len(raw))
    out += raw


def _nullable_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += _INT16.pack(-1)
    else:
        _string(out, value)


def encode(version: int, data: Mapping) -> bytes:
    """The body of a Metadata response of `version` (0-8) for `data`, a dict of the schema's
    field names as messages.encode_response takes it."""
    if not 0 <= version <= MAX_VERSION:
        raise ValueError(f"Metadata response version {version} is not 0-{MAX_VERSION}")
    out = bytearray()
    if version >= 3:
        out += _INT32.pack(data.get("throttle_time", 0))
    brokers = data.get("brokers", ())
    out += _INT32.pack(len(brokers))
    for broker in brokers:
        out += _INT32.pack(broker.get("node_id", 0))
        _string(out, broker.get("host", ""))
        out += _INT32.pack(broker.get("port", 0))
        if version >= 1:
            _nullable_string(out, broker.get("rack"))
    if version >= 2:
        _nullable_string(out, data.get("cluster_id"))
    if version >= 1:
        out += _INT32.pack(data.get("controller_id", -1))
    topics = data.get("topics", ())
    out += _INT32.pack(len(topics))
    for topic in topics:
        out += _INT16.pack(topic.get("error_code", 0))
        _string(out, topic.get("name", ""))
        if version >= 1:
            out.append(1 if topic.get("is_internal", False) else 0)
        partitions = topic.get("partitions", ())
        out += _INT32.pack(len(partitions))
        for p in partitions:
            out += _PARTITION_HEAD.pack(p.get("error_code", 0), p.get("partition_index", 0),
                                        p.get("leader_id", 0))  # fmt: skip
            if version >= 7:
                out += _INT32.pack(p.get("leader_epoch", -1))
            out += _int32_array(p.get("replica_nodes", ()))
            out += _int32_array(p.get("isr_nodes", ()))
            if version >= 5:
                out += _int32_array(p.get("offline_replicas", ()))
        if version >= 8:
            out += _INT32.pack(
                topic.get("topic_authorized_operations", AUTHORIZED_OPERATIONS_UNKNOWN)
            )
    if version >= 8:
        out += _INT32.pack(data.get("cluster_authorized_operations", AUTHORIZED_OPERATIONS_UNKNOWN))
    return bytes(out)
