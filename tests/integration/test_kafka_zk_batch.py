"""KafkaZkClient's batched controller writes, on the file backend and a real ZooKeeper.

write_partition_states must keep the single writes' semantics per partition (fenced by the
controller epoch's version, None on a clash, parents created first) while committing them as
one batch; consume_isr_change_notifications reads and deletes a whole list at once; a leader's
ISR writes (update_isrs_from_leader) go in one batch too, and the topics' assignments and
configs are read in one get_many. Each test
gets a fresh store, or a fresh chroot of the shared ZooKeeper server (KafkaZkClient's paths are
absolute).
"""

from __future__ import annotations

import json

import pytest

from localcluster.coord import connect, file_store, kafka_zk, paths
from localcluster.coord.kafka_zk import ControllerMovedError, KafkaZkClient
from localcluster.metadata_types import LeaderAndIsr

pytestmark = pytest.mark.zookeeper

TOPIC = "orders"


@pytest.fixture
def zk(coord_backend):
    chroot = coord_backend.base if coord_backend.name == "zookeeper" else ""
    client = connect(
        coord_backend.spec + chroot, session_timeout_ms=coord_backend.session_timeout_ms
    )
    coord_backend.clients.append(client)
    zk = KafkaZkClient(client)
    zk.ensure_persistent_paths()
    zk.create_topic(TOPIC, {p: (0, 1, 2) for p in range(6)}, {})
    return zk


def leader(broker: int, leader_epoch: int = 0) -> LeaderAndIsr:
    return LeaderAndIsr(broker, leader_epoch, (0, 1, 2), 1)


def become_controller(zk: KafkaZkClient, broker_id: int) -> int:
    """Win the seat and return /controller_epoch's version (what writes are fenced by)."""
    won = zk.try_become_controller(broker_id)
    assert won is not None
    return won[1]


def test_creates_make_parents_and_a_clash_holds_back_only_its_own_partition(zk):
    fence = become_controller(zk, 0)
    assert zk.write_partition_states([((TOPIC, 0), leader(0), None)], fence) == {(TOPIC, 0): 0}
    writes = [((TOPIC, p), leader(p % 3), None) for p in range(6)]  # partition 0 exists
    versions = zk.write_partition_states(writes, fence)
    assert versions == {(TOPIC, 0): None, **{(TOPIC, p): 0 for p in range(1, 6)}}
    found = zk.partition_states([(TOPIC, p) for p in range(6)] + [(TOPIC, 99)])
    assert found[(TOPIC, 99)] is None
    for p in range(6):
        state, version = found[(TOPIC, p)]
        assert (state.leader, version) == (p % 3 if p else 0, 0)
        assert zk.partition_state(TOPIC, p) == found[(TOPIC, p)]
    children = zk.coord.get_children(paths.topic_partitions_path(TOPIC))
    assert sorted(children, key=int) == [str(p) for p in range(6)]


def test_updates_are_conditional_each_on_its_own_version(zk):
    fence = become_controller(zk, 0)
    zk.write_partition_states([((TOPIC, p), leader(0), None) for p in range(3)], fence)
    assert zk.update_partition_state((TOPIC, 1), leader(1, 1), 0, fence) == 1
    versions = zk.write_partition_states(
        [
            ((TOPIC, 0), leader(2, 1), 0),  # current: applied
            ((TOPIC, 1), leader(2, 2), 0),  # stale (it is at 1): a clash
            ((TOPIC, 2), leader(2, 1), 0),
            ((TOPIC, 2), leader(1, 2), 1),  # sees the write before it in the same batch
            ((TOPIC, 5), leader(2, 1), 0),  # no znode: a clash, as the single form says
        ],
        fence,
    )
    assert versions == {(TOPIC, 0): 1, (TOPIC, 1): None, (TOPIC, 2): 2, (TOPIC, 5): None}
    assert zk.partition_state(TOPIC, 0) == (leader(2, 1), 1)
    assert zk.partition_state(TOPIC, 1) == (leader(1, 1), 1)
    assert zk.partition_state(TOPIC, 2) == (leader(1, 2), 2)
    assert zk.partition_state(TOPIC, 5) is None


def test_a_moved_controller_epoch_fences_the_whole_batch(zk):
    old_fence = become_controller(zk, 0)
    zk.write_partition_states([((TOPIC, 0), leader(0), None)], old_fence)
    zk.coord.delete(paths.CONTROLLER)  # broker 0's session "expired"; broker 1 takes the seat
    new_fence = become_controller(zk, 1)
    assert new_fence != old_fence
    with pytest.raises(ControllerMovedError):
        zk.write_partition_states(
            [((TOPIC, 0), leader(1, 1), 0), ((TOPIC, 1), leader(1), None)], old_fence
        )
    with pytest.raises(ControllerMovedError):
        zk.update_partition_state((TOPIC, 0), leader(1, 1), 0, old_fence)
    assert zk.partition_state(TOPIC, 0) == (leader(0), 0), "nothing of a fenced batch landed"
    assert zk.partition_state(TOPIC, 1) is None
    assert zk.write_partition_states([((TOPIC, 1), leader(1), None)], new_fence) == {(TOPIC, 1): 0}


def test_isr_change_notifications_are_consumed_in_one_batch(zk):
    fence = become_controller(zk, 0)
    zk.write_partition_states([((TOPIC, p), leader(0), None) for p in range(4)], fence)
    for p in range(4):
        # one call per partition: one notification each
        assert zk.update_isrs_from_leader([((TOPIC, p), LeaderAndIsr(0, 0, (0, 1), 1), 0)]) == [1]
    zk.coord.create(paths.isr_change_notification_prefix(), b"not json", sequence=True)
    names = zk.isr_change_notifications()
    assert len(names) == 5
    changed = zk.consume_isr_change_notifications(names + ["isr_change_9999999999"])
    assert sorted(changed) == [(TOPIC, p) for p in range(4)], "the malformed one names none"
    assert zk.isr_change_notifications() == []
    assert zk.consume_isr_change_notifications(names) == [], "consumed already: nothing twice"


def test_leaders_isr_writes_go_in_one_batch_each_conditional_with_its_notification(zk):
    fence = become_controller(zk, 0)
    zk.write_partition_states([((TOPIC, p), leader(0), None) for p in range(6)], fence)
    shrunk = LeaderAndIsr(0, 0, (0, 1), 1)
    assert zk.update_isrs_from_leader([((TOPIC, p), shrunk, 0) for p in (0, 1)]) == [1, 1]
    assert len(zk.isr_change_notifications()) == 1, "one notification names both"
    assert sorted(zk.consume_isr_change_notifications(zk.isr_change_notifications())) == [
        (TOPIC, 0),
        (TOPIC, 1),
    ]
    versions = zk.update_isrs_from_leader(
        [
            ((TOPIC, 2), shrunk, 0),
            ((TOPIC, 3), shrunk, 5),  # a stale version: a clash, nothing written
            ((TOPIC, 4), shrunk, 0),
            ((TOPIC, 9), shrunk, 0),  # no znode: a clash
        ]
    )
    assert versions == [1, None, 1, None], "a clash holds back only its own partition"
    assert zk.partition_state(TOPIC, 2) == (shrunk, 1)
    assert zk.partition_state(TOPIC, 3) == (leader(0), 0)
    assert sorted(zk.consume_isr_change_notifications(zk.isr_change_notifications())) == [
        (TOPIC, 2),
        (TOPIC, 4),
    ], "a notification for each write that landed, none for a clash"


def test_more_isr_writes_than_one_transaction_holds(zk, monkeypatch):
    monkeypatch.setattr(kafka_zk, "ISR_WRITES_PER_TRANSACTION", 2)
    fence = become_controller(zk, 0)
    zk.write_partition_states([((TOPIC, p), leader(0), None) for p in range(5)], fence)
    shrunk = LeaderAndIsr(0, 0, (0, 1), 1)
    writes = [((TOPIC, p), shrunk, 0) for p in range(5)]
    assert zk.update_isrs_from_leader(writes) == [1] * 5
    assert len(zk.isr_change_notifications()) == 3
    changed = zk.consume_isr_change_notifications(zk.isr_change_notifications())
    assert sorted(changed) == [(TOPIC, p) for p in range(5)]


def test_assignments_and_configs_of_many_topics_in_one_read(zk):
    zk.create_topic("compacted", {0: (1, 2, 0)}, {"cleanup.policy": "compact"})
    zk.create_topic("garbled", {0: (1, 2, 0)}, {"cleanup.policy": "compact"})
    zk.coord.set("/config/topics/garbled", b"{not json")
    zk.create_topic("mangled", {0: (1, 2, 0)}, {})
    zk.coord.set("/brokers/topics/mangled", b'{"version": 2, "partitions": {"0": "x"}}')
    assignments, configs, unreadable = zk.assignments_and_configs(
        [TOPIC, "gone", "compacted", "garbled", "mangled"])  # fmt: skip
    assert assignments == {TOPIC: zk.assignment(TOPIC), "compacted": zk.assignment("compacted"),
                           "garbled": zk.assignment("garbled")}  # fmt: skip
    assert configs == {TOPIC: {}, "compacted": {"cleanup.policy": "compact"}}
    # one garbled znode fails that topic alone, naming it: its config, or its assignment
    assert sorted(unreadable) == ["garbled", "mangled"]
    assert "/config/topics/garbled does not hold JSON" in unreadable["garbled"]
    assert "/brokers/topics/mangled" in unreadable["mangled"]
    assert zk.assignments_and_configs([]) == ({}, {}, {})


def test_topic_znodes_are_deleted_in_one_batch_even_with_an_unknown_child(zk):
    fence = become_controller(zk, 0)
    zk.write_partition_states([((TOPIC, p), leader(0), None) for p in range(6)], fence)
    assert zk.request_topic_deletion(TOPIC)
    zk.coord.create(paths.topic_path(TOPIC) + "/stray", makepath=False)  # not Kafka's layout
    zk.delete_topic_znodes(TOPIC)
    for path in (
        paths.topic_path(TOPIC),
        "/config/topics/" + TOPIC,
        paths.delete_topic_path(TOPIC),
    ):
        assert zk.coord.exists(path) is None, path
    assert zk.topics() == [] and zk.topics_to_delete() == []
    zk.delete_topic_znodes(TOPIC)  # gone already: nothing to do, no error


def test_the_file_store_commits_a_batch_with_one_changelog_write_per_thousand(
    zk, coord_backend, monkeypatch
):
    if coord_backend.name != "file":
        pytest.skip("the changelog is the file backend's")
    fence = become_controller(zk, 0)
    appends = []
    real_append = file_store.FileStore._append_changelog

    def counted(store, lines):
        appends.append(len(lines))
        return real_append(store, lines)

    zk.coord.create(paths.topic_path("wide"), json.dumps({"version": 1, "partitions": {}}).encode())
    monkeypatch.setattr(file_store.FileStore, "_append_changelog", counted)
    writes = [(("wide", p), leader(0), None) for p in range(1200)]
    versions = zk.write_partition_states(writes, fence)
    assert set(versions.values()) == {0} and len(versions) == 1200
    # 1 + 1,200 parent creates and 1,200 fenced creates, 1,000 transactions per lock hold
    assert appends == [1000, 1000, 401], "one changelog write per lock hold, one line each"
