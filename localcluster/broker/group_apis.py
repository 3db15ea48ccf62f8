"""The group APIs on the wire: FindCoordinator and every request a consumer group sends.

Each handler decodes the request of its version (kio), builds the group core's request
(group/messages.py), hands it to the shard that owns the group (GroupCoordinator) and encodes
the answer for the same version. What differs between versions lives here and nowhere else:
- FindCoordinator v0-v3 locate one key, v4 (KIP-699) a list; only group keys exist here.
  `__consumer_offsets` is created on first use, as Kafka does, and COORDINATOR_NOT_AVAILABLE is
  the answer until its partition has a leader.
- LeaveGroup v0-v2 name one member; v3+ a batch (KIP-345).
- OffsetFetch v1-v7 ask for one group; v8+ for several, split here by coordinator shard, as are
  DescribeGroups and DeleteGroups. ListGroups asks every shard hosted here.
- OffsetCommit for a topic or partition that does not exist is answered
  UNKNOWN_TOPIC_OR_PARTITION here; the rest goes to the shard.
Responses are built from the core's dataclasses with absent (None) fields left out, so each
version's encoder fills what it lacks with Kafka's defaults.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from kio.schema.errors import ErrorCode

from localcluster.broker.group_coordinator import OFFSETS_TOPIC, GroupCoordinator
from localcluster.broker.metadata import ClusterMetadata, TopicCreationError
from localcluster.broker.network import ConnectionContext
from localcluster.group import GroupCoordinatorShard, ShardState, partition_for
from localcluster.group import messages as m
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey

log = logging.getLogger(__name__)

GROUP_KEY_TYPE = 0
NO_AUTHORIZED_OPERATIONS = -(2**31)  # Kafka's value when include_authorized_operations is false


def _ms(duration) -> int:
    return -1 if duration is None else int(duration.total_seconds() * 1000)


def _wire(value):
    """A core response as the dict `encode_response` takes: None fields left out."""
    if dataclasses.is_dataclass(value):
        return {f.name: _wire(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not None}  # fmt: skip
    if isinstance(value, tuple | list):
        return [_wire(v) for v in value]
    return value


def _client_host(context: ConnectionContext) -> str:
    """Kafka's form (InetAddress.toString without a name): "/127.0.0.1"."""
    if context.listener.is_unix:
        return "/localhost"
    return "/" + context.peer.rsplit(":", 1)[0]


class GroupApis:
    def __init__(self, coordinator: GroupCoordinator, metadata: ClusterMetadata, config):
        self.coordinator = coordinator
        self.metadata = metadata
        self.config = config
        self._creating: asyncio.Task | None = None

    def handlers(self) -> dict:
        return {
            ApiKey.FIND_COORDINATOR: self.handle_find_coordinator,
            ApiKey.JOIN_GROUP: self.handle_join_group,
            ApiKey.SYNC_GROUP: self.handle_sync_group,
            ApiKey.HEARTBEAT: self.handle_heartbeat,
            ApiKey.LEAVE_GROUP: self.handle_leave_group,
            ApiKey.OFFSET_COMMIT: self.handle_offset_commit,
            ApiKey.OFFSET_FETCH: self.handle_offset_fetch,
            ApiKey.OFFSET_DELETE: self.handle_offset_delete,
            ApiKey.LIST_GROUPS: self.handle_list_groups,
            ApiKey.DESCRIBE_GROUPS: self.handle_describe_groups,
            ApiKey.DELETE_GROUPS: self.handle_delete_groups,
        }

    def _shard(self, group_id: str) -> GroupCoordinatorShard:
        return self.coordinator.serving_shard(group_id)

    async def _ask(self, group_id: str, request):
        return await self.coordinator.handle(self._shard(group_id), request)

    # -- FindCoordinator ---------------------------------------------------------------------

    async def handle_find_coordinator(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)
        keys = request.coordinator_keys if header.api_version >= 4 else (request.key,)
        if getattr(request, "key_type", GROUP_KEY_TYPE) != GROUP_KEY_TYPE:
            found = {k: (ErrorCode.invalid_request, "only group coordinators exist here "
                         "(transactions are not implemented)", None) for k in keys}  # fmt: skip
        else:
            found = await self._locate(keys, context)
        entries = [{"key": k, "error_code": found[k][0], "error_message": found[k][1],
                    **(found[k][2] or {"node_id": -1, "host": "", "port": -1})} for k in keys]  # fmt: skip
        if header.api_version >= 4:
            return messages.write_response(header, {"coordinators": entries})
        entry = entries[0]
        del entry["key"]
        return messages.write_response(header, entry)

    async def _locate(self, keys, context: ConnectionContext) -> dict:
        data = await self.metadata.describe([OFFSETS_TOPIC], False, context.listener)
        topic = data["topics"][0]
        if topic["error_code"] == ErrorCode.unknown_topic_or_partition:
            await self._create_offsets_topic()
        partitions = {p["partition_index"]: p for p in topic["partitions"]}
        brokers = {b["node_id"]: b for b in data["brokers"]}
        found = {}
        for key in keys:
            partition = partitions.get(partition_for(key, len(partitions))) if partitions else None
            leader = brokers.get(partition["leader_id"]) if partition else None
            if leader is None:
                found[key] = (ErrorCode.coordinator_not_available,
                              f"{OFFSETS_TOPIC} has no leader for this group's partition yet", None)  # fmt: skip
            else:
                found[key] = (ErrorCode.none, None, {"node_id": leader["node_id"],
                              "host": leader["host"], "port": leader["port"]})  # fmt: skip
        return found

    async def _create_offsets_topic(self) -> None:
        """Kafka creates the offsets topic on the first FindCoordinator. Its replication factor
        is offsets.topic.replication.factor, lowered to the live brokers on a small cluster
        (Kafka refuses instead, the classic one-broker trap)."""
        if self._creating is not None and not self._creating.done():
            return await asyncio.shield(self._creating)
        self._creating = asyncio.get_running_loop().create_task(self._create())
        await asyncio.shield(self._creating)

    async def _create(self) -> None:
        c = self.config
        live = len(await asyncio.to_thread(self.metadata.zk.live_brokers))
        rf = min(c.offsets_topic_replication_factor, max(live, 1))
        if rf < c.offsets_topic_replication_factor:
            log.warning("creating %s with replication factor %d, not "
                        "offsets.topic.replication.factor=%d: only %d broker(s) are alive",
                        OFFSETS_TOPIC, rf, c.offsets_topic_replication_factor, live)  # fmt: skip
        configs = {"cleanup.policy": "compact", "segment.bytes": str(c.offsets_topic_segment_bytes)}
        try:
            await self.metadata.create_topic(OFFSETS_TOPIC, c.offsets_topic_num_partitions, rf,
                                             configs, None)  # fmt: skip
        except TopicCreationError as e:
            if e.error_code != ErrorCode.topic_already_exists:
                log.warning("could not create %s: %s", OFFSETS_TOPIC, e)

    # -- membership ----------------------------------------------------------------------------

    async def handle_join_group(self, header, reader, context) -> bytes:
        r = messages.read_request(header, reader)
        request = m.JoinGroupRequest(
            group_id=r.group_id, session_timeout_ms=_ms(r.session_timeout), member_id=r.member_id,
            protocol_type=r.protocol_type,
            protocols=tuple(m.JoinGroupProtocol(p.name, p.metadata) for p in r.protocols),
            api_version=header.api_version, client_id=header.client_id or "",
            client_host=_client_host(context),
            rebalance_timeout_ms=_ms(getattr(r, "rebalance_timeout", None)),
            group_instance_id=getattr(r, "group_instance_id", None),
            reason=getattr(r, "reason", None))  # fmt: skip
        return messages.write_response(header, _wire(await self._ask(r.group_id, request)))

    async def handle_sync_group(self, header, reader, context) -> bytes:
        r = messages.read_request(header, reader)
        request = m.SyncGroupRequest(
            r.group_id, r.generation_id, r.member_id,
            tuple(m.SyncGroupAssignment(a.member_id, a.assignment) for a in r.assignments),
            getattr(r, "group_instance_id", None), getattr(r, "protocol_type", None),
            getattr(r, "protocol_name", None))  # fmt: skip
        return messages.write_response(header, _wire(await self._ask(r.group_id, request)))

    async def handle_heartbeat(self, header, reader, context) -> bytes:
        r = messages.read_request(header, reader)
        request = m.HeartbeatRequest(r.group_id, r.generation_id, r.member_id,
                                     getattr(r, "group_instance_id", None))  # fmt: skip
        return messages.write_response(header, _wire(await self._ask(r.group_id, request)))

    async def handle_leave_group(self, header, reader, context) -> bytes:
        r = messages.read_request(header, reader)
        if header.api_version < 3:
            members = (m.MemberIdentity(r.member_id),)
        else:
            members = tuple(m.MemberIdentity(x.member_id, x.group_instance_id,
                                             getattr(x, "reason", None)) for x in r.members)  # fmt: skip
        response = await self._ask(r.group_id, m.LeaveGroupRequest(r.group_id, members))
        if header.api_version < 3:
            error = response.error_code or (response.members[0].error_code
                                            if response.members else 0)  # fmt: skip
            return messages.write_response(header, {"error_code": error})
        return messages.write_response(header, _wire(response))

    # -- offsets ---------------------------------------------------------------------------------

    async def handle_offset_commit(self, header, reader, context) -> bytes:
        r = messages.read_request(header, reader)
        known = await self._known_partitions({t.name for t in r.topics})
        unknown, topics = [], []
        for t in r.topics:
            partitions = []
            for p in t.partitions:
                if p.partition_index in known.get(t.name, ()):
                    partitions.append(m.OffsetCommitPartition(
                        p.partition_index, p.committed_offset,
                        getattr(p, "committed_leader_epoch", -1),
                        committed_metadata=p.committed_metadata))  # fmt: skip
                else:
                    unknown.append((t.name, p.partition_index))
            if partitions:
                topics.append(m.OffsetCommitTopic(t.name, tuple(partitions)))
        request = m.OffsetCommitRequest(
            r.group_id, tuple(topics), r.generation_id_or_member_epoch, r.member_id,
            getattr(r, "group_instance_id", None), _ms(getattr(r, "retention_time", None)))  # fmt: skip
        errors = {tp: ErrorCode.unknown_topic_or_partition for tp in unknown}
        if topics or not unknown:
            response = await self._ask(r.group_id, request)
            for t in response.topics:
                for p in t.partitions:
                    errors[(t.name, p.partition_index)] = p.error_code
        return messages.write_response(header, {"topics": [
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index,
                 "error_code": errors.get((t.name, p.partition_index), 0)} for p in t.partitions]}
            for t in r.topics]})  # fmt: skip

    async def _known_partitions(self, topics) -> dict[str, set[int]]:
        cache = self.metadata.cache
        if cache.ready:
            known = {t: set(cache.partitions_of(t)) for t in topics}
            if all(known.values()):
                return known

        def from_store():
            out = {}
            for t in topics:
                assignment = self.metadata.zk.assignment(t)
                out[t] = set(assignment.partitions) if assignment else set()
            return out

        return await asyncio.to_thread(from_store)

    async def handle_offset_fetch(self, header, reader, context) -> bytes:
        r = messages.read_request(header, reader)
        if header.api_version >= 8:
            groups = [m.OffsetFetchGroup(g.group_id, None if g.topics is None else tuple(
                m.OffsetFetchTopic(t.name, tuple(t.partition_indexes)) for t in g.topics))
                for g in r.groups]  # fmt: skip
        else:
            topics = None if r.topics is None else tuple(
                m.OffsetFetchTopic(t.name, tuple(t.partition_indexes)) for t in r.topics)  # fmt: skip
            groups = [m.OffsetFetchGroup(r.group_id, topics)]
        require_stable = getattr(r, "require_stable", False)
        answered = await self._per_shard(
            [g.group_id for g in groups],
            lambda ids: m.OffsetFetchRequest(tuple(g for g in groups if g.group_id in ids),
                                             require_stable),
            lambda response: response.groups)  # fmt: skip
        results = [answered[g.group_id] for g in groups]
        if header.api_version >= 8:
            return messages.write_response(header, {"groups": _wire(results)})
        group = results[0]
        topics = _wire(group.topics)
        if header.api_version < 2 and group.error_code:
            # v0-v1 have no group error: each asked partition carries it
            topics = [{"name": t.name, "partitions": [
                {"partition_index": p, "committed_offset": -1, "error_code": group.error_code}
                for p in t.partition_indexes]} for t in groups[0].topics or ()]  # fmt: skip
        return messages.write_response(header, {"topics": topics, "error_code": group.error_code})

    async def handle_offset_delete(self, header, reader, context) -> bytes:
        r = messages.read_request(header, reader)
        request = m.OffsetDeleteRequest(r.group_id, tuple(
            m.OffsetFetchTopic(t.name, tuple(p.partition_index for p in t.partitions))
            for t in r.topics))  # fmt: skip
        return messages.write_response(header, _wire(await self._ask(r.group_id, request)))

    # -- group administration ------------------------------------------------------------------

    async def handle_list_groups(self, header, reader, context) -> bytes:
        r = messages.read_request(header, reader)
        request = m.ListGroupsRequest(tuple(getattr(r, "states_filter", ())),
                                      tuple(getattr(r, "types_filter", ())))  # fmt: skip
        shards = self.coordinator.loaded_shards()
        responses = await asyncio.gather(*(self.coordinator.handle(s, request) for s in shards
                                           if s.state is ShardState.ACTIVE))  # fmt: skip
        loading = any(s.state is ShardState.LOADING for s in shards)
        groups = [g for response in responses for g in response.groups]
        error = ErrorCode.coordinator_load_in_progress if loading else 0
        return messages.write_response(header, {"error_code": error, "groups": _wire(groups)})

    async def handle_describe_groups(self, header, reader, context) -> bytes:
        r = messages.read_request(header, reader)
        answered = await self._per_shard(
            list(r.groups), lambda ids: m.DescribeGroupsRequest(tuple(ids)),
            lambda response: response.groups)  # fmt: skip
        return messages.write_response(header, {"groups": [
            {**_wire(answered[g]), "authorized_operations": NO_AUTHORIZED_OPERATIONS}
            for g in r.groups]})  # fmt: skip

    async def handle_delete_groups(self, header, reader, context) -> bytes:
        r = messages.read_request(header, reader)
        answered = await self._per_shard(
            list(r.groups_names), lambda ids: m.DeleteGroupsRequest(tuple(ids)),
            lambda response: response.results)  # fmt: skip
        return messages.write_response(
            header, {"results": _wire([answered[g] for g in r.groups_names])}
        )

    async def _per_shard(self, group_ids: list[str], build, parts) -> dict:
        """Split a request over several groups by shard, ask each, and index the answers'
        parts by group id."""
        by_shard: dict[int, tuple[GroupCoordinatorShard, list[str]]] = {}
        for group_id in dict.fromkeys(group_ids):
            shard = self._shard(group_id)
            by_shard.setdefault(id(shard) if shard.state is ShardState.NOT_LOADED
                                else shard.partition, (shard, []))[1].append(group_id)  # fmt: skip
        responses = await asyncio.gather(*(self.coordinator.handle(shard, build(ids))
                                           for shard, ids in by_shard.values()))  # fmt: skip
        return {part.group_id: part for response in responses for part in parts(response)}
