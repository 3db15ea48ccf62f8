"""The requests a coordinator shard handles and the responses it answers, in Kafka's field names.

The broker decodes the wire request (kio), builds one of these for the shard that owns the group
(`partition_for(group_id, offsets.topic.num.partitions)`), and encodes the response for the
negotiated version. Every field the shard needs is here and nothing version-specific leaks in
except `api_version`, which the shard reads the way Kafka's broker does:
- JoinGroup: v0 has no rebalance timeout (the session timeout is used); v4+ without a
  group.instance.id must first fetch a member id (MEMBER_ID_REQUIRED, KIP-394); v9+ static
  leaders may be told to skip the assignment.
Defaults are the values an older version's request implies (generation -1, member id "").
Responses carry only what a shard knows; a request spanning groups on several shards
(DescribeGroups, DeleteGroups, OffsetFetch v8+) is split by the broker, one part per shard.
"""

from __future__ import annotations

from dataclasses import dataclass

UNKNOWN_MEMBER_ID = ""  # JoinGroupRequest.UNKNOWN_MEMBER_ID
NO_GENERATION = -1
NO_LEADER = ""
DEFAULT_RETENTION_TIME = -1  # OffsetCommitRequest.DEFAULT_RETENTION_TIME
DEFAULT_TIMESTAMP = -1  # OffsetCommitRequest.DEFAULT_TIMESTAMP
NO_OFFSET = -1  # OffsetFetchResponse.INVALID_OFFSET


# -- JoinGroup / SyncGroup / Heartbeat / LeaveGroup --------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinGroupProtocol:
    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupRequest:
    group_id: str
    session_timeout_ms: int
    member_id: str
    protocol_type: str
    protocols: tuple[JoinGroupProtocol, ...]
    api_version: int
    client_id: str = ""
    client_host: str = ""  # Kafka's form is InetAddress.toString: "/127.0.0.1"
    rebalance_timeout_ms: int = -1  # v1+
    group_instance_id: str | None = None  # v5+
    reason: str | None = None  # v8+


@dataclass(frozen=True, slots=True)
class JoinGroupResponseMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupResponse:
    error_code: int
    member_id: str = UNKNOWN_MEMBER_ID
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = NO_LEADER
    skip_assignment: bool = False
    members: tuple[JoinGroupResponseMember, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncGroupAssignment:
    member_id: str
    assignment: bytes


@dataclass(frozen=True, slots=True)
class SyncGroupRequest:
    group_id: str
    generation_id: int
    member_id: str
    assignments: tuple[SyncGroupAssignment, ...] = ()
    group_instance_id: str | None = None  # v3+
    protocol_type: str | None = None  # v5+
    protocol_name: str | None = None  # v5+


@dataclass(frozen=True, slots=True)
class SyncGroupResponse:
    error_code: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None  # v3+


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error_code: int


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest:
    """v3+ batch form; the broker turns v0-v2's single member_id into one MemberIdentity."""

    group_id: str
    members: tuple[MemberIdentity, ...]


@dataclass(frozen=True, slots=True)
class MemberResponse:
    member_id: str
    group_instance_id: str | None
    error_code: int


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse:
    """v0-v2 answer one error: `error_code` if set, else the only member's (Kafka's rule)."""

    error_code: int
    members: tuple[MemberResponse, ...] = ()


# -- offsets ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetCommitPartition:
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int = -1  # v6+
    commit_timestamp: int = DEFAULT_TIMESTAMP  # v1 only
    committed_metadata: str | None = ""


@dataclass(frozen=True, slots=True)
class OffsetCommitTopic:
    name: str
    partitions: tuple[OffsetCommitPartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest:
    """Topics or partitions that do not exist are the broker's to answer
    (UNKNOWN_TOPIC_OR_PARTITION, from its metadata) before the rest reach the shard."""

    group_id: str
    topics: tuple[OffsetCommitTopic, ...]
    generation_id_or_member_epoch: int = NO_GENERATION  # v1+
    member_id: str = UNKNOWN_MEMBER_ID  # v1+
    group_instance_id: str | None = None  # v7+
    retention_time_ms: int = DEFAULT_RETENTION_TIME  # v2-v4


@dataclass(frozen=True, slots=True)
class PartitionError:
    partition_index: int
    error_code: int


@dataclass(frozen=True, slots=True)
class TopicPartitionErrors:
    name: str
    partitions: tuple[PartitionError, ...]


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse:
    topics: tuple[TopicPartitionErrors, ...]


@dataclass(frozen=True, slots=True)
class OffsetFetchTopic:
    name: str
    partition_indexes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OffsetFetchGroup:
    group_id: str
    topics: tuple[OffsetFetchTopic, ...] | None = None  # None: every committed partition


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest:
    """v8+ carries several groups; v0-v7's one group is a one-element `groups`."""

    groups: tuple[OffsetFetchGroup, ...]
    require_stable: bool = False  # v7+; only transactions make an offset unstable


@dataclass(frozen=True, slots=True)
class OffsetFetchPartition:
    partition_index: int
    committed_offset: int = NO_OFFSET
    committed_leader_epoch: int = -1
    metadata: str = ""
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class OffsetFetchResponseTopic:
    name: str
    partitions: tuple[OffsetFetchPartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetFetchResponseGroup:
    group_id: str
    error_code: int
    topics: tuple[OffsetFetchResponseTopic, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse:
    groups: tuple[OffsetFetchResponseGroup, ...]


@dataclass(frozen=True, slots=True)
class OffsetDeleteRequest:
    group_id: str
    topics: tuple[OffsetFetchTopic, ...]


@dataclass(frozen=True, slots=True)
class OffsetDeleteResponse:
    error_code: int
    topics: tuple[TopicPartitionErrors, ...] = ()


# -- group administration ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ListGroupsRequest:
    states_filter: tuple[str, ...] = ()  # v4+, case-insensitive
    types_filter: tuple[str, ...] = ()  # v5+; every group here is "classic"


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str
    group_type: str = "classic"


@dataclass(frozen=True, slots=True)
class ListGroupsResponse:
    error_code: int
    groups: tuple[ListedGroup, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeGroupsRequest:
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DescribedGroupMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    member_metadata: bytes
    member_assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    error_code: int
    group_id: str
    group_state: str = ""
    protocol_type: str = ""
    protocol_data: str = ""
    members: tuple[DescribedGroupMember, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeGroupsResponse:
    groups: tuple[DescribedGroup, ...]


@dataclass(frozen=True, slots=True)
class DeleteGroupsRequest:
    groups_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeletableGroupResult:
    group_id: str
    error_code: int


@dataclass(frozen=True, slots=True)
class DeleteGroupsResponse:
    results: tuple[DeletableGroupResult, ...]


GroupRequest = (
    JoinGroupRequest
    | SyncGroupRequest
    | HeartbeatRequest
    | LeaveGroupRequest
    | OffsetCommitRequest
    | OffsetFetchRequest
    | OffsetDeleteRequest
    | ListGroupsRequest
    | DescribeGroupsRequest
    | DeleteGroupsRequest
)
