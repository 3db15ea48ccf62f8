"""Version negotiation against a real broker process, over raw sockets.

Frames are built here with localcluster.protocol (headers, the hand-written Produce/Fetch
codecs) and kio (everything else); responses are parsed with kio's schemas, which are
generated from Kafka's own JSON and so are an oracle independent of the broker's encoders.
"""

from __future__ import annotations

import re
import struct
import time

import pytest

from localcluster.protocol import fetch, messages, produce
from localcluster.protocol.api import (
    SUPPORTED,
    ApiKey,
)
from localcluster.storage import Record, encode_batch
from tests.brokers import BrokerSet
from tests.helpers import wait_until
from tests.raw_connection import RawConnection

UNSUPPORTED_VERSION = 35
TOPIC = "versions"
DELETED = "versions-deleted"  # DeleteRecords' own: later Fetches of TOPIC still start at 0


class Raw(RawConnection):
    def request(self, api_key: int, version: int, body: bytes):
        """The kio response entity."""
        correlation_id = self.send(api_key, version, body)
        data, offset = self.recv(api_key, version, correlation_id)
        return messages.decode_response(api_key, version, data, offset)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cluster = tmp_path_factory.mktemp("cluster")
    started = BrokerSet(cluster)
    try:
        broker = started.start(1)
        raw = Raw(broker.port)
        created = raw.request(ApiKey.CREATE_TOPICS, 4, messages.encode_request(19, 4, {
            "topics": [{"name": name, "num_partitions": 1, "replication_factor": 1}
                       for name in (TOPIC, DELETED)], "timeout": 10_000}))  # fmt: skip
        assert [t.error_code for t in created.topics] == [0, 0], created
        batch = encode_batch([Record(b"%d" % i) for i in range(4)])
        answered: set[str] = set()

        def produced() -> bool:
            # A client retries a leader that has not taken the new partition up yet (the
            # broker answers CreateTopics once the store has its state, before a broker that
            # has had no UpdateMetadata yet has seen its LeaderAndIsr). Both topics get
            # records here, so that any test of the module may run first (pytest-xdist deals
            # them out): the Fetch and ListOffsets checks expect TOPIC to hold some.
            missing = [t for t in (TOPIC, DELETED) if t not in answered]
            answer = raw.request(ApiKey.PRODUCE, 8, produce.write_produce_request(
                produce.ProduceRequest(None, -1, 10_000, [
                    (t, [produce.ProducePartition(0, memoryview(batch))]) for t in missing]), 8))  # fmt: skip
            for topic_answer in answer.responses:
                error = topic_answer.partition_responses[0].error_code
                assert error in (0, 3, 6), answer  # none, or retriable until the leader has it
                if error == 0:
                    answered.add(topic_answer.name)
            return len(answered) == 2

        wait_until(produced, timeout_s=15, interval_s=0.05, message="the fixture's produce")
        wait_for_group_coordinator(raw)
        raw.close()
        yield broker
    finally:
        started.cleanup()


def wait_for_group_coordinator(raw: Raw) -> None:
    """The first FindCoordinator creates __consumer_offsets; wait until its shard is loaded."""

    def loaded() -> bool:
        found = raw.request(ApiKey.FIND_COORDINATOR, 3, sample_request(ApiKey.FIND_COORDINATOR, 3))
        if found.error_code != 0:
            return False
        fetched = raw.request(ApiKey.OFFSET_FETCH, 7, messages.encode_request(9, 7, {
            "group_id": "probe", "topics": None}))  # fmt: skip
        return fetched.error_code == 0

    wait_until(loaded, timeout_s=30, interval_s=0.05, message="a loaded group coordinator")


def _group_sample(api_key: int, version: int) -> dict:
    """The group APIs' sample bodies (their answers are checked in `check_response`)."""
    commit_partition = {"partition_index": 0, "committed_offset": 10 + version,
                        "committed_leader_epoch": -1, "committed_metadata": "m"}  # fmt: skip
    fetch_topics = [{"name": TOPIC, "partition_indexes": [0]}]
    return {
        ApiKey.FIND_COORDINATOR: {
            "key": "versions-group",
            "key_type": 0,
            "coordinator_keys": ["versions-group"],
        },
        ApiKey.JOIN_GROUP: {
            "group_id": f"join-v{version}",
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
        },
        ApiKey.SYNC_GROUP: {
            "group_id": "nobody",
            "generation_id": 1,
            "member_id": "m-1",
            "assignments": [],
        },
        ApiKey.HEARTBEAT: {"group_id": "nobody", "generation_id": 1, "member_id": "m-1"},
        ApiKey.LEAVE_GROUP: {
            "group_id": "nobody",
            "member_id": "m-1",
            "members": [{"member_id": "m-1"}],
        },
        ApiKey.OFFSET_COMMIT: {
            "group_id": f"commit-v{version}",
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "retention_time": -1,
            "topics": [{"name": TOPIC, "partitions": [commit_partition]}],
        },
        ApiKey.OFFSET_FETCH: {
            "group_id": "commit-v2",
            "topics": fetch_topics,
            "groups": [
                {
                    "group_id": "commit-v2",
                    "member_id": None,
                    "member_epoch": -1,
                    "topics": fetch_topics,
                }
            ],
        },
        ApiKey.OFFSET_DELETE: {
            "group_id": "commit-v5",
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0}]}],
        },
        ApiKey.LIST_GROUPS: {},
        ApiKey.DESCRIBE_GROUPS: {"groups": ["commit-v3"]},
        ApiKey.DELETE_GROUPS: {"groups_names": [f"commit-v{6 + version}"]},
    }[api_key]


GROUP_APIS = [ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT,
              ApiKey.LEAVE_GROUP, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.OFFSET_DELETE,
              ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_GROUPS, ApiKey.DELETE_GROUPS]  # fmt: skip
UNKNOWN_MEMBER_ID, MEMBER_ID_REQUIRED = 25, 79


def _check_group_response(api_key: int, version: int, response) -> None:
    if api_key == ApiKey.FIND_COORDINATOR:
        found = response.coordinators[0] if version >= 4 else response
        assert found.error_code == 0 and found.node_id == 1, response
    elif api_key == ApiKey.JOIN_GROUP:
        if version >= 4:  # KIP-394: a new member first gets its id
            assert response.error_code == MEMBER_ID_REQUIRED and response.member_id, response
        else:
            assert response.error_code == 0 and response.generation_id == 1, response
            assert response.leader == response.member_id, response
    elif api_key in (ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT):
        assert response.error_code == UNKNOWN_MEMBER_ID, response
    elif api_key == ApiKey.LEAVE_GROUP:
        codes = {response.error_code, *(m.error_code for m in getattr(response, "members", ()))}
        assert UNKNOWN_MEMBER_ID in codes, response
    elif api_key == ApiKey.OFFSET_COMMIT:
        assert response.topics[0].partitions[0].error_code == 0, response
    elif api_key == ApiKey.OFFSET_FETCH:
        topics = response.groups[0].topics if version >= 8 else response.topics
        (partition,) = topics[0].partitions
        assert partition.error_code == 0 and partition.committed_offset == 12, response
    elif api_key == ApiKey.OFFSET_DELETE:
        assert response.error_code == 0, response
        assert response.topics[0].partitions[0].error_code == 0, response
    elif api_key == ApiKey.LIST_GROUPS:
        assert response.error_code == 0 and "commit-v2" in {g.group_id for g in response.groups}
    elif api_key == ApiKey.DESCRIBE_GROUPS:
        (group,) = response.groups
        assert (group.error_code, group.group_state) == (0, "Empty"), response
    else:
        assert api_key == ApiKey.DELETE_GROUPS
        assert response.results[0].error_code == 0, response


def api_versions_body(version: int) -> bytes:
    if version >= 3:
        return messages.encode_request(18, 3, {"client_software_name": "raw-test",
                                               "client_software_version": "1.0"})  # fmt: skip
    return b""


def ranges(response) -> dict[int, tuple[int, int]]:
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_api_versions_every_supported_version_is_answered(broker, version):
    raw = Raw(broker.port)
    try:
        response = raw.request(ApiKey.API_VERSIONS, version, api_versions_body(version))
    finally:
        raw.close()
    assert response.error_code == 0
    advertised = ranges(response)
    assert advertised[ApiKey.API_VERSIONS] == (0, 3)
    # librdkafka 2.x speaks RecordBatch v2 only when Produce v3 and Fetch v4 are offered.
    assert advertised[ApiKey.PRODUCE][0] <= 3 <= advertised[ApiKey.PRODUCE][1]
    assert advertised[ApiKey.FETCH][0] <= 4 <= advertised[ApiKey.FETCH][1]
    # librdkafka 2.0 asks for ListOffsets 0-2 and Metadata 0-4: the ranges must overlap.
    assert advertised[ApiKey.LIST_OFFSETS][0] <= 2
    assert advertised[ApiKey.METADATA][0] <= 4
    assert ApiKey.CREATE_TOPICS in advertised


def test_api_versions_unsupported_version_gets_error_35_in_a_v0_body(broker):
    raw = Raw(broker.port)
    try:
        correlation_id = raw.send(ApiKey.API_VERSIONS, 99, b"")
        data, offset = raw.recv(ApiKey.API_VERSIONS, 0, correlation_id)
        assert data[offset:offset + 2] == struct.pack(">h", UNSUPPORTED_VERSION)  # fmt: skip
        response = messages.decode_response(ApiKey.API_VERSIONS, 0, data, offset)
        assert response.error_code == UNSUPPORTED_VERSION
        advertised = ranges(response)
        assert advertised[ApiKey.API_VERSIONS] == (0, 3)
        assert ApiKey.PRODUCE in advertised and ApiKey.FETCH in advertised
        # The client retries on the same connection with a version both sides know.
        again = raw.request(ApiKey.API_VERSIONS, 3, api_versions_body(3))
        assert again.error_code == 0
    finally:
        raw.close()


def sample_request(api_key: int, version: int) -> bytes:
    """A small valid request body of `api_key` at `version`, against TOPIC."""
    if api_key == ApiKey.PRODUCE:
        batch = encode_batch([Record(b"v%d" % version, key=b"k")])
        return produce.write_produce_request(produce.ProduceRequest(
            None, -1, 10_000, [(TOPIC, [produce.ProducePartition(0, memoryview(batch))])]), version)  # fmt: skip
    if api_key == ApiKey.FETCH:
        return fetch.write_fetch_request(fetch.FetchRequest(
            -1, 0, 0, 1 << 20, 0, [(TOPIC, [fetch.FetchPartition(0, 0, 1 << 20)])]), version)  # fmt: skip
    if api_key == ApiKey.LIST_OFFSETS:
        return messages.encode_request(api_key, version, {"replica_id": -1, "topics": [
            {"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1,
                                            "current_leader_epoch": -1}]}]})  # fmt: skip
    if api_key == ApiKey.METADATA:
        return messages.encode_request(api_key, version, {"topics": [{"name": TOPIC}],
                                                          "allow_auto_topic_creation": False})  # fmt: skip
    if api_key == ApiKey.CREATE_TOPICS:
        return messages.encode_request(api_key, version, {"topics": [
            {"name": f"created-v{version}", "num_partitions": 2, "replication_factor": 1}],
            "timeout": 10_000})  # fmt: skip
    if api_key == ApiKey.API_VERSIONS:
        return api_versions_body(version)
    if api_key in GROUP_APIS:
        return messages.encode_request(api_key, version, _group_sample(api_key, version))
    if api_key == ApiKey.DELETE_TOPICS:  # each version deletes one of CreateTopics' samples
        name = f"created-v{2 + (version - 1) % 3}" if version <= 3 else "no-such-topic"
        return messages.encode_request(api_key, version, {
            "topic_names": [name], "topics": [{"name": name}], "timeout": 10_000})  # fmt: skip
    if api_key == ApiKey.ELECT_LEADERS:  # one broker: its leader is the preferred replica
        return messages.encode_request(api_key, version, {"election_type": 0, "topic_partitions": [
            {"topic": TOPIC, "partitions": [0]}], "timeout": 10_000})  # fmt: skip
    if api_key == ApiKey.CREATE_PARTITIONS:  # each version grows a topic of its own by one
        return messages.encode_request(api_key, version, {"topics": [
            {"name": f"created-v{2 + version % 3}", "count": 3 if version < 3 else 4,
             "assignments": None}],
            "timeout": 10_000, "validate_only": version == 3})  # fmt: skip
    if api_key in (ApiKey.ALTER_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS):
        return messages.encode_request(api_key, version, {"resources": [
            {"resource_type": 2, "resource_name": TOPIC, "configs": [
                {"name": "retention.ms", "value": str(1000 + version), "config_operation": 0}]}],
            "validate_only": False})  # fmt: skip
    if api_key == ApiKey.DESCRIBE_CONFIGS:
        return messages.encode_request(api_key, version, {"resources": [
            {"resource_type": 2, "resource_name": TOPIC, "configuration_keys": None},
            {"resource_type": 4, "resource_name": "1", "configuration_keys": ["broker.id"]}],
            "include_synonyms": True})  # fmt: skip
    if api_key == ApiKey.OFFSET_FOR_LEADER_EPOCH:
        return messages.encode_request(api_key, version, {"replica_id": -1, "topics": [
            {"topic": TOPIC, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                             "leader_epoch": 0}]}]})  # fmt: skip
    if api_key == ApiKey.INIT_PRODUCER_ID:
        return messages.encode_request(api_key, version, {
            "transactional_id": None, "transaction_timeout": 60_000, "producer_id": -1,
            "producer_epoch": -1})  # fmt: skip
    if api_key == ApiKey.DESCRIBE_PRODUCERS:
        return messages.encode_request(api_key, version, {
            "topics": [{"name": TOPIC, "partition_indexes": [0]}]})  # fmt: skip
    if api_key == ApiKey.DESCRIBE_CLUSTER:
        return messages.encode_request(api_key, version, {
            "include_cluster_authorized_operations": False, "endpoint_type": 1})  # fmt: skip
    if api_key == ApiKey.DESCRIBE_LOG_DIRS:
        return messages.encode_request(api_key, version, {"topics": None})
    if api_key == ApiKey.ALTER_PARTITION_REASSIGNMENTS:  # to the replicas it has: done at once
        return messages.encode_request(api_key, version, {"timeout": 10_000, "topics": [
            {"name": TOPIC, "partitions": [{"partition_index": 0, "replicas": [1]}]}]})  # fmt: skip
    if api_key == ApiKey.LIST_PARTITION_REASSIGNMENTS:
        return messages.encode_request(api_key, version, {"timeout": 10_000, "topics": None})
    if api_key == ApiKey.DELETE_RECORDS:  # v0 and v1 move the start by one, v2 to the HW (4)
        return messages.encode_request(api_key, version, {"topics": [{"name": DELETED, "partitions": [
            {"partition_index": 0, "offset": version + 1 if version < 2 else -1}]}],
            "timeout": 10_000})  # fmt: skip
    raise AssertionError(f"no sample for {api_key}")


def check_response(api_key: int, version: int, response) -> None:
    if api_key == ApiKey.PRODUCE:
        (partition,) = response.responses[0].partition_responses
        assert partition.error_code == 0 and partition.base_offset >= 0, response
    elif api_key == ApiKey.FETCH:
        (partition,) = response.responses[0].partitions
        assert partition.error_code == 0 and partition.high_watermark >= 1, response
        assert partition.records, "an earlier Produce put records at offset 0"
    elif api_key == ApiKey.LIST_OFFSETS:
        (partition,) = response.topics[0].partitions
        latest = partition.offset if version >= 1 else partition.old_style_offsets[0]
        assert partition.error_code == 0 and latest >= 1, response
    elif api_key == ApiKey.METADATA:
        assert [b.node_id for b in response.brokers] == [1]
        (topic,) = response.topics
        assert topic.name == TOPIC and topic.error_code == 0
        assert [(p.partition_index, p.leader_id) for p in topic.partitions] == [(0, 1)]
    elif api_key == ApiKey.CREATE_TOPICS:
        (topic,) = response.topics
        assert topic.name == f"created-v{version}" and topic.error_code == 0, response
    elif api_key == ApiKey.API_VERSIONS:
        assert response.error_code == 0
    elif api_key in GROUP_APIS:
        _check_group_response(api_key, version, response)
    elif api_key == ApiKey.DELETE_TOPICS:
        (result,) = response.responses
        expected = 0 if version <= 3 else 3  # deleted, then UNKNOWN_TOPIC_OR_PARTITION
        assert result.error_code == expected, response
    elif api_key == ApiKey.ELECT_LEADERS:
        (result,) = response.replica_election_results
        assert [(p.partition_id, p.error_code) for p in result.partition_result] == [(0, 84)]
    elif api_key == ApiKey.CREATE_PARTITIONS:
        (result,) = response.results
        assert result.error_code == 0, response
    elif api_key in (ApiKey.ALTER_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS):
        (result,) = response.responses
        assert result.error_code == 0 and result.resource_name == TOPIC, response
    elif api_key == ApiKey.DESCRIBE_CONFIGS:
        topic, broker = response.results
        assert topic.error_code == 0 and broker.error_code == 0, response
        assert {c.name for c in topic.configs} >= {"min.insync.replicas", "retention.ms"}
        assert [(c.name, c.value) for c in broker.configs] == [("broker.id", "1")], response
    elif api_key == ApiKey.OFFSET_FOR_LEADER_EPOCH:
        (partition,) = response.topics[0].partitions
        # Epoch 0 is the only (so the latest) epoch: it ends at the log end, past the Produce.
        assert (partition.error_code, partition.leader_epoch) == (0, 0), response
        assert partition.end_offset >= 1, response
    elif api_key == ApiKey.DESCRIBE_PRODUCERS:
        (partition,) = response.topics[0].partitions
        assert partition.error_code == 0, response  # the sample Produce was not idempotent
    elif api_key == ApiKey.INIT_PRODUCER_ID:
        assert response.error_code == 0 and response.producer_id >= 0, response
        assert response.producer_epoch == 0, response
    elif api_key == ApiKey.DESCRIBE_CLUSTER:
        assert (response.error_code, response.controller_id) == (0, 1), response
        assert [b.broker_id for b in response.brokers] == [1] and response.cluster_id, response
        assert response.cluster_authorized_operations == -(2**31), response
    elif api_key == ApiKey.DESCRIBE_LOG_DIRS:
        (result,) = response.results
        sizes = {(t.name, p.partition_index): p.partition_size
                 for t in result.topics for p in t.partitions}  # fmt: skip
        assert result.error_code == 0 and sizes[(TOPIC, 0)] > 0, response
    elif api_key == ApiKey.ALTER_PARTITION_REASSIGNMENTS:
        (partition,) = response.responses[0].partitions
        assert (response.error_code, partition.error_code) == (0, 0), response
    elif api_key == ApiKey.LIST_PARTITION_REASSIGNMENTS:
        assert response.error_code == 0 and response.topics == (), response
    elif api_key == ApiKey.DELETE_RECORDS:
        (partition,) = response.topics[0].partitions
        assert partition.error_code == 0, response
        if version < 2:
            assert partition.low_watermark == version + 1, response
        else:  # -1: the high watermark, past the fixture's four records
            assert partition.low_watermark == 4, response


# Produce first so that every Fetch and ListOffsets version finds a record.
ORDER = [ApiKey.PRODUCE, ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.FETCH,
         ApiKey.LIST_OFFSETS, ApiKey.CREATE_TOPICS, ApiKey.OFFSET_FOR_LEADER_EPOCH,
         ApiKey.INIT_PRODUCER_ID, ApiKey.DESCRIBE_PRODUCERS, *GROUP_APIS, ApiKey.CREATE_PARTITIONS,
         ApiKey.DELETE_TOPICS, ApiKey.DESCRIBE_CONFIGS, ApiKey.ALTER_CONFIGS,
         ApiKey.INCREMENTAL_ALTER_CONFIGS, ApiKey.ELECT_LEADERS, ApiKey.DESCRIBE_CLUSTER,
         ApiKey.DESCRIBE_LOG_DIRS, ApiKey.DELETE_RECORDS, ApiKey.ALTER_PARTITION_REASSIGNMENTS,
         ApiKey.LIST_PARTITION_REASSIGNMENTS]  # fmt: skip
EVERY_ADVERTISED = [(k, v) for k in ORDER for v in range(SUPPORTED[k].min, SUPPORTED[k].max + 1)]
# The controller's requests change leadership; they are tested where a controller is.
CONTROLLER_APIS = {ApiKey.LEADER_AND_ISR, ApiKey.STOP_REPLICA, ApiKey.UPDATE_METADATA,
                   ApiKey.CONTROLLED_SHUTDOWN}  # fmt: skip
# SASL's requests only make sense on a SASL listener (on this PLAINTEXT one they get
# ILLEGAL_SASL_STATE and a closed connection); test_sasl_clients.py speaks them.
SASL_APIS = {ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}


def test_the_broker_advertises_exactly_its_table(broker):
    raw = Raw(broker.port)
    try:
        advertised = ranges(raw.request(ApiKey.API_VERSIONS, 3, api_versions_body(3)))
    finally:
        raw.close()
    assert advertised == {int(k): (r.min, r.max) for k, r in SUPPORTED.items()}
    assert set(advertised) - CONTROLLER_APIS - SASL_APIS == set(ORDER), (
        "a new API needs a sample request here")  # fmt: skip


def test_every_advertised_version_is_answered_on_one_connection(broker):
    raw = Raw(broker.port)
    try:
        for api_key, version in EVERY_ADVERTISED:
            response = raw.request(api_key, version, sample_request(api_key, version))
            try:
                check_response(api_key, version, response)
            except AssertionError as e:
                raise AssertionError(f"{ApiKey(api_key).name} v{version}: {e}") from e
    finally:
        raw.close()


def test_pipelined_requests_are_answered_in_order(broker):
    raw = Raw(broker.port)
    try:
        frames, expected = b"", []
        for api_key, version in [(ApiKey.API_VERSIONS, 2), (ApiKey.METADATA, 8),
                                 (ApiKey.FETCH, 11), (ApiKey.API_VERSIONS, 0)]:  # fmt: skip
            frames += raw.frame(api_key, version, sample_request(api_key, version))
            expected.append((api_key, version, raw.correlation_id))
        raw.sock.sendall(frames)
        for api_key, version, correlation_id in expected:
            data, offset = raw.recv(api_key, version, correlation_id)
            check_response(
                api_key, version, messages.decode_response(api_key, version, data, offset)
            )
    finally:
        raw.close()


@pytest.mark.parametrize("api_key, version, why", [
    (ApiKey.PRODUCE, 2, "Produce below the advertised range (message sets, not batches)"),
    (ApiKey.FETCH, 3, "Fetch below the advertised range"),
    (ApiKey.FETCH, 99, "Fetch above the advertised range"),
    (ApiKey.METADATA, 99, "Metadata above the advertised range"),
    (ApiKey.LIST_OFFSETS, 0, "ListOffsets v0 is not advertised"),
    (1000, 0, "an API key Kafka never had"),
])  # fmt: skip
def test_an_unadvertised_version_closes_only_that_connection(broker, api_key, version, why):
    other = Raw(broker.port)
    bad = Raw(broker.port)
    try:
        bad.send(api_key, version, b"\x00" * 16)
        assert bad.recv_frame() is None, f"{why}: expected the connection to be closed"
        port = bad.local_port
        line = wait_until(lambda: re.search(rf"closing connection from 127\.0\.0\.1:{port}: "
                                            rf"(.*not supported.*)", broker.log_text()),
                          message=f"a log line naming the connection from port {port}")  # fmt: skip
        assert str(version) in line.group(1)
        assert broker.is_alive()
        # A connection opened before the bad one is still served.
        assert other.request(ApiKey.API_VERSIONS, 3, api_versions_body(3)).error_code == 0
        assert (
            other.request(ApiKey.METADATA, 8, sample_request(ApiKey.METADATA, 8))
            .topics[0]
            .error_code
            == 0
        )
    finally:
        bad.close()
        other.close()


def test_broker_answers_while_a_connection_sits_half_way_through_a_frame(broker):
    """A slow or stuck client (size sent, body pending) must not hold up anyone else."""
    stuck = Raw(broker.port)
    other = Raw(broker.port)
    try:
        stuck.sock.sendall(struct.pack(">i", 100) + b"\x00\x12")
        started = time.monotonic()
        assert other.request(ApiKey.API_VERSIONS, 0, b"").error_code == 0
        assert time.monotonic() - started < 5
    finally:
        stuck.close()
        other.close()
