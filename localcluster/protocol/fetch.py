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

from dataclasses import dataclass, field

from localcluster.protocol.wire import Reader, Writer

CONSUMER_REPLICA_ID = -1
NO_SESSION_ID = 0
FINAL_EPOCH = -1


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


def read_fetch_request(reader: Reader, version: int) -> FetchRequest:
    replica_id = reader.int32()
    max_wait_ms = reader.int32()
    min_bytes = reader.int32()
    max_bytes = reader.int32()
    isolation_level = reader.int8()
    session_id, session_epoch = NO_SESSION_ID, FINAL_EPOCH
    if version >= 7:
        session_id, session_epoch = reader.int32(), reader.int32()
    topics = []
    for _ in range(reader.array_length()):
        name = reader.string()
        partitions = []
        for _ in range(reader.array_length()):
            partition = reader.int32()
            epoch = reader.int32() if version >= 9 else -1
            fetch_offset = reader.int64()
            log_start = reader.int64() if version >= 5 else -1
            partitions.append(FetchPartition(partition, fetch_offset, reader.int32(), epoch,
                                             log_start))  # fmt: skip
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
    w = Writer().int32(request.replica_id).int32(request.max_wait_ms).int32(request.min_bytes)
    w.int32(request.max_bytes).int8(request.isolation_level)
    if version >= 7:
        w.int32(request.session_id).int32(request.session_epoch)
    w.int32(len(request.topics))
    for name, partitions in request.topics:
        w.string(name).int32(len(partitions))
        for p in partitions:
            w.int32(p.partition)
            if version >= 9:
                w.int32(p.current_leader_epoch)
            w.int64(p.fetch_offset)
            if version >= 5:
                w.int64(p.log_start_offset)
            w.int32(p.partition_max_bytes)
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
    w.int32(len(responses))
    for name, partitions in responses:
        w.string(name).int32(len(partitions))
        for p in partitions:
            w.int32(p.partition).int16(p.error_code).int64(p.high_watermark)
            w.int64(p.last_stable_offset)
            if version >= 5:
                w.int64(p.log_start_offset)
            w.int32(0)  # aborted_transactions: none (no transactions here)
            if version >= 11:
                w.int32(-1)  # preferred_read_replica
            w.int32(p.records_size)
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
    reader.int32()  # throttle_time_ms
    error_code, session_id = 0, NO_SESSION_ID
    if version >= 7:
        error_code = reader.int16()
        session_id = reader.int32()
    out = []
    for _ in range(reader.array_length()):
        name = reader.string()
        partitions = []
        for _ in range(reader.array_length()):
            p = FetchPartitionResponse(reader.int32(), reader.int16(), reader.int64(),
                                       reader.int64())  # fmt: skip
            if version >= 5:
                p.log_start_offset = reader.int64()
            aborted = reader.int32()
            for _ in range(max(aborted, 0)):
                reader.int64()
                reader.int64()
            if version >= 11:
                reader.int32()
            records = reader.nullable_bytes()
            p.records = [records] if records is not None and len(records) else []
            partitions.append(p)
        out.append((name, partitions))
    return error_code, session_id, out
