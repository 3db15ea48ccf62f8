"""protocol.messages: kio-encoded messages built from plain dicts, for every version we speak;
garbage request bodies fail only as MalformedRequestError."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.protocol import messages
from localcluster.protocol.api import SUPPORTED, ApiKey
from localcluster.protocol.wire import MalformedRequestError

# The APIs whose request bodies the broker decodes through kio.
KIO_DECODED = [(k, v) for k in (ApiKey.METADATA, ApiKey.LIST_OFFSETS, ApiKey.CREATE_TOPICS,
                                ApiKey.API_VERSIONS, ApiKey.OFFSET_FOR_LEADER_EPOCH)
               if k in SUPPORTED for v in range(SUPPORTED[k].min, SUPPORTED[k].max + 1)]  # fmt: skip


@pytest.mark.parametrize(
    "version", range(SUPPORTED[ApiKey.METADATA].min, SUPPORTED[ApiKey.METADATA].max + 1)
)
def test_metadata_request_topics_round_trip_including_null(version):
    """Regression: v1+ topics is a nullable array of entities; build() passed the dicts to kio."""
    data = messages.encode_request(
        ApiKey.METADATA, version, {"topics": [{"name": "a"}, {"name": "b"}]}
    )
    decoded = messages.decode_request(ApiKey.METADATA, version, data, 0)
    assert [t.name for t in decoded.topics] == ["a", "b"]
    if version >= 1:  # null means every topic
        everything = messages.encode_request(ApiKey.METADATA, version, {"topics": None})
        assert messages.decode_request(ApiKey.METADATA, version, everything, 0).topics is None


def test_missing_fields_get_zero_values_and_unknown_fields_are_dropped():
    response = {"brokers": [{"node_id": 1, "host": "h", "port": 9092, "rack": None}],
                "cluster_id": "c", "controller_id": 1, "topics": [
                    {"name": "t", "error_code": 0, "partitions": [
                        {"error_code": 0, "partition_index": 0, "leader_id": 1, "leader_epoch": 3,
                         "replica_nodes": [1], "isr_nodes": [1], "offline_replicas": []}]}]}  # fmt: skip
    v0 = messages.decode_response(
        ApiKey.METADATA, 0, messages.encode_response(ApiKey.METADATA, 0, response)
    )
    assert [(b.node_id, b.host, b.port) for b in v0.brokers] == [(1, "h", 9092)]
    assert not hasattr(v0, "cluster_id")  # v0 lacks it: dropped, not an error
    v8 = messages.decode_response(
        ApiKey.METADATA, 8, messages.encode_response(ApiKey.METADATA, 8, response)
    )
    assert v8.cluster_id == "c" and v8.topics[0].partitions[0].leader_epoch == 3
    assert v8.throttle_time == timedelta(0) and v8.topics[0].is_internal is False  # zero-filled


def test_durations_are_milliseconds_and_error_codes_plain_ints():
    data = messages.encode_response(
        ApiKey.API_VERSIONS, 1, {"error_code": 35, "api_keys": [], "throttle_time": 250}
    )
    decoded = messages.decode_response(ApiKey.API_VERSIONS, 1, data)
    assert decoded.error_code == 35 and decoded.throttle_time == timedelta(milliseconds=250)


@pytest.mark.parametrize("api_key, version", KIO_DECODED)
@settings(max_examples=40, deadline=None)
@given(body=st.binary(max_size=80))
def test_garbage_request_bodies_are_malformed_or_parse(api_key, version, body):
    try:
        messages.decode_request(api_key, version, body, 0)
    except MalformedRequestError:
        pass


@pytest.mark.parametrize("api_key, version", KIO_DECODED)
def test_truncated_requests_are_malformed(api_key, version):
    sample = {
        ApiKey.METADATA: {"topics": [{"name": "topic"}]},
        ApiKey.LIST_OFFSETS: {"replica_id": -1, "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "timestamp": -1}]}]},
        ApiKey.CREATE_TOPICS: {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1}],
                               "timeout": 1000},
        ApiKey.API_VERSIONS: {"client_software_name": "x", "client_software_version": "1"},
        ApiKey.OFFSET_FOR_LEADER_EPOCH: {"replica_id": -1, "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "current_leader_epoch": 1, "leader_epoch": 0}]}]},
    }[api_key]  # fmt: skip
    data = messages.encode_request(api_key, version, sample)
    for cut in range(len(data)):
        with pytest.raises(MalformedRequestError):
            messages.decode_request(api_key, version, data[:cut], 0)


def test_preload_loads_both_schemas_of_each_pair_once():
    from localcluster.protocol import messages
    from localcluster.protocol.api import ApiKey

    pair = (ApiKey.OFFSET_FOR_LEADER_EPOCH, 3)
    messages.preload([pair])
    before = messages.request_schema.cache_info().hits, messages.response_schema.cache_info().hits
    messages.request_schema(*pair), messages.response_schema(*pair)
    after = messages.request_schema.cache_info().hits, messages.response_schema.cache_info().hits
    assert after == (before[0] + 1, before[1] + 1)  # both were loaded already: cache hits
