"""The group requests the consumer and the admin client share: finding a group's coordinator,
and OffsetFetch / OffsetCommit bodies and answers in every version this client speaks.

`find_coordinator` asks any broker (FindCoordinator v4 names a list of keys, v0-v3 one) and
retries COORDINATOR_NOT_AVAILABLE, which a broker answers while `__consumer_offsets` is being
created or its partition has no leader, until a deadline. OffsetFetch v8+ carries a list of
groups, v1-v7 one group; the helpers hide the difference. Offsets are {(topic, partition):
offset}; -1 is Kafka's "no committed offset".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from localcluster.client.connection import Address, BrokerConnection, KafkaError
from localcluster.client.metadata import TopicPartition
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey

GROUP_KEY_TYPE = 0
NO_OFFSET = -1
# Errors after which the group's coordinator must be found again (Java's
# AbstractCoordinator.markCoordinatorUnknown causes).
COORDINATOR_ERRORS = frozenset({ErrorCode.coordinator_not_available, ErrorCode.not_coordinator})


@dataclass(frozen=True, slots=True)
class Coordinator:
    node_id: int
    address: Address  # as FindCoordinator answered (host:port)


async def call(connection: BrokerConnection, api_key: int, body: Mapping, *,
               timeout_ms: int | None = None):  # fmt: skip
    """Send one request at the negotiated version; the decoded kio response."""
    frame, offset = await connection.send(
        api_key, lambda v: messages.encode_request(api_key, v, body), timeout_ms=timeout_ms
    )
    return messages.decode_response(api_key, connection.version(api_key), frame, offset)


async def find_coordinator(cluster, group_id: str, timeout_ms: int,
                           retry_backoff_ms: int = 100) -> Coordinator:  # fmt: skip
    """The broker coordinating `group_id`; retried on retriable errors until timeout_ms, then
    the last error is raised."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        connection = await cluster.any_connection()
        try:
            code, message, found = await _ask_coordinator(connection, group_id)
        except KafkaError as e:
            cluster.connection_failed(connection)
            code, message, found = -1, str(e), None
            error = e
        else:
            error = None if code == 0 else KafkaError.from_code(
                code, f"FindCoordinator for group {group_id!r}", message)  # fmt: skip
        if found is not None:
            return found
        assert error is not None
        if not error.retriable or time.monotonic() >= deadline:
            raise error
        await asyncio.sleep(retry_backoff_ms / 1000)


async def _ask_coordinator(connection: BrokerConnection, group_id: str):
    version = connection.version(ApiKey.FIND_COORDINATOR)
    body = {"key": group_id, "key_type": GROUP_KEY_TYPE, "coordinator_keys": [group_id]}
    answer = await call(connection, ApiKey.FIND_COORDINATOR, body)
    entry = answer.coordinators[0] if version >= 4 else answer
    if entry.error_code:
        return int(entry.error_code), entry.error_message, None
    return 0, None, Coordinator(int(entry.node_id), Address(entry.host, int(entry.port)))


# -- OffsetFetch --------------------------------------------------------------------------------


def _topics(partitions: Iterable[TopicPartition] | None):
    if partitions is None:
        return None  # every partition the group has an offset for
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return [{"name": t, "partition_indexes": sorted(ps)} for t, ps in sorted(by_topic.items())]


async def offset_fetch(connection: BrokerConnection, group_id: str,
                       partitions: Iterable[TopicPartition] | None = None,
                       require_stable: bool = False) -> dict[TopicPartition, int]:  # fmt: skip
    """{tp: committed offset (-1: none)}; raises KafkaError on a group or partition error."""
    version = connection.version(ApiKey.OFFSET_FETCH)
    topics = _topics(partitions)
    body = {"group_id": group_id, "topics": topics, "require_stable": require_stable,
            "groups": [{"group_id": group_id, "member_id": None, "member_epoch": -1,
                        "topics": topics}]}  # fmt: skip
    answer = await call(connection, ApiKey.OFFSET_FETCH, body)
    group = answer.groups[0] if version >= 8 else answer
    if getattr(group, "error_code", 0):
        raise KafkaError.from_code(int(group.error_code), f"OffsetFetch for group {group_id!r}")
    out: dict[TopicPartition, int] = {}
    for t in group.topics:
        for p in t.partitions:
            if p.error_code:
                raise KafkaError.from_code(
                    int(p.error_code), f"OffsetFetch {t.name}-{p.partition_index} for {group_id!r}"
                )
            out[(t.name, p.partition_index)] = int(p.committed_offset)
    return out


# -- OffsetCommit -------------------------------------------------------------------------------


async def offset_commit(connection: BrokerConnection, group_id: str,
                        offsets: Mapping[TopicPartition, int], *, generation_id: int = -1,
                        member_id: str = "", group_instance_id: str | None = None,
                        timeout_ms: int | None = None) -> dict[TopicPartition, int]:  # fmt: skip
    """{tp: error code} of one OffsetCommit (generation -1 and no member: an admin's commit,
    which the coordinator takes only while the group has no members)."""
    by_topic: dict[str, list[dict]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append({
            "partition_index": partition, "committed_offset": offset,
            "committed_leader_epoch": -1, "committed_metadata": "",
            "commit_timestamp": -1})  # fmt: skip
    body = {"group_id": group_id, "generation_id_or_member_epoch": generation_id,
            "member_id": member_id, "group_instance_id": group_instance_id,
            "retention_time": -1,
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}  # fmt: skip
    answer = await call(connection, ApiKey.OFFSET_COMMIT, body, timeout_ms=timeout_ms)
    return {(t.name, p.partition_index): int(p.error_code)
            for t in answer.topics for p in t.partitions}  # fmt: skip
