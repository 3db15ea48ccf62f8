"""TopicConfig: overrides validated with Kafka's names, ranges and error codes; effective values
resolved over the broker's defaults; retention applies only with cleanup.policy=delete."""

from __future__ import annotations

import logging

import pytest

from localcluster.broker.config import BrokerConfig, ConfigError
from localcluster.broker.replica_manager import ReplicaManager
from localcluster.topic_config import (
    INVALID_CONFIG,
    TopicConfigError,
    resolve,
    unclean_leader_election,
    validate,
)

BROKER = BrokerConfig(min_insync_replicas=2, message_max_bytes=5000, log_retention_ms=99)


@pytest.mark.parametrize("overrides, words", [
    ({"min.insync.replicas": "0"}, "min.insync.replicas=0: must be at least 1"),
    ({"retention.ms": "-2"}, "retention.ms=-2: must be at least -1"),
    ({"cleanup.policy": "foo"}, "cleanup.policy='foo': use delete, compact"),
    ({"segment.bytes": "ten"}, "segment.bytes='ten': expected an integer"),
    ({"unclean.leader.election.enable": "yes"}, "expected true or false"),
    ({"retention.msec": "1"}, "unknown topic config retention.msec"),
    ({"min.insync.replicas": "4"}, "min.insync.replicas=4 is above the replication factor 3"),
])  # fmt: skip
def test_a_bad_override_is_invalid_config_naming_the_property(overrides, words):
    with pytest.raises(TopicConfigError) as refused:
        validate(overrides, replication_factor=3)
    assert refused.value.error_code == INVALID_CONFIG
    assert words in str(refused.value)


def test_good_overrides_are_normalised():
    assert validate({"cleanup.policy": "Compact, delete", "unclean.leader.election.enable": "TRUE",
                     "min.insync.replicas": " 2 "}, 3) == {  # fmt: skip
        "cleanup.policy": "compact,delete", "unclean.leader.election.enable": "true",
        "min.insync.replicas": "2"}  # fmt: skip


def test_resolve_takes_the_broker_default_for_what_the_topic_does_not_set():
    config = resolve({"max.message.bytes": "100"}, BROKER, "t")
    assert (config.max_message_bytes, config.min_insync_replicas, config.retention_ms) == (
        100, 2, 99)  # fmt: skip
    assert config.cleanup_policy == ("delete",) and config.deletes and not config.compacts


def test_a_stored_value_that_no_longer_parses_falls_back_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        config = resolve({"min.insync.replicas": "many"}, BROKER, "orders")
    assert config.min_insync_replicas == 2
    assert "topic orders: ignoring the stored config min.insync.replicas" in caplog.text


def test_compacted_topics_have_no_time_or_size_retention(tmp_path):
    manager = ReplicaManager(BROKER, tmp_path / "data", tmp_path)
    compacted = manager.log_config(resolve({"cleanup.policy": "compact",
                                            "retention.bytes": "10"}, BROKER))  # fmt: skip
    assert (compacted.retention_ms, compacted.retention_bytes) == (-1, -1)
    both = manager.log_config(resolve({"cleanup.policy": "compact,delete"}, BROKER))
    assert both.retention_ms == 99


def test_unclean_election_reads_the_topic_over_the_broker():
    assert unclean_leader_election({"unclean.leader.election.enable": "true"}, False)
    assert not unclean_leader_election({}, False)
    assert unclean_leader_election({"unclean.leader.election.enable": "bad"}, True)


def test_a_bad_broker_default_is_a_config_error():
    with pytest.raises(ConfigError, match="log.cleanup.policy='purge'"):
        BrokerConfig.from_properties({"log.cleanup.policy": "purge"})
