"""protocol.fetch: the hand-written Fetch v4-v11 codec, round trips over every supported version,
byte-for-byte agreement with kio, and responses whose record bytes come from a file slice."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.protocol import messages
from localcluster.protocol.api import SUPPORTED, ApiKey
from localcluster.protocol.fetch import (
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    read_fetch_request,
    read_fetch_response,
    write_fetch_request,
    write_fetch_response,
)
from localcluster.protocol.wire import MalformedRequestError, Reader
from localcluster.storage import Record, encode_batch

VERSIONS = list(range(SUPPORTED[ApiKey.FETCH].min, SUPPORTED[ApiKey.FETCH].max + 1))
FAST = settings(max_examples=20, deadline=None)

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
topic_names = st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=20)


def requests(version: int):
    partition = st.builds(FetchPartition, partition=st.integers(0, 2**31 - 1), fetch_offset=i64,
                          partition_max_bytes=i32,
                          current_leader_epoch=i32 if version >= 9 else st.just(-1),
                          log_start_offset=i64 if version >= 5 else st.just(-1))  # fmt: skip
    return st.builds(FetchRequest, replica_id=i32, max_wait_ms=i32, min_bytes=i32, max_bytes=i32,
                     isolation_level=st.sampled_from([0, 1]),
                     topics=st.lists(st.tuples(topic_names, st.lists(partition, max_size=3)), max_size=3),
                     session_id=i32 if version >= 7 else st.just(0),
                     session_epoch=i32 if version >= 7 else st.just(-1),
                     rack_id=st.text(max_size=8) if version >= 11 else st.just(""))  # fmt: skip


@pytest.mark.parametrize("version", VERSIONS)
@FAST
@given(data=st.data())
def test_request_round_trip_and_kio_agrees(version, data):
    request = data.draw(requests(version))
    frame = write_fetch_request(request, version)
    reader = Reader(frame)
    assert read_fetch_request(reader, version) == request
    assert reader.remaining() == 0
    kio = messages.decode_request(ApiKey.FETCH, version, frame, 0)
    assert (kio.replica_id, kio.max_wait // timedelta(milliseconds=1), kio.min_bytes, kio.max_bytes,
            kio.isolation_level) == (request.replica_id, request.max_wait_ms, request.min_bytes,
                                     request.max_bytes, request.isolation_level)  # fmt: skip
    assert [(t.topic, [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in t.partitions])
            for t in kio.topics] == [(name, [(p.partition, p.fetch_offset, p.partition_max_bytes)
                                             for p in ps]) for name, ps in request.topics]  # fmt: skip
    if version >= 9:
        assert [p.current_leader_epoch for t in kio.topics for p in t.partitions] == [
            p.current_leader_epoch for _, ps in request.topics for p in ps
        ]
    if version >= 11:
        assert kio.rack_id == request.rack_id


def test_forgotten_topics_are_read_and_ignored():
    """librdkafka sends forgotten topics (v7+) when it uses fetch sessions."""
    body = messages.encode_request(ApiKey.FETCH, 11, {
        "replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": 1000, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "t", "partitions": [{"partition": 2, "current_leader_epoch": 4,
                                                  "fetch_offset": 10, "log_start_offset": -1,
                                                  "partition_max_bytes": 100}]}],
        "forgotten_topics_data": [{"topic": "old", "partitions": [1, 2, 3]}], "rack_id": "r1"})  # fmt: skip
    reader = Reader(body)
    request = read_fetch_request(reader, 11)
    assert reader.remaining() == 0
    assert (
        request.topics == [("t", [FetchPartition(2, 10, 100, 4, -1)])] and request.rack_id == "r1"
    )


def partition_responses(version: int):
    batches = st.lists(st.binary(max_size=12), min_size=1, max_size=3).map(
        lambda vs: [encode_batch([Record(v) for v in vs])])  # fmt: skip
    return st.builds(FetchPartitionResponse, partition=st.integers(0, 1000),
                     error_code=st.sampled_from([0, 1, 3, 6, 74]), high_watermark=i64,
                     last_stable_offset=i64,
                     log_start_offset=i64 if version >= 5 else st.just(-1),
                     records=st.just([]) | batches)  # fmt: skip


def join(parts: list) -> bytes:
    return b"".join(
        os.pread(p.fd, p.length, p.position) if hasattr(p, "length") else bytes(p) for p in parts
    )


@pytest.mark.parametrize("version", VERSIONS)
@FAST
@given(data=st.data())
def test_response_round_trip_and_kio_agrees(version, data):
    responses = data.draw(st.lists(st.tuples(topic_names, st.lists(partition_responses(version), max_size=3)),
                                   max_size=3))  # fmt: skip
    frame = join(write_fetch_response(responses, version))
    reader = Reader(frame)
    error, parsed = read_fetch_response(reader, version)
    assert error == 0 and reader.remaining() == 0

    def fields(p):
        return (p.partition, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
                b"".join(bytes(r) for r in p.records))  # fmt: skip

    assert [(n, [fields(p) for p in ps]) for n, ps in parsed] == [
        (n, [fields(p) for p in ps]) for n, ps in responses
    ]
    kio = messages.decode_response(ApiKey.FETCH, version, frame)
    assert [(t.topic, [(p.partition_index, p.error_code, p.high_watermark, p.records or b"") for p in t.partitions])
            for t in kio.responses] == [(n, [(p.partition, p.error_code, p.high_watermark,
                                              b"".join(bytes(r) for r in p.records)) for p in ps])
                                        for n, ps in responses]  # fmt: skip


@dataclass
class FileBytes:
    """Stands in for storage's FileSlice: what the network layer sendfile()s."""

    fd: int
    position: int
    length: int


@pytest.mark.parametrize("version", [4, 7, 11])
def test_file_slices_take_the_place_of_record_bytes(tmp_path, version):
    batch = encode_batch([Record(b"from-the-segment", key=b"k")])
    path = tmp_path / "segment"
    path.write_bytes(b"JUNK" + batch + b"MORE")
    fd = os.open(path, os.O_RDONLY)
    try:
        slice_ = FileBytes(fd, 4, len(batch))
        responses = [("t", [FetchPartitionResponse(0, 0, 9, 9, 0, [slice_]),
                            FetchPartitionResponse(1, 0, 0, 0, 0, [])])]  # fmt: skip
        parts = write_fetch_response(responses, version)
        assert slice_ in parts, "the slice is passed through for sendfile, not copied"
        frame = join(parts)
    finally:
        os.close(fd)
    _, ((_, (first, second)),) = read_fetch_response(Reader(frame), version)
    assert bytes(first.records[0]) == batch and second.records == []


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_of_a_request_is_malformed(version):
    frame = write_fetch_request(FetchRequest(-1, 500, 1, 1 << 20, 0, [
        ("topic", [FetchPartition(0, 5, 1000, 3, 0), FetchPartition(1, 0, 1000)])], 0, -1, "rack"), version)  # fmt: skip
    for cut in range(len(frame)):
        with pytest.raises(MalformedRequestError):
            read_fetch_request(Reader(frame[:cut]), version)
