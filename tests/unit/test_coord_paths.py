"""Path validation (ZooKeeper's rules) and Kafka's ZooKeeper layout helpers."""

from __future__ import annotations

import pytest

from localcluster.coord import BadPathError, paths


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/brokers",
        "/brokers/ids/0",
        "/a b/c-d_e.f",
        "/topic.with.dots",
        "/ünïcode",
        "/x/..y",
        "/x/y..",
    ],
)
def test_valid_paths(path):
    assert paths.validate_path(path) == path


@pytest.mark.parametrize(
    ("path", "complaint"),
    [
        ("brokers", "not absolute"),
        ("", "not absolute"),
        ("/brokers/", "ends with '/'"),
        ("//brokers", "empty name"),
        ("/a//b", "empty name"),
        ("/a/./b", "relative name"),
        ("/a/..", "relative name"),
        ("/a\x00b", "U+0000"),
        ("/a\x1fb", "U+001F"),
        ("/a\ud800b", "U+D800"),
        ("/a\ufff5", "U+FFF5"),
    ],
)
def test_invalid_paths_say_what_is_wrong(path, complaint):
    with pytest.raises(BadPathError) as raised:
        paths.validate_path(path)
    assert complaint in str(raised.value)
    assert repr(path) in str(raised.value), "the message names the offending path"
    assert isinstance(raised.value, ValueError)


def test_non_string_path():
    with pytest.raises(BadPathError, match="must be a str"):
        paths.validate_path(b"/bytes")


def test_sequential_create_may_end_with_a_slash():
    assert paths.validate_path("/isr_change_notification/", sequential=True)
    with pytest.raises(BadPathError):
        paths.validate_path("/isr_change_notification/", sequential=False)


def test_parent_name_join_ancestors():
    assert paths.parent_of("/brokers/ids/0") == "/brokers/ids"
    assert paths.parent_of("/brokers") == "/"
    assert paths.name_of("/brokers/ids/0") == "0"
    assert paths.join("/", "brokers") == "/brokers"
    assert paths.join("/brokers", "ids") == "/brokers/ids"
    assert paths.ancestors("/a/b/c") == ["/a", "/a/b"]
    assert paths.ancestors("/a") == []


def test_kafka_layout():
    assert paths.broker_path(3) == "/brokers/ids/3"
    assert paths.topic_path("orders") == "/brokers/topics/orders"
    assert paths.partition_state_path("orders", 7) == "/brokers/topics/orders/partitions/7/state"
    assert paths.CONTROLLER == "/controller" and paths.CONTROLLER_EPOCH == "/controller_epoch"
    assert paths.REASSIGN_PARTITIONS == "/admin/reassign_partitions"
    assert paths.PREFERRED_REPLICA_ELECTION == "/admin/preferred_replica_election"
    assert paths.delete_topic_path("orders") == "/admin/delete_topics/orders"
    assert paths.isr_change_notification_prefix() == "/isr_change_notification/isr_change_"
    assert paths.sequence_suffix(42) == "0000000042"
    with pytest.raises(BadPathError):
        paths.topic_path("bad/../topic")
