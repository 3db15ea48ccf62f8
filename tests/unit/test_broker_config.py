"""BrokerConfig: Kafka's property names and defaults, parsing, and clear errors."""

from __future__ import annotations

import dataclasses

import pytest

from localcluster.broker.config import (
    BrokerConfig,
    ConfigError,
    parse_assignments,
    split_assignment,
)

# Kafka's defaults (ZooKeeper era); the two one-host deviations are written down in config.py.
KAFKA_DEFAULTS = {
    "broker.rack": None,
    "num.partitions": 1,
    "default.replication.factor": 1,
    "min.insync.replicas": 1,
    "unclean.leader.election.enable": False,
    "replica.fetch.wait.max.ms": 500,
    "replica.high.watermark.checkpoint.interval.ms": 5_000,
    "log.segment.bytes": 1 << 30,
    "log.index.size.max.bytes": 10 << 20,
    "log.retention.bytes": -1,
    "log.retention.ms": 168 * 3600 * 1000,  # log.retention.hours=168
    "log.retention.check.interval.ms": 300_000,
    "message.max.bytes": 1048588,
    "socket.request.max.bytes": 100 * 1024 * 1024,
    "auto.create.topics.enable": True,
    "auto.leader.rebalance.enable": True,
    "leader.imbalance.check.interval.seconds": 300,
    "controlled.shutdown.enable": True,
    "replication.protocol": "leader-epoch",
}
ONE_HOST_DEFAULTS = {"replica.lag.time.max.ms": 10_000, "zookeeper.session.timeout.ms": 6_000}


def test_defaults_are_kafkas():
    props = BrokerConfig().properties()
    for name, value in {**KAFKA_DEFAULTS, **ONE_HOST_DEFAULTS}.items():
        assert props[name] == value, name
    assert BrokerConfig.from_properties({}) == BrokerConfig()


def test_every_field_has_a_kafka_style_name():
    names = [f.metadata["property"] for f in dataclasses.fields(BrokerConfig)]
    assert len(names) == len(set(names))
    for f in dataclasses.fields(BrokerConfig):
        assert f.metadata["property"].replace(".", "_") == f.name, f.name  # broker.id -> broker_id
    assert set(KAFKA_DEFAULTS) | set(ONE_HOST_DEFAULTS) <= set(names)


def test_parses_by_type():
    config = BrokerConfig.from_properties({
        "broker.id": "3", "broker.rack": " rack-a ", "min.insync.replicas": " 2",
        "unclean.leader.election.enable": "TRUE", "controlled.shutdown.enable": "false",
        "replica.lag.time.max.ms": "2500", "log.retention.bytes": "-1",
        "replication.protocol": "hw-truncation", "log.dirs": "/tmp/x",
    })  # fmt: skip
    assert config.broker_id == 3 and config.broker_rack == "rack-a"
    assert config.min_insync_replicas == 2 and config.replica_lag_time_max_ms == 2500
    assert config.unclean_leader_election_enable is True
    assert config.controlled_shutdown_enable is False
    assert config.log_retention_bytes == -1
    assert config.replication_protocol == "hw-truncation" and config.log_dirs == "/tmp/x"


def test_empty_optional_string_is_none():
    assert BrokerConfig.from_properties({"broker.rack": ""}).broker_rack is None
    assert BrokerConfig.from_properties({"log.dirs": "  "}).log_dirs is None


def test_overrides_and_properties():
    assert BrokerConfig.from_properties({}, broker_id=4).broker_id == 4
    assert BrokerConfig.from_properties({"num.partitions": "3"}, broker_id=4).num_partitions == 3


def test_properties_round_trip():
    config = BrokerConfig.from_properties({"broker.id": "2", "broker.rack": "r1", "log.dirs": "/d",
                                           "min.insync.replicas": "2"})  # fmt: skip
    text = {k: str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in config.properties().items() if v is not None}  # fmt: skip
    assert BrokerConfig.from_properties(text) == config


def test_unknown_property_names_the_known_ones():
    with pytest.raises(
        ConfigError, match=r"unknown broker property 'min.isr'.*min\.insync\.replicas"
    ):
        BrokerConfig.from_properties({"min.isr": "2"})
    with pytest.raises(ConfigError, match="unknown broker property 'min_insync_replicas'"):
        BrokerConfig.from_properties({"min_insync_replicas": "2"})  # attribute names are not names


@pytest.mark.parametrize(
    "name, raw, match",
    [
        ("min.insync.replicas", "two", r"min\.insync\.replicas='two': expected an integer"),
        ("broker.id", "1.5", r"broker\.id='1\.5': expected an integer"),
        ("log.segment.bytes", "", "expected an integer"),
        (
            "unclean.leader.election.enable",
            "yes",
            r"unclean\.leader\.election\.enable='yes': expected true or false",
        ),
        ("auto.create.topics.enable", "1", "expected true or false"),
        (
            "replication.protocol",
            "raft",
            r"replication\.protocol='raft': use leader-epoch or hw-truncation",
        ),
        ("min.insync.replicas", "0", r"min\.insync\.replicas must be at least 1"),
        ("num.partitions", "-1", r"num\.partitions must be at least 1"),
        ("default.replication.factor", "0", r"default\.replication\.factor must be at least 1"),
    ],
)
def test_bad_values_are_clear_errors(name, raw, match):
    with pytest.raises(ConfigError, match=match):
        BrokerConfig.from_properties({name: raw})


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_fetch_wait_may_not_exceed_the_lag_time():
    # Kafka's rule: a follower long-polling an idle leader for longer than
    # replica.lag.time.max.ms would fall out of the ISR between its fetches.
    assert (
        BrokerConfig.from_properties(
            {"replica.fetch.wait.max.ms": "10000"}
        ).replica_fetch_wait_max_ms
        == 10_000
    )
    with pytest.raises(
        ConfigError, match=r"replica\.fetch\.wait\.max\.ms.*replica\.lag\.time\.max\.ms"
    ):
        BrokerConfig.from_properties({"replica.fetch.wait.max.ms": "10001"})
    with pytest.raises(
        ConfigError, match=r"replica\.fetch\.wait\.max\.ms.*replica\.lag\.time\.max\.ms"
    ):
        BrokerConfig.from_properties({"replica.lag.time.max.ms": "400"})


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BrokerConfig().broker_id = 3  # type: ignore[misc]


# -- parse_assignments (--set key=value) --------------------------------------------------------------


def test_parse_assignments():
    assert parse_assignments([]) == {}
    assert parse_assignments(["min.insync.replicas=2", " broker.rack = r1 ", "log.dirs="]) == {
        "min.insync.replicas": "2", "broker.rack": "r1", "log.dirs": ""}  # fmt: skip
    assert parse_assignments(("a=b=c",)) == {"a": "b=c"}  # the first '=' splits
    assert parse_assignments(["a=1", "a=2"]) == {"a": "2"}  # the last one wins


@pytest.mark.parametrize("item", ["min.insync.replicas", "=2", "  =x", ""])
def test_parse_assignments_rejects_non_assignments(item):
    with pytest.raises(ConfigError, match=r"expected key=value, e\.g\. min\.insync\.replicas=2"):
        parse_assignments([item])


def test_parse_assignments_names_the_option_and_an_example():
    with pytest.raises(ConfigError, match=r"^--config 'x': expected key=value, e\.g\. a=1$"):
        parse_assignments(["x"], option="--config", example="a=1")
    with pytest.raises(ConfigError, match=r"^'x': expected"):
        parse_assignments(["x"], option="")


def test_split_assignment_cuts_at_the_first_separator():
    assert split_assignment(" a = b=c ") == ("a", "b=c")
    assert split_assignment("a:b=c", separators="=:") == ("a", "b=c")  # Java: ':' first here
    assert split_assignment("a:b") is None and split_assignment(" = b") is None


def test_parse_assignments_feeds_from_properties():
    config = BrokerConfig.from_properties(parse_assignments(["min.insync.replicas=2"]), broker_id=1)
    assert (config.broker_id, config.min_insync_replicas) == (1, 2)
