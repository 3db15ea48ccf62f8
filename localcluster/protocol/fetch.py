"""Fetch v4-v11, hand-written: the response's record bytes go out with os.sendfile.

Request:  replica_id int32, max_wait_ms int32, min_bytes int32, max_bytes int32,
          isolation_level int8, session_id int32 + session_epoch int32 (v7+),
          [topic string, [partition int32, current_leader_epoch int32 (v9+), fetch_offset int64,
          log_start_offset int64 (v5+), partition_max_bytes int32]],
          forgotten_topics [topic string, [partition int32]] (v7+), rack_id string (v11+)
          (session_id, session_epoch and forgotten_topics: KIP-227, protocol/incremental_fetch.py)
Response: throttle_time_ms int32, error_code int16 + session_id int32 (v7+),
          [topic string, [partition int32, error_code int16, high_watermark int64,
          last_stable_offset int64, log_start_offset int64 (v5+),
          aborted_transactions nullable [producer_id int64, first_offset int64],
          preferred_read_replica int32 (v11+), records nullable_bytes]]

`write_fetch_response` returns a list of parts: bytes, and the storage's FileSlices in place
of record bytes, for the network layer to send in order without copying the records.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from localcluster.protocol.wire import Reader, Writer

CONSUMER_REPLICA_ID = -1
NO_SESSION_ID = 0
FINAL_EPOCH = -1
FETCH_VERSIONS = range(4, 12)


@dataclass(slots=True)
class FetchPartition:
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    log_start_offset: int = -1


@dataclass(slots=True)
class FetchRequest:
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    topics: list[tuple[str, list[FetchPartition]]]
    session_id: int = NO_SESSION_ID
    session_epoch: int = FINAL_EPOCH
    rack_id: str = ""
    forgotten: list[tuple[str, list[int]]] = field(default_factory=list)  # KIP-227 (v7+)


@dataclass(slots=True)
class FetchPartitionResponse:
    partition: int
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: list = field(default_factory=list)  # bytes-like or FileSlice parts

    @property
    def records_size(self) -> int:
        return sum(len(r) if not hasattr(r, "length") else r.length for r in self.records)


def _request_partition(version: int) -> struct.Struct:
    """A request partition's fixed fields: partition, [current_leader_epoch (v9+)],
    fetch_offset, [log_start_offset (v5+)], partition_max_bytes."""
    return struct.Struct(">i" + ("i" if version >= 9 else "") + "q"
                         + ("q" if version >= 5 else "") + "i")  # fmt: skip


def _response_partition_head(version: int) -> struct.Struct:
    """A response partition's fields before its aborted transactions: partition, error_code,
    high_watermark, last_stable_offset, [log_start_offset (v5+)], the aborted count."""
    return struct.Struct(">ihqq" + ("q" if version >= 5 else "") + "i")


def _response_partition_tail(version: int) -> struct.Struct:
    """After the aborted transactions: [preferred_read_replica (v11+)], the records' size."""
    return struct.Struct(">" + ("i" if version >= 11 else "") + "i")


# Each partition's fixed fields go through one struct (one bounds check, one (un)pack): the
# follower's fetch loop codes a request and a response per round on both ends.
_REQUEST_PARTITION = {v: _request_partition(v) for v in FETCH_VERSIONS}
_RESPONSE_HEAD = {v: _response_partition_head(v) for v in FETCH_VERSIONS}
_RESPONSE_TAIL = {v: _response_partition_tail(v) for v in FETCH_VERSIONS}
_ABORTED_TRANSACTION = struct.Struct(">qq")
_REQUEST_HEAD = struct.Struct(">iiiib")
_SESSION = struct.Struct(">ii")
_RESPONSE_SESSION = struct.Struct(">ihi")


def read_fetch_request(reader: Reader, version: int) -> FetchRequest:
    replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level = reader.fields(_REQUEST_HEAD)
    session_id, session_epoch = NO_SESSION_ID, FINAL_EPOCH
    if version >= 7:
        session_id, session_epoch = reader.fields(_SESSION)
    block, with_epoch, with_start = _REQUEST_PARTITION[version], version >= 9, version >= 5
    topics = []
    for _ in range(reader.array_length()):
        name = reader.string()
        partitions = []
        for _ in range(reader.array_length()):
            values = reader.fields(block)
            if with_epoch:  # v9+: partition, epoch, fetch offset, log start, max bytes
                partitions.append(FetchPartition(values[0], values[2], values[4], values[1],
                                                 values[3]))  # fmt: skip
            elif with_start:  # v5-v8: partition, fetch offset, log start, max bytes
                partitions.append(FetchPartition(values[0], values[1], values[3], -1, values[2]))
            else:  # v4: partition, fetch offset, max bytes
                partitions.append(FetchPartition(values[0], values[1], values[2]))
        topics.append((name, partitions))
    forgotten = []
    if version >= 7:
        for _ in range(reader.array_length()):
            name = reader.string()
            forgotten.append((name, [reader.int32() for _ in range(reader.array_length())]))
    rack_id = reader.string() if version >= 11 else ""
    return FetchRequest(replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level, topics,
                        session_id, session_epoch, rack_id, forgotten)  # fmt: skip


def write_fetch_request(request: FetchRequest, version: int) -> bytes:
    w = Writer().fields(_REQUEST_HEAD, request.replica_id, request.max_wait_ms,
                        request.min_bytes, request.max_bytes, request.isolation_level)  # fmt: skip
    if version >= 7:
        w.fields(_SESSION, request.session_id, request.session_epoch)
    block, with_epoch, with_start = _REQUEST_PARTITION[version], version >= 9, version >= 5
    w.int32(len(request.topics))
    for name, partitions in request.topics:
        w.string(name).int32(len(partitions))
        for p in partitions:
            values = [p.partition]
            if with_epoch:
                values.append(p.current_leader_epoch)
            values.append(p.fetch_offset)
            if with_start:
                values.append(p.log_start_offset)
            values.append(p.partition_max_bytes)
            w.fields(block, *values)
    if version >= 7:
        w.int32(len(request.forgotten))
        for name, partitions in request.forgotten:
            w.string(name).int32(len(partitions))
            for partition in partitions:
                w.int32(partition)
    if version >= 11:
        w.string(request.rack_id)
    return w.getvalue()


def write_fetch_response(responses: list[tuple[str, list[FetchPartitionResponse]]], version: int,
                         error_code: int = 0, session_id: int = NO_SESSION_ID) -> list:  # fmt: skip
    parts: list = []
    w = Writer().int32(0)  # throttle_time_ms
    if version >= 7:
        w.int16(error_code).int32(session_id)
    head, tail = _RESPONSE_HEAD[version], _RESPONSE_TAIL[version]
    with_start, with_replica = version >= 5, version >= 11
    w.int32(len(responses))
    for name, partitions in responses:
        w.string(name).int32(len(partitions))
        for p in partitions:
            # aborted_transactions: none (no transactions here)
            if with_start:
                w.fields(head, p.partition, p.error_code, p.high_watermark, p.last_stable_offset,
                         p.log_start_offset, 0)  # fmt: skip
            else:
                w.fields(head, p.partition, p.error_code, p.high_watermark, p.last_stable_offset, 0)
            size = p.records_size
            if with_replica:
                w.fields(tail, -1, size)  # preferred_read_replica: none
            else:
                w.fields(tail, size)
            if p.records:
                parts.append(bytes(w.buf))
                parts.extend(p.records)
                w = Writer()
    parts.append(bytes(w.buf))
    return parts


def read_fetch_response(
    reader: Reader, version: int
) -> tuple[int, list[tuple[str, list[FetchPartitionResponse]]]]:
    """(top-level error code, responses); records come back as memoryviews of the frame."""
    error_code, _, responses = read_session_fetch_response(reader, version)
    return error_code, responses


def read_session_fetch_response(
    reader: Reader, version: int
) -> tuple[int, int, list[tuple[str, list[FetchPartitionResponse]]]]:
    """(top-level error code, session id, responses), for a fetcher with a KIP-227 session."""
    error_code, session_id = 0, NO_SESSION_ID
    if version >= 7:
        _, error_code, session_id = reader.fields(_RESPONSE_SESSION)
    else:
        reader.int32()  # throttle_time_ms
    head, tail, with_start = _RESPONSE_HEAD[version], _RESPONSE_TAIL[version], version >= 5
    out = []
    for _ in range(reader.array_length()):
        name = reader.string()
        partitions = []
        for _ in range(reader.array_length()):
            values = reader.fields(head)
            p = FetchPartitionResponse(*values[:4])
            if with_start:
                p.log_start_offset = values[4]
            for _ in range(max(values[-1], 0)):  # aborted transactions: skipped
                reader.fields(_ABORTED_TRANSACTION)
            size = reader.fields(tail)[-1]
            records = None if size < 0 else reader.raw(size)
            p.records = [records] if records is not None and len(records) else []
            partitions.append(p)
        out.append((name, partitions))
    return error_code, session_id, out
