"""protocol.api: request headers v1 and v2 (tagged fields when the API version is flexible),
response headers (ApiVersions always v0), and the advertised version table."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.protocol.api import (
    SUPPORTED,
    ApiKey,
    RequestHeader,
    is_flexible,
    read_request_header,
    response_header,
    write_request_header,
)
from localcluster.protocol.wire import MalformedRequestError, Reader, Writer


def header_v1(api_key: int, version: int, correlation_id: int, client_id: bytes | None) -> bytes:
    w = Writer().int16(api_key).int16(version).int32(correlation_id)
    if client_id is None:
        return w.int16(-1).getvalue()
    return w.int16(len(client_id)).bytes(client_id).getvalue()


def test_a_v1_header_is_parsed_and_the_body_follows():
    data = header_v1(ApiKey.PRODUCE, 3, 77, b"kcat") + b"BODY"
    reader = Reader(data)
    assert read_request_header(reader) == RequestHeader(0, 3, 77, "kcat")
    assert bytes(reader.raw(reader.remaining())) == b"BODY"


def test_a_null_client_id_is_none():
    assert read_request_header(Reader(header_v1(ApiKey.FETCH, 4, 1, None))).client_id is None


def test_a_v2_header_skips_its_tagged_fields():
    # ApiVersions v3 is flexible: header v2 = v1 + tagged fields (here two, with payloads).
    tagged = (
        Writer().uvarint(2).uvarint(0).uvarint(3).bytes(b"xyz").uvarint(5).uvarint(1).bytes(b"q")
    )
    data = header_v1(ApiKey.API_VERSIONS, 3, 9, b"librdkafka") + tagged.getvalue() + b"\x07BODY"
    reader = Reader(data)
    assert read_request_header(reader) == RequestHeader(18, 3, 9, "librdkafka")
    assert bytes(reader.raw(reader.remaining())) == b"\x07BODY"


def test_a_non_flexible_version_has_no_tagged_fields_to_skip():
    # A body that begins with a byte that would be a tag count must be left alone.
    data = header_v1(ApiKey.METADATA, 8, 3, b"c") + b"\x01\x02"
    reader = Reader(data)
    read_request_header(reader)
    assert reader.remaining() == 2


def test_api_versions_above_what_we_speak_is_still_parsed_as_v2():
    """The client sends its newest ApiVersions with header v2; we must read it to answer 35."""
    data = header_v1(ApiKey.API_VERSIONS, 99, 5, b"new-client") + b"\x00" + b"rest"
    reader = Reader(data)
    assert read_request_header(reader) == RequestHeader(18, 99, 5, "new-client")
    assert bytes(reader.raw(reader.remaining())) == b"rest"


def test_unknown_api_keys_parse_as_v1_so_they_can_be_refused_cleanly():
    header = read_request_header(Reader(header_v1(1000, 0, 1, b"x")))
    assert (header.api_key, header.api_version) == (1000, 0)


@pytest.mark.parametrize("data", [
    b"",
    b"\x00\x12",
    struct.pack(">hhi", 18, 0, 1),  # client_id missing
    struct.pack(">hhih", 18, 0, 1, 20) + b"short",  # client_id runs past the frame
    header_v1(ApiKey.API_VERSIONS, 3, 1, b"c") + b"\x01\x00\x09ab",  # tagged field runs past
    header_v1(ApiKey.API_VERSIONS, 3, 1, b"c"),  # tagged field count missing
    header_v1(ApiKey.PRODUCE, -1, 1, b"c"),  # negative version
])  # fmt: skip
def test_bad_headers_are_malformed(data):
    with pytest.raises(MalformedRequestError):
        read_request_header(Reader(data))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_any_bytes_parse_or_are_malformed(data):
    try:
        read_request_header(Reader(data))
    except MalformedRequestError:
        pass


@settings(max_examples=200, deadline=None)
@given(api_key=st.sampled_from(sorted(SUPPORTED)), correlation_id=st.integers(-(2**31), 2**31 - 1),
       client_id=st.none() | st.text(max_size=30), data=st.data())  # fmt: skip
def test_write_then_read_request_header_round_trips(api_key, correlation_id, client_id, data):
    version = data.draw(st.integers(SUPPORTED[api_key].min, SUPPORTED[api_key].max))
    header = RequestHeader(int(api_key), version, correlation_id, client_id)
    w = Writer()
    write_request_header(w, header)
    w.bytes(b"body")
    reader = Reader(w.getvalue())
    assert read_request_header(reader) == header
    assert bytes(reader.raw(reader.remaining())) == b"body"


def test_response_headers():
    assert response_header(ApiKey.PRODUCE, 8, 7) == struct.pack(">i", 7)  # v0
    assert response_header(ApiKey.API_VERSIONS, 3, 7) == struct.pack(">i", 7)  # always v0
    # A flexible version's response header is v1: an empty tagged-field section follows.
    for api_key in (ApiKey.METADATA, ApiKey.FETCH, ApiKey.PRODUCE):
        version = SUPPORTED[api_key].first_flexible
        assert response_header(api_key, version, 7) == struct.pack(">i", 7) + b"\x00"
        assert response_header(api_key, version - 1, 7) == struct.pack(">i", 7)


def test_the_advertised_table_lets_librdkafka_use_record_batch_v2():
    assert 3 in SUPPORTED[ApiKey.PRODUCE] and 4 in SUPPORTED[ApiKey.FETCH]
    assert list(range(4)) == [v for v in range(10) if v in SUPPORTED[ApiKey.API_VERSIONS]]
    assert is_flexible(ApiKey.API_VERSIONS, 3) and not is_flexible(ApiKey.API_VERSIONS, 2)
    assert not is_flexible(1000, 5)
    for api_key, r in SUPPORTED.items():
        assert 0 <= r.min <= r.max, api_key
