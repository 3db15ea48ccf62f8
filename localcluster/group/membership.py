"""Group membership requests: JoinGroup, SyncGroup, Heartbeat, LeaveGroup.

Functions of the shard (coordinator.py); the rebalance they start lives in rebalance.py.
Kafka's GroupCoordinator.scala, confirmed in its source (apache/kafka, 2024-10):
- a new member of a v4+ JoinGroup without group.instance.id gets MEMBER_ID_REQUIRED and a
  generated id (client id, or instance id, + "-" + a UUID) and is held pending until it rejoins
  or its session timeout passes (KIP-394);
- a known static member joining with an unknown member id takes over its old member id, whose
  parked requests are fenced with FENCED_INSTANCE_ID (KIP-345); in Stable, if the selected
  protocol would not change, only the group record is rewritten, no rebalance (v9+: the leader
  is told to skip the assignment; before v9 it is sent the old leader id); in
  CompletingRebalance the group rebalances again;
- a leader's JoinGroup in Stable, and any member's with new metadata, rebalance; a follower
  rejoining with the same metadata gets the current generation back;
- the errors: INVALID_SESSION_TIMEOUT outside group.min/max.session.timeout.ms,
  INCONSISTENT_GROUP_PROTOCOL (no protocols, another protocol type, none in common),
  UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID,
  GROUP_MAX_SIZE_REACHED, COORDINATOR_NOT_AVAILABLE for a Dead group;
- the leader's SyncGroup writes the group record (missing members get an empty assignment);
  every member gets its assignment when the record commits.
Ours: protocol metadata beyond `member_metadata_max_bytes` per member, or strings that could
not be written in a record, are INVALID_REQUEST. Where Kafka silently drops a parked request
(a second JoinGroup or SyncGroup for the same member), the superseded one is answered
REBALANCE_IN_PROGRESS so the runtime can free it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from localcluster.group import errors
from localcluster.group import messages as m
from localcluster.group.metadata import GroupMetadata, GroupState, MemberMetadata, Parked
from localcluster.group.rebalance import (
    answer_join,
    answer_parked,
    join_result,
    maybe_prepare_rebalance,
    park_join,
    park_sync,
    prepare_rebalance,
    propagate_assignment,
    remove_member_and_update_group,
    remove_pending_member_and_update_group,
    remove_quietly,
    reset_and_propagate_assignment_error,
    schedule_heartbeat,
    store_group,
    try_complete_join,
    validate_current_member,
)

if TYPE_CHECKING:
    from localcluster.group.coordinator import GroupCoordinatorShard

log = logging.getLogger(__name__)

S = GroupState
MAX_STRING_BYTES = 0x7FFF  # a Kafka string


# -- JoinGroup --------------------------------------------------------------------------------


def handle_join_group(
    shard: GroupCoordinatorShard, req: m.JoinGroupRequest, now_ms: int, reply_to: object
) -> None:
    config = shard.config
    if (
        not config.group_min_session_timeout_ms
        <= req.session_timeout_ms
        <= config.group_max_session_timeout_ms
    ):
        shard.reply(reply_to, m.JoinGroupResponse(errors.INVALID_SESSION_TIMEOUT, req.member_id))
        return
    if _is_oversized(shard, req):
        shard.reply(reply_to, m.JoinGroupResponse(errors.INVALID_REQUEST, req.member_id))
        return
    is_unknown_member = req.member_id == m.UNKNOWN_MEMBER_ID
    group = shard.groups.get(req.group_id)
    if group is None:
        if not is_unknown_member:
            shard.reply(reply_to, m.JoinGroupResponse(errors.UNKNOWN_MEMBER_ID, req.member_id))
            return
        group = shard.create_group(req.group_id, now_ms)
    if not _accept_joining_member(shard, group, req.member_id):
        remove_quietly(shard, group, req.member_id)
        shard.reply(reply_to, m.JoinGroupResponse(errors.GROUP_MAX_SIZE_REACHED))
    elif is_unknown_member:
        _new_member_join(shard, group, req, now_ms, reply_to)
    else:
        _current_member_join(shard, group, req, now_ms, reply_to)
    if group.is_in(S.PREPARING_REBALANCE):
        try_complete_join(shard, group, now_ms)


def _is_oversized(shard: GroupCoordinatorShard, req: m.JoinGroupRequest) -> bool:
    """Our bound on one member's metadata (Kafka has none below the request size), and Kafka's
    string limit on the fields that go into the group record."""
    if sum(len(p.metadata) for p in req.protocols) > shard.config.member_metadata_max_bytes:
        log.warning("group %r: JoinGroup from %r with %d protocol bytes refused", req.group_id,
                    req.client_id, sum(len(p.metadata) for p in req.protocols))  # fmt: skip
        return True
    # the generated member id is the client or instance id + "-" + a UUID: leave it room
    strings = (req.client_id + "-" * 64, req.client_host, (req.group_instance_id or "") + "-" * 64,
               req.member_id, req.protocol_type)  # fmt: skip
    return any(len(s.encode()) > MAX_STRING_BYTES for s in strings) or any(
        len(p.name.encode()) > MAX_STRING_BYTES for p in req.protocols
    )


def _accept_joining_member(
    shard: GroupCoordinatorShard, group: GroupMetadata, member_id: str
) -> bool:
    max_size = shard.config.group_max_size
    if group.is_in(S.EMPTY, S.DEAD):
        return True
    if group.is_in(S.PREPARING_REBALANCE):
        # awaiting members, not the size: lets a lowered max kick the last rejoiners out
        joined = group.has(member_id) and group.get(member_id).awaiting_join is not None
        return joined or group.num_awaiting_join < max_size
    return group.has(member_id) or group.size < max_size


def _protocols(req: m.JoinGroupRequest) -> tuple[tuple[str, bytes], ...]:
    return tuple((p.name, p.metadata) for p in req.protocols)


def _rebalance_timeout_ms(req: m.JoinGroupRequest) -> int:
    # JoinGroup v0 has no rebalance timeout: Kafka uses the session timeout
    if req.api_version == 0 or req.rebalance_timeout_ms < 0:
        return req.session_timeout_ms
    return req.rebalance_timeout_ms


def _new_member_join(
    shard, group: GroupMetadata, req: m.JoinGroupRequest, now_ms, reply_to
) -> None:
    if group.is_in(S.DEAD):
        shard.reply(reply_to, m.JoinGroupResponse(errors.COORDINATOR_NOT_AVAILABLE))
        return
    if not group.supports_protocols(req.protocol_type, {p.name for p in req.protocols}):
        shard.reply(reply_to, m.JoinGroupResponse(errors.INCONSISTENT_GROUP_PROTOCOL))
        return
    new_member_id = f"{req.group_instance_id or req.client_id}-{shard.new_uuid()}"
    assert not group.has(new_member_id) and new_member_id not in group.pending_members
    if req.group_instance_id is not None:
        old_member_id = group.current_static_member_id(req.group_instance_id)
        if old_member_id is not None:
            _update_static_member_and_rebalance(
                shard, group, old_member_id, new_member_id, req, now_ms, reply_to
            )
        else:
            _add_member_and_rebalance(shard, group, new_member_id, req, now_ms, reply_to)
    elif req.api_version >= 4:  # KIP-394: first hand out the member id
        group.pending_members.add(new_member_id)
        shard.timers.arm(
            ("pending", group.group_id, new_member_id), now_ms + req.session_timeout_ms
        )
        shard.reply(reply_to, m.JoinGroupResponse(errors.MEMBER_ID_REQUIRED, new_member_id))
    else:
        _add_member_and_rebalance(shard, group, new_member_id, req, now_ms, reply_to)


def _current_member_join(
    shard, group: GroupMetadata, req: m.JoinGroupRequest, now_ms, reply_to
) -> None:
    member_id = req.member_id
    if group.is_in(S.DEAD):
        shard.reply(reply_to, m.JoinGroupResponse(errors.COORDINATOR_NOT_AVAILABLE, member_id))
        return
    if not group.supports_protocols(req.protocol_type, {p.name for p in req.protocols}):
        shard.reply(reply_to, m.JoinGroupResponse(errors.INCONSISTENT_GROUP_PROTOCOL, member_id))
        return
    if member_id in group.pending_members:
        if req.group_instance_id is not None:  # Kafka throws IllegalStateException here
            shard.reply(reply_to, m.JoinGroupResponse(errors.UNKNOWN_SERVER_ERROR, member_id))
            return
        shard.timers.cancel(("pending", group.group_id, member_id))
        _add_member_and_rebalance(shard, group, member_id, req, now_ms, reply_to)
        return
    error = validate_current_member(group, member_id, req.group_instance_id)
    if error is not None:
        shard.reply(reply_to, m.JoinGroupResponse(error, member_id))
        return
    member = group.get(member_id)
    protocols = _protocols(req)
    if group.is_in(S.PREPARING_REBALANCE):
        _update_member_and_rebalance(shard, group, member, req, now_ms, reply_to, "joining")
    elif group.is_in(S.COMPLETING_REBALANCE):
        if member.matches(protocols):  # it lost the JoinGroup response: send it again
            shard.reply(
                reply_to, join_result(group, member, include_members=group.is_leader(member_id))
            )
        else:
            _update_member_and_rebalance(
                shard, group, member, req, now_ms, reply_to, "new metadata"
            )
    elif group.is_in(S.STABLE):
        if group.is_leader(member_id) or not member.matches(protocols):
            # a leader's JoinGroup forces a rebalance (e.g. for topic metadata changes)
            _update_member_and_rebalance(shard, group, member, req, now_ms, reply_to, "rejoining")
        else:
            shard.reply(reply_to, join_result(group, member, include_members=False))
    else:  # Empty: a member id the group no longer has
        shard.reply(reply_to, m.JoinGroupResponse(errors.UNKNOWN_MEMBER_ID, member_id))


def _add_member_and_rebalance(shard, group: GroupMetadata, member_id: str, req: m.JoinGroupRequest,
                              now_ms: int, reply_to: object) -> None:  # fmt: skip
    member = MemberMetadata(
        member_id=member_id,
        group_instance_id=req.group_instance_id,
        client_id=req.client_id,
        client_host=req.client_host,
        rebalance_timeout_ms=_rebalance_timeout_ms(req),
        session_timeout_ms=req.session_timeout_ms,
        protocol_type=req.protocol_type,
        supported_protocols=_protocols(req),
        awaiting_join=Parked(reply_to),
        is_new=True,
    )
    if group.is_in(S.PREPARING_REBALANCE) and group.generation_id == 0:
        group.new_member_added = True  # extends the initial delay
    group.add(member)
    # a new member cannot heartbeat until it has joined: its join times out instead
    schedule_heartbeat(shard, group, member, now_ms, shard.config.new_member_join_timeout_ms)
    maybe_prepare_rebalance(shard, group, now_ms, f"adding member {member_id}")


def _update_member_and_rebalance(
    shard, group, member: MemberMetadata, req, now_ms, reply_to, why
) -> None:
    group.update_member(member, _protocols(req), _rebalance_timeout_ms(req), req.session_timeout_ms)
    park_join(shard, member, reply_to)
    maybe_prepare_rebalance(shard, group, now_ms, f"member {member.member_id} {why}")


def _update_static_member_and_rebalance(shard, group: GroupMetadata, old_member_id: str,
                                        new_member_id: str, req: m.JoinGroupRequest, now_ms: int,
                                        reply_to: object) -> None:  # fmt: skip
    instance_id = req.group_instance_id
    assert instance_id is not None and group.is_in(
        S.STABLE, S.COMPLETING_REBALANCE, S.PREPARING_REBALANCE
    )
    current_leader = group.leader_id
    member = group.get(old_member_id)
    answer_parked(shard, member, errors.FENCED_INSTANCE_ID, join_member_id=old_member_id)
    old = (member.supported_protocols, member.rebalance_timeout_ms, member.session_timeout_ms)
    group.replace_static_member(instance_id, old_member_id, new_member_id)
    shard.timers.cancel(("heartbeat", group.group_id, old_member_id))
    schedule_heartbeat(shard, group, member, now_ms)
    group.update_member(member, _protocols(req), _rebalance_timeout_ms(req), req.session_timeout_ms)
    park_join(shard, member, reply_to)
    log.info("group %r: static member %r rejoined as %s (was %s) in %s", group.group_id,
             instance_id, new_member_id, old_member_id, group.state.value)  # fmt: skip
    if group.is_in(S.COMPLETING_REBALANCE):
        # the leader may be assigning to the old member id: assign again
        prepare_rebalance(shard, group, now_ms, f"static member {instance_id} rejoined")
    elif group.is_in(S.STABLE):
        if group.select_protocol() != group.protocol_name:
            maybe_prepare_rebalance(
                shard, group, now_ms, f"static member {instance_id} changed protocol"
            )
            return
        generation_id = group.generation_id
        skip = req.api_version >= 9

        def done(error: int, now_ms: int) -> None:
            if error == errors.NONE:
                is_leader = group.is_leader(new_member_id)
                if skip:
                    response = join_result(group, member, is_leader, skip_assignment=is_leader)
                else:  # the old leader id keeps the old leader from assigning in a Stable group
                    response = join_result(group, member, False, leader=current_leader)
                answer_join(shard, member, response)
                # its session may have paused while the record was in flight
                schedule_heartbeat(shard, group, member, now_ms)
            else:
                _revert_static_member(shard, group, member, instance_id, old_member_id, old,
                                      current_leader, generation_id, error, now_ms)  # fmt: skip

        store_group(
            shard, group, {x.member_id: x.assignment for x in group.members.values()}, now_ms, done
        )


def _revert_static_member(shard, group, member, instance_id, old_member_id, old, current_leader,
                          generation_id, error, now_ms) -> None:  # fmt: skip
    """The record of the new member id failed: give the static member its old id back."""
    log.warning("group %r: could not persist static member %r: %s", group.group_id, instance_id,
                errors.error_name(error))  # fmt: skip
    parked = member.awaiting_join
    member.awaiting_join = None
    new_member_id = member.member_id
    still_there = (
        not group.is_in(S.DEAD)
        and group.members.get(new_member_id) is member
        and group.current_static_member_id(instance_id) == new_member_id
    )
    if still_there:
        group.update_member(member, *old)
        group.replace_static_member(instance_id, new_member_id, old_member_id)
        shard.timers.cancel(("heartbeat", group.group_id, new_member_id))
        schedule_heartbeat(shard, group, member, now_ms)
    if parked is not None:
        shard.reply(parked.reply_to, m.JoinGroupResponse(
            error, generation_id=generation_id, protocol_type=group.protocol_type,
            protocol_name=group.protocol_name, leader=current_leader or m.NO_LEADER))  # fmt: skip


# -- SyncGroup --------------------------------------------------------------------------------


def handle_sync_group(shard, req: m.SyncGroupRequest, now_ms: int, reply_to: object) -> None:
    group = shard.groups.get(req.group_id)
    if group is None:
        shard.reply(reply_to, m.SyncGroupResponse(errors.UNKNOWN_MEMBER_ID))
        return
    error = _validate_sync_group(group, req)
    if error is None and group.is_in(S.EMPTY):
        error = errors.UNKNOWN_MEMBER_ID
    if error is None and group.is_in(S.PREPARING_REBALANCE):
        error = errors.REBALANCE_IN_PROGRESS
    if error is not None:
        shard.reply(reply_to, m.SyncGroupResponse(error))
        return
    member = group.get(req.member_id)
    group.pending_sync_members.discard(req.member_id)
    if group.is_in(S.STABLE):
        shard.reply(reply_to, m.SyncGroupResponse(
            errors.NONE, member.assignment, group.protocol_type, group.protocol_name))  # fmt: skip
        schedule_heartbeat(shard, group, member, now_ms)
        return
    assert group.is_in(S.COMPLETING_REBALANCE)
    park_sync(shard, member, reply_to)
    if group.is_leader(req.member_id):
        assignment = {a.member_id: a.assignment for a in req.assignments}
        for member_id in group.members:
            assignment.setdefault(member_id, b"")  # Kafka fills missing members with nothing
        log.info("group %r: assignment from leader %s for generation %d", group.group_id,
                 req.member_id, group.generation_id)  # fmt: skip
        generation_id = group.generation_id

        def done(error: int, now_ms: int) -> None:
            # another member may have joined meanwhile: act only on the same rebalance
            if not group.is_in(S.COMPLETING_REBALANCE) or group.generation_id != generation_id:
                return
            if error != errors.NONE:
                reset_and_propagate_assignment_error(shard, group, error, now_ms)
                maybe_prepare_rebalance(
                    shard,
                    group,
                    now_ms,
                    f"storing the assignment failed: {errors.error_name(error)}",
                )
                return
            for x in group.members.values():
                x.assignment = assignment[x.member_id]
            propagate_assignment(shard, group, errors.NONE, now_ms)
            group.transition_to(S.STABLE, now_ms)

        store_group(shard, group, assignment, now_ms, done)


def _validate_sync_group(group: GroupMetadata, req: m.SyncGroupRequest) -> int | None:
    if group.is_in(S.DEAD):
        return errors.COORDINATOR_NOT_AVAILABLE
    error = validate_current_member(group, req.member_id, req.group_instance_id)
    if error is not None:
        return error
    if req.generation_id != group.generation_id:
        return errors.ILLEGAL_GENERATION
    if req.protocol_type is not None and req.protocol_type != group.protocol_type:
        return errors.INCONSISTENT_GROUP_PROTOCOL
    if req.protocol_name is not None and req.protocol_name != group.protocol_name:
        return errors.INCONSISTENT_GROUP_PROTOCOL
    return None


# -- Heartbeat and LeaveGroup -----------------------------------------------------------------


def handle_heartbeat(shard, req: m.HeartbeatRequest, now_ms: int, reply_to: object) -> None:
    shard.reply(reply_to, m.HeartbeatResponse(_heartbeat(shard, req, now_ms)))


def _heartbeat(shard, req: m.HeartbeatRequest, now_ms: int) -> int:
    group = shard.groups.get(req.group_id)
    if group is None:
        return errors.UNKNOWN_MEMBER_ID
    if group.is_in(S.DEAD):
        return errors.COORDINATOR_NOT_AVAILABLE
    error = validate_current_member(group, req.member_id, req.group_instance_id)
    if error is not None:
        return error
    if req.generation_id != group.generation_id:
        return errors.ILLEGAL_GENERATION
    if group.is_in(S.EMPTY):
        return errors.UNKNOWN_MEMBER_ID
    schedule_heartbeat(shard, group, group.get(req.member_id), now_ms)
    if group.is_in(S.PREPARING_REBALANCE):
        return errors.REBALANCE_IN_PROGRESS
    return errors.NONE


def handle_leave_group(shard, req: m.LeaveGroupRequest, now_ms: int, reply_to: object) -> None:
    group = shard.groups.get(req.group_id)
    if group is None:
        shard.reply(reply_to, m.LeaveGroupResponse(errors.NONE, tuple(
            m.MemberResponse(x.member_id, x.group_instance_id, errors.UNKNOWN_MEMBER_ID)
            for x in req.members)))  # fmt: skip
        return
    if group.is_in(S.DEAD):
        shard.reply(reply_to, m.LeaveGroupResponse(errors.COORDINATOR_NOT_AVAILABLE))
        return
    results = tuple(
        m.MemberResponse(x.member_id, x.group_instance_id, _leave_one(shard, group, x, now_ms))
        for x in req.members
    )
    shard.reply(reply_to, m.LeaveGroupResponse(errors.NONE, results))


def _leave_one(shard, group: GroupMetadata, identity: m.MemberIdentity, now_ms: int) -> int:
    member_id = identity.member_id
    if member_id == m.UNKNOWN_MEMBER_ID:
        # an administrative removal of a static member by its group.instance.id (KIP-345)
        current = group.current_static_member_id(identity.group_instance_id or "")
        if identity.group_instance_id is None or current is None:
            return errors.UNKNOWN_MEMBER_ID
        member_id = current
    elif member_id in group.pending_members:
        remove_pending_member_and_update_group(shard, group, member_id, now_ms)
        return errors.NONE
    else:
        error = validate_current_member(group, member_id, identity.group_instance_id)
        if error is not None:
            return error
    log.info("group %r: member %s left (reason: %s)", group.group_id, member_id,
             identity.reason or "not provided")  # fmt: skip
    remove_member_and_update_group(shard, group, group.get(member_id), now_ms)
    return errors.NONE
