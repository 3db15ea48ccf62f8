"""The rebalance: the join and sync phases, session timeouts, and loading and unloading groups.

Functions of the shard (coordinator.py) that membership.py's handlers and the shard's timers
call. Kafka's GroupCoordinator.scala, confirmed in its source (apache/kafka, 2024-10):
- the first rebalance of an Empty group waits group.initial.rebalance.delay.ms, again while new
  members keep arriving at generation 0, up to the rebalance timeout (InitialDelayedJoin); any
  other join phase (DelayedJoin) ends when every member and no pending member has joined, or
  after the rebalance timeout, the largest of the members';
- when it ends, dynamic members that did not rejoin are removed (static ones stay), the leader
  is kept if it rejoined, else a member that did leads; if none did (only silent static members
  are left) the phase waits another rebalance timeout; then the generation is bumped, the
  protocol selected, and the joins answered (the leader gets the members' metadata);
- members that do not SyncGroup within the rebalance timeout are removed and the group
  rebalances again (DelayedSync);
- session timeouts pause for members awaiting a join or sync answer ("heartbeats are paused
  during rebalance") and restart when they are answered; a new member's join times out after
  5 minutes instead (NewMemberJoinTimeoutMs); a group loaded from the log gives every member a
  fresh session from the load.
"""

from __future__ import annotations

import logging

from localcluster.group import errors
from localcluster.group import messages as m
from localcluster.group.metadata import (
    GroupMetadata,
    GroupState,
    MemberMetadata,
    Parked,
    group_metadata_value,
)
from localcluster.group.records import group_metadata_record

log = logging.getLogger(__name__)

S = GroupState


def join_result(group: GroupMetadata, member: MemberMetadata, include_members: bool,
                leader: str | None = None, skip_assignment: bool = False) -> m.JoinGroupResponse:  # fmt: skip
    members = ()
    if include_members:
        assert group.protocol_name is not None
        members = tuple(
            m.JoinGroupResponseMember(
                x.member_id, x.group_instance_id, x.metadata(group.protocol_name)
            )
            for x in group.members.values()
        )
    return m.JoinGroupResponse(
        errors.NONE,
        member_id=member.member_id,
        generation_id=group.generation_id,
        protocol_type=group.protocol_type,
        protocol_name=group.protocol_name,
        leader=(leader if leader is not None else group.leader_id) or m.NO_LEADER,
        skip_assignment=skip_assignment,
        members=members,
    )


# -- the rebalance ----------------------------------------------------------------------------


def maybe_prepare_rebalance(shard, group: GroupMetadata, now_ms: int, reason: str) -> None:
    if group.can_rebalance:
        prepare_rebalance(shard, group, now_ms, reason)


def prepare_rebalance(shard, group: GroupMetadata, now_ms: int, reason: str) -> None:
    if group.is_in(S.COMPLETING_REBALANCE):
        reset_and_propagate_assignment_error(shard, group, errors.REBALANCE_IN_PROGRESS, now_ms)
    group.pending_sync_members.clear()
    shard.timers.cancel(("sync", group.group_id))
    was_empty = group.is_in(S.EMPTY)
    rebalance_timeout_ms = group.rebalance_timeout_ms
    log.info("group %r: preparing to rebalance in %s with old generation %d (%s)", group.group_id,
             group.state.value, group.generation_id, reason)  # fmt: skip
    group.transition_to(S.PREPARING_REBALANCE, now_ms)
    if was_empty:  # InitialDelayedJoin: only its timer completes the join
        delay_ms = shard.config.group_initial_rebalance_delay_ms
        group.initial_join = (delay_ms, max(rebalance_timeout_ms - delay_ms, 0))
        shard.timers.arm(("join", group.group_id), now_ms + delay_ms)
    else:
        group.initial_join = None
        shard.timers.arm(("join", group.group_id), now_ms + rebalance_timeout_ms)
        try_complete_join(shard, group, now_ms)


def try_complete_join(shard, group: GroupMetadata, now_ms: int) -> None:
    """A DelayedJoin completes as soon as every member (and no pending one) has joined."""
    if (
        group.is_in(S.PREPARING_REBALANCE)
        and group.initial_join is None
        and group.has_all_members_joined
    ):
        shard.timers.cancel(("join", group.group_id))
        complete_join(shard, group, now_ms)


def on_join_deadline(shard, group: GroupMetadata, now_ms: int) -> None:
    if not group.is_in(S.PREPARING_REBALANCE):
        return
    if group.initial_join is not None:
        delay_ms, remaining_ms = group.initial_join
        if group.new_member_added and remaining_ms != 0:
            group.new_member_added = False
            next_delay_ms = min(shard.config.group_initial_rebalance_delay_ms, remaining_ms)
            group.initial_join = (next_delay_ms, max(remaining_ms - delay_ms, 0))
            shard.timers.arm(("join", group.group_id), now_ms + next_delay_ms)
            return
        group.initial_join = None
    complete_join(shard, group, now_ms)


def complete_join(shard, group: GroupMetadata, now_ms: int) -> None:
    """Kafka's onCompleteJoin: drop who did not rejoin, bump the generation, answer the joins."""
    for member in [
        x for x in group.members.values() if x.awaiting_join is None and not x.is_static_member
    ]:
        log.info(
            "group %r: removing member %s, which did not rejoin", group.group_id, member.member_id
        )
        remove(shard, group, member)
    if group.is_in(S.DEAD):
        return
    if not group.maybe_elect_new_joined_leader() and group.members:
        # only static members are left and none rejoined: wait another rebalance timeout
        log.error("group %r: could not complete the rebalance, no member rejoined", group.group_id)
        shard.timers.arm(("join", group.group_id), now_ms + group.rebalance_timeout_ms)
        return
    group.init_next_generation(now_ms)
    if group.is_in(S.EMPTY):
        log.info("group %r: generation %d is empty", group.group_id, group.generation_id)
        store_group(shard, group, {}, now_ms, _warn_on_error(group))
        return
    log.info("group %r: generation %d with %d members, protocol %r", group.group_id,
             group.generation_id, group.size, group.protocol_name)  # fmt: skip
    for member in group.members.values():
        answer_join(shard, member, join_result(group, member, group.is_leader(member.member_id)))
        schedule_heartbeat(shard, group, member, now_ms)
        member.is_new = False
        group.pending_sync_members.add(member.member_id)
    group.sync_generation = group.generation_id
    shard.timers.arm(("sync", group.group_id), now_ms + group.rebalance_timeout_ms)


def _warn_on_error(group: GroupMetadata):
    def done(error: int, now_ms: int) -> None:
        # the previous generation stays in the log; with no members that is safe (Kafka)
        if error != errors.NONE:
            log.warning("group %r: failed to write the empty group: %s", group.group_id,
                        errors.error_name(error))  # fmt: skip

    return done


def on_sync_deadline(shard, group: GroupMetadata, now_ms: int) -> None:
    """DelayedSync expired: members that never sent SyncGroup are removed; rebalance."""
    if group.sync_generation != group.generation_id or not group.is_in(
        S.COMPLETING_REBALANCE, S.STABLE
    ):
        return
    if not group.pending_sync_members:
        return
    missing = sorted(group.pending_sync_members)
    for member_id in missing:
        remove(shard, group, group.get(member_id))
    prepare_rebalance(shard, group, now_ms, f"members {missing} did not send SyncGroup in time")


def store_group(
    shard, group: GroupMetadata, assignment: dict[str, bytes], now_ms: int, done
) -> None:
    """Append the group record; `done(error, now_ms)` once it committed or failed."""
    records = [group_metadata_record(group.group_id, group_metadata_value(group, assignment))]
    if not shard.fits(records):
        done(errors.group_append_error(errors.RECORD_LIST_TOO_LARGE), now_ms)
        return
    shard.append(
        records,
        now_ms,
        on_success=lambda now_ms: done(errors.NONE, now_ms),
        on_failure=lambda code, now_ms: done(errors.group_append_error(code), now_ms),
    )


def reset_and_propagate_assignment_error(
    shard, group: GroupMetadata, error: int, now_ms: int
) -> None:
    assert group.is_in(S.COMPLETING_REBALANCE)
    for member in group.members.values():
        member.assignment = b""
    propagate_assignment(shard, group, error, now_ms)


def propagate_assignment(shard, group: GroupMetadata, error: int, now_ms: int) -> None:
    for member in group.members.values():
        parked = member.awaiting_sync
        if parked is None:
            continue
        member.awaiting_sync = None
        if error == errors.NONE:
            response = m.SyncGroupResponse(
                error, member.assignment, group.protocol_type, group.protocol_name
            )
        else:
            response = m.SyncGroupResponse(error)
        shard.reply(parked.reply_to, response)
        # its session paused while it waited, and may have run out: count it from the answer
        schedule_heartbeat(shard, group, member, now_ms)


# -- timeouts ---------------------------------------------------------------------------------


def on_heartbeat_expired(shard, group: GroupMetadata, member_id: str, now_ms: int) -> None:
    member = group.members.get(member_id)
    if group.is_in(S.DEAD) or member is None:
        return
    waiting = member.awaiting_join is not None or member.awaiting_sync is not None
    if waiting and not member.is_new:
        return  # heartbeats pause during a rebalance; the timer is armed again after it
    log.info("group %r: member %s failed (session timeout %d ms), removing it", group.group_id,
             member_id, member.session_timeout_ms)  # fmt: skip
    remove_member_and_update_group(shard, group, member, now_ms)


def on_pending_member_expired(shard, group: GroupMetadata, member_id: str, now_ms: int) -> None:
    if not group.is_in(S.DEAD) and member_id in group.pending_members:
        log.info("group %r: pending member %s expired", group.group_id, member_id)
        remove_pending_member_and_update_group(shard, group, member_id, now_ms)


# -- loading and unloading --------------------------------------------------------------------


def on_group_loaded(shard, group: GroupMetadata, now_ms: int) -> None:
    assert group.is_in(S.STABLE, S.EMPTY)
    if group.size > shard.config.group_max_size:
        prepare_rebalance(shard, group, now_ms, "freshly loaded group is over capacity")
    for member in group.members.values():
        schedule_heartbeat(shard, group, member, now_ms)


def on_group_unloaded(shard, group: GroupMetadata) -> None:
    group.state = S.DEAD  # Dead is valid from every state
    for member in group.members.values():
        answer_parked(shard, member, errors.NOT_COORDINATOR)


# -- helpers ----------------------------------------------------------------------------------


def validate_current_member(
    group: GroupMetadata, member_id: str, group_instance_id: str | None
) -> int | None:
    """Kafka's validateCurrentMember: a static member must be the instance id's current one."""
    if group_instance_id is not None:
        current = group.current_static_member_id(group_instance_id)
        if current is None:
            return errors.UNKNOWN_MEMBER_ID
        if current != member_id:
            log.info("group %r: member %s of instance %r is fenced by %s", group.group_id,
                     member_id, group_instance_id, current)  # fmt: skip
            return errors.FENCED_INSTANCE_ID
    if not group.has(member_id):
        return errors.UNKNOWN_MEMBER_ID
    return None


def schedule_heartbeat(shard, group: GroupMetadata, member: MemberMetadata, now_ms: int,
                       timeout_ms: int | None = None) -> None:  # fmt: skip
    timeout_ms = member.session_timeout_ms if timeout_ms is None else timeout_ms
    shard.timers.arm(("heartbeat", group.group_id, member.member_id), now_ms + timeout_ms)


def park_join(shard, member: MemberMetadata, reply_to: object) -> None:
    if member.awaiting_join is not None:
        shard.reply(
            member.awaiting_join.reply_to,
            m.JoinGroupResponse(errors.REBALANCE_IN_PROGRESS, member.member_id),
        )
    member.awaiting_join = Parked(reply_to)


def park_sync(shard, member: MemberMetadata, reply_to: object) -> None:
    if member.awaiting_sync is not None:
        shard.reply(
            member.awaiting_sync.reply_to, m.SyncGroupResponse(errors.REBALANCE_IN_PROGRESS)
        )
    member.awaiting_sync = Parked(reply_to)


def answer_join(shard, member: MemberMetadata, response: m.JoinGroupResponse) -> None:
    if member.awaiting_join is not None:
        shard.reply(member.awaiting_join.reply_to, response)
        member.awaiting_join = None


def answer_parked(
    shard, member: MemberMetadata, error: int, join_member_id: str = m.UNKNOWN_MEMBER_ID
) -> None:
    """Answer whatever the member has parked with `error`."""
    answer_join(shard, member, m.JoinGroupResponse(error, join_member_id))
    if member.awaiting_sync is not None:
        shard.reply(member.awaiting_sync.reply_to, m.SyncGroupResponse(error))
        member.awaiting_sync = None


def remove(shard, group: GroupMetadata, member: MemberMetadata) -> None:
    answer_parked(shard, member, errors.UNKNOWN_MEMBER_ID)
    group.remove(member.member_id)
    shard.timers.cancel(("heartbeat", group.group_id, member.member_id))


def remove_quietly(shard, group: GroupMetadata, member_id: str) -> None:
    """GROUP_MAX_SIZE_REACHED: Kafka drops the member (or pending member) with no rebalance."""
    member = group.members.get(member_id)
    if member is not None:
        remove(shard, group, member)
    group.remove(member_id)
    shard.timers.cancel(("pending", group.group_id, member_id))


def remove_member_and_update_group(
    shard, group: GroupMetadata, member: MemberMetadata, now_ms: int
) -> None:
    remove(shard, group, member)
    if group.is_in(S.STABLE, S.COMPLETING_REBALANCE):
        maybe_prepare_rebalance(shard, group, now_ms, f"member {member.member_id} removed")
    elif group.is_in(S.PREPARING_REBALANCE):
        try_complete_join(shard, group, now_ms)


def remove_pending_member_and_update_group(
    shard, group: GroupMetadata, member_id: str, now_ms: int
) -> None:
    group.remove(member_id)
    shard.timers.cancel(("pending", group.group_id, member_id))
    if group.is_in(S.PREPARING_REBALANCE):
        try_complete_join(shard, group, now_ms)
