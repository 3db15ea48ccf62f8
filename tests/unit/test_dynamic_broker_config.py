"""Dynamic broker configs' pure rules (broker/dynamic_config.py): which properties are dynamic,
how values are checked, and the precedence of the layers with Kafka's source numbers."""

from __future__ import annotations

import pytest

from localcluster import topic_config
from localcluster.broker import dynamic_config as dc
from localcluster.broker.config import BrokerConfig

STATIC = BrokerConfig.from_properties({"broker.id": "2", "log.retention.ms": "5000"})


def test_the_dynamic_set_is_every_log_default_a_topic_inherits():
    assert set(dc.DYNAMIC) == {spec.broker_property for spec in topic_config.SPECS.values()}
    assert {"log.retention.ms", "min.insync.replicas", "unclean.leader.election.enable",
            "log.cleaner.min.cleanable.ratio"} <= set(dc.DYNAMIC)  # fmt: skip
    assert not {"listeners", "broker.id", "log.dirs"} & set(dc.DYNAMIC)


def test_entity_names_are_kafkas():
    assert (dc.entity(None), dc.entity(3)) == ("<default>", "3")


@pytest.mark.parametrize("properties, code, words", [
    ({"listeners": "PLAINTEXT://:1", "log.roll.ms": "1"}, dc.INVALID_REQUEST,
     "Cannot update these configs dynamically: listeners"),
    ({"broker.id": "7"}, dc.INVALID_REQUEST, "dynamically: broker.id"),
    ({"log.retention.ms": "-2"}, topic_config.INVALID_CONFIG, "log.retention.ms=-2"),
    ({"min.insync.replicas": "0"}, topic_config.INVALID_CONFIG, "min.insync.replicas=0"),
    ({"log.cleanup.policy": "foo"}, topic_config.INVALID_CONFIG, "log.cleanup.policy='foo'"),
    ({"log.message.timestamp.type": "createtime"}, topic_config.INVALID_CONFIG,
     "log.message.timestamp.type"),
    ({"log.cleaner.min.cleanable.ratio": "1.5"}, topic_config.INVALID_CONFIG, "[0, 1]"),
    ({"log.segment.bytes": None}, topic_config.INVALID_CONFIG, "a value is required"),
    ({"no.such.property": "1"}, topic_config.INVALID_CONFIG, "unknown broker property"),
])  # fmt: skip
def test_validate_refuses_static_unknown_and_bad_values(properties, code, words):
    with pytest.raises(dc.DynamicConfigError) as caught:
        dc.validate(properties)
    assert caught.value.error_code == code
    assert words in str(caught.value)


def test_validate_normalises_values():
    assert dc.validate({"log.cleanup.policy": "Compact, delete",
                        "unclean.leader.election.enable": "TRUE",
                        "log.retention.bytes": " 4096 "}) == {
        "log.cleanup.policy": "compact,delete", "unclean.leader.election.enable": "true",
        "log.retention.bytes": "4096"}  # fmt: skip


def test_the_broker_layer_beats_the_default_layer_which_beats_the_properties():
    effective = dc.effective(STATIC, {"log.retention.ms": "7000", "min.insync.replicas": "2"},
                             {"min.insync.replicas": "3"})  # fmt: skip
    assert (effective.log_retention_ms, effective.min_insync_replicas) == (7000, 3)
    assert effective.broker_id == 2 and STATIC.log_retention_ms == 5000  # a new object
    assert dc.effective(STATIC, {}, {}) is STATIC
    # what a topic without an override then resolves to
    resolved = topic_config.resolve({"retention.ms": "9"}, effective)
    assert (resolved.retention_ms, resolved.min_insync_replicas) == (9, 3)


def test_a_stored_value_that_is_static_or_bad_is_skipped():
    effective = dc.effective(STATIC, {"listeners": "x", "log.retention.ms": "-7"},
                             {"log.segment.bytes": "many"})  # fmt: skip
    assert effective == STATIC


def test_synonyms_in_precedence_order_with_sources():
    layers = ({"log.retention.ms": "7000"}, {"log.retention.ms": "8000"})
    assert dc.synonyms("log.retention.ms", STATIC, *layers) == [
        ("log.retention.ms", "8000", dc.DYNAMIC_BROKER_CONFIG),
        ("log.retention.ms", "7000", dc.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("log.retention.ms", "5000", dc.STATIC_BROKER_CONFIG),
        ("log.retention.ms", "604800000", dc.DEFAULT_CONFIG)]  # fmt: skip
    # a property left at its default: DEFAULT_CONFIG alone; a static one ignores the layers
    assert dc.synonyms("log.roll.ms", STATIC, {}, {}) == [
        ("log.roll.ms", "604800000", dc.DEFAULT_CONFIG)]  # fmt: skip
    assert dc.synonyms("broker.id", STATIC, {"broker.id": "9"}, {}) == [
        ("broker.id", "2", dc.STATIC_BROKER_CONFIG), ("broker.id", "0", dc.DEFAULT_CONFIG)]  # fmt: skip


def test_a_topic_override_comes_first_then_its_broker_property():
    chain = dc.topic_synonyms("retention.ms", {"retention.ms": "1"}, STATIC,
                              {"log.retention.ms": "7000"}, {})  # fmt: skip
    assert [(name, source) for name, _, source in chain] == [
        ("retention.ms", dc.DYNAMIC_TOPIC_CONFIG),
        ("log.retention.ms", dc.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("log.retention.ms", dc.STATIC_BROKER_CONFIG),
        ("log.retention.ms", dc.DEFAULT_CONFIG)]  # fmt: skip
    without = dc.topic_synonyms("segment.bytes", {}, STATIC, {}, {"log.segment.bytes": "4096"})
    assert without[0] == ("log.segment.bytes", "4096", dc.DYNAMIC_BROKER_CONFIG)


def test_config_types_and_documentation_are_kafkas():
    assert dc.config_type("log.cleanup.policy") == topic_config.LIST
    assert dc.config_type("log.retention.ms") == topic_config.LONG
    assert dc.config_type("broker.id") == topic_config.INT
    assert dc.config_type("controlled.shutdown.enable") == topic_config.BOOLEAN
    assert dc.config_type("listeners") == topic_config.STRING
    assert "delete a segment" in dc.documentation("log.retention.ms")
    assert dc.documentation("broker.id") is None


@pytest.mark.parametrize("args", [["describe"], ["describe", "1", "--default"],
                                  ["alter", "--default"], ["alter", "1"]])  # fmt: skip
def test_the_cli_wants_one_target_and_something_to_change(args, tmp_path):
    from click.testing import CliRunner

    from localcluster.cli import main

    result = CliRunner().invoke(main, ["broker", *args, "--dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--default" in result.output or "nothing to change" in result.output
