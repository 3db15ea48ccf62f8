"""Produce v3-v8, hand-written: the request's record bytes stay memoryviews into the frame.

Request:  transactional_id nullable_string, acks int16, timeout_ms int32,
          [topic string, [partition int32, records nullable_bytes]]
Response: [topic string, [partition int32, error_code int16, base_offset int64,
          log_append_time_ms int64, log_start_offset int64 (v5+),
          record_errors [] + error_message nullable_string (v8+)]], throttle_time_ms int32
"""

from __future__ import annotations

from dataclasses import dataclass

from localcluster.protocol.wire import Reader, Writer


@dataclass(slots=True)
class ProducePartition:
    partition: int
    records: memoryview | None


@dataclass(slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: list[tuple[str, list[ProducePartition]]]


@dataclass(slots=True)
class ProducePartitionResponse:
    partition: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


def read_produce_request(reader: Reader, version: int) -> ProduceRequest:
    transactional_id = reader.nullable_string()
    acks = reader.int16()
    timeout_ms = reader.int32()
    topics = []
    for _ in range(reader.array_length()):
        name = reader.string()
        partitions = []
        for _ in range(reader.array_length()):
            partitions.append(ProducePartition(reader.int32(), reader.nullable_bytes()))
        topics.append((name, partitions))
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)


def write_produce_request(request: ProduceRequest, version: int) -> bytes:
    return b"".join(produce_request_parts(request, version))


def produce_request_parts(request: ProduceRequest, version: int) -> list:
    """The request's bytes in parts, each partition's records as they are (not copied): a
    connection writes the parts with one writev. Joined, a 1 MB batch was copied three times
    on its way to the socket (into the request, out of it, into the frame)."""
    parts = []
    w = Writer().nullable_string(request.transactional_id).int16(request.acks)
    w.int32(request.timeout_ms).int32(len(request.topics))
    for name, partitions in request.topics:
        w.string(name).int32(len(partitions))
        for p in partitions:
            w.int32(p.partition)
            if p.records is None:
                w.int32(-1)
            else:
                parts += (w.int32(len(p.records)).getvalue(), p.records)
                w = Writer()
    parts.append(w.getvalue())
    return parts


def write_produce_response(
    responses: list[tuple[str, list[ProducePartitionResponse]]], version: int
) -> bytes:
    w = Writer().int32(len(responses))
    for name, partitions in responses:
        w.string(name).int32(len(partitions))
        for p in partitions:
            w.int32(p.partition).int16(p.error_code).int64(p.base_offset)
            w.int64(p.log_append_time_ms)
            if version >= 5:
                w.int64(p.log_start_offset)
            if version >= 8:
                w.int32(0).nullable_string(p.error_message)
    w.int32(0)  # throttle_time_ms
    return w.getvalue()


def read_produce_response(
    reader: Reader, version: int
) -> list[tuple[str, list[ProducePartitionResponse]]]:
    out = []
    for _ in range(reader.array_length()):
        name = reader.string()
        partitions = []
        for _ in range(reader.array_length()):
            p = ProducePartitionResponse(reader.int32(), reader.int16(), reader.int64(),
                                         reader.int64())  # fmt: skip
            if version >= 5:
                p.log_start_offset = reader.int64()
            if version >= 8:
                for _ in range(reader.array_length()):
                    reader.int32()
                    reader.nullable_string()
                p.error_message = reader.nullable_string()
            partitions.append(p)
        out.append((name, partitions))
    reader.int32()  # throttle_time_ms
    return out
