"""Committed offsets and group administration: OffsetCommit, OffsetFetch, OffsetDelete,
ListGroups, DescribeGroups, DeleteGroups, and offsets retention.

Functions of the shard (coordinator.py). Confirmed in Kafka's source (GroupCoordinator.scala,
GroupMetadataManager.scala, GroupCoordinatorAdapter.scala; OffsetMetadataManager.java and
ClassicGroup.java of the new coordinator agree unless said):
- a commit with generation -1 is accepted for an Empty or missing group (a "simple" group is
  created); a commit for a missing group with a generation >= 0 is ILLEGAL_GENERATION (the
  ZooKeeper-era answer; Kafka 3.7's new coordinator says GROUP_ID_NOT_FOUND from v9);
  members are checked by member id, instance id and generation; CompletingRebalance answers
  REBALANCE_IN_PROGRESS; a commit from a member of a Stable/PreparingRebalance group counts as
  a heartbeat;
- metadata longer than offset.metadata.max.bytes is OFFSET_METADATA_TOO_LARGE for that
  partition only; the commit timestamp is the request's (v1) or now; the expire timestamp is
  now + retention_time_ms when v2-v4 give one (then the record is OffsetCommitValue v1);
- the offset is visible to OffsetFetch, and the commit answered, only once its record is
  committed; an offset deleted meanwhile stays deleted;
- require_stable only concerns transactional commits, so UNSTABLE_OFFSET_COMMIT never happens;
- OffsetDelete: a consumer group may delete offsets of topics none of its members subscribes
  to (GROUP_SUBSCRIBED_TO_TOPIC otherwise), another non-empty group none (NON_EMPTY_GROUP);
- DeleteGroups: only Empty groups (NON_EMPTY_GROUP), missing ones GROUP_ID_NOT_FOUND;
- a group that is Empty with no offsets left becomes Dead and is removed; its tombstone is
  written only if it ever had a generation (> 0);
- retention: every offsets.retention.check.interval.ms, expired offsets get tombstones.
DeleteGroups and OffsetDelete answer after their tombstones commit (the new coordinator; the
old one wrote them with acks=0 and answered at once); their effect in memory is immediate.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from localcluster.group import errors, rebalance
from localcluster.group import messages as m
from localcluster.group.consumer_protocol import CONSUMER_PROTOCOL_TYPE
from localcluster.group.metadata import GroupMetadata, GroupState, OffsetAndMetadata
from localcluster.group.records import (
    CoordinatorRecord,
    group_metadata_tombstone,
    offset_commit_record,
    offset_commit_tombstone,
)

if TYPE_CHECKING:
    from localcluster.group.coordinator import GroupCoordinatorShard

log = logging.getLogger(__name__)

S = GroupState


# -- OffsetCommit -----------------------------------------------------------------------------


def commit_error_response(req: m.OffsetCommitRequest, error: int) -> m.OffsetCommitResponse:
    return m.OffsetCommitResponse(tuple(
        m.TopicPartitionErrors(t.name, tuple(m.PartitionError(p.partition_index, error) for p in t.partitions))
        for t in req.topics))  # fmt: skip


def handle_offset_commit(shard: GroupCoordinatorShard, req: m.OffsetCommitRequest, now_ms: int,
                         reply_to: object) -> None:  # fmt: skip
    group = shard.groups.get(req.group_id)
    if group is None:
        if req.generation_id_or_member_epoch >= 0:
            # a commit from an older generation of a group that is gone
            shard.reply(reply_to, commit_error_response(req, errors.ILLEGAL_GENERATION))
            return
        log.info("group %r: created by a manual offset commit", req.group_id)
        group = shard.create_group(req.group_id, now_ms)
    error = _validate_offset_commit(group, req)
    if error is not None:
        shard.reply(reply_to, commit_error_response(req, error))
        return
    if group.is_in(S.STABLE, S.PREPARING_REBALANCE):
        rebalance.schedule_heartbeat(shard, group, group.get(req.member_id), now_ms)
    _store_offsets(shard, group, req, now_ms, reply_to)


def _validate_offset_commit(group: GroupMetadata, req: m.OffsetCommitRequest) -> int | None:
    generation_id = req.generation_id_or_member_epoch
    if group.is_in(S.DEAD):
        return errors.COORDINATOR_NOT_AVAILABLE
    if generation_id < 0 and group.is_in(S.EMPTY):
        return None  # the admin client, or a consumer without group management
    if (
        generation_id >= 0
        or req.member_id != m.UNKNOWN_MEMBER_ID
        or req.group_instance_id is not None
    ):
        error = rebalance.validate_current_member(group, req.member_id, req.group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return errors.ILLEGAL_GENERATION
    elif not group.is_in(S.EMPTY):
        return errors.UNKNOWN_MEMBER_ID  # only members commit for a group that has them
    if group.is_in(S.COMPLETING_REBALANCE):
        return errors.REBALANCE_IN_PROGRESS
    return None


def _utf16_length(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2  # Java's String.length


def _store_offsets(
    shard, group: GroupMetadata, req: m.OffsetCommitRequest, now_ms: int, reply_to
) -> None:
    requested: dict[tuple[str, int], m.OffsetCommitPartition] = {}
    for topic in req.topics:
        for p in topic.partitions:
            requested[(topic.name, p.partition_index)] = p  # a repeated partition: the last wins
    expire_ms = (
        None
        if req.retention_time_ms == m.DEFAULT_RETENTION_TIME
        else now_ms + req.retention_time_ms
    )
    valid: dict[tuple[str, int], OffsetAndMetadata] = {}
    for tp, p in requested.items():
        metadata = p.committed_metadata or ""
        if _utf16_length(metadata) <= shard.config.offset_metadata_max_bytes:
            timestamp = now_ms if p.commit_timestamp == m.DEFAULT_TIMESTAMP else p.commit_timestamp
            valid[tp] = OffsetAndMetadata(p.committed_offset, p.committed_leader_epoch, metadata,
                                          timestamp, expire_ms)  # fmt: skip

    def response(error: int) -> m.OffsetCommitResponse:
        by_topic: dict[str, list[m.PartitionError]] = {}
        for tp in requested:
            code = error if tp in valid else errors.OFFSET_METADATA_TOO_LARGE
            by_topic.setdefault(tp[0], []).append(m.PartitionError(tp[1], code))
        return m.OffsetCommitResponse(
            tuple(m.TopicPartitionErrors(t, tuple(ps)) for t, ps in by_topic.items())
        )

    records = [
        offset_commit_record(group.group_id, t, p, o.to_value()) for (t, p), o in valid.items()
    ]
    if not records:
        shard.reply(reply_to, response(errors.NONE))
        return
    if not shard.fits(records):
        shard.reply(
            reply_to, response(errors.offset_commit_append_error(errors.RECORD_LIST_TOO_LARGE))
        )
        return

    def on_success(now_ms: int) -> None:
        if not group.is_in(S.DEAD):
            for tp, offset in valid.items():
                group.complete_offset_commit(tp, append_id, offset)
        shard.reply(reply_to, response(errors.NONE))

    def on_failure(code: int, now_ms: int) -> None:
        if not group.is_in(S.DEAD):
            for tp in valid:
                group.complete_offset_commit(tp, append_id, None)
        shard.reply(reply_to, response(errors.offset_commit_append_error(code)))

    append_id = shard.append(records, now_ms, on_success, on_failure)
    for tp in valid:
        group.prepare_offset_commit(tp, append_id)


# -- OffsetFetch ------------------------------------------------------------------------------


def handle_offset_fetch(shard, req: m.OffsetFetchRequest) -> m.OffsetFetchResponse:
    return m.OffsetFetchResponse(tuple(_fetch_group(shard, g) for g in req.groups))


def _fetch_group(shard, request: m.OffsetFetchGroup) -> m.OffsetFetchResponseGroup:
    error = shard.group_status(request.group_id, allow_empty_id=True)
    if error != errors.NONE:
        return m.OffsetFetchResponseGroup(request.group_id, error)
    group = shard.groups.get(request.group_id)
    offsets = {} if group is None or group.is_in(S.DEAD) else group.offsets
    if request.topics is None:
        wanted: dict[str, list[int]] = {}
        for topic, partition in offsets:
            wanted.setdefault(topic, []).append(partition)
    else:
        wanted = {t.name: list(t.partition_indexes) for t in request.topics}
    topics = []
    for topic, partitions in wanted.items():
        answers = []
        for partition in partitions:
            o = offsets.get((topic, partition))
            if o is None:
                answers.append(m.OffsetFetchPartition(partition))
            else:
                answers.append(
                    m.OffsetFetchPartition(
                        partition, o.committed_offset, o.leader_epoch, o.metadata
                    )
                )
        topics.append(m.OffsetFetchResponseTopic(topic, tuple(answers)))
    return m.OffsetFetchResponseGroup(request.group_id, errors.NONE, tuple(topics))


# -- OffsetDelete -----------------------------------------------------------------------------


def handle_offset_delete(shard, req: m.OffsetDeleteRequest, now_ms: int, reply_to: object) -> None:
    group = shard.groups.get(req.group_id)
    if group is None or group.is_in(S.DEAD):
        shard.reply(reply_to, m.OffsetDeleteResponse(errors.GROUP_ID_NOT_FOUND))
        return
    if not group.is_in(S.EMPTY) and group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        shard.reply(reply_to, m.OffsetDeleteResponse(errors.NON_EMPTY_GROUP))
        return
    results: dict[str, list[m.PartitionError]] = {}
    eligible = []
    for topic in req.topics:
        subscribed = not group.is_in(S.EMPTY) and group.is_subscribed_to_topic(topic.name)
        for partition in topic.partition_indexes:
            code = errors.GROUP_SUBSCRIBED_TO_TOPIC if subscribed else errors.NONE
            results.setdefault(topic.name, []).append(m.PartitionError(partition, code))
            if not subscribed:
                eligible.append((topic.name, partition))
    response = m.OffsetDeleteResponse(
        errors.NONE, tuple(m.TopicPartitionErrors(t, tuple(ps)) for t, ps in results.items())
    )
    records = (
        cleanup_group(shard, group, group.remove_offsets(eligible), now_ms) if eligible else []
    )
    _append_then_reply(shard, records, now_ms, reply_to, response,
                       lambda code: m.OffsetDeleteResponse(code))  # fmt: skip


def _append_then_reply(shard, records, now_ms, reply_to, response, failed) -> None:
    """Answer `response` once `records` commit (at once if there are none)."""
    if not records:
        shard.reply(reply_to, response)
        return
    if not shard.fits(records):
        shard.reply(reply_to, failed(errors.operation_append_error(errors.RECORD_LIST_TOO_LARGE)))
        return
    shard.append(
        records,
        now_ms,
        on_success=lambda now_ms: shard.reply(reply_to, response),
        on_failure=lambda code, now_ms: shard.reply(
            reply_to, failed(errors.operation_append_error(code))
        ),
    )


def cleanup_group(shard, group: GroupMetadata, removed, now_ms: int) -> list[CoordinatorRecord]:
    """Tombstones for `removed` offsets; an Empty group left with no offsets dies with them."""
    records = [offset_commit_tombstone(group.group_id, t, p) for t, p in removed]
    if group.is_in(S.EMPTY) and not group.has_offsets:
        group.transition_to(S.DEAD, now_ms)
    if group.is_in(S.DEAD):
        shard.remove_group(group)
        log.info("group %r: dead and removed in generation %d", group.group_id, group.generation_id)
        if group.generation_id > 0:  # a group only ever used for offsets has no group record
            records.append(group_metadata_tombstone(group.group_id))
    return records


def expire_offsets(shard, now_ms: int) -> None:
    records: list[CoordinatorRecord] = []
    retention_ms = shard.config.offsets_retention_ms
    expired = 0
    for group in list(shard.groups.values()):
        removed = group.remove_expired_offsets(now_ms, retention_ms)
        expired += len(removed)
        records += cleanup_group(shard, group, removed, now_ms)
    if expired:
        log.info("__consumer_offsets-%d: expired %d offsets", shard.partition, expired)
    # like Kafka, nobody waits for these: if they are lost, the next check writes them again
    for start in range(0, len(records), 1000):
        chunk = records[start : start + 1000]
        if shard.fits(chunk):
            shard.append(chunk, now_ms, lambda now_ms: None, lambda code, now_ms: None)


# -- ListGroups, DescribeGroups, DeleteGroups --------------------------------------------------


def handle_list_groups(shard, req: m.ListGroupsRequest) -> m.ListGroupsResponse:
    from localcluster.group.coordinator import ShardState

    if shard.state is ShardState.LOADING:
        return m.ListGroupsResponse(errors.COORDINATOR_LOAD_IN_PROGRESS)
    states = {s.lower() for s in req.states_filter}
    types = {t.lower() for t in req.types_filter}
    if types and "classic" not in types:
        return m.ListGroupsResponse(errors.NONE)
    return m.ListGroupsResponse(errors.NONE, tuple(
        m.ListedGroup(g.group_id, g.protocol_type or "", g.state.value)
        for g in shard.groups.values() if not states or g.state.value.lower() in states))  # fmt: skip


def handle_describe_groups(shard, req: m.DescribeGroupsRequest) -> m.DescribeGroupsResponse:
    return m.DescribeGroupsResponse(tuple(_describe(shard, group_id) for group_id in req.groups))


def _describe(shard, group_id: str) -> m.DescribedGroup:
    error = shard.group_status(group_id, allow_empty_id=True)
    if error != errors.NONE:
        return m.DescribedGroup(error, group_id)
    group = shard.groups.get(group_id)
    if group is None:
        return m.DescribedGroup(errors.NONE, group_id, S.DEAD.value)
    stable = group.is_in(S.STABLE)
    members = tuple(
        m.DescribedGroupMember(
            x.member_id,
            x.group_instance_id,
            x.client_id,
            x.client_host,
            x.metadata(group.protocol_name) if stable else b"",
            x.assignment if stable else b"",
        )  # fmt: skip
        for x in group.members.values()
    )
    protocol = group.protocol_name if stable else ""
    return m.DescribedGroup(errors.NONE, group_id, group.state.value, group.protocol_type or "",
                            protocol or "", members)  # fmt: skip


def handle_delete_groups(shard, req: m.DeleteGroupsRequest, now_ms: int, reply_to: object) -> None:
    results: dict[str, int] = {}
    records: list[CoordinatorRecord] = []
    deleted = []
    for group_id in req.groups_names:
        error = shard.group_status(group_id, allow_empty_id=True)
        group = shard.groups.get(group_id) if error == errors.NONE else None
        if error != errors.NONE:
            results[group_id] = error
        elif group is None or group.is_in(S.DEAD):
            results[group_id] = errors.GROUP_ID_NOT_FOUND
        elif not group.is_in(S.EMPTY):
            results[group_id] = errors.NON_EMPTY_GROUP
        else:
            group.transition_to(S.DEAD, now_ms)
            removed = group.remove_offsets(group.all_offset_partitions())
            records += cleanup_group(shard, group, removed, now_ms)
            results[group_id] = errors.NONE
            deleted.append(group_id)

    def response(error: int) -> m.DeleteGroupsResponse:
        return m.DeleteGroupsResponse(tuple(
            m.DeletableGroupResult(g, error if g in deleted else code) for g, code in results.items()))  # fmt: skip

    _append_then_reply(shard, records, now_ms, reply_to, response(errors.NONE), response)
