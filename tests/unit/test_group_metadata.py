"""GroupMetadata's state machine and rules, and the shard's deadline queue."""

from __future__ import annotations

import itertools

import pytest

from localcluster.group.metadata import (
    VALID_PREVIOUS_STATES,
    GroupMetadata,
    GroupState,
    IllegalGroupStateTransition,
    MemberMetadata,
    OffsetAndMetadata,
    group_from_value,
    group_metadata_value,
)
from localcluster.group.timers import Timers
from tests.group_harness import subscription

S = GroupState
KAFKA_TABLE = {  # GroupMetadata.scala / ClassicGroupState.java
    S.EMPTY: {S.PREPARING_REBALANCE},
    S.PREPARING_REBALANCE: {S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY},
    S.COMPLETING_REBALANCE: {S.PREPARING_REBALANCE},
    S.STABLE: {S.COMPLETING_REBALANCE},
    S.DEAD: {S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD},
}


def member(
    member_id: str, *protocols: str, instance: str | None = None, topics=("t",)
) -> MemberMetadata:
    return MemberMetadata(member_id, instance, "c", "h", 30_000, 10_000, "consumer",
                          tuple((p, subscription(*topics)) for p in protocols))  # fmt: skip


def test_the_table_is_kafkas():
    assert VALID_PREVIOUS_STATES == KAFKA_TABLE


@pytest.mark.parametrize("source, target", list(itertools.product(GroupState, GroupState)))
def test_every_transition(source, target):
    group = GroupMetadata("g", source, current_state_timestamp_ms=5)
    if source in KAFKA_TABLE[target]:
        group.transition_to(target, 9)
        assert (group.state, group.current_state_timestamp_ms) == (target, 9)
    else:
        with pytest.raises(IllegalGroupStateTransition):
            group.transition_to(target, 9)
        assert (group.state, group.current_state_timestamp_ms) == (source, 5)  # unchanged


def test_first_member_leads_and_the_next_one_inherits():
    group = GroupMetadata("g")
    group.add(member("a", "range"))
    group.add(member("b", "range"))
    assert group.leader_id == "a" and group.protocol_type == "consumer"
    group.remove("a")
    assert group.leader_id == "b"
    group.remove("b")
    assert group.leader_id is None


def test_supports_protocols():
    group = GroupMetadata("g")
    assert not group.supports_protocols("consumer", set())
    assert not group.supports_protocols("", {"range"})
    group.add(member("a", "range", "roundrobin"))
    group.transition_to(S.PREPARING_REBALANCE, 0)
    assert group.supports_protocols("consumer", {"roundrobin", "sticky"})
    assert not group.supports_protocols("consumer", {"sticky"})
    assert not group.supports_protocols("connect", {"range"})


def test_select_protocol_counts_first_choices_among_common_protocols():
    group = GroupMetadata("g")
    group.add(member("a", "sticky", "range", "roundrobin"))
    group.add(member("b", "roundrobin", "range"))
    group.add(member("c", "roundrobin", "range"))
    assert group.select_protocol() == "roundrobin"  # sticky is not common; b and c vote rr


def test_subscribed_topics_union_and_unknown_on_bad_metadata():
    group = GroupMetadata("g")
    group.add(member("a", "range", topics=("x",)))
    group.add(member("b", "range", topics=("y", "z")))
    group.protocol_name = "range"
    assert group.compute_subscribed_topics() == {"x", "y", "z"}
    group.members["b"].supported_protocols = (("range", b"\x00"),)
    assert group.compute_subscribed_topics() is None  # unknown: treated as subscribed to all
    group.subscribed_topics = None
    assert group.is_subscribed_to_topic("anything")


def test_replace_static_member_moves_leadership_and_the_owed_sync():
    group = GroupMetadata("g")
    group.add(member("old", "range", instance="i"))
    group.pending_sync_members.add("old")
    replaced = group.replace_static_member("i", "old", "new")
    assert replaced.member_id == "new" and group.leader_id == "new"
    assert group.static_members == {"i": "new"} and group.pending_sync_members == {"new"}


def test_group_record_round_trips_through_load():
    group = GroupMetadata("g", S.COMPLETING_REBALANCE, 77, generation_id=3)
    group.add(member("a", "range", "roundrobin", instance="i"))
    group.add(member("b", "range"))
    group.protocol_name = "range"
    loaded = group_from_value("g", group_metadata_value(group, {"a": b"A", "b": b"B"}))
    assert loaded.state is S.STABLE and loaded.generation_id == 3 and loaded.leader_id == "a"
    assert loaded.current_state_timestamp_ms == 77 and loaded.static_members == {"i": "a"}
    assert loaded.get("a").supported_protocols == (("range", subscription("t")),)
    assert (loaded.get("a").assignment, loaded.get("b").assignment) == (b"A", b"B")
    assert loaded.subscribed_topics == {"t"}


def test_offset_commit_completion_and_deletion_in_flight():
    group = GroupMetadata("g")
    offset = OffsetAndMetadata(5, -1, "", 0)
    group.prepare_offset_commit(("t", 0), 1)
    group.prepare_offset_commit(("t", 0), 2)
    group.complete_offset_commit(("t", 0), 1, offset)
    assert group.offsets[("t", 0)] == offset and group.has_pending_commit(("t", 0))
    group.remove_offsets([("t", 0)])
    group.complete_offset_commit(("t", 0), 2, OffsetAndMetadata(6, -1, "", 0))
    assert group.offsets == {} and not group.has_offsets


def test_timers_fire_in_deadline_then_arming_order_and_rearm_replaces():
    timers = Timers()
    timers.arm("a", 10)
    timers.arm("b", 5)
    timers.arm("c", 5)
    timers.arm("a", 3)  # replaces a's 10
    timers.arm("d", 7)
    timers.cancel("d")
    assert timers.next_deadline_ms() == 3
    assert [timers.pop_due(6) for _ in range(4)] == ["a", "b", "c", None]
    assert timers.next_deadline_ms() is None and len(timers) == 0


def test_timers_heap_stays_bounded_when_rearmed_often():
    timers = Timers()
    for i in range(10_000):
        timers.arm("k", i)
    assert len(timers._heap) <= 2 * len(timers) + 65
    assert timers.pop_due(10_000) == "k"
