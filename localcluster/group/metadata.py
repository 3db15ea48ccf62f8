"""A classic group's metadata: its state machine, members, protocol selection and offsets.

Kafka's GroupMetadata / MemberMetadata (core/.../coordinator/group) and ClassicGroup /
ClassicGroupState (group-coordinator/.../classic), as data plus the rules that only look at the
group itself. What the coordinator does around them (replies, records, timers) lives in
membership.py, rebalance.py and offsets.py.

States and their valid previous states (an illegal transition raises and changes nothing):
    Empty               <- PreparingRebalance
    PreparingRebalance  <- Stable, CompletingRebalance, Empty
    CompletingRebalance <- PreparingRebalance
    Stable              <- CompletingRebalance
    Dead                <- Stable, PreparingRebalance, CompletingRebalance, Empty, Dead
Invariants: every static member's instance id maps to its member id; the leader, when set, is a
member; a pending member (KIP-394, holding a generated id) is not a member yet.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

from localcluster.group.consumer_protocol import (
    CONSUMER_PROTOCOL_TYPE,
    ConsumerProtocolError,
    subscribed_topics,
)
from localcluster.group.records import (
    NO_TIMESTAMP,
    GroupMetadataValue,
    MemberMetadataValue,
    OffsetCommitValue,
)


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


S = GroupState
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    S.EMPTY: frozenset({S.PREPARING_REBALANCE}),
    S.PREPARING_REBALANCE: frozenset({S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    S.STABLE: frozenset({S.COMPLETING_REBALANCE}),
    S.DEAD: frozenset({S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD}),
}


class IllegalGroupStateTransition(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Parked:
    """A request waiting for its answer (Kafka's awaiting join/sync callback)."""

    reply_to: object


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    committed_offset: int
    leader_epoch: int  # -1: none
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int | None = None  # only OffsetCommit v2-v4 with a retention time

    def to_value(self) -> OffsetCommitValue:
        expire = self.expire_timestamp_ms
        return OffsetCommitValue(
            offset=self.committed_offset,
            metadata=self.metadata,
            commit_timestamp=self.commit_timestamp_ms,
            leader_epoch=self.leader_epoch,
            expire_timestamp=NO_TIMESTAMP if expire is None else expire,
            version=3 if expire is None else 1,  # Kafka 3.x: v1 only to keep an expire timestamp
        )

    @classmethod
    def from_value(cls, value: OffsetCommitValue) -> OffsetAndMetadata:
        expire = None if value.expire_timestamp == NO_TIMESTAMP else value.expire_timestamp
        return cls(value.offset, value.leader_epoch, value.metadata, value.commit_timestamp, expire)


@dataclass(eq=False, slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    supported_protocols: tuple[tuple[str, bytes], ...]  # in the member's order of preference
    assignment: bytes = b""
    awaiting_join: Parked | None = None
    awaiting_sync: Parked | None = None
    is_new: bool = False  # joined in this rebalance; its join may time out (5 minutes)

    @property
    def is_static_member(self) -> bool:
        return self.group_instance_id is not None

    @property
    def protocol_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.supported_protocols)

    def metadata(self, protocol: str) -> bytes:
        for name, data in self.supported_protocols:
            if name == protocol:
                return data
        raise AssertionError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        return protocols == self.supported_protocols

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.supported_protocols:
            if name in candidates:
                return name
        raise AssertionError(f"member {self.member_id} supports none of {sorted(candidates)}")


TopicPartition = tuple[str, int]


@dataclass(eq=False)
class GroupMetadata:
    group_id: str
    state: GroupState = GroupState.EMPTY
    current_state_timestamp_ms: int | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation_id: int = 0
    leader_id: str | None = None
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_members: set[str] = field(default_factory=set)
    pending_sync_members: set[str] = field(default_factory=set)
    supported_protocols: Counter = field(default_factory=Counter)
    subscribed_topics: frozenset[str] | None = None  # consumer groups, when known
    new_member_added: bool = False  # a member joined during the initial delay (generation 0)
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    # append ids of offset commits in flight, per partition; a deletion clears them
    pending_offset_commits: dict[TopicPartition, set[int]] = field(default_factory=dict)
    # the rebalance in progress: (delay_ms, remaining_ms) of an InitialDelayedJoin, else None
    initial_join: tuple[int, int] | None = None
    sync_generation: int | None = None  # the generation a DelayedSync waits for

    # -- state -----------------------------------------------------------------------------

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def transition_to(self, target: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise IllegalGroupStateTransition(
                f"group {self.group_id!r}: {self.state.value} -> {target.value} is not a valid "
                f"transition (valid from: "
                f"{', '.join(sorted(s.value for s in VALID_PREVIOUS_STATES[target]))})"
            )
        self.state = target
        self.current_state_timestamp_ms = now_ms

    @property
    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS_STATES[GroupState.PREPARING_REBALANCE]

    # -- members ---------------------------------------------------------------------------

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def get(self, member_id: str) -> MemberMetadata:
        return self.members[member_id]

    @property
    def size(self) -> int:
        return len(self.members)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    @property
    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join is not None)

    @property
    def has_all_members_joined(self) -> bool:
        return self.num_awaiting_join == len(self.members) and not self.pending_members

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def current_static_member_id(self, group_instance_id: str) -> str | None:
        return self.static_members.get(group_instance_id)

    def add(self, member: MemberMetadata) -> None:
        assert member.member_id not in self.members, member.member_id
        if member.group_instance_id is not None:
            assert member.group_instance_id not in self.static_members, member.group_instance_id
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        assert self.protocol_type == member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocol_names)
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> MemberMetadata | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported_protocols.subtract(member.protocol_names)
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync_members.discard(member_id)
        return member

    def update_member(
        self,
        member: MemberMetadata,
        protocols: tuple[tuple[str, bytes], ...],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
    ) -> None:
        self.supported_protocols.subtract(member.protocol_names)
        member.supported_protocols = protocols
        self.supported_protocols.update(member.protocol_names)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms

    def replace_static_member(
        self, group_instance_id: str, old_member_id: str, new_member_id: str
    ) -> MemberMetadata:
        """Give a static member its new member id; the caller fences what the old one parked."""
        member = self.members.pop(old_member_id)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        if old_member_id in self.pending_sync_members:
            # the new incarnation owes the SyncGroup the old one did not send
            self.pending_sync_members.discard(old_member_id)
            self.pending_sync_members.add(new_member_id)
        return member

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep a leader that rejoined, else pick a member that did; False when none did."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].awaiting_join is not None:
            return True
        for member_id, member in self.members.items():
            if member.awaiting_join is not None:
                self.leader_id = member_id
                return True
        return False

    # -- protocols -------------------------------------------------------------------------

    def supports_protocols(self, protocol_type: str, protocol_names: set[str]) -> bool:
        if self.is_in(GroupState.EMPTY):
            return bool(protocol_type) and bool(protocol_names)
        return protocol_type == self.protocol_type and any(
            self.supported_protocols[name] == len(self.members) for name in protocol_names
        )

    def select_protocol(self) -> str:
        """The protocol all members support with the most votes (each votes its first choice).

        Ties go to the protocol voted first in member order (Kafka leaves them to a hash map).
        """
        assert self.members, "cannot select a protocol for an empty group"
        candidates = {p for p, n in self.supported_protocols.items() if n == len(self.members)}
        votes = Counter(member.vote(candidates) for member in self.members.values())
        return max(votes, key=votes.__getitem__)  # Counter keeps first-vote order

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        try:
            for member in self.members.values():
                topics |= subscribed_topics(member.metadata(self.protocol_name))
        except ConsumerProtocolError:
            return None  # unknown: treated as subscribed to everything
        return frozenset(topics)

    def is_subscribed_to_topic(self, topic: str) -> bool:
        if self.subscribed_topics is None:
            return True
        return topic in self.subscribed_topics

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    # -- offsets ---------------------------------------------------------------------------

    @property
    def has_offsets(self) -> bool:
        return bool(self.offsets) or bool(self.pending_offset_commits)

    def has_pending_commit(self, tp: TopicPartition) -> bool:
        return bool(self.pending_offset_commits.get(tp))

    def prepare_offset_commit(self, tp: TopicPartition, append_id: int) -> None:
        self.pending_offset_commits.setdefault(tp, set()).add(append_id)

    def complete_offset_commit(
        self, tp: TopicPartition, append_id: int, offset: OffsetAndMetadata | None
    ) -> None:
        """Materialise a committed offset (None: the append failed) unless deleted meanwhile."""
        pending = self.pending_offset_commits.get(tp)
        if pending is None or append_id not in pending:
            return  # the partition's offsets were deleted after this commit was appended
        pending.discard(append_id)
        if not pending:
            del self.pending_offset_commits[tp]
        if offset is not None:
            self.offsets[tp] = offset

    def remove_offsets(self, tps) -> list[TopicPartition]:
        """Forget the offsets of `tps`, committed or in flight; the partitions to tombstone.

        An in-flight commit gets a tombstone too: its record precedes the tombstone in the log,
        and without one a reload would bring the deleted offset back.
        """
        removed = []
        for tp in tps:
            in_flight = self.pending_offset_commits.pop(tp, None)
            if self.offsets.pop(tp, None) is not None or in_flight:
                removed.append(tp)
        return removed

    def all_offset_partitions(self) -> list[TopicPartition]:
        return list(dict.fromkeys([*self.offsets, *self.pending_offset_commits]))

    def remove_expired_offsets(
        self, now_ms: int, retention_ms: int
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Kafka 2.1+ (KIP-211): an Empty group's offsets expire `retention_ms` after it became
        Empty; a Stable consumer group's offsets of topics nobody subscribes to, after their
        commit; a group without a protocol type (offsets only), after their commit."""
        if self.protocol_type is None:
            subscribed: frozenset[str] = frozenset()

            def base(o: OffsetAndMetadata) -> int:
                return o.commit_timestamp_ms
        elif self.is_in(GroupState.EMPTY):
            subscribed = frozenset()
            became_empty_ms = self.current_state_timestamp_ms

            def base(o: OffsetAndMetadata) -> int:
                return o.commit_timestamp_ms if became_empty_ms is None else became_empty_ms
        elif (
            self.protocol_type == CONSUMER_PROTOCOL_TYPE
            and self.subscribed_topics is not None
            and self.is_in(GroupState.STABLE)
        ):
            subscribed = self.subscribed_topics

            def base(o: OffsetAndMetadata) -> int:
                return o.commit_timestamp_ms
        else:
            return {}
        expired = [
            tp
            for tp, o in self.offsets.items()
            if tp[0] not in subscribed
            and not self.has_pending_commit(tp)
            and _is_expired(o, base(o), now_ms, retention_ms)
        ]
        return {tp: self.offsets.pop(tp) for tp in expired}


def _is_expired(o: OffsetAndMetadata, base_ms: int, now_ms: int, retention_ms: int) -> bool:
    if o.expire_timestamp_ms is not None:  # an old commit's own retention
        return now_ms >= o.expire_timestamp_ms
    return now_ms - base_ms >= retention_ms


# -- to and from GroupMetadataValue ------------------------------------------------------------


def group_metadata_value(group: GroupMetadata, assignment: dict[str, bytes]) -> GroupMetadataValue:
    """The record Kafka writes for `group` with `assignment` (every member must have one)."""
    members = []
    for member in group.members.values():
        assert group.protocol_name is not None, "a non-empty group record needs a protocol"
        members.append(
            MemberMetadataValue(
                member_id=member.member_id,
                client_id=member.client_id,
                client_host=member.client_host,
                session_timeout=member.session_timeout_ms,
                subscription=member.metadata(group.protocol_name),
                assignment=assignment[member.member_id],
                group_instance_id=member.group_instance_id,
                rebalance_timeout=member.rebalance_timeout_ms,
            )
        )
    timestamp = group.current_state_timestamp_ms
    return GroupMetadataValue(
        protocol_type=group.protocol_type or "",
        generation=group.generation_id,
        protocol=group.protocol_name,
        leader=group.leader_id,
        members=tuple(members),
        current_state_timestamp=NO_TIMESTAMP if timestamp is None else timestamp,
    )


def group_from_value(group_id: str, value: GroupMetadataValue) -> GroupMetadata:
    """A group as loaded from its last record: Stable with those members, or Empty."""
    protocol_type = value.protocol_type or None
    group = GroupMetadata(
        group_id=group_id,
        state=GroupState.STABLE if value.members else GroupState.EMPTY,
        current_state_timestamp_ms=(
            None if value.current_state_timestamp == NO_TIMESTAMP else value.current_state_timestamp
        ),
        protocol_type=protocol_type,
        protocol_name=value.protocol,
        generation_id=value.generation,
        leader_id=value.leader,
    )
    for m in value.members:
        group.add(
            MemberMetadata(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                # v0 records have no rebalance timeout: Kafka uses the session timeout
                rebalance_timeout_ms=m.session_timeout
                if value.version == 0
                else m.rebalance_timeout,
                session_timeout_ms=m.session_timeout,
                protocol_type=value.protocol_type,
                supported_protocols=((value.protocol or "", m.subscription),),
                assignment=m.assignment,
            )
        )
    group.subscribed_topics = group.compute_subscribed_topics()
    return group
