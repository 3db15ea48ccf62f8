"""protocol/metadata_response.py writes the same bytes as kio's generic writer for every
Metadata version the broker serves, whatever the dict holds or leaves out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.protocol import messages, metadata_response
from localcluster.protocol.api import SUPPORTED, ApiKey

VERSIONS = range(SUPPORTED[ApiKey.METADATA].min, SUPPORTED[ApiKey.METADATA].max + 1)
int32 = st.integers(-(1 << 31), (1 << 31) - 1)
ids = st.lists(st.integers(-1, 1 << 20), max_size=5)
text = st.text(max_size=20)


def maybe(key: str, values) -> st.SearchStrategy[dict]:
    """{key: value} or {} (the writer's default)."""
    return st.one_of(st.just({}), values.map(lambda v: {key: v}))


def merged(*parts) -> st.SearchStrategy[dict]:
    return st.tuples(*parts).map(lambda ds: {k: v for d in ds for k, v in d.items()})


partition = merged(
    st.fixed_dictionaries({"error_code": st.sampled_from([0, 3, 5, 9]), "partition_index": int32,
                           "leader_id": int32, "replica_nodes": ids, "isr_nodes": ids}),
    maybe("leader_epoch", int32), maybe("offline_replicas", ids),
)  # fmt: skip
topic = merged(
    st.fixed_dictionaries({"error_code": st.sampled_from([0, 3, 17]), "name": text,
                           "partitions": st.lists(partition, max_size=4)}),
    maybe("is_internal", st.booleans()), maybe("topic_authorized_operations", int32),
)  # fmt: skip
broker = merged(
    st.fixed_dictionaries({"node_id": int32, "host": text, "port": st.integers(0, 65535)}),
    maybe("rack", st.none() | text),
)
response = merged(
    st.fixed_dictionaries({"brokers": st.lists(broker, max_size=3),
                           "topics": st.lists(topic, max_size=3)}),
    maybe("cluster_id", st.none() | text), maybe("controller_id", int32),
    maybe("throttle_time", st.integers(0, 1 << 20)),
    maybe("cluster_authorized_operations", int32),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(data=response, version=st.sampled_from(VERSIONS))
def test_the_bytes_are_the_generic_writers(data, version):
    expected = messages.encode_response(ApiKey.METADATA, version, data)
    assert metadata_response.encode(version, data) == expected


def test_a_large_topic_is_written_the_same():
    partitions = [{"error_code": 0, "partition_index": p, "leader_id": p % 5, "leader_epoch": 3,
                   "replica_nodes": [p % 5, (p + 1) % 5, (p + 2) % 5], "isr_nodes": [p % 5],
                   "offline_replicas": []} for p in range(2000)]  # fmt: skip
    data = {"brokers": [{"node_id": b, "host": "127.0.0.1", "port": 9092 + b} for b in range(5)],
            "cluster_id": "c", "controller_id": 1,
            "topics": [{"error_code": 0, "name": "t", "partitions": partitions}]}  # fmt: skip
    for version in VERSIONS:
        assert metadata_response.encode(version, data) == messages.encode_response(
            ApiKey.METADATA, version, data
        )


def test_a_version_it_does_not_write_is_refused():
    with pytest.raises(ValueError, match="version 9"):
        metadata_response.encode(9, {})
