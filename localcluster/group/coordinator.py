"""GroupCoordinatorShard: the group coordinator of one `__consumer_offsets` partition. Sans-I/O.

Its state is the replay of its partition. The runtime drives it with events and the current time
and carries out what each call returns (a `Result`):
- `replies`: responses to send now, each for the `reply_to` token its request came with. A
  request may be answered in a later call (a parked JoinGroup, a SyncGroup waiting for the
  leader, anything waiting for its records to commit).
- `appends`: record batches to append to the partition with acks=all, in order. The runtime then
  reports `on_appended(append_id, last_offset)` or `on_append_failed(append_id, error_code,
  now_ms)`, and `on_committed(high_watermark, now_ms)` as the high watermark moves: an append
  whose last offset is below it is committed, and only then are the replies that wait for it
  sent. Appends complete in append order.
- `next_deadline_ms`: when to call `tick(now_ms)` next (session and rebalance timeouts, the
  initial rebalance delay, offsets retention); None when nothing is armed.

Lifecycle (Kafka's onElection / onResignation): NOT_LOADED answers NOT_COORDINATOR;
`begin_loading()` then `replay(...)` of the partition's records (LOADING answers
COORDINATOR_LOAD_IN_PROGRESS, a Heartbeat NONE and a SyncGroup REBALANCE_IN_PROGRESS, as Kafka);
`complete_loading(now_ms)` makes it ACTIVE; `unload()` (leadership lost) answers everything
parked with NOT_COORDINATOR and forgets all state.

Rules from Kafka's ZooKeeper-era GroupCoordinator / GroupMetadataManager, with the new
coordinator's ClassicGroup where they agree; membership.py, rebalance.py and offsets.py say
which. Bounds: in-flight appends are bounded by the requests in flight (one per client connection, as Kafka
mutes a connection until it answers) plus one group record per group; a member's protocol
metadata by `member_metadata_max_bytes`; an append by `max_append_bytes` (message.max.bytes).
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from localcluster.group import errors, membership, offsets, rebalance
from localcluster.group import messages as m
from localcluster.group.metadata import (
    GroupMetadata,
    GroupState,
    OffsetAndMetadata,
    group_from_value,
)
from localcluster.group.records import (
    CoordinatorRecord,
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordDecodeError,
    UnknownKey,
    decode_record,
    partition_for,
)
from localcluster.group.timers import Timers

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1
MAX_STRING_BYTES = 0x7FFF  # a Kafka string, as every record field is


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Kafka's names and defaults (GroupCoordinatorConfig), plus two bounds of ours."""

    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    group_initial_rebalance_delay_ms: int = 3_000  # the broker picks a local-cluster value
    group_max_size: int = INT32_MAX
    offsets_retention_ms: int = 10_080 * 60_000  # offsets.retention.minutes = 10080
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4_096  # offset.metadata.max.bytes (UTF-16 units)
    new_member_join_timeout_ms: int = 300_000  # GroupCoordinator.NewMemberJoinTimeoutMs
    # ours: one member's JoinGroup protocol metadata, summed; beyond it INVALID_REQUEST
    member_metadata_max_bytes: int = 1 << 20
    max_append_bytes: int = 1_048_588  # message.max.bytes: a larger batch fails as Kafka's would


class ShardState(enum.Enum):
    NOT_LOADED = "NotLoaded"
    LOADING = "Loading"
    ACTIVE = "Active"


@dataclass(frozen=True, slots=True)
class Reply:
    reply_to: object
    response: object  # one of messages.*Response


@dataclass(frozen=True, slots=True)
class Append:
    append_id: int
    records: tuple[CoordinatorRecord, ...]
    timestamp_ms: int  # the records' timestamp (CREATE_TIME, as Kafka's coordinator writes)


@dataclass(frozen=True, slots=True)
class Result:
    replies: tuple[Reply, ...] = ()
    appends: tuple[Append, ...] = ()
    next_deadline_ms: int | None = None


class LogRecord(Protocol):
    """What `replay` reads: storage.record_batch.Record has these."""

    offset: int | None
    key: bytes | None
    value: bytes | None


@dataclass(slots=True)
class _PendingAppend:
    on_success: Callable[[int], None]  # now_ms
    on_failure: Callable[[int, int], None]  # error_code, now_ms
    last_offset: int | None = None


class GroupCoordinatorShard:
    def __init__(
        self,
        partition: int,
        num_partitions: int,
        config: GroupConfig | None = None,
        new_uuid: Callable[[], str] | None = None,
    ):
        assert 0 <= partition < num_partitions
        self.partition = partition
        self.num_partitions = num_partitions
        self.config = config or GroupConfig()
        self.new_uuid = new_uuid or (lambda: str(uuid.uuid4()))
        self.state = ShardState.NOT_LOADED
        self.coordinator_epoch = -1
        self.groups: dict[str, GroupMetadata] = {}
        self.timers = Timers()
        self.replay_errors = 0
        self._pending: dict[int, _PendingAppend] = {}
        self._next_append_id = 0
        self._replies: list[Reply] = []
        self._appends: list[Append] = []
        self._loaded_groups: dict[str, GroupMetadataValue] = {}
        self._loaded_offsets: dict[tuple[str, str, int], OffsetAndMetadata] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def begin_loading(self, coordinator_epoch: int = -1) -> None:
        """Became leader of the partition: forget everything, then replay what the log holds."""
        assert self.state is ShardState.NOT_LOADED, self.state
        self._reset()
        self.state = ShardState.LOADING
        self.coordinator_epoch = coordinator_epoch

    def replay(self, records: Iterable[LogRecord]) -> None:
        """Apply the records of non-control batches, in log order (tombstones delete)."""
        assert self.state is ShardState.LOADING, "replay only while loading"
        for record in records:
            try:
                key, value = decode_record(record.key, record.value)
            except RecordDecodeError as e:
                self.replay_errors += 1
                log.error("__consumer_offsets-%d offset %s: skipping %s", self.partition,
                          record.offset, e)  # fmt: skip
                continue
            self._replay_one(key, value)

    def replay_batch(self, batch) -> None:
        """Replay one RecordBatch (bytes), skipping control batches as Kafka's loader does."""
        from localcluster.storage import record_batch

        if not record_batch.read_header(batch).is_control:
            self.replay(record_batch.iter_records(batch))

    def complete_loading(self, now_ms: int) -> Result:
        assert self.state is ShardState.LOADING, self.state
        self.state = ShardState.ACTIVE
        for group_id, value in self._loaded_groups.items():
            self.groups[group_id] = group_from_value(group_id, value)
        for (group_id, topic, partition), offset in self._loaded_offsets.items():
            group = self.groups.get(group_id)
            if group is None:  # offsets only: a group that keeps its offsets in Kafka
                group = self.groups[group_id] = GroupMetadata(group_id, GroupState.EMPTY, now_ms)
            group.offsets[(topic, partition)] = offset
        self._loaded_groups.clear()
        self._loaded_offsets.clear()
        for group in self.groups.values():
            rebalance.on_group_loaded(self, group, now_ms)
        self.timers.arm(
            ("expire-offsets",), now_ms + self.config.offsets_retention_check_interval_ms
        )
        log.debug("__consumer_offsets-%d: loaded %d groups (%d offsets) in epoch %d", self.partition,
                 len(self.groups), sum(len(g.offsets) for g in self.groups.values()),
                 self.coordinator_epoch)  # fmt: skip
        return self._result()

    def unload(self) -> Result:
        """Lost leadership: everything waiting is answered NOT_COORDINATOR, the state dropped."""
        if self.state is ShardState.NOT_LOADED:
            return Result()
        for append_id in list(self._pending):
            pending = self._pending.pop(append_id)
            pending.on_failure(errors.NOT_LEADER_OR_FOLLOWER, 0)
        for group in self.groups.values():
            rebalance.on_group_unloaded(self, group)
        replies = tuple(self._replies)
        log.info("__consumer_offsets-%d: unloaded %d groups", self.partition, len(self.groups))
        self._reset()
        return Result(replies=replies)

    def _reset(self) -> None:
        self.state = ShardState.NOT_LOADED
        self.groups.clear()
        self.timers.clear()
        self._pending.clear()
        self._replies.clear()
        self._appends.clear()
        self._loaded_groups.clear()
        self._loaded_offsets.clear()

    def _replay_one(self, key, value) -> None:
        if isinstance(key, UnknownKey):
            log.warning("__consumer_offsets-%d: ignoring a record with key version %d",
                        self.partition, key.version)  # fmt: skip
        elif isinstance(key, OffsetCommitKey):
            tp = (key.group, key.topic, key.partition)
            if value is None:
                self._loaded_offsets.pop(tp, None)
            else:
                assert isinstance(value, OffsetCommitValue)
                self._loaded_offsets[tp] = OffsetAndMetadata.from_value(value)
        else:
            assert isinstance(key, GroupMetadataKey)
            if value is None:
                self._loaded_groups.pop(key.group, None)
            else:
                assert isinstance(value, GroupMetadataValue)
                self._loaded_groups[key.group] = value

    # -- events ------------------------------------------------------------------------------

    def handle(self, request: m.GroupRequest, now_ms: int, reply_to: object = None) -> Result:
        """One client request; its answer is in this Result's replies or a later one's."""
        if isinstance(request, m.ListGroupsRequest):
            self._reply(reply_to, offsets.handle_list_groups(self, request))
        elif isinstance(request, m.DescribeGroupsRequest):
            self._reply(reply_to, offsets.handle_describe_groups(self, request))
        elif isinstance(request, m.DeleteGroupsRequest):
            offsets.handle_delete_groups(self, request, now_ms, reply_to)
        elif isinstance(request, m.OffsetFetchRequest):
            self._reply(reply_to, offsets.handle_offset_fetch(self, request))
        else:
            self._handle_group_request(request, now_ms, reply_to)
        return self._result()

    def _handle_group_request(self, request, now_ms: int, reply_to: object) -> None:
        handlers = {
            m.JoinGroupRequest: membership.handle_join_group,
            m.SyncGroupRequest: membership.handle_sync_group,
            m.HeartbeatRequest: membership.handle_heartbeat,
            m.LeaveGroupRequest: membership.handle_leave_group,
            m.OffsetCommitRequest: offsets.handle_offset_commit,
            m.OffsetDeleteRequest: offsets.handle_offset_delete,
        }
        handler = handlers[type(request)]
        error = self.group_status(request.group_id, allow_empty_id=_ALLOWS_EMPTY_ID[type(request)])
        if error == errors.COORDINATOR_LOAD_IN_PROGRESS and isinstance(request, m.HeartbeatRequest):
            self._reply(reply_to, m.HeartbeatResponse(errors.NONE))  # Kafka answers it blindly
            return
        if error == errors.COORDINATOR_LOAD_IN_PROGRESS and isinstance(request, m.SyncGroupRequest):
            # the rebalance state is lost with the old coordinator: send the member back to
            # JoinGroup (older clients do not expect COORDINATOR_LOAD_IN_PROGRESS here)
            error = errors.REBALANCE_IN_PROGRESS
        if error != errors.NONE:
            self._reply(reply_to, _error_response(request, error))
            return
        handler(self, request, now_ms, reply_to)

    def tick(self, now_ms: int) -> Result:
        """Fire every deadline due at `now_ms`."""
        if self.state is ShardState.ACTIVE:
            while (key := self.timers.pop_due(now_ms)) is not None:
                self._fire(key, now_ms)
        return self._result()

    def _fire(self, key: tuple, now_ms: int) -> None:
        kind = key[0]
        if kind == "expire-offsets":
            offsets.expire_offsets(self, now_ms)
            self.timers.arm(key, now_ms + self.config.offsets_retention_check_interval_ms)
            return
        group = self.groups.get(key[1])
        if group is None:
            return
        if kind == "heartbeat":
            rebalance.on_heartbeat_expired(self, group, key[2], now_ms)
        elif kind == "pending":
            rebalance.on_pending_member_expired(self, group, key[2], now_ms)
        elif kind == "join":
            rebalance.on_join_deadline(self, group, now_ms)
        else:
            assert kind == "sync", key
            rebalance.on_sync_deadline(self, group, now_ms)

    def on_appended(self, append_id: int, last_offset: int) -> None:
        """The append is in the local log, ending at `last_offset`; it waits for the HW."""
        pending = self._pending.get(append_id)
        if pending is not None:
            pending.last_offset = last_offset

    def on_committed(self, high_watermark: int, now_ms: int) -> Result:
        """The high watermark moved: complete appends below it, in append order."""
        for append_id in list(self._pending):
            pending = self._pending[append_id]
            if pending.last_offset is None or pending.last_offset >= high_watermark:
                break  # later appends sit behind this one in the log
            del self._pending[append_id]
            pending.on_success(now_ms)
        return self._result()

    def on_append_failed(self, append_id: int, error_code: int, now_ms: int) -> Result:
        pending = self._pending.pop(append_id, None)
        if pending is not None:
            log.warning("__consumer_offsets-%d: append %d failed: %s", self.partition,
                        append_id, errors.error_name(error_code))  # fmt: skip
            pending.on_failure(error_code, now_ms)
        return self._result()

    def next_deadline_ms(self) -> int | None:
        return self.timers.next_deadline_ms()

    # -- for the handlers --------------------------------------------------------------------

    def group_status(self, group_id: str, allow_empty_id: bool = False) -> int:
        """Kafka's validateGroupStatus: may this shard serve `group_id` now?"""
        if (not group_id and not allow_empty_id) or len(group_id.encode()) > MAX_STRING_BYTES:
            return errors.INVALID_GROUP_ID
        if partition_for(group_id, self.num_partitions) != self.partition:
            return errors.NOT_COORDINATOR
        if self.state is ShardState.LOADING:
            return errors.COORDINATOR_LOAD_IN_PROGRESS
        if self.state is ShardState.NOT_LOADED:
            return errors.NOT_COORDINATOR
        return errors.NONE

    def reply(self, reply_to: object, response: object) -> None:
        self._reply(reply_to, response)

    def _reply(self, reply_to: object, response: object) -> None:
        self._replies.append(Reply(reply_to, response))

    def fits(self, records: list[CoordinatorRecord]) -> bool:
        size = sum(len(r.key) + len(r.value or b"") + 24 for r in records)  # ~record overhead
        return size + 61 <= self.config.max_append_bytes  # 61: the batch header

    def append(
        self,
        records: list[CoordinatorRecord],
        now_ms: int,
        on_success: Callable[[int], None],
        on_failure: Callable[[int, int], None],
    ) -> int:
        assert records and self.fits(records)
        self._next_append_id += 1
        append_id = self._next_append_id
        self._pending[append_id] = _PendingAppend(on_success, on_failure)
        self._appends.append(Append(append_id, tuple(records), now_ms))
        return append_id

    def create_group(self, group_id: str, now_ms: int) -> GroupMetadata:
        assert group_id not in self.groups
        group = self.groups[group_id] = GroupMetadata(group_id, GroupState.EMPTY, now_ms)
        return group

    def remove_group(self, group: GroupMetadata) -> None:
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
            self.timers.cancel(("join", group.group_id))
            self.timers.cancel(("sync", group.group_id))

    def _result(self) -> Result:
        result = Result(tuple(self._replies), tuple(self._appends), self.timers.next_deadline_ms())
        self._replies.clear()
        self._appends.clear()
        return result


_ALLOWS_EMPTY_ID = {
    # Kafka lets the offset APIs (and Describe/DeleteGroups) use the empty group id
    m.JoinGroupRequest: False,
    m.SyncGroupRequest: False,
    m.HeartbeatRequest: False,
    m.LeaveGroupRequest: False,
    m.OffsetCommitRequest: True,
    m.OffsetDeleteRequest: False,
}


def _error_response(request, error: int):
    if isinstance(request, m.JoinGroupRequest):
        return m.JoinGroupResponse(error, member_id=request.member_id)
    if isinstance(request, m.SyncGroupRequest):
        return m.SyncGroupResponse(error)
    if isinstance(request, m.HeartbeatRequest):
        return m.HeartbeatResponse(error)
    if isinstance(request, m.LeaveGroupRequest):
        return m.LeaveGroupResponse(error)
    if isinstance(request, m.OffsetCommitRequest):
        return offsets.commit_error_response(request, error)
    assert isinstance(request, m.OffsetDeleteRequest)
    return m.OffsetDeleteResponse(error)
