"""Bad input over raw sockets: the broker closes (or answers with an error) only the offending
connection, logs why, never appends anything it rejected, and keeps serving everyone else.

One broker serves the module, started with a small socket.request.max.bytes and
message.max.bytes so the size limits are cheap to cross. After every case a fresh, well-behaved
connection produces a record and fetches it back.
"""

from __future__ import annotations

import os
import random
import re
import socket
import struct

import pytest

from localcluster.protocol import fetch, messages, produce
from localcluster.protocol.api import (
    SUPPORTED,
    ApiKey,
    RequestHeader,
    write_request_header,
)
from localcluster.protocol.wire import Reader, Writer
from localcluster.storage import Record, encode_batch, iter_batches, iter_records
from localcluster.storage import record_batch as rb
from tests.brokers import BrokerSet
from tests.helpers import wait_until
from tests.raw_connection import RawConnection

REQUEST_MAX_BYTES = 64 * 1024
MESSAGE_MAX_BYTES = 16 * 1024
TOPIC = "bad-input"
GOOD = "good"

NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUIRED_ACKS = 21


class Raw(RawConnection):
    """One TCP connection speaking framed requests, with the cases' APIs."""

    def request(self, api_key: int, version: int, body: bytes) -> Reader:
        """A Reader positioned at the response body."""
        data, offset = self.recv(api_key, version, self.send(api_key, version, body))
        return Reader(data, offset)

    # -- the APIs the cases use ---------------------------------------------------------------

    def produce(self, topic: str, partition: int, records: bytes | None, acks: int = -1,
                version: int = 8) -> produce.ProducePartitionResponse:  # fmt: skip
        body = produce.write_produce_request(produce.ProduceRequest(
            None, acks, 10_000, [(topic, [produce.ProducePartition(partition, records)])]), version)  # fmt: skip
        ((_, (result,)),) = produce.read_produce_response(
            self.request(ApiKey.PRODUCE, version, body), version
        )
        return result

    def fetch(self, topic: str, partition: int, offset: int, max_wait_ms: int = 0,
              version: int = 11) -> fetch.FetchPartitionResponse:  # fmt: skip
        body = fetch.write_fetch_request(fetch.FetchRequest(
            -1, max_wait_ms, 1, 1 << 20, 0, [(topic, [fetch.FetchPartition(partition, offset, 1 << 20)])]),
            version)  # fmt: skip
        error, ((_, (result,)),) = fetch.read_fetch_response(
            self.request(ApiKey.FETCH, version, body), version
        )
        assert error == NONE
        return result

    def list_offset(self, topic: str, partition: int, timestamp: int = -1) -> tuple[int, int]:
        """(error code, offset); timestamp -1 is the latest offset, -2 the earliest."""
        body = messages.encode_request(ApiKey.LIST_OFFSETS, 5, {"replica_id": -1, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "timestamp": timestamp,
                                            "current_leader_epoch": -1}]}]})  # fmt: skip
        reader = self.request(ApiKey.LIST_OFFSETS, 5, body)
        response = messages.decode_response(ApiKey.LIST_OFFSETS, 5, reader.buf, reader.pos)
        (p,) = response.topics[0].partitions
        return int(p.error_code), int(p.offset)


def records_of(partition) -> list:
    """Every record of a fetched partition, across all its batches."""
    data = b"".join(bytes(part) for part in partition.records)
    return [r for position, header in iter_batches(data)
            for r in iter_records(data[position : position + header.size])]  # fmt: skip


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cluster = tmp_path_factory.mktemp("cluster")
    started = BrokerSet(cluster)
    try:
        broker = started.start(1, socket_request_max_bytes=REQUEST_MAX_BYTES,
                               message_max_bytes=MESSAGE_MAX_BYTES)  # fmt: skip
        raw = Raw(broker.port)
        body = messages.encode_request(ApiKey.CREATE_TOPICS, 4, {"timeout": 10_000, "topics": [
            {"name": TOPIC, "num_partitions": 2, "replication_factor": 1},
            {"name": GOOD, "num_partitions": 1, "replication_factor": 1}]})  # fmt: skip
        reader = raw.request(ApiKey.CREATE_TOPICS, 4, body)
        created = messages.decode_response(ApiKey.CREATE_TOPICS, 4, reader.buf, reader.pos)
        assert [t.error_code for t in created.topics] == [0, 0], created
        # The topics are usable once their leader (this broker) has taken them up.
        wait_until(lambda: raw.list_offset(TOPIC, 1)[0] == NONE and raw.list_offset(GOOD, 0)[0] == NONE,
                   timeout_s=10, message="the new topics are led")  # fmt: skip
        raw.close()
        yield broker
    finally:
        started.cleanup()


def batch(*values: bytes, key: bytes | None = None) -> bytes:
    return encode_batch([Record(v, key=key) for v in values])


def assert_still_serving(broker) -> None:
    """A well-behaved client on a new connection produces and reads back its record."""
    assert broker.is_alive(), broker.log_text()[-3000:]
    raw = Raw(broker.port)
    try:
        value = b"still-serving-%d" % random.getrandbits(32)
        result = raw.produce(GOOD, 0, batch(value))
        assert result.error_code == NONE, result
        fetched = raw.fetch(GOOD, 0, result.base_offset)
        assert fetched.error_code == NONE
        records = records_of(fetched)
        assert (records[0].offset, records[0].value) == (result.base_offset, value)
    finally:
        raw.close()


def wait_for_log(broker, pattern: str) -> re.Match:
    return wait_until(lambda: re.search(pattern, broker.log_text()), timeout_s=5,
                      message=f"a broker log line matching {pattern!r}")  # fmt: skip


def peer(raw: Raw) -> str:
    return rf"127\.0\.0\.1:{raw.local_port}"


def no_unexpected_errors(broker) -> None:
    text = broker.log_text()
    at = text.find("unexpected error")
    assert at < 0 and "Traceback" not in text, text[max(at, 0) : max(at, 0) + 3000]


# -- framing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_garbage_closes_the_connection(broker, seed):
    garbage = random.Random(seed).randbytes(4096)
    raw = Raw(broker.port)
    try:
        raw.sock.sendall(garbage)
        assert raw.closed_by_broker()
        wait_for_log(broker, rf"closing connection from {peer(raw)}: frame size -?\d+ outside")
    finally:
        raw.close()
    assert_still_serving(broker)


def test_a_truncated_frame_then_close_is_logged_and_harmless(broker):
    raw = Raw(broker.port)
    try:
        raw.sock.sendall(struct.pack(">i", 100) + b"\x00\x12\x00\x00" + b"\x00" * 16)
    finally:
        raw.close()
    wait_for_log(broker, rf"connection from {peer(raw)} ended: peer closed after 20 of 100 bytes")
    assert_still_serving(broker)


@pytest.mark.parametrize("size, why", [
    (REQUEST_MAX_BYTES + 1, "one byte over socket.request.max.bytes"),
    (2**31 - 1, "the largest int32"),
    (-1, "negative"),
    (-(2**31), "the smallest int32"),
    (0, "empty"),
    (4, "shorter than a request header"),
])  # fmt: skip
def test_a_frame_size_out_of_bounds_closes_the_connection(broker, size, why):
    raw = Raw(broker.port)
    try:
        # The broker must decide from the size alone: it must not wait for (or buffer) a body.
        raw.sock.sendall(struct.pack(">i", size))
        assert raw.closed_by_broker(), why
        match = wait_for_log(broker, rf"closing connection from {peer(raw)}: frame size (-?\d+) outside "
                                     rf"\[\d+, {REQUEST_MAX_BYTES}\]")  # fmt: skip
        assert int(match.group(1)) == size
    finally:
        raw.close()
    assert_still_serving(broker)


def test_a_frame_of_exactly_the_maximum_size_is_read(broker):
    """The limit is inclusive (Kafka: size > socket.request.max.bytes is refused)."""
    raw = Raw(broker.port)
    try:
        header = Writer()
        write_request_header(header, RequestHeader(ApiKey.API_VERSIONS, 0, 7, "x"))
        padding = REQUEST_MAX_BYTES - len(header.buf)
        raw.sock.sendall(
            struct.pack(">i", REQUEST_MAX_BYTES) + bytes(header.buf) + b"\x00" * padding
        )
        data = raw.recv_frame()
        assert data is not None and Reader(data).int32() == 7
    finally:
        raw.close()


def test_a_header_that_runs_past_its_frame_closes_the_connection(broker):
    raw = Raw(broker.port)
    try:
        # api_key 18, version 0, correlation id 1, client_id length 500 in a 12-byte frame.
        raw.sock.sendall(struct.pack(">ihhih", 10, 18, 0, 1, 500))
        assert raw.closed_by_broker()
        wait_for_log(broker, rf"closing connection from {peer(raw)}: .*runs past")
    finally:
        raw.close()
    assert_still_serving(broker)


@pytest.mark.parametrize("api_key, version, body, reason", [
    (ApiKey.PRODUCE, 8, b"\xff\xff\x00", r"needs \d+ bytes at \d+"),
    (ApiKey.FETCH, 11, struct.pack(">iiiib", -1, 0, 1, 100, 0), r"needs \d+ bytes at \d+"),
    (ApiKey.METADATA, 8, struct.pack(">i", 3) + b"\x00", r"MetadataRequest v8 does not parse"),
])  # fmt: skip
def test_a_body_that_does_not_parse_closes_the_connection_with_a_reason(broker, api_key, version,
                                                                        body, reason):  # fmt: skip
    raw = Raw(broker.port)
    try:
        raw.send(api_key, version, body)
        assert raw.closed_by_broker()
        wait_for_log(broker, rf"closing connection from {peer(raw)}: .*{reason}")
    finally:
        raw.close()
    assert_still_serving(broker)


FUZZED = [(k, v) for k in (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA,
                          ApiKey.CREATE_TOPICS, ApiKey.API_VERSIONS)
          for v in (SUPPORTED[k].min, SUPPORTED[k].max)]  # fmt: skip


def valid_body(api_key: int, version: int) -> bytes | None:
    """A valid request to mutate; None where mutations could do lasting harm (CreateTopics
    with a flipped partition count would create a topic of millions of partitions)."""
    if api_key == ApiKey.PRODUCE:
        return produce.write_produce_request(produce.ProduceRequest(None, -1, 1000, [
            (TOPIC, [produce.ProducePartition(1, batch(b"fuzz", b"fuzz", key=b"k"))])]), version)  # fmt: skip
    if api_key == ApiKey.FETCH:
        return fetch.write_fetch_request(fetch.FetchRequest(-1, 0, 1, 1 << 16, 0, [
            (TOPIC, [fetch.FetchPartition(1, 0, 1 << 16)])]), version)  # fmt: skip
    if api_key == ApiKey.LIST_OFFSETS:
        return messages.encode_request(api_key, version, {"replica_id": -1, "topics": [
            {"name": TOPIC, "partitions": [{"partition_index": 1, "timestamp": -2}]}]})  # fmt: skip
    if api_key == ApiKey.METADATA:
        return messages.encode_request(api_key, version, {"topics": [{"name": TOPIC}],
                                                          "allow_auto_topic_creation": False})  # fmt: skip
    if api_key == ApiKey.API_VERSIONS:
        return messages.encode_request(api_key, 3, {"client_software_name": "fuzz",
                                                    "client_software_version": "1"}) if version >= 3 else b""  # fmt: skip
    return None


def fuzzed_bodies(api_key: int, version: int, count: int):
    """Random bytes, and valid requests with a few bytes flipped or cut short."""
    rng = random.Random(f"{api_key}-{version}")
    valid = valid_body(api_key, version)
    for i in range(count):
        if not valid or i % 2 == 0:
            body = rng.randbytes(rng.choice([0, 1, 3, 7, 20, 64, 300]))
        else:
            body = bytearray(valid)
            for _ in range(rng.randint(1, 3)):
                body[rng.randrange(len(body))] = rng.randrange(256)
            if rng.random() < 0.3:
                body = body[: rng.randrange(len(body))]
        if api_key == ApiKey.FETCH and len(body) >= 8:
            body = body[:4] + struct.pack(">i", 0) + body[8:]  # max_wait_ms 0: no long poll
        yield bytes(body)


@pytest.mark.parametrize("api_key, version", FUZZED)
def test_fuzzed_bodies_behind_a_valid_header_never_hit_an_unexpected_error(
    broker, api_key, version
):
    """Every parser reports bad bytes as a malformed request (a logged close), never as an
    unexpected exception; a body that happens to parse is answered."""
    for body in fuzzed_bodies(api_key, version, 60):
        raw = Raw(broker.port, timeout_s=10)
        try:
            correlation_id = raw.send(api_key, version, body)
            data = raw.recv_frame()
            if data is not None:
                assert Reader(data).int32() == correlation_id
        finally:
            raw.close()
    assert broker.is_alive()
    no_unexpected_errors(broker)
    assert_still_serving(broker)


# -- produce ----------------------------------------------------------------------------------


def corrupt_crc(data: bytes) -> bytes:
    out = bytearray(data)
    out[-1] ^= 0xFF  # inside the CRC's range (attributes .. end)
    return bytes(out)


def corrupt_magic(data: bytes) -> bytes:
    out = bytearray(data)
    out[16] = 1
    return bytes(out)


def corrupt_count(data: bytes) -> bytes:
    out = bytearray(data)
    struct.pack_into(">i", out, 57, 5)  # recordsCount 5 for lastOffsetDelta 0
    return bytes(out)


def overstated_length(data: bytes) -> bytes:
    out = bytearray(data)
    struct.pack_into(">i", out, 8, len(data))  # batchLength past the bytes sent
    return bytes(out)


def truncated(data: bytes) -> bytes:
    return data[: rb.HEADER_SIZE - 5]


def second_batch_bad(data: bytes) -> bytes:
    return data + corrupt_crc(data)


@pytest.mark.parametrize("mutate", [corrupt_crc, corrupt_magic, corrupt_count, overstated_length,
                                    truncated, second_batch_bad, lambda d: b""])  # fmt: skip
def test_a_corrupt_batch_is_corrupt_message_and_nothing_is_appended(broker, mutate):
    raw = Raw(broker.port)
    try:
        error, end_before = raw.list_offset(TOPIC, 0)
        assert error == NONE
        result = raw.produce(TOPIC, 0, mutate(batch(b"a", b"b", key=b"k")))
        assert result.error_code == CORRUPT_MESSAGE, result
        assert raw.list_offset(TOPIC, 0) == (NONE, end_before)
        at_end = raw.fetch(TOPIC, 0, end_before)
        assert (
            at_end.error_code == NONE
            and at_end.records == []
            and at_end.high_watermark == end_before
        )
        # The same connection stays usable: a produce error is an answer, not a close.
        good = raw.produce(TOPIC, 0, batch(b"fine"))
        assert (good.error_code, good.base_offset) == (NONE, end_before)
    finally:
        raw.close()
    assert_still_serving(broker)


def test_a_null_records_field_is_corrupt_message(broker):
    raw = Raw(broker.port)
    try:
        _, end_before = raw.list_offset(TOPIC, 1)
        assert raw.produce(TOPIC, 1, None).error_code == CORRUPT_MESSAGE
        assert raw.list_offset(TOPIC, 1) == (NONE, end_before)
    finally:
        raw.close()


def test_a_batch_over_message_max_bytes_is_message_too_large(broker):
    raw = Raw(broker.port)
    try:
        _, end_before = raw.list_offset(TOPIC, 1)
        big = batch(b"x" * (MESSAGE_MAX_BYTES + 1))
        assert len(big) < REQUEST_MAX_BYTES
        result = raw.produce(TOPIC, 1, big)
        assert result.error_code == MESSAGE_TOO_LARGE, result
        assert raw.list_offset(TOPIC, 1) == (NONE, end_before)
        # Just under the limit is fine.
        fits = batch(b"y" * (MESSAGE_MAX_BYTES - 200))
        assert len(fits) <= MESSAGE_MAX_BYTES
        assert raw.produce(TOPIC, 1, fits).error_code == NONE
        assert raw.list_offset(TOPIC, 1) == (NONE, end_before + 1)
    finally:
        raw.close()
    assert_still_serving(broker)


def test_invalid_acks_is_refused_and_nothing_is_appended(broker):
    raw = Raw(broker.port)
    try:
        _, end_before = raw.list_offset(TOPIC, 0)
        assert raw.produce(TOPIC, 0, batch(b"z"), acks=2).error_code == INVALID_REQUIRED_ACKS
        assert raw.list_offset(TOPIC, 0) == (NONE, end_before)
    finally:
        raw.close()


def test_acks_0_with_a_corrupt_batch_sends_nothing_and_appends_nothing(broker):
    raw = Raw(broker.port)
    try:
        _, end_before = raw.list_offset(TOPIC, 0)
        body = produce.write_produce_request(produce.ProduceRequest(None, 0, 10_000, [
            (TOPIC, [produce.ProducePartition(0, corrupt_crc(batch(b"q")))])]), 8)  # fmt: skip
        raw.send(ApiKey.PRODUCE, 8, body)
        # The next answer on this connection is the ListOffsets one (acks=0 has no response).
        assert raw.list_offset(TOPIC, 0) == (NONE, end_before)
    finally:
        raw.close()


@pytest.mark.parametrize(
    "topic, partition", [("no-such-topic", 0), (TOPIC, 2), (TOPIC, 99), (TOPIC, -1)]
)
def test_unknown_topics_and_partitions(broker, topic, partition):
    raw = Raw(broker.port)
    try:
        assert (
            raw.produce(topic, partition, batch(b"lost")).error_code == UNKNOWN_TOPIC_OR_PARTITION
        )
        assert raw.fetch(topic, partition, 0).error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert raw.list_offset(topic, partition)[0] == UNKNOWN_TOPIC_OR_PARTITION
    finally:
        raw.close()
    assert_still_serving(broker)


def test_a_produce_for_an_unknown_topic_does_not_create_it(broker):
    raw = Raw(broker.port)
    try:
        assert raw.produce("never-created", 0, batch(b"v")).error_code == UNKNOWN_TOPIC_OR_PARTITION
        body = messages.encode_request(
            ApiKey.METADATA, 8, {"topics": None, "allow_auto_topic_creation": False}
        )
        reader = raw.request(ApiKey.METADATA, 8, body)
        listed = messages.decode_response(ApiKey.METADATA, 8, reader.buf, reader.pos)
        assert "never-created" not in {t.name for t in listed.topics}
    finally:
        raw.close()


# -- fetch ------------------------------------------------------------------------------------


def test_fetch_past_the_end_is_offset_out_of_range(broker):
    raw = Raw(broker.port)
    try:
        assert raw.produce(TOPIC, 0, batch(b"e1", b"e2")).error_code == NONE
        _, end = raw.list_offset(TOPIC, 0)
        past = raw.fetch(TOPIC, 0, end + 1)
        assert past.error_code == OFFSET_OUT_OF_RANGE and past.records == []
        far = raw.fetch(TOPIC, 0, 2**62)
        assert far.error_code == OFFSET_OUT_OF_RANGE
        negative = raw.fetch(TOPIC, 0, -3)
        assert negative.error_code == OFFSET_OUT_OF_RANGE
        # At the end exactly is not an error: nothing yet.
        at_end = raw.fetch(TOPIC, 0, end)
        assert at_end.error_code == NONE and at_end.records == [] and at_end.high_watermark == end
        # The last record is still served.
        last = raw.fetch(TOPIC, 0, end - 1)
        records = records_of(last)
        assert records[-1].offset == end - 1 and records[-1].value == b"e2"
    finally:
        raw.close()
    assert_still_serving(broker)


def test_the_broker_survived_the_whole_module(broker):
    assert broker.is_alive()
    no_unexpected_errors(broker)


@pytest.mark.parametrize(
    "name", ["bad-inpu\x10", "a/b", "..", ".", "trailing-newline\n", "x" * 250, ""]
)
def test_metadata_for_an_illegal_topic_name_is_an_error_not_a_close(broker, name):
    """Regression: an illegal name went to the store as a znode path; the store refused it
    ('\\x10') and the broker closed the connection with an unexpected error."""
    raw = Raw(broker.port)
    try:
        for allow_auto_create, expected in (
            (False, UNKNOWN_TOPIC_OR_PARTITION),
            (True, INVALID_TOPIC_EXCEPTION),
        ):
            body = messages.encode_request(ApiKey.METADATA, 8, {"topics": [{"name": name}],
                                                                "allow_auto_topic_creation": allow_auto_create})  # fmt: skip
            reader = raw.request(ApiKey.METADATA, 8, body)
            (topic,) = messages.decode_response(ApiKey.METADATA, 8, reader.buf, reader.pos).topics
            assert (topic.name, topic.error_code, topic.partitions) == (name, expected, ())
        body = messages.encode_request(ApiKey.CREATE_TOPICS, 4, {"timeout": 5000, "topics": [
            {"name": name, "num_partitions": 1, "replication_factor": 1}]})  # fmt: skip
        reader = raw.request(ApiKey.CREATE_TOPICS, 4, body)
        (created,) = messages.decode_response(
            ApiKey.CREATE_TOPICS, 4, reader.buf, reader.pos
        ).topics
        assert created.error_code == INVALID_TOPIC_EXCEPTION, created
    finally:
        raw.close()
    no_unexpected_errors(broker)
    assert_still_serving(broker)


# -- good input at the edges ------------------------------------------------------------------


def test_several_batches_in_one_produce_get_consecutive_offsets(broker):
    raw = Raw(broker.port)
    try:
        _, end_before = raw.list_offset(TOPIC, 1)
        # The client's base offsets and leader epochs are garbage; the leader rewrites them.
        first = bytearray(batch(b"b1-a", b"b1-b"))
        struct.pack_into(">qii", first, 0, 12345, len(first) - 12, 99)
        second = batch(b"b2-a", b"b2-b", b"b2-c")
        result = raw.produce(TOPIC, 1, bytes(first) + second)
        assert (result.error_code, result.base_offset) == (NONE, end_before)
        assert raw.list_offset(TOPIC, 1) == (NONE, end_before + 5)
        fetched = records_of(raw.fetch(TOPIC, 1, end_before))
        assert [(r.offset, r.value) for r in fetched] == [
            (end_before + i, v) for i, v in enumerate([b"b1-a", b"b1-b", b"b2-a", b"b2-b", b"b2-c"])
        ]
    finally:
        raw.close()


def test_metadata_v0_with_no_topics_lists_every_topic_and_v1_lists_none(broker):
    raw = Raw(broker.port)
    try:
        listed = {}
        for version in (0, 1):
            body = messages.encode_request(ApiKey.METADATA, version, {"topics": []})
            reader = raw.request(ApiKey.METADATA, version, body)
            response = messages.decode_response(ApiKey.METADATA, version, reader.buf, reader.pos)
            listed[version] = {t.name for t in response.topics}
        assert {TOPIC, GOOD} <= listed[0] and listed[1] == set()
    finally:
        raw.close()


INVALID_REPLICA_ASSIGNMENT = 39
INVALID_REQUEST = 42


@pytest.mark.parametrize("num_partitions, replication_factor, assignment, expected", [
    (-1, -1, {0: [1, 1]}, INVALID_REPLICA_ASSIGNMENT),  # a broker twice
    (-1, -1, {5: [1]}, INVALID_REPLICA_ASSIGNMENT),  # partitions not 0..n-1
    (-1, -1, {0: [1], 2: [1]}, INVALID_REPLICA_ASSIGNMENT),
    (-1, -1, {0: [1], 1: []}, INVALID_REPLICA_ASSIGNMENT),  # no replicas
    (-1, -1, {0: [1], 1: [1, 2]}, INVALID_REPLICA_ASSIGNMENT),  # uneven replication
    (2, -1, {0: [1], 1: [1]}, INVALID_REQUEST),  # both a count and an assignment
    (-1, 1, {0: [1], 1: [1]}, INVALID_REQUEST),
    (-1, -1, {0: [1], 1: [1]}, NONE),
    (-1, -1, {0: [2]}, NONE),  # Kafka's ZK mode accepts brokers that are not (yet) alive
])  # fmt: skip
def test_create_topics_checks_a_manual_assignment(broker, num_partitions, replication_factor,
                                                  assignment, expected):  # fmt: skip
    name = f"manual-{abs(hash((num_partitions, replication_factor, str(assignment))))}"
    raw = Raw(broker.port)
    try:
        body = messages.encode_request(ApiKey.CREATE_TOPICS, 4, {"timeout": 5000, "topics": [
            {"name": name, "num_partitions": num_partitions, "replication_factor": replication_factor,
             "assignments": [{"partition_index": p, "broker_ids": b} for p, b in assignment.items()]}]})  # fmt: skip
        reader = raw.request(ApiKey.CREATE_TOPICS, 4, body)
        (created,) = messages.decode_response(
            ApiKey.CREATE_TOPICS, 4, reader.buf, reader.pos
        ).topics
        assert created.error_code == expected, created
        body = messages.encode_request(ApiKey.METADATA, 8, {"topics": [{"name": name}],
                                                            "allow_auto_topic_creation": False})  # fmt: skip
        reader = raw.request(ApiKey.METADATA, 8, body)
        (topic,) = messages.decode_response(ApiKey.METADATA, 8, reader.buf, reader.pos).topics
        if expected == NONE:
            assert {
                p.partition_index: list(p.replica_nodes) for p in topic.partitions
            } == assignment
        else:
            assert topic.error_code == UNKNOWN_TOPIC_OR_PARTITION, "a refused topic must not exist"
    finally:
        raw.close()


def test_the_unix_socket_listener_refuses_bad_frames_the_same_way(broker):
    """The inter-broker listener shares the framing: a bad frame closes only that connection."""
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    good = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        for s in (bad, good):
            s.settimeout(10)
            s.connect(str(broker.socket_path))
        bad.sendall(struct.pack(">i", -77))
        assert bad.recv(16) == b""
        wait_for_log(broker, r"closing connection from unix socket: frame size -77 outside")
        header = Writer()
        write_request_header(header, RequestHeader(ApiKey.API_VERSIONS, 0, 42, "unix"))
        good.sendall(struct.pack(">i", len(header.buf)) + bytes(header.buf))
        size = struct.unpack(">i", good.recv(4))[0]
        assert size > 6 and struct.unpack(">i", good.recv(4))[0] == 42
    finally:
        bad.close()
        good.close()
    assert_still_serving(broker)


def open_sockets(pid: int) -> int:
    fds = f"/proc/{pid}/fd"
    count = 0
    for fd in os.listdir(fds):
        try:
            count += os.readlink(f"{fds}/{fd}").startswith("socket:")
        except FileNotFoundError:
            pass  # closed while we looked
    return count


def test_connections_of_departed_long_polling_clients_are_released(broker):
    baseline = open_sockets(broker.pid)
    for _ in range(20):
        raw = Raw(broker.port)
        _, end = raw.list_offset(GOOD, 0)
        body = fetch.write_fetch_request(fetch.FetchRequest(-1, 60_000, 1, 1 << 20, 0, [
            (GOOD, [fetch.FetchPartition(0, end, 1 << 20)])]), 11)  # fmt: skip
        raw.send(ApiKey.FETCH, 11, body)
        raw.close()
    wait_until(lambda: open_sockets(broker.pid) <= baseline + 2, timeout_s=3,
               message="the broker closes the sockets of clients that went away")  # fmt: skip
