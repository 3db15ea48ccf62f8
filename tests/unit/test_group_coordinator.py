"""GroupCoordinatorShard: every membership transition and timeout, driven with explicit now_ms."""

from __future__ import annotations

from localcluster.group import errors as E
from localcluster.group import messages as m
from localcluster.group.consumer_protocol import Assignment, encode_assignment
from localcluster.group.coordinator import GroupConfig
from localcluster.group.metadata import GroupState as S
from localcluster.group.records import GroupMetadataKey, decode_record
from tests.group_harness import GroupHarness, heartbeat, join, sync

DELAYED = GroupConfig(group_initial_rebalance_delay_ms=3_000)


def assignment(*partitions: int, topic: str = "t") -> bytes:
    return encode_assignment(Assignment(((topic, partitions),)))


def member_id_for(h: GroupHarness, **kw) -> str:
    response = h.call(join(**kw))
    assert response.error_code == E.MEMBER_ID_REQUIRED, response
    return response.member_id


def form(h: GroupHarness, n: int, instances=None, version: int = 5, session_ms: int = 10_000):
    """n members join in one rebalance and sync; returns their member ids, leader first."""
    tokens = []
    for i in range(n):
        instance = instances[i] if instances else None
        member_id = "" if instance else member_id_for(h, client_id=f"c{i}", version=version)
        tokens.append(h.send(join(member_id, instance=instance, client_id=f"c{i}",
                                  version=version, session_ms=session_ms)))  # fmt: skip
    responses = h.run_until_answered(tokens)
    assert all(r.error_code == E.NONE for r in responses), responses
    ids = [r.member_id for r in responses]
    leader = responses[0].leader
    generation = responses[0].generation_id
    assignments = {mid: assignment(i) for i, mid in enumerate(ids)}
    sync_tokens = [h.send(sync(mid, generation, assignments if mid == leader else None,
                               instance=instances[i] if instances else None))
                   for i, mid in enumerate(ids)]  # fmt: skip
    assert all(h.reply(t).error_code == E.NONE for t in sync_tokens)
    assert h.group().state is S.STABLE
    return [leader] + [x for x in ids if x != leader]


# -- KIP-394: MEMBER_ID_REQUIRED --------------------------------------------------------------


def test_member_id_required_then_rejoin_joins_the_group():
    h = GroupHarness(DELAYED)
    response = h.call(join(version=4, client_id="app"))
    assert response.error_code == E.MEMBER_ID_REQUIRED
    assert response.member_id == "app-uuid1"
    group = h.group()
    assert group.state is S.EMPTY and group.pending_members == {"app-uuid1"} and not group.members
    token = h.send(join("app-uuid1", version=4, client_id="app"))
    assert h.reply(token) is None and group.state is S.PREPARING_REBALANCE
    h.advance(2_999)
    assert h.reply(token) is None
    h.advance(1)  # the initial delay is over, nobody else came
    joined = h.reply(token)
    assert (joined.error_code, joined.generation_id, joined.leader) == (E.NONE, 1, "app-uuid1")
    assert joined.protocol_name == "range" and len(joined.members) == 1
    assert group.state is S.COMPLETING_REBALANCE and not group.pending_members


def test_versions_before_4_join_without_a_member_id_round_trip():
    h = GroupHarness()
    response = h.call(join(version=3, client_id="old"))
    assert response.error_code == E.NONE and response.member_id == "old-uuid1"
    assert response.generation_id == 1


def test_pending_member_expires_after_its_session_timeout():
    h = GroupHarness()
    member_id_for(h, session_ms=8_000)
    assert h.group().pending_members
    h.advance(7_999)
    assert h.group().pending_members
    h.advance(1)
    assert not h.group().pending_members
    late = h.call(join("c-uuid1", session_ms=8_000))  # its id is forgotten: back to the start
    assert late.error_code == E.UNKNOWN_MEMBER_ID


def test_a_pending_member_holds_the_join_phase_until_it_expires():
    h = GroupHarness()
    (leader,) = form(h, 1)
    member_id_for(h, client_id="late", session_ms=6_000)
    assert h.group().state is S.STABLE  # a pending member alone does not rebalance
    token = h.send(join(leader, client_id="c0"))  # the leader's JoinGroup forces a rebalance
    assert h.group().state is S.PREPARING_REBALANCE and h.reply(token) is None
    h.advance(5_999)
    assert h.reply(token) is None
    h.advance(1)
    response = h.reply(token)
    assert response.error_code == E.NONE and response.generation_id == 2


# -- rebalances -------------------------------------------------------------------------------


def test_two_members_one_rebalance_replies_after_the_group_record_commits():
    h = GroupHarness(DELAYED, auto_commit=False)
    a, b = member_id_for(h, client_id="a"), member_id_for(h, client_id="b")
    ta, tb = h.send(join(a, client_id="a")), h.send(join(b, client_id="b"))
    h.advance(6_000)  # extended once: b joined during the initial delay
    ra, rb = h.reply(ta), h.reply(tb)
    assert ra.generation_id == rb.generation_id == 1 and ra.leader == rb.leader == a
    assert [x.member_id for x in ra.members] == [a, b] and rb.members == ()
    follower = h.send(sync(b, 1))
    assert h.reply(follower) is None  # waits for the leader
    leader = h.send(sync(a, 1, {a: assignment(0), b: assignment(1)}))
    assert h.reply(leader) is None and h.reply(follower) is None
    assert len(h.in_flight) == 1 and h.group().state is S.COMPLETING_REBALANCE
    h.commit()
    assert h.reply(leader).assignment == assignment(0)
    assert h.reply(follower).assignment == assignment(1)
    assert h.group().state is S.STABLE
    key, value = decode_record(h.log[-1].key, h.log[-1].value)
    assert key == GroupMetadataKey("g") and value.generation == 1
    assert [x.assignment for x in value.members] == [assignment(0), assignment(1)]


def test_failed_group_record_answers_kafkas_error_and_rebalances():
    h = GroupHarness(auto_commit=False)
    (a,) = [h.call(join(version=3)).member_id]
    token = h.send(sync(a, 1, {a: assignment(0)}))
    h.fail(0, E.NOT_ENOUGH_REPLICAS)
    assert h.reply(token).error_code == E.COORDINATOR_NOT_AVAILABLE
    assert h.group().state is S.PREPARING_REBALANCE


def test_initial_rebalance_delay_extends_while_members_arrive_up_to_the_rebalance_timeout():
    h = GroupHarness(DELAYED)
    ta = h.send(join(version=3, client_id="a", rebalance_ms=10_000))
    h.advance(2_000)
    h.send(join(version=3, client_id="b", rebalance_ms=10_000))
    h.advance(1_000)  # t=3000: b arrived, wait 3000 more (7000 left of the rebalance timeout)
    assert h.reply(ta) is None
    h.advance(2_000)
    h.send(join(version=3, client_id="c", rebalance_ms=10_000))
    h.advance(1_000)  # t=6000: extended again, 1000 left
    h.advance(2_000)
    h.send(join(version=3, client_id="d", rebalance_ms=10_000))
    h.advance(1_000)  # t=9000: d arrived; the last delay is min(3000, 1000), then none remains
    assert h.reply(ta) is None
    h.advance(999)
    assert h.reply(ta) is None
    h.advance(1)
    assert h.reply(ta).error_code == E.NONE and len(h.reply(ta).members) == 4


def test_initial_delay_without_newcomers_completes_once():
    h = GroupHarness(DELAYED)
    token = h.send(join(version=3))
    h.advance(2_999)
    assert h.reply(token) is None
    h.advance(1)
    assert h.reply(token).generation_id == 1


def test_leader_rejoin_rebalances_and_keeps_the_leader():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2)
    ta = h.send(join(a, client_id="c0"))
    assert h.group().state is S.PREPARING_REBALANCE
    assert h.call(heartbeat(b, 1)).error_code == E.REBALANCE_IN_PROGRESS
    tb = h.send(join(b, client_id="c1"))
    assert h.reply(ta).generation_id == h.reply(tb).generation_id == 2
    assert h.reply(ta).leader == a


def test_follower_rejoin_with_same_metadata_in_stable_gets_the_current_generation():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2)
    response = h.call(join(b, client_id="c1"))
    assert (response.error_code, response.generation_id, response.members) == (E.NONE, 1, ())
    assert h.group().state is S.STABLE


def test_rebalance_timeout_removes_members_that_did_not_rejoin():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2)
    t0 = h.now_ms
    ta = h.send(join(a, client_id="c0", rebalance_ms=30_000))
    for _ in range(9):  # b stays alive but never rejoins
        h.advance(3_000)
        assert h.call(heartbeat(b, 1)).error_code == E.REBALANCE_IN_PROGRESS
    h.advance(t0 + 30_000 - h.now_ms - 1)
    assert h.reply(ta) is None
    h.advance(1)
    response = h.reply(ta)
    assert response.generation_id == 2 and [x.member_id for x in response.members] == [a]
    assert h.call(heartbeat(b, 2)).error_code == E.UNKNOWN_MEMBER_ID


def test_session_timeout_removes_a_silent_member_and_its_partitions_move():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2, session_ms=10_000)
    assert h.group().get(b).assignment == assignment(1)
    for _ in range(3):
        h.advance(3_000)
        assert h.call(heartbeat(a, 1)).error_code == E.NONE
    h.advance(999)  # t = 9999 since b's last sign of life
    assert h.group().has(b)
    h.advance(1)
    assert not h.group().has(b) and h.group().state is S.PREPARING_REBALANCE
    assert h.call(heartbeat(a, 1)).error_code == E.REBALANCE_IN_PROGRESS
    rejoin = h.call(join(a, client_id="c0"))
    assert rejoin.generation_id == 2 and [x.member_id for x in rejoin.members] == [a]
    done = h.call(sync(a, 2, {a: assignment(0, 1)}))
    assert done.assignment == assignment(0, 1)  # the leader gave itself b's partition


def test_members_awaiting_join_are_not_expired_by_their_session():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2, session_ms=6_000)
    ta = h.send(join(a, client_id="c0", session_ms=6_000, rebalance_ms=60_000))
    for _ in range(7):  # b stays alive without rejoining, so the join phase lasts
        h.advance(3_000)
        assert h.call(heartbeat(b, 1)).error_code == E.REBALANCE_IN_PROGRESS
    # a has waited 21 s, far past its 6 s session: it is not removed
    assert h.group().has(a) and h.reply(ta) is None
    h.advance(6_000)  # b stops: its session expires, the join completes without it
    assert not h.group().has(b) and h.reply(ta).generation_id == 2


def test_new_member_join_times_out_after_five_minutes():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2)
    ta = h.send(join(a, client_id="c0", rebalance_ms=600_000, session_ms=600_000))
    tc = h.send(join(version=3, client_id="new", session_ms=600_000))
    member = h.group().get(h.group().leader_id)
    assert member.member_id == a
    for _ in range(100):  # b keeps heartbeating but never rejoins: the join waits
        h.advance(2_999)
        h.call(heartbeat(b, 1))
    h.advance(300_000 - 100 * 2_999)
    response = h.reply(tc)
    assert response.error_code == E.UNKNOWN_MEMBER_ID  # the new member's join timed out
    assert h.reply(ta) is None


def test_member_that_never_syncs_is_removed_after_the_rebalance_timeout():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2)
    ta, tb = (
        h.send(join(a, client_id="c0", rebalance_ms=20_000)),
        h.send(join(b, client_id="c1", rebalance_ms=20_000)),
    )
    assert h.reply(ta).generation_id == 2
    h.call(sync(a, 2, {a: assignment(0), b: assignment(1)}))
    for _ in range(6):  # both heartbeat; only a sent SyncGroup
        h.advance(3_000)
        h.call(heartbeat(a, 2))
        h.call(heartbeat(b, 2))
    h.advance(1_999)
    assert h.group().has(b)
    h.advance(1)
    assert not h.group().has(b) and h.group().state is S.PREPARING_REBALANCE
    assert h.reply(tb).generation_id == 2


def test_a_superseded_parked_join_is_answered():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2)
    first = h.send(join(a, client_id="c0"))
    second = h.send(join(a, client_id="c0"))
    assert h.reply(first).error_code == E.REBALANCE_IN_PROGRESS
    assert h.reply(second) is None


def test_protocol_selection_takes_the_most_voted_common_protocol():
    h = GroupHarness(DELAYED)
    tokens = [
        h.send(
            join(
                version=3,
                client_id="a",
                protocols=(("range", None), ("roundrobin", None), ("sticky", None)),
            )
        ),
        h.send(join(version=3, client_id="b", protocols=(("roundrobin", None), ("range", None)))),
        h.send(join(version=3, client_id="c", protocols=(("range", None), ("roundrobin", None)))),
    ]
    assert {r.protocol_name for r in h.run_until_answered(tokens)} == {"range"}
    h2 = GroupHarness(DELAYED)
    tokens = [
        h2.send(join(version=3, client_id="a", protocols=(("sticky", None), ("range", None)))),
        h2.send(join(version=3, client_id="b", protocols=(("roundrobin", None), ("range", None)))),
    ]
    assert {r.protocol_name for r in h2.run_until_answered(tokens)} == {
        "range"
    }  # the only common one


def test_last_member_leaving_empties_the_group_with_a_new_generation():
    h = GroupHarness(DELAYED)
    (a,) = form(h, 1)
    response = h.call(m.LeaveGroupRequest("g", (m.MemberIdentity(a),)))
    assert response.members[0].error_code == E.NONE
    group = h.group()
    assert group.state is S.EMPTY and group.generation_id == 2 and group.protocol_name is None
    key, value = decode_record(h.log[-1].key, h.log[-1].value)
    assert (
        value.generation == 2 and value.members == () and value.current_state_timestamp == h.now_ms
    )


# -- static membership (KIP-345) --------------------------------------------------------------


def test_static_member_rejoin_replaces_the_old_id_without_a_rebalance():
    h = GroupHarness(DELAYED, auto_commit=False)
    tokens = [
        h.send(join(instance="i1", client_id="c0")),
        h.send(join(instance="i2", client_id="c1")),
    ]
    s1, s2 = (r.member_id for r in h.run_until_answered(tokens))
    assert s1 == "i1-uuid1"
    h.send(sync(s1, 1, {s1: assignment(0), s2: assignment(1)}, instance="i1"))
    h.send(sync(s2, 1, instance="i2"))
    h.commit()
    token = h.send(join(instance="i1", client_id="c0"))  # i1 restarted with no member id
    group = h.group()
    assert group.state is S.STABLE and group.generation_id == 1
    assert h.reply(token) is None and len(h.in_flight) == 1  # the new id goes to the log first
    h.commit()
    response = h.reply(token)
    new_id = response.member_id
    assert new_id == "i1-uuid3" and response.error_code == E.NONE and response.generation_id == 1
    assert response.leader == s1 and response.members == ()  # before v9: the old leader id
    assert h.call(heartbeat(s1, 1, instance="i1")).error_code == E.FENCED_INSTANCE_ID
    assert h.call(heartbeat(new_id, 1, instance="i1")).error_code == E.NONE
    assert h.call(sync(new_id, 1, instance="i1")).assignment == assignment(0)
    assert h.group().state is S.STABLE and h.group().leader_id == new_id
    _, value = decode_record(h.log[-1].key, h.log[-1].value)
    assert {x.member_id for x in value.members} == {new_id, s2}


def test_static_leader_rejoin_on_v9_is_told_to_skip_the_assignment():
    h = GroupHarness(DELAYED)
    s1, s2 = form(h, 2, instances=["i1", "i2"])
    response = h.call(join(instance="i1", client_id="c0", version=9))
    assert response.skip_assignment and response.leader == response.member_id
    assert {x.member_id for x in response.members} == {response.member_id, s2}
    assert h.group().state is S.STABLE


def test_static_member_rejoining_with_another_protocol_rebalances():
    h = GroupHarness(DELAYED)
    form(h, 2, instances=["i1", "i2"])
    token = h.send(
        join(instance="i2", client_id="c1", protocols=(("roundrobin", None), ("range", None)))
    )
    assert h.group().state is S.STABLE  # range is still the only common protocol
    assert h.reply(token).error_code == E.NONE
    # a member cannot switch to a protocol the others lack
    alone = h.call(join(instance="i2", client_id="c1", protocols=(("roundrobin", None),)))
    assert alone.error_code == E.INCONSISTENT_GROUP_PROTOCOL
    h2 = GroupHarness(DELAYED)
    both, other = (("roundrobin", None), ("range", None)), (("range", None), ("roundrobin", None))
    tokens = [h2.send(join(instance=f"i{i}", client_id=f"c{i}", protocols=p))
              for i, p in enumerate([both, other, other])]  # fmt: skip
    responses = h2.run_until_answered(tokens)
    assert responses[0].protocol_name == "range"  # two votes to one
    leader = responses[0].leader
    h2.call(sync(leader, 1, {r.member_id: b"" for r in responses}, instance="i0"))
    for i, r in enumerate(responses[1:], 1):
        h2.call(sync(r.member_id, 1, instance=f"i{i}"))
    assert h2.group().state is S.STABLE
    h2.send(join(instance="i1", client_id="c1", protocols=both))  # now roundrobin has two votes
    assert h2.group().state is S.PREPARING_REBALANCE


def test_static_member_rejoining_while_completing_rebalance_rebalances_again():
    h = GroupHarness(DELAYED)
    tokens = [
        h.send(join(instance="i1", client_id="c0")),
        h.send(join(instance="i2", client_id="c1")),
    ]
    old = h.run_until_answered(tokens)[1].member_id  # the follower: its sync waits
    assert h.group().state is S.COMPLETING_REBALANCE
    fenced_sync = h.send(sync(old, 1, instance="i2"))
    h.send(join(instance="i2", client_id="c1"))
    assert h.reply(fenced_sync).error_code == E.FENCED_INSTANCE_ID
    assert h.group().state in (S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE)


def test_static_members_stay_through_a_rebalance_they_miss():
    h = GroupHarness(DELAYED)
    s1, s2 = form(h, 2, instances=["i1", "i2"], session_ms=60_000)
    t1 = h.send(join(s1, instance="i1", client_id="c0", session_ms=60_000, rebalance_ms=10_000))
    h.advance(29_999)  # the rebalance timeout is the members' largest: s2's 30 s
    assert h.reply(t1) is None
    h.advance(1)
    response = h.reply(t1)
    assert response.generation_id == 2 and {x.member_id for x in response.members} == {s1, s2}


def test_leave_group_batch_form_removes_static_members_by_instance_id():
    h = GroupHarness(DELAYED)
    s1, s2, s3 = form(h, 3, instances=["i1", "i2", "i3"])
    response = h.call(m.LeaveGroupRequest("g", (
        m.MemberIdentity("", "i2"),  # an admin removal by instance id
        m.MemberIdentity("stale", "i3"),  # fenced: i3 is s3
        m.MemberIdentity("", "nobody"),
        m.MemberIdentity("unknown"),
    )))  # fmt: skip
    assert [x.error_code for x in response.members] == [
        E.NONE, E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID, E.UNKNOWN_MEMBER_ID]  # fmt: skip
    assert set(h.group().members) == {s1, s3} and h.group().state is S.PREPARING_REBALANCE


def test_leave_of_a_pending_member_and_of_a_missing_group():
    h = GroupHarness()
    pending = member_id_for(h)
    response = h.call(m.LeaveGroupRequest("g", (m.MemberIdentity(pending),)))
    assert response.members[0].error_code == E.NONE and not h.group().pending_members
    response = h.call(m.LeaveGroupRequest("other", (m.MemberIdentity("x"),)))
    assert (response.error_code, response.members[0].error_code) == (E.NONE, E.UNKNOWN_MEMBER_ID)


# -- error codes ------------------------------------------------------------------------------


def test_join_errors_leave_the_group_intact():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2)
    cases = [
        (join(a, session_ms=5_999), E.INVALID_SESSION_TIMEOUT),
        (join(a, session_ms=1_800_001), E.INVALID_SESSION_TIMEOUT),
        (join(a, protocols=()), E.INCONSISTENT_GROUP_PROTOCOL),
        (join(a, protocols=(("roundrobin", None),)), E.INCONSISTENT_GROUP_PROTOCOL),
        (join(a, protocol_type="connect"), E.INCONSISTENT_GROUP_PROTOCOL),
        (join(version=4, protocols=()), E.INCONSISTENT_GROUP_PROTOCOL),
        (join("nobody"), E.UNKNOWN_MEMBER_ID),
        (join("nobody", group_id="missing"), E.UNKNOWN_MEMBER_ID),
        (join(a, protocols=(("range", b"x" * (1 << 20 + 1)),)), E.INVALID_REQUEST),
        (join(group_id=""), E.INVALID_GROUP_ID),
        (join(a, instance="i9"), E.UNKNOWN_MEMBER_ID),
    ]
    for request, expected in cases:
        assert h.call(request).error_code == expected, request
    group = h.group()
    assert group.state is S.STABLE and set(group.members) == {a, b} and group.generation_id == 1
    assert "missing" not in h.shard.groups


def test_empty_group_rejects_an_empty_protocol_list():
    h = GroupHarness()
    assert h.call(join(version=3, protocols=())).error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.call(join(version=3, protocol_type="")).error_code == E.INCONSISTENT_GROUP_PROTOCOL


def test_group_max_size_reached():
    h = GroupHarness(GroupConfig(group_initial_rebalance_delay_ms=3_000, group_max_size=2))
    tokens = [h.send(join(version=3, client_id=f"c{i}")) for i in range(3)]
    assert h.reply(tokens[2]).error_code == E.GROUP_MAX_SIZE_REACHED
    h.run_until_answered(tokens[:2])
    assert h.reply(tokens[0]).error_code == E.NONE and len(h.reply(tokens[0]).members) == 2


def test_requests_for_another_partitions_group_get_not_coordinator():
    h = GroupHarness(num_partitions=50, partition=0)  # "hello" lives on partition 22
    assert h.call(join(group_id="hello")).error_code == E.NOT_COORDINATOR
    assert h.call(heartbeat("x", 1, group_id="hello")).error_code == E.NOT_COORDINATOR


def test_sync_group_errors():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2)
    assert h.call(sync(a, 2)).error_code == E.ILLEGAL_GENERATION
    assert h.call(sync("nobody", 1)).error_code == E.UNKNOWN_MEMBER_ID
    assert h.call(sync(a, 1, group_id="missing")).error_code == E.UNKNOWN_MEMBER_ID
    assert h.call(sync(a, 1, protocol_type="connect")).error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert (
        h.call(sync(a, 1, protocol_name="roundrobin")).error_code == E.INCONSISTENT_GROUP_PROTOCOL
    )
    assert h.call(sync(a, 1, protocol_type="consumer", protocol_name="range")).error_code == E.NONE
    h.send(join(a, client_id="c0"))
    assert h.call(sync(b, 1)).error_code == E.REBALANCE_IN_PROGRESS


def test_heartbeat_errors():
    h = GroupHarness(DELAYED)
    s1, s2 = form(h, 2, instances=["i1", "i2"])
    assert h.call(heartbeat(s1, 1, instance="i1")).error_code == E.NONE
    assert h.call(heartbeat(s1, 0, instance="i1")).error_code == E.ILLEGAL_GENERATION
    assert h.call(heartbeat("nobody", 1)).error_code == E.UNKNOWN_MEMBER_ID
    assert h.call(heartbeat(s1, 1, group_id="missing")).error_code == E.UNKNOWN_MEMBER_ID
    assert h.call(heartbeat(s2, 1, instance="i1")).error_code == E.FENCED_INSTANCE_ID
    assert h.call(heartbeat("", 1, group_id="")).error_code == E.INVALID_GROUP_ID


# -- loading and unloading --------------------------------------------------------------------


def test_loading_answers_load_in_progress_and_heartbeats_blindly():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2)
    h.shard.unload()
    h.shard.begin_loading()
    assert h.call(join(a)).error_code == E.COORDINATOR_LOAD_IN_PROGRESS
    assert h.call(heartbeat(a, 1)).error_code == E.NONE
    assert h.call(sync(a, 1)).error_code == E.REBALANCE_IN_PROGRESS
    assert h.call(m.ListGroupsRequest()).error_code == E.COORDINATOR_LOAD_IN_PROGRESS
    (described,) = h.call(m.DescribeGroupsRequest(("g",))).groups
    assert described.error_code == E.COORDINATOR_LOAD_IN_PROGRESS
    h.shard.replay(h.log)
    h.absorb(h.shard.complete_loading(h.now_ms))
    assert h.group().state is S.STABLE and set(h.group().members) == {a, b}
    assert h.call(heartbeat(a, 1)).error_code == E.NONE


def test_loaded_members_must_heartbeat_within_a_session_of_the_load():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2, session_ms=10_000)
    h.advance(5_000)
    h.failover()
    h.advance(9_000)
    assert h.call(heartbeat(a, 1)).error_code == E.NONE
    h.advance(1_000)  # b said nothing for a session since the load
    assert h.group().has(a) and not h.group().has(b)


def test_unloading_answers_parked_requests_and_then_not_coordinator():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2)
    parked = h.send(join(a, client_id="c0"))
    h.auto_commit = False
    from tests.group_harness import commit

    pending = h.send(commit({("t", 0): 5}, a, 1))
    assert h.reply(parked) is None and h.reply(pending) is None
    h.absorb(h.shard.unload())
    assert h.reply(parked).error_code == E.NOT_COORDINATOR
    assert set(h.replies[pending].topics[0].partitions) == {m.PartitionError(0, E.NOT_COORDINATOR)}
    assert h.call(heartbeat(a, 1)).error_code == E.NOT_COORDINATOR
    assert h.shard.next_deadline_ms() is None and not h.shard.groups


def test_failover_keeps_the_stable_generation():
    h = GroupHarness(DELAYED)
    a, b = form(h, 2)
    h.failover()
    group = h.group()
    assert group.state is S.STABLE and group.generation_id == 1 and group.leader_id == a
    assert group.get(b).assignment == assignment(1)
    assert h.call(sync(b, 1)).assignment == assignment(1)
    assert h.call(join(b, client_id="c1")).generation_id == 1


def test_a_member_answered_with_an_error_after_waiting_must_heartbeat_again():
    # b's session pauses while its SyncGroup waits; when the wait ends in an error its session
    # starts again (Kafka's propagateAssignment), so a b that then dies is still removed
    h = GroupHarness(DELAYED)
    tokens = [h.send(join(instance=f"i{i}", client_id=f"c{i}", session_ms=6_000, rebalance_ms=12_000))
              for i in range(2)]  # fmt: skip
    a, b = (r.member_id for r in h.run_until_answered(tokens, step_ms=100))
    waiting = h.send(sync(b, 1, instance="i1"))  # a (the leader) never sends its SyncGroup
    for _ in range(6):  # a heartbeats; b's session (6 s) passes while its SyncGroup waits
        h.advance(2_000)
        h.call(heartbeat(a, 1, instance="i0"))
    assert h.group().has(b)  # the sync deadline (12 s) has come: a is removed, b must rejoin
    assert h.reply(waiting).error_code == E.REBALANCE_IN_PROGRESS
    assert not h.group().has(a) and h.group().state is S.PREPARING_REBALANCE
    h.advance(6_000)  # b never comes back
    assert h.group().state is S.EMPTY and not h.group().members


def test_a_shard_that_never_loaded_is_not_the_coordinator():
    from localcluster.group.coordinator import GroupCoordinatorShard

    shard = GroupCoordinatorShard(0, 1)
    (reply,) = shard.handle(join(), 0, reply_to="t").replies
    assert reply.response.error_code == E.NOT_COORDINATOR
    (reply,) = shard.handle(m.ListGroupsRequest(), 0, reply_to="l").replies
    assert reply.response == m.ListGroupsResponse(E.NONE)


def test_replay_batch_reads_record_batches_and_skips_control_batches():
    from localcluster.group.coordinator import GroupCoordinatorShard
    from localcluster.storage import record_batch as rb

    h = GroupHarness()
    form(h, 1)
    records = [rb.Record(value=r.value, key=r.key) for r in h.log]
    data = rb.encode_batch(records)
    control = rb.encode_batch([rb.Record(value=b"", key=b"\x00\x00\x00\x00")],
                              rb.BatchSpec(base_offset=len(records), attributes=0x20))  # fmt: skip
    shard = GroupCoordinatorShard(0, 1)
    shard.begin_loading(coordinator_epoch=3)
    shard.replay_batch(data)
    shard.replay_batch(control)
    shard.complete_loading(h.now_ms)
    assert shard.groups["g"].state is S.STABLE and shard.replay_errors == 0


def test_oversized_strings_are_refused_not_crashed_on():
    h = GroupHarness()
    assert h.call(join(version=3, client_id="c" * 32_767)).error_code == E.INVALID_REQUEST
    assert h.call(join(group_id="g" * 40_000)).error_code == E.INVALID_GROUP_ID
