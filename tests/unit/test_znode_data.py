"""Znode JSON: Kafka's layouts round-trip, Kafka-written data decodes, garbage is a ZnodeDataError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.coord.znode_data import (
    ZnodeDataError,
    decode_broker_registration,
    decode_leader_and_isr,
    decode_topic_assignment,
    decode_topic_config,
    encode_broker_registration,
    encode_leader_and_isr,
    encode_topic_assignment,
    encode_topic_config,
)
from localcluster.metadata_types import BrokerRegistration, EndPoint, LeaderAndIsr, TopicAssignment

BROKER_PATH = "/brokers/ids/3"
TOPIC_PATH = "/brokers/topics/t"
STATE_PATH = "/brokers/topics/t/partitions/0/state"
CONFIG_PATH = "/config/topics/t"

ids = st.lists(st.integers(0, 2**31 - 1), max_size=6).map(tuple)
tables = st.dictionaries(st.integers(0, 10_000), ids, max_size=8)


# -- broker registration ----------------------------------------------------------------------------


def test_broker_registration_layout():
    endpoints = (EndPoint("PLAINTEXT", "127.0.0.1", 9092),
                 EndPoint("BROKER", "10.0.0.3", 9093, "SASL_PLAINTEXT"))  # fmt: skip
    reg = BrokerRegistration(3, endpoints, "/tmp/b3.sock", rack="r1", pid=42,
                             timestamp_ms=1_700_000_000_000, host_id="boot/4026531840")  # fmt: skip
    value = json.loads(encode_broker_registration(reg))
    assert value == {
        "version": 5, "host": "127.0.0.1", "port": 9092,
        "endpoints": ["PLAINTEXT://127.0.0.1:9092", "BROKER://10.0.0.3:9093"],
        "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT", "BROKER": "SASL_PLAINTEXT"},
        "jmx_port": -1, "rack": "r1", "timestamp": "1700000000000", "unix_socket": "/tmp/b3.sock",
        "pid": 42, "host_id": "boot/4026531840",
    }  # fmt: skip
    assert decode_broker_registration(3, BROKER_PATH, encode_broker_registration(reg)) == reg
    assert reg.endpoint("BROKER") == endpoints[1] and reg.endpoint("CLIENT") is None


def test_broker_registration_without_plaintext_has_kafkas_null_host():
    reg = BrokerRegistration(1, (EndPoint("SASL_PLAINTEXT", "h", 9094, "SASL_PLAINTEXT"),))
    value = json.loads(encode_broker_registration(reg))
    assert value["host"] is None and value["port"] == -1
    assert decode_broker_registration(1, BROKER_PATH, encode_broker_registration(reg)) == reg


listener_names = st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True)
endpoint_lists = st.lists(
    st.builds(EndPoint, listener_names, st.from_regex(r"[a-z0-9.\-]{1,20}", fullmatch=True),
              st.integers(0, 65535), st.sampled_from(["PLAINTEXT", "SASL_PLAINTEXT"])),
    min_size=1, max_size=3, unique_by=lambda e: e.listener_name)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 1000), endpoint_lists, st.text(max_size=30),
       st.one_of(st.none(), st.text(max_size=10)), st.one_of(st.none(), st.integers(1, 2**22)),
       st.integers(0, 2**45), st.text(max_size=20))  # fmt: skip
def test_broker_registration_round_trip(broker_id, endpoints, sock, rack, pid, ts, host):
    reg = BrokerRegistration(broker_id, tuple(endpoints), sock, rack, pid, ts, host)
    assert (
        decode_broker_registration(broker_id, BROKER_PATH, encode_broker_registration(reg)) == reg
    )


def test_broker_registration_written_by_kafka():
    data = (b'{"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT","SASL":"SASL_PLAINTEXT"},'
            b'"endpoints":["PLAINTEXT://kafka1:9092","SASL://kafka1:9094"],"jmx_port":-1,'
            b'"host":"kafka1","timestamp":"1600000000000","port":9092,"version":4}')  # fmt: skip
    reg = decode_broker_registration(1, BROKER_PATH, data)
    assert reg == BrokerRegistration(
        1, (EndPoint("PLAINTEXT", "kafka1", 9092), EndPoint("SASL", "kafka1", 9094, "SASL_PLAINTEXT")),
        "", None, None, 1_600_000_000_000)  # fmt: skip


@pytest.mark.parametrize("data, match", [
    (b"", "does not hold JSON"),
    (b"\xff\xfe", "does not hold JSON"),
    (b"{not json", "does not hold JSON"),
    (b"[1, 2]", "holds list, expected an object"),
    (b'"host"', "holds str, expected an object"),
    (b'{"host": "h", "port": 9092}', "lacks or garbles 'endpoints'"),
    (b'{"endpoints": ["PLAINTEXT://h"]}', BROKER_PATH),
    (b'{"endpoints": ["PLAINTEXT://h:many"]}', BROKER_PATH),
    (b'{"endpoints": "PLAINTEXT://h:1"}', BROKER_PATH),
    (b'{"endpoints": ["PLAINTEXT://h:1"], "timestamp": "soon"}', BROKER_PATH),
])  # fmt: skip
def test_broker_registration_garbage(data, match):
    with pytest.raises(ZnodeDataError, match=match) as e:
        decode_broker_registration(3, BROKER_PATH, data)
    assert BROKER_PATH in str(e.value)


# -- topic assignment ---------------------------------------------------------------------------------


def test_topic_assignment_layout():
    ta = TopicAssignment({1: (2, 3), 0: (1, 2)}, adding_replicas={1: (3,)})
    assert json.loads(encode_topic_assignment(ta)) == {
        "version": 2, "partitions": {"0": [1, 2], "1": [2, 3]}, "adding_replicas": {"1": [3]},
        "removing_replicas": {},
    }  # fmt: skip
    assert decode_topic_assignment(TOPIC_PATH, encode_topic_assignment(ta)) == ta


@settings(max_examples=100, deadline=None)
@given(tables, tables, tables)
def test_topic_assignment_round_trip(partitions, adding, removing):
    ta = TopicAssignment(partitions, adding, removing)
    assert decode_topic_assignment(TOPIC_PATH, encode_topic_assignment(ta)) == ta


def test_topic_assignment_version_1_written_by_kafka():
    ta = decode_topic_assignment(TOPIC_PATH, b'{"version":1,"partitions":{"1":[2,0],"0":[0,1]}}')
    assert ta == TopicAssignment({0: (0, 1), 1: (2, 0)}, {}, {})


@pytest.mark.parametrize("data, match", [
    (b"{}", "has no partitions"),
    (b'{"version": 2}', "has no partitions"),
    (b'{"partitions": [[1, 2]]}', "partitions is malformed"),
    (b'{"partitions": null}', "partitions is malformed"),
    (b'{"partitions": {"zero": [1]}}', "partitions is malformed"),
    (b'{"partitions": {"0": [1, "x"]}}', "partitions is malformed"),
    (b'{"partitions": {"0": 1}}', "partitions is malformed"),
    (b'{"partitions": {"0": "12"}}', "partitions is malformed"),  # not the list [1, 2]
    (b'{"partitions": {"0": [1]}, "adding_replicas": {"0": null}}', "adding_replicas is malformed"),
    (b'{"partitions": {"0": [1]}, "removing_replicas": 7}', "removing_replicas is malformed"),
    (b"[]", "holds list"),
])  # fmt: skip
def test_topic_assignment_garbage(data, match):
    with pytest.raises(ZnodeDataError, match=match) as e:
        decode_topic_assignment(TOPIC_PATH, data)
    assert TOPIC_PATH in str(e.value)


# -- partition state ----------------------------------------------------------------------------------


def test_partition_state_layout():
    state = LeaderAndIsr(leader=2, leader_epoch=5, isr=(2, 0), controller_epoch=3)
    assert json.loads(encode_leader_and_isr(state)) == {"version": 1, "leader": 2, "leader_epoch": 5,
                                          "isr": [2, 0], "controller_epoch": 3}  # fmt: skip
    assert decode_leader_and_isr(STATE_PATH, encode_leader_and_isr(state)) == state


@settings(max_examples=100, deadline=None)
@given(st.integers(-1, 2**31 - 1), st.integers(0, 2**31 - 1), ids, st.integers(0, 2**31 - 1))
def test_partition_state_round_trip(leader, epoch, isr, controller_epoch):
    state = LeaderAndIsr(leader, epoch, isr, controller_epoch)
    assert decode_leader_and_isr(STATE_PATH, encode_leader_and_isr(state)) == state


def test_partition_state_written_by_kafka():
    data = b'{"controller_epoch":1,"leader":1,"version":1,"leader_epoch":0,"isr":[1,2]}'
    assert decode_leader_and_isr(STATE_PATH, data) == LeaderAndIsr(1, 0, (1, 2), 1)


@pytest.mark.parametrize("data", [
    b'{"leader": 1, "leader_epoch": 0, "isr": [1]}',
    b'{"leader": 1, "isr": [1], "controller_epoch": 1}',
    b'{"leader": "one", "leader_epoch": 0, "isr": [1], "controller_epoch": 1}',
    b'{"leader": 1, "leader_epoch": 0, "isr": null, "controller_epoch": 1}',
    b'{"leader": 1, "leader_epoch": 0, "isr": 1, "controller_epoch": 1}',
    b'{"leader": 1, "leader_epoch": 0, "isr": "12", "controller_epoch": 1}',
    b'{"leader": 1, "leader_epoch": 0, "isr": [{}], "controller_epoch": 1}',
    b"null",
    b"",
])  # fmt: skip
def test_partition_state_garbage(data):
    with pytest.raises(ZnodeDataError, match=STATE_PATH):
        decode_leader_and_isr(STATE_PATH, data)


# -- topic config -------------------------------------------------------------------------------------


def test_topic_config_round_trip():
    config = {"min.insync.replicas": "2", "retention.ms": "1000"}
    assert json.loads(encode_topic_config(config)) == {"version": 1, "config": config}
    assert decode_topic_config(CONFIG_PATH, encode_topic_config(config)) == config
    assert decode_topic_config(CONFIG_PATH, encode_topic_config({})) == {}
    assert decode_topic_config(CONFIG_PATH, b'{"version": 1}') == {}
    assert decode_topic_config(CONFIG_PATH, b'{"config": {"a": 1}}') == {"a": "1"}


@pytest.mark.parametrize(
    "data", [b"", b"[1]", b'{"config": [1]}', b'{"config": null}', b'{"config": "a=b"}']
)
def test_topic_config_garbage(data):
    with pytest.raises(ZnodeDataError, match=CONFIG_PATH):
        decode_topic_config(CONFIG_PATH, data)


def test_encoding_is_canonical():
    # sorted keys, no spaces: equal values are equal bytes (a conditional write compares nothing
    # else, and the file backend's readers see stable content)
    a = encode_leader_and_isr(LeaderAndIsr(1, 2, (1, 2), 3))
    assert a == encode_leader_and_isr(LeaderAndIsr(1, 2, (1, 2), 3)) and b" " not in a
    assert encode_topic_assignment(TopicAssignment({1: (1,), 0: (0,)})) == encode_topic_assignment(
        TopicAssignment({0: (0,), 1: (1,)})
    )


def test_znode_data_error_is_a_value_error():
    assert issubclass(ZnodeDataError, ValueError)
