"""Kafka error codes the group coordinator answers, and how a failed append maps onto them.

The core does not import kio: these are Kafka's numbers (clients/.../protocol/Errors.java), and a
unit test checks them against kio's table. A failed append of the coordinator's own records is
reported by the runtime with the replica layer's error; the coordinator answers the client what
Kafka answers for that failure, which differs by operation (Kafka's GroupMetadataManager.storeGroup
for group metadata, maybeConvertOffsetCommitError for offset commits, and the new coordinator
runtime's CoordinatorOperationExceptionHelper for deletions).
"""

from __future__ import annotations

NONE = 0
UNKNOWN_SERVER_ERROR = -1
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_FETCH_SIZE = 4
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
OFFSET_METADATA_TOO_LARGE = 12
NETWORK_EXCEPTION = 13
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
RECORD_LIST_TOO_LARGE = 18
NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
INVALID_COMMIT_OFFSET_SIZE = 28
INVALID_REQUEST = 42
KAFKA_STORAGE_ERROR = 56
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
MEMBER_ID_REQUIRED = 79
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82
GROUP_SUBSCRIBED_TO_TOPIC = 86
UNSTABLE_OFFSET_COMMIT = 88

ERROR_NAMES = {
    value: name for name, value in globals().items() if name.isupper() and isinstance(value, int)
}

_REPLICATION_UNAVAILABLE = frozenset(
    {UNKNOWN_TOPIC_OR_PARTITION, NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND}
)
_NOT_LEADER = frozenset({NOT_LEADER_OR_FOLLOWER, KAFKA_STORAGE_ERROR})
_TOO_LARGE = frozenset({MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE, INVALID_FETCH_SIZE})


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, f"error {code}")


def group_append_error(code: int) -> int:
    """What a JoinGroup/SyncGroup answers when its group metadata record failed (storeGroup)."""
    if code in _REPLICATION_UNAVAILABLE:
        return COORDINATOR_NOT_AVAILABLE
    if code in _NOT_LEADER:
        return NOT_COORDINATOR
    if code == REQUEST_TIMED_OUT:
        return REBALANCE_IN_PROGRESS
    if code in _TOO_LARGE:
        return UNKNOWN_SERVER_ERROR
    return code


def offset_commit_append_error(code: int) -> int:
    """What an OffsetCommit answers when its records failed (maybeConvertOffsetCommitError)."""
    if code == NETWORK_EXCEPTION:
        return COORDINATOR_LOAD_IN_PROGRESS
    if code in _REPLICATION_UNAVAILABLE:
        return COORDINATOR_NOT_AVAILABLE
    if code in _NOT_LEADER:
        return NOT_COORDINATOR
    if code in _TOO_LARGE:
        return INVALID_COMMIT_OFFSET_SIZE
    return code


def operation_append_error(code: int) -> int:
    """DeleteGroups/OffsetDelete after a failed write (the new runtime's exception helper)."""
    if code == NETWORK_EXCEPTION:
        return COORDINATOR_LOAD_IN_PROGRESS
    if code in _REPLICATION_UNAVAILABLE or code == REQUEST_TIMED_OUT:
        return COORDINATOR_NOT_AVAILABLE
    if code in _NOT_LEADER:
        return NOT_COORDINATOR
    if code in _TOO_LARGE:
        return UNKNOWN_SERVER_ERROR
    return code
