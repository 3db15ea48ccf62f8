"""Offsets and group administration on the coordinator core: commit, fetch, delete, retention,
ListGroups, DescribeGroups, DeleteGroups."""

from __future__ import annotations

from localcluster.group import errors as E
from localcluster.group import messages as m
from localcluster.group.coordinator import GroupConfig
from localcluster.group.metadata import GroupState as S
from localcluster.group.records import (
    GroupMetadataKey,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_record,
)
from tests.group_harness import (
    GroupHarness,
    commit,
    committed,
    errors_of,
    fetch,
    heartbeat,
    join,
    sync,
)

RETENTION = GroupConfig(
    group_initial_rebalance_delay_ms=0,
    offsets_retention_ms=60_000,
    offsets_retention_check_interval_ms=10_000,
)


def one_member_group(h: GroupHarness, topics=("t",)) -> str:
    member = h.call(join(version=3, topics=topics)).member_id
    assert h.call(sync(member, 1, {member: b""})).error_code == E.NONE
    return member


def records_of(h: GroupHarness, start: int = 0):
    return [decode_record(r.key, r.value) for r in h.log[start:]]


# -- OffsetCommit -----------------------------------------------------------------------------


def test_simple_commit_creates_a_group_and_is_answered_only_after_it_commits():
    h = GroupHarness(auto_commit=False)
    h.now_ms = 1_000
    token = h.send(commit({("t", 0): 42, ("t", 1): 7}, metadata="m"))
    assert h.reply(token) is None and h.group().state is S.EMPTY
    assert committed(h) == {}  # not visible before the high watermark passes the record
    h.commit()
    assert errors_of(h.reply(token)) == {("t", 0): E.NONE, ("t", 1): E.NONE}
    assert committed(h) == {("t", 0): 42, ("t", 1): 7}
    key, value = records_of(h)[0]
    assert key == OffsetCommitKey("g", "t", 0, version=1)
    assert value == OffsetCommitValue(42, "m", 1_000, leader_epoch=-1, version=3)


def test_commit_waits_for_the_high_watermark_not_for_the_append():
    h = GroupHarness(auto_commit=False)
    token = h.send(commit({("t", 0): 1}))
    append = h.in_flight.pop()
    h.shard.on_appended(append.append_id, 10)
    h.absorb(h.shard.on_committed(10, h.now_ms))  # HW 10: offset 10 is not committed yet
    assert h.reply(token) is None
    h.absorb(h.shard.on_committed(11, h.now_ms))
    assert errors_of(h.reply(token)) == {("t", 0): E.NONE}


def test_commit_errors_by_group_state():
    h = GroupHarness()
    assert errors_of(h.call(commit({("t", 0): 1}, "m1", 3, group_id="gone"))) == {
        ("t", 0): E.ILLEGAL_GENERATION
    }
    member = one_member_group(h)
    cases = [
        (commit({("t", 0): 1}), E.UNKNOWN_MEMBER_ID),  # only members commit for a live group
        (commit({("t", 0): 1}, member, 2), E.ILLEGAL_GENERATION),
        (commit({("t", 0): 1}, "nobody", 1), E.UNKNOWN_MEMBER_ID),
        (commit({("t", 0): 1}, member, 1, instance="i1"), E.UNKNOWN_MEMBER_ID),
        (commit({("t", 0): 1}, member, 1), E.NONE),
    ]
    for request, expected in cases:
        assert errors_of(h.call(request)) == {("t", 0): expected}, request
    h2 = GroupHarness(GroupConfig(group_initial_rebalance_delay_ms=3_000))
    member = h2.run_until_answered([h2.send(join(version=3))])[0].member_id
    assert h2.group().state is S.COMPLETING_REBALANCE
    assert errors_of(h2.call(commit({("t", 0): 1}, member, 1))) == {
        ("t", 0): E.REBALANCE_IN_PROGRESS
    }


def test_commit_during_preparing_rebalance_counts_as_a_heartbeat():
    h = GroupHarness()
    member = one_member_group(h)
    h.send(join(version=3, client_id="other"))  # a newcomer: PreparingRebalance
    assert h.group().state is S.PREPARING_REBALANCE
    for _ in range(5):  # never heartbeats, only commits: its session stays alive
        h.advance(5_000)
        assert errors_of(h.call(commit({("t", 0): 1}, member, 1))) == {("t", 0): E.NONE}
    assert h.group().has(member)


def test_metadata_too_large_fails_only_that_partition():
    h = GroupHarness()
    request = m.OffsetCommitRequest("g", (m.OffsetCommitTopic("t", (
        m.OffsetCommitPartition(0, 5, committed_metadata="x" * 4096),
        m.OffsetCommitPartition(1, 6, committed_metadata="x" * 4097),
    )),))  # fmt: skip
    assert errors_of(h.call(request)) == {("t", 0): E.NONE, ("t", 1): E.OFFSET_METADATA_TOO_LARGE}
    assert committed(h) == {("t", 0): 5}


def test_failed_commit_maps_the_replica_error_and_keeps_the_old_offset():
    h = GroupHarness(auto_commit=False)
    h.send(commit({("t", 0): 1}))
    h.commit()
    for replica_error, expected in [
        (E.NOT_ENOUGH_REPLICAS, E.COORDINATOR_NOT_AVAILABLE),
        (E.NOT_LEADER_OR_FOLLOWER, E.NOT_COORDINATOR),
        (E.MESSAGE_TOO_LARGE, E.INVALID_COMMIT_OFFSET_SIZE),
        (E.REQUEST_TIMED_OUT, E.REQUEST_TIMED_OUT),
    ]:
        token = h.send(commit({("t", 0): 2}))
        h.fail(0, replica_error)
        assert errors_of(h.reply(token)) == {("t", 0): expected}
    assert committed(h) == {("t", 0): 1}
    assert not h.group().pending_offset_commits


def test_retention_time_writes_a_v1_value_with_its_expire_timestamp():
    h = GroupHarness()
    h.now_ms = 5_000
    h.call(commit({("t", 0): 9}, retention_ms=1_000))
    _, value = records_of(h)[0]
    assert (value.version, value.expire_timestamp, value.commit_timestamp) == (1, 6_000, 5_000)


def test_offset_deleted_while_its_commit_is_in_flight_stays_deleted():
    h = GroupHarness(auto_commit=False)
    h.send(commit({("t", 0): 1}))
    h.commit()
    token = h.send(commit({("t", 0): 2}))
    delete = h.send(m.OffsetDeleteRequest("g", (m.OffsetFetchTopic("t", (0,)),)))
    h.commit()
    assert errors_of(h.reply(token)) == {("t", 0): E.NONE}
    assert h.reply(delete).error_code == E.NONE
    assert "g" not in h.shard.groups  # its last offset went: the empty group is gone
    assert h.rebuild().groups == {}


# -- OffsetFetch ------------------------------------------------------------------------------


def test_offset_fetch_single_and_multi_group():
    h = GroupHarness()
    h.call(commit({("t", 0): 3, ("u", 1): 4}))
    response = h.call(m.OffsetFetchRequest((
        m.OffsetFetchGroup("g", (m.OffsetFetchTopic("t", (0, 5)),)),
        m.OffsetFetchGroup("missing", (m.OffsetFetchTopic("t", (0,)),)),
        m.OffsetFetchGroup("g"),
    ), require_stable=True))  # fmt: skip
    first, missing, everything = response.groups
    assert [(p.partition_index, p.committed_offset, p.error_code) for p in first.topics[0].partitions] == [
        (0, 3, E.NONE), (5, -1, E.NONE)]  # fmt: skip
    assert missing.error_code == E.NONE and missing.topics[0].partitions[0].committed_offset == -1
    assert {(t.name, p.partition_index) for t in everything.topics for p in t.partitions} == {
        ("t", 0),
        ("u", 1),
    }
    h2 = GroupHarness(num_partitions=50)
    (other,) = h2.call(fetch("hello")).groups  # partition 22, not this shard's 0
    assert other.error_code == E.NOT_COORDINATOR


# -- OffsetDelete -----------------------------------------------------------------------------


def test_offset_delete_refuses_topics_the_group_consumes():
    h = GroupHarness()
    member = one_member_group(h, topics=("t",))
    h.call(commit({("t", 0): 1, ("old", 0): 2}, member, 1))
    response = h.call(m.OffsetDeleteRequest("g", (
        m.OffsetFetchTopic("t", (0,)), m.OffsetFetchTopic("old", (0,)))))  # fmt: skip
    assert {(t.name, p.error_code) for t in response.topics for p in t.partitions} == {
        ("t", E.GROUP_SUBSCRIBED_TO_TOPIC), ("old", E.NONE)}  # fmt: skip
    assert committed(h) == {("t", 0): 1}
    key, value = records_of(h)[-1]
    assert key == OffsetCommitKey("g", "old", 0) and value is None


def test_offset_delete_errors():
    h = GroupHarness()
    request = m.OffsetDeleteRequest("g", (m.OffsetFetchTopic("t", (0,)),))
    assert h.call(request).error_code == E.GROUP_ID_NOT_FOUND
    member = h.call(join(version=3, protocol_type="connect")).member_id
    h.call(sync(member, 1, {member: b""}))
    assert h.call(request).error_code == E.NON_EMPTY_GROUP
    assert h.call(m.OffsetDeleteRequest("", ())).error_code == E.INVALID_GROUP_ID


# -- ListGroups, DescribeGroups, DeleteGroups ---------------------------------------------------


def test_list_groups_with_a_states_filter():
    h = GroupHarness()
    one_member_group(h)
    h.call(commit({("t", 0): 1}, group_id="simple"))
    all_groups = h.call(m.ListGroupsRequest())
    assert {(g.group_id, g.group_state, g.protocol_type) for g in all_groups.groups} == {
        ("g", "Stable", "consumer"), ("simple", "Empty", "")}  # fmt: skip
    assert [g.group_id for g in h.call(m.ListGroupsRequest(("STABLE",))).groups] == ["g"]
    assert h.call(m.ListGroupsRequest(types_filter=("consumer",))).groups == ()
    assert len(h.call(m.ListGroupsRequest(types_filter=("Classic",))).groups) == 2


def test_describe_groups():
    h = GroupHarness()
    member = one_member_group(h)
    stable, missing = h.call(m.DescribeGroupsRequest(("g", "nobody"))).groups
    assert (stable.group_state, stable.protocol_type, stable.protocol_data) == (
        "Stable",
        "consumer",
        "range",
    )
    (described,) = stable.members
    assert (described.member_id, described.client_id, described.client_host) == (
        member,
        "c",
        "/127.0.0.1",
    )
    assert described.member_metadata == h.group().get(member).metadata("range")
    assert (missing.error_code, missing.group_state, missing.members) == (E.NONE, "Dead", ())
    h.send(join(version=3, client_id="new"))
    (rebalancing,) = h.call(m.DescribeGroupsRequest(("g",))).groups
    assert rebalancing.protocol_data == "" and all(
        x.member_metadata == b"" for x in rebalancing.members
    )


def test_delete_groups():
    h = GroupHarness(auto_commit=False)
    h.send(commit({("t", 0): 1}, group_id="simple"))
    h.commit()
    member = h.call(join(version=3, group_id="gone")).member_id
    h.send(sync(member, 1, {member: b""}, group_id="gone"))
    h.commit()
    h.send(m.LeaveGroupRequest("gone", (m.MemberIdentity(member),)))
    h.commit()
    live = h.call(join(version=3, group_id="live")).member_id
    assert live
    token = h.send(m.DeleteGroupsRequest(("simple", "gone", "live", "never")))
    assert h.reply(token) is None  # answered once the tombstones commit
    assert "simple" not in h.shard.groups and "gone" not in h.shard.groups
    start = len(h.log)
    h.commit()
    assert {(r.group_id, r.error_code) for r in h.reply(token).results} == {
        ("simple", E.NONE), ("gone", E.NONE), ("live", E.NON_EMPTY_GROUP), ("never", E.GROUP_ID_NOT_FOUND)}  # fmt: skip
    tombstones = records_of(h, start)
    assert (OffsetCommitKey("simple", "t", 0), None) in tombstones
    assert (GroupMetadataKey("gone"), None) in tombstones
    assert (GroupMetadataKey("simple"), None) not in tombstones  # generation 0: never written
    assert h.rebuild().groups == {}  # "live" has not synced: no record of it yet


# -- retention --------------------------------------------------------------------------------


def test_an_empty_groups_offsets_expire_a_retention_after_it_became_empty():
    h = GroupHarness(RETENTION)
    member = one_member_group(h)
    h.call(commit({("t", 0): 1}, member, 1))
    h.advance(5_000)
    h.call(heartbeat(member, 1))
    h.call(m.LeaveGroupRequest("g", (m.MemberIdentity(member),)))
    assert h.group().state is S.EMPTY and h.now_ms == 5_000
    # checks run every 10 s from the load (t=0); the retention runs out at t=65 s
    h.advance(69_999 - h.now_ms)
    assert committed(h) == {("t", 0): 1}
    h.advance(1)
    assert "g" not in h.shard.groups
    assert records_of(h)[-2:] == [
        (OffsetCommitKey("g", "t", 0), None),
        (GroupMetadataKey("g"), None),
    ]


def test_simple_groups_offsets_expire_by_their_commit_time():
    h = GroupHarness(RETENTION)
    h.call(commit({("t", 0): 1}))
    h.advance(30_000)
    h.call(commit({("t", 1): 1}))
    h.advance(30_000)  # t=60 s: the first offset is a retention old
    assert committed(h) == {("t", 1): 1}
    h.advance(30_000)
    assert "g" not in h.shard.groups


def test_stable_consumer_groups_keep_offsets_of_subscribed_topics():
    h = GroupHarness(RETENTION)
    member = one_member_group(h, topics=("t",))
    h.call(commit({("t", 0): 1, ("gone", 0): 2}, member, 1))
    for _ in range(30):
        h.advance(3_000)
        assert h.call(heartbeat(member, 1)).error_code == E.NONE
    assert committed(h) == {("t", 0): 1}  # the unsubscribed topic's offset expired


def test_expired_offsets_with_explicit_expire_timestamp_use_it():
    h = GroupHarness(RETENTION)
    h.call(commit({("t", 0): 1}, retention_ms=15_000))
    h.advance(10_000)
    assert committed(h) == {("t", 0): 1}
    h.advance(10_000)
    assert committed(h) == {}
