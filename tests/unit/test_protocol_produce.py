"""protocol.produce: the hand-written Produce v3-v8 codec, round trips over every supported
version and byte-for-byte agreement with kio (generated from Kafka's JSON schemas); a client
writes each partition's records as they are, uncopied."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.protocol import messages
from localcluster.protocol.api import SUPPORTED, ApiKey
from localcluster.protocol.produce import (
    ProducePartition,
    ProducePartitionResponse,
    ProduceRequest,
    produce_request_parts,
    read_produce_request,
    read_produce_response,
    write_produce_request,
    write_produce_response,
)
from localcluster.protocol.wire import MalformedRequestError, Reader
from localcluster.storage import Record, encode_batch

VERSIONS = list(range(SUPPORTED[ApiKey.PRODUCE].min, SUPPORTED[ApiKey.PRODUCE].max + 1))
FAST = settings(max_examples=20, deadline=None)

topic_names = st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=20)
batches = st.lists(st.binary(max_size=20), min_size=1, max_size=3).map(
    lambda values: encode_batch([Record(v) for v in values]))  # fmt: skip
requests = st.builds(
    ProduceRequest,
    transactional_id=st.none() | st.text(max_size=10),
    acks=st.sampled_from([-1, 0, 1]),
    timeout_ms=st.integers(0, 2**31 - 1),
    topics=st.lists(st.tuples(topic_names, st.lists(st.builds(
        ProducePartition, partition=st.integers(0, 2**31 - 1), records=st.none() | batches), max_size=3)),
        max_size=3),
)  # fmt: skip
partition_responses = st.builds(
    ProducePartitionResponse,
    partition=st.integers(0, 1000),
    error_code=st.sampled_from([0, 2, 3, 6, 10, 19, 20]),
    base_offset=st.integers(-1, 2**62),
    log_append_time_ms=st.just(-1),
    log_start_offset=st.integers(-1, 2**62),
    error_message=st.none() | st.text(max_size=30),
)  # fmt: skip


def as_tuples(request: ProduceRequest):
    return (request.transactional_id, request.acks, request.timeout_ms,
            [(name, [(p.partition, None if p.records is None else bytes(p.records)) for p in partitions])
             for name, partitions in request.topics])  # fmt: skip


@pytest.mark.parametrize("version", VERSIONS)
@FAST
@given(request=requests)
def test_request_round_trip_and_kio_agrees(version, request):
    data = write_produce_request(request, version)
    reader = Reader(data)
    assert as_tuples(read_produce_request(reader, version)) == as_tuples(request)
    assert reader.remaining() == 0
    # kio reads our bytes as the same request ...
    kio = messages.decode_request(ApiKey.PRODUCE, version, data, 0)
    assert (kio.transactional_id, kio.acks, kio.timeout // timedelta(milliseconds=1)) == (
        request.transactional_id,
        request.acks,
        request.timeout_ms,
    )
    assert [
        (t.name, [(p.index, p.records) for p in t.partition_data]) for t in kio.topic_data
    ] == as_tuples(request)[3]
    # ... and writes exactly our bytes.
    assert messages.encode_request(ApiKey.PRODUCE, version, {
        "transactional_id": request.transactional_id, "acks": request.acks, "timeout": request.timeout_ms,
        "topic_data": [{"name": name, "partition_data": [
            {"index": p.partition, "records": None if p.records is None else bytes(p.records)}
            for p in partitions]} for name, partitions in request.topics]}) == data  # fmt: skip


def test_a_request_in_parts_carries_each_batch_uncopied():
    one, two = encode_batch([Record(b"a" * 1000)]), bytearray(encode_batch([Record(b"b")]))
    request = ProduceRequest("tx", -1, 30_000, [("t", [ProducePartition(0, one), ProducePartition(1, None)]),
                                                ("u", [ProducePartition(7, two)])])  # fmt: skip
    parts = produce_request_parts(request, 8)
    assert parts[1] is one and parts[3] is two and len(parts) == 5
    assert b"".join(parts) == write_produce_request(request, 8)
    assert as_tuples(read_produce_request(Reader(b"".join(parts)), 8)) == as_tuples(request)


def test_request_records_stay_views_into_the_frame():
    batch = encode_batch([Record(b"zero-copy")])
    frame = bytearray(
        write_produce_request(ProduceRequest(None, 1, 5, [("t", [ProducePartition(0, batch)])]), 3)
    )
    parsed = read_produce_request(Reader(frame), 3)
    records = parsed.topics[0][1][0].records
    assert isinstance(records, memoryview) and records.obj is frame


@pytest.mark.parametrize("version", VERSIONS)
@FAST
@given(
    responses=st.lists(
        st.tuples(topic_names, st.lists(partition_responses, max_size=3)), max_size=3
    )
)
def test_response_round_trip_and_kio_agrees(version, responses):
    data = write_produce_response(responses, version)
    reader = Reader(data)
    parsed = read_produce_response(reader, version)
    assert reader.remaining() == 0

    def fields(p: ProducePartitionResponse):
        return (p.partition, p.error_code, p.base_offset, p.log_append_time_ms,
                p.log_start_offset if version >= 5 else -1, p.error_message if version >= 8 else None)  # fmt: skip

    assert [(n, [fields(p) for p in ps]) for n, ps in parsed] == [
        (n, [fields(p) for p in ps]) for n, ps in responses
    ]
    kio = messages.decode_response(ApiKey.PRODUCE, version, data)
    assert [(t.name, [(p.index, p.error_code, p.base_offset) for p in t.partition_responses])
            for t in kio.responses] == [(n, [(p.partition, p.error_code, p.base_offset) for p in ps])
                                        for n, ps in responses]  # fmt: skip
    if version >= 8:
        assert [p.error_message for t in kio.responses for p in t.partition_responses] == [
            p.error_message for _, ps in responses for p in ps
        ]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_of_a_request_is_malformed(version):
    data = write_produce_request(ProduceRequest("tx", -1, 100, [
        ("topic", [ProducePartition(0, encode_batch([Record(b"a")])), ProducePartition(1, None)])]), version)  # fmt: skip
    for cut in range(len(data)):
        with pytest.raises(MalformedRequestError):
            read_produce_request(Reader(data[:cut]), version)
