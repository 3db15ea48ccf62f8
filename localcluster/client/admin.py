"""The admin client: create, delete and describe topics and their configs, describe the
cluster, delete records, elect leaders, reassign partitions, and consumer groups (list,
describe, committed offsets, alter offsets, delete).

Descriptions come from Metadata requests (never auto-creating a topic): brokers and the
controller for `describe_cluster`, leader, leader epoch, replicas, ISR and offline replicas
per partition for `describe_topic`. `create_topic` sends CreateTopics to the controller (any
broker when the controller is unknown or unreachable; every broker here can create topics)
and raises KafkaError with the broker's error code and message on failure
(TOPIC_ALREADY_EXISTS is code 36). `Admin` is the synchronous facade.

DeleteTopics, DescribeConfigs (topics), ElectLeaders and the reassignment APIs go to the
controller as `create_topic` does; DeleteRecords to each partition's leader, as Kafka's
AdminClient sends it. A partition's failure raises KafkaError with its code, except
`elect_leaders`, which answers each partition's code (ELECTION_NOT_NEEDED is not a failure).

Groups as Kafka's AdminClient reaches them: ListGroups goes to every broker (each lists the
groups it coordinates); DescribeGroups, OffsetFetch, OffsetCommit and DeleteGroups go to the
group's coordinator (FindCoordinator), found again after NOT_COORDINATOR or
COORDINATOR_NOT_AVAILABLE and retried on COORDINATOR_LOAD_IN_PROGRESS until
request.timeout.ms.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from localcluster.client import group_requests
from localcluster.client.connection import (
    DEFAULT_CLIENT_ID,
    SECURITY_DEFAULTS,
    ClientSecurity,
    KafkaConnectionError,
    KafkaError,
    LoopThread,
    check_error,
    resolve_config,
)
from localcluster.client.group_requests import COORDINATOR_ERRORS
from localcluster.client.metadata import (
    BrokerInfo,
    Cluster,
    PartitionInfo,
    TopicInfo,
    TopicPartition,
)
from localcluster.group.consumer_protocol import (
    ConsumerProtocolError,
    decode_assignment,
    decode_subscription,
)
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey

DEFAULTS = {
    "client.id": DEFAULT_CLIENT_ID,
    "request.timeout.ms": 30_000,
    "reconnect.backoff.ms": 50,
    "metadata.max.age.ms": 300_000,
    **SECURITY_DEFAULTS,
}


# DescribeConfigs' config_source codes, by Kafka's names (DescribeConfigsResponse.ConfigSource)
CONFIG_SOURCES = {0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
                  3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG",
                  5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ConfigValue:
    """One config as DescribeConfigs answers it: its value and where that value comes from."""

    value: str | None
    source: str  # a CONFIG_SOURCES name: DYNAMIC_TOPIC_CONFIG for a topic's override
    read_only: bool


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerInfo, ...]


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partitions: tuple[PartitionInfo, ...]


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str  # "" from brokers that answer ListGroups v0-v3
    coordinator: int  # the broker that listed it


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    topics: tuple[str, ...]  # subscribed (consumer protocol), () when unreadable
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str  # Empty, PreparingRebalance, CompletingRebalance, Stable, Dead
    protocol_type: str
    protocol: str
    coordinator: int
    members: tuple[MemberDescription, ...]


def _member(m, consumer: bool) -> MemberDescription:
    topics: tuple[str, ...] = ()
    assignment: tuple[TopicPartition, ...] = ()
    if consumer:  # other protocol types carry bytes only their clients read
        try:
            topics = decode_subscription(bytes(m.member_metadata)).topics
        except ConsumerProtocolError:
            pass
        try:
            if m.member_assignment:
                parts = decode_assignment(bytes(m.member_assignment)).assigned_partitions
                assignment = tuple((t, p) for t, ps in parts for p in ps)
        except ConsumerProtocolError:
            pass
    return MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                             tuple(topics), assignment)  # fmt: skip


class AsyncAdmin:
    def __init__(self, config: Mapping | None = None, *, bootstrap_servers=None, cluster_dir=None,
                 **settings):  # fmt: skip
        config = dict(config or {})
        bootstrap_servers = config.pop("bootstrap.servers", bootstrap_servers)
        self.config = resolve_config(DEFAULTS, config, settings)
        c = self.config
        self.cluster = Cluster(bootstrap_servers, cluster_dir, client_id=c["client.id"],
                               security=ClientSecurity.from_config(c),
                               request_timeout_ms=c["request.timeout.ms"],
                               reconnect_backoff_ms=c["reconnect.backoff.ms"],
                               metadata_max_age_ms=c["metadata.max.age.ms"],
                               allow_auto_create_topics=False)  # fmt: skip
        self.cluster.all_topics = True

    async def start(self) -> AsyncAdmin:
        await self.cluster.start()
        return self

    async def __aenter__(self) -> AsyncAdmin:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.cluster.close()

    async def _metadata(self, topics: list[str] | None):
        """A Metadata answer from any live broker (one retry through another connection)."""
        for attempt in range(2):
            connection = await self.cluster.any_connection()
            try:
                return await self.cluster.fetch_metadata(
                    connection, topics, allow_auto_create=False
                )
            except KafkaConnectionError:
                self.cluster.connection_failed(connection)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                           config: Mapping[str, str] | None = None, *,
                           replica_assignment: Mapping[int, list[int]] | None = None,
                           validate_only: bool = False, timeout_ms: int | None = None) -> None:  # fmt: skip
        """Create a topic (-1: the broker's num.partitions / default.replication.factor)."""
        timeout_ms = self.config["request.timeout.ms"] if timeout_ms is None else timeout_ms
        topic = {"name": name, "num_partitions": -1 if replica_assignment else partitions,
                 "replication_factor": -1 if replica_assignment else replication_factor,
                 "assignments": [{"partition_index": p, "broker_ids": list(b)}
                                 for p, b in sorted((replica_assignment or {}).items())],
                 "configs": [{"name": k, "value": str(v)} for k, v in (config or {}).items()]}  # fmt: skip
        request = {"topics": [topic], "timeout": timeout_ms, "validate_only": validate_only}
        connection = await self._controller_connection()
        try:
            frame, offset = await connection.send(
                ApiKey.CREATE_TOPICS, lambda v: messages.encode_request(ApiKey.CREATE_TOPICS, v, request),
                timeout_ms=timeout_ms + self.config["request.timeout.ms"])  # fmt: skip
        except KafkaConnectionError:
            self.cluster.connection_failed(connection)
            raise
        response = messages.decode_response(ApiKey.CREATE_TOPICS,
                                            connection.version(ApiKey.CREATE_TOPICS), frame, offset)  # fmt: skip
        for result in response.topics:
            check_error(result.error_code, f"create topic {result.name!r}",
                        getattr(result, "error_message", None))  # fmt: skip

    async def _ask(self, api_key: ApiKey, body: dict, connection=None, timeout_ms: int = 0):
        """Send one request (to the controller unless a connection is given); its answer."""
        connection = connection or await self._controller_connection()
        try:
            frame, offset = await connection.send(
                api_key, lambda v: messages.encode_request(api_key, v, body),
                timeout_ms=timeout_ms + self.config["request.timeout.ms"])  # fmt: skip
        except KafkaConnectionError:
            self.cluster.connection_failed(connection)
            raise
        return messages.decode_response(api_key, connection.version(api_key), frame, offset)

    async def delete_topics(self, names: list[str], timeout_ms: int | None = None) -> None:
        """Delete topics; returns once the controller deleted them (KafkaError otherwise)."""
        timeout_ms = self.config["request.timeout.ms"] if timeout_ms is None else timeout_ms
        answer = await self._ask(ApiKey.DELETE_TOPICS, {
            "topic_names": list(names), "topics": [{"name": n} for n in names],
            "timeout": timeout_ms}, timeout_ms=timeout_ms)  # fmt: skip
        for result in answer.responses:
            check_error(result.error_code, f"delete topic {result.name!r}",
                        getattr(result, "error_message", None))  # fmt: skip

    async def describe_configs(self, topic: str) -> dict[str, ConfigValue]:
        """A topic's effective configs, each with its source (DescribeConfigs)."""
        answer = await self._ask(ApiKey.DESCRIBE_CONFIGS, {"resources": [
            {"resource_type": 2, "resource_name": topic, "configuration_keys": None}]})  # fmt: skip
        (result,) = answer.results
        check_error(result.error_code, f"describe configs of {topic!r}", result.error_message)
        return {c.name: ConfigValue(c.value, CONFIG_SOURCES.get(c.config_source, "UNKNOWN"),
                                    c.read_only)
                for c in result.configs}  # fmt: skip

    async def alter_topic_configs(self, topic: str, set_configs: Mapping[str, str],
                                  delete: list[str] = ()) -> None:  # fmt: skip
        """Set and delete overrides of a topic's config (IncrementalAlterConfigs SET and
        DELETE); the broker validates the result as CreateTopics does (INVALID_CONFIG)."""
        await self._alter_configs(2, topic, set_configs, delete, f"alter configs of {topic!r}")

    async def describe_broker_configs(self, broker_id: int | None = None
                                      ) -> dict[str, ConfigValue]:  # fmt: skip
        """A broker's properties with their sources, asked of that broker; None: the
        cluster-wide dynamic default layer alone (what `alter_broker_configs(None, ...)` set)."""
        name = "" if broker_id is None else str(broker_id)
        connection = None
        if broker_id is not None:
            if broker_id not in self.cluster.metadata.brokers:
                await self._metadata([])  # its address
            connection = await self.cluster.connection(broker_id)
        answer = await self._ask(ApiKey.DESCRIBE_CONFIGS, {"resources": [
            {"resource_type": 4, "resource_name": name, "configuration_keys": None}]},
            connection)  # fmt: skip
        (result,) = answer.results
        what = "the cluster-wide default" if broker_id is None else f"broker {broker_id}"
        check_error(result.error_code, f"describe configs of {what}", result.error_message)
        return {c.name: ConfigValue(c.value, CONFIG_SOURCES.get(c.config_source, "UNKNOWN"),
                                    c.read_only)
                for c in result.configs}  # fmt: skip

    async def alter_broker_configs(self, broker_id: int | None, set_configs: Mapping[str, str],
                                   delete: list[str] = ()) -> None:  # fmt: skip
        """Set and delete dynamic broker properties of one broker, or the cluster-wide default
        (None); only the log defaults topics inherit are dynamic (INVALID_REQUEST otherwise)."""
        what = "the cluster-wide default" if broker_id is None else f"broker {broker_id}"
        await self._alter_configs(4, "" if broker_id is None else str(broker_id), set_configs,
                                  delete, f"alter configs of {what}")  # fmt: skip

    async def _alter_configs(self, resource_type: int, name: str, set_configs: Mapping[str, str],
                             delete, what: str) -> None:  # fmt: skip
        operations = ([{"name": k, "config_operation": 0, "value": str(v)}
                       for k, v in set_configs.items()]
                      + [{"name": k, "config_operation": 1, "value": None} for k in delete])  # fmt: skip
        answer = await self._ask(ApiKey.INCREMENTAL_ALTER_CONFIGS, {"validate_only": False,
            "resources": [{"resource_type": resource_type, "resource_name": name,
                           "configs": operations}]})  # fmt: skip
        (result,) = answer.responses
        check_error(result.error_code, what, result.error_message)

    async def delete_records(self, offsets: Mapping[TopicPartition, int],
                             timeout_ms: int | None = None) -> dict[TopicPartition, int]:  # fmt: skip
        """Move each partition's log start to its offset (-1: the high watermark) on its
        leader; {partition: low watermark} once every in-sync replica starts there."""
        timeout_ms = self.config["request.timeout.ms"] if timeout_ms is None else timeout_ms
        by_leader: dict[int, dict[TopicPartition, int]] = {}
        for topic in sorted({t for t, _ in offsets}):
            leaders = {p.partition: p.leader for p in (await self.describe_topic(topic)).partitions}
            for (t, p), offset in offsets.items():
                if t == topic:
                    if p not in leaders:
                        raise KafkaError(
                            f"{t}-{p} does not exist", ErrorCode.unknown_topic_or_partition
                        )
                    by_leader.setdefault(leaders[p], {})[(t, p)] = offset
        out = {}
        for leader, wanted in sorted(by_leader.items()):
            topics: dict[str, list] = {}
            for (t, p), offset in sorted(wanted.items()):
                topics.setdefault(t, []).append({"partition_index": p, "offset": offset})
            answer = await self._ask(ApiKey.DELETE_RECORDS, {"timeout": timeout_ms, "topics": [
                {"name": t, "partitions": rows} for t, rows in topics.items()]},
                await self.cluster.connection(leader), timeout_ms)  # fmt: skip
            for topic in answer.topics:
                for p in topic.partitions:
                    check_error(p.error_code, f"delete records of {topic.name}-{p.partition_index}")
                    out[(topic.name, p.partition_index)] = p.low_watermark
        return out

    async def elect_leaders(self, partitions: list[TopicPartition] | None = None,
                            unclean: bool = False,
                            timeout_ms: int | None = None) -> dict[TopicPartition, int]:  # fmt: skip
        """ElectLeaders (PREFERRED, or UNCLEAN) for the partitions (None: all); each one's error
        code (0: elected; ELECTION_NOT_NEEDED 84 and the rest as the controller answered)."""
        timeout_ms = self.config["request.timeout.ms"] if timeout_ms is None else timeout_ms
        by_topic: dict[str, list[int]] = {}
        for t, p in partitions or ():
            by_topic.setdefault(t, []).append(p)
        answer = await self._ask(ApiKey.ELECT_LEADERS, {
            "election_type": 1 if unclean else 0, "timeout": timeout_ms,
            "topic_partitions": None if partitions is None else [
                {"topic": t, "partitions": ps} for t, ps in by_topic.items()]}, timeout_ms=timeout_ms)  # fmt: skip
        check_error(getattr(answer, "error_code", 0), "elect leaders")
        return {(r.topic, p.partition_id): int(p.error_code)
                for r in answer.replica_election_results for p in r.partition_result}  # fmt: skip

    async def alter_partition_reassignments(self, targets: Mapping[TopicPartition, list[int] | None],
                                            timeout_ms: int | None = None) -> None:  # fmt: skip
        """Reassign partitions (None cancels one under way); returns once the controller took
        each up (ListPartitionReassignments shows it until it completes)."""
        timeout_ms = self.config["request.timeout.ms"] if timeout_ms is None else timeout_ms
        by_topic: dict[str, list] = {}
        for (t, p), replicas in sorted(targets.items()):
            by_topic.setdefault(t, []).append({"partition_index": p, "replicas": replicas})
        answer = await self._ask(ApiKey.ALTER_PARTITION_REASSIGNMENTS, {
            "timeout": timeout_ms, "topics": [{"name": t, "partitions": rows}
                                              for t, rows in by_topic.items()]}, timeout_ms=timeout_ms)  # fmt: skip
        check_error(answer.error_code, "reassign partitions", answer.error_message)
        for topic in answer.responses:
            for p in topic.partitions:
                check_error(p.error_code, f"reassign {topic.name}-{p.partition_index}",
                            p.error_message)  # fmt: skip

    async def list_partition_reassignments(self) -> dict[TopicPartition, dict[str, list[int]]]:
        """Partitions under way: {partition: {"replicas", "adding", "removing"}}."""
        answer = await self._ask(ApiKey.LIST_PARTITION_REASSIGNMENTS, {"timeout": 10_000,
                                                                       "topics": None})  # fmt: skip
        check_error(answer.error_code, "list partition reassignments", answer.error_message)
        return {(t.name, p.partition_index): {"replicas": list(p.replicas),
                                              "adding": list(p.adding_replicas),
                                              "removing": list(p.removing_replicas)}
                for t in answer.topics for p in t.partitions}  # fmt: skip

    async def _controller_connection(self):
        snapshot = await self._metadata([])
        self.cluster.metadata.brokers = snapshot.brokers
        if snapshot.controller_id in snapshot.brokers:
            try:
                return await self.cluster.connection(snapshot.controller_id)
            except KafkaConnectionError:
                pass
        return await self.cluster.any_connection()

    async def describe_cluster(self) -> ClusterDescription:
        snapshot = await self._metadata([])
        return ClusterDescription(snapshot.cluster_id, snapshot.controller_id,
                                  tuple(b for _, b in sorted(snapshot.brokers.items())))  # fmt: skip

    async def describe_topic(self, name: str) -> TopicDescription:
        """Raises KafkaError (UNKNOWN_TOPIC_OR_PARTITION) for a topic that does not exist."""
        snapshot = await self._metadata([name])
        info: TopicInfo | None = snapshot.topics.get(name)
        if info is None:
            raise KafkaError(
                f"topic {name!r}: not in the broker's answer", ErrorCode.unknown_topic_or_partition
            )
        check_error(info.error_code, f"describe topic {name!r}")
        return TopicDescription(name, info.partitions)

    async def describe_producers(self, name: str) -> dict[int, list[dict]]:
        """{partition: active producers} from each partition's leader (DescribeProducers):
        producer id, epoch, last sequence, last timestamp, as Kafka's kafka-transactions.sh
        describe-producers shows them."""
        description = await self.describe_topic(name)
        out: dict[int, list[dict]] = {}
        for p in description.partitions:
            connection = await self.cluster.connection(p.leader)
            body = {"topics": [{"name": name, "partition_indexes": [p.partition]}]}
            frame, offset = await connection.send(ApiKey.DESCRIBE_PRODUCERS, lambda v, b=body: (
                messages.encode_request(ApiKey.DESCRIBE_PRODUCERS, v, b)))  # fmt: skip
            version = connection.version(ApiKey.DESCRIBE_PRODUCERS)
            answer = messages.decode_response(ApiKey.DESCRIBE_PRODUCERS, version, frame, offset)
            (partition,) = answer.topics[0].partitions
            check_error(partition.error_code, f"describe producers of {name}-{p.partition}")
            out[p.partition] = [{"producer_id": a.producer_id, "producer_epoch": a.producer_epoch,
                                 "last_sequence": a.last_sequence,
                                 "last_timestamp": a.last_timestamp}
                                for a in partition.active_producers]  # fmt: skip
        return out

    async def list_topics(self) -> list[str]:
        snapshot = await self._metadata(None)
        return sorted(snapshot.topics)

    # -- consumer groups ----------------------------------------------------------------------

    async def _at_coordinator(self, group_id: str, ask):
        """`await ask(connection)` -> (error code, result) at the group's coordinator, again
        at the new one after a coordinator error, until request.timeout.ms; (node id, result)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config["request.timeout.ms"] / 1000
        while True:
            found = await group_requests.find_coordinator(self.cluster, group_id,
                                                          self.config["request.timeout.ms"])  # fmt: skip
            if found.node_id not in self.cluster.metadata.brokers:
                await self.cluster.refresh_metadata()
            try:
                connection = await self.cluster.connection(found.node_id)
                code, result = await ask(connection)
            except KafkaConnectionError as e:
                code, result = -1, e
            retriable = code in COORDINATOR_ERRORS or code in (
                -1, ErrorCode.coordinator_load_in_progress)  # fmt: skip
            if not retriable:
                check_error(code, f"group {group_id!r}")
                return found.node_id, result
            if loop.time() > deadline:
                if isinstance(result, KafkaError):
                    raise result
                check_error(code, f"group {group_id!r}")
            await asyncio.sleep(0.1)

    async def list_groups(self) -> list[GroupListing]:
        """Every group any live broker coordinates (ListGroups to each broker). A broker
        that cannot answer raises KafkaError naming it."""
        snapshot = await self._metadata([])
        self.cluster.metadata.brokers = snapshot.brokers
        out: list[GroupListing] = []
        for node_id in sorted(snapshot.brokers):
            connection = await self.cluster.connection(node_id)
            for _attempt in range(20):  # COORDINATOR_LOAD_IN_PROGRESS: a shard is loading
                answer = await group_requests.call(connection, ApiKey.LIST_GROUPS,
                                                   {"states_filter": [], "types_filter": []})  # fmt: skip
                if answer.error_code != ErrorCode.coordinator_load_in_progress:
                    break
                await asyncio.sleep(0.1)
            check_error(answer.error_code, f"ListGroups at broker {node_id}")
            out += [GroupListing(g.group_id, g.protocol_type, getattr(g, "group_state", ""), node_id)
                    for g in answer.groups]  # fmt: skip
        return sorted(out, key=lambda g: g.group_id)

    async def describe_group(self, group_id: str) -> GroupDescription:
        """State, protocol and members of one group (state Dead: no such group)."""

        async def ask(connection):
            answer = await group_requests.call(connection, ApiKey.DESCRIBE_GROUPS,
                                               {"groups": [group_id],
                                                "include_authorized_operations": False})  # fmt: skip
            group = answer.groups[0]
            return int(group.error_code), group

        node_id, g = await self._at_coordinator(group_id, ask)
        consumer = g.protocol_type == "consumer"
        return GroupDescription(g.group_id, g.group_state, g.protocol_type, g.protocol_data,
                                node_id, tuple(_member(m, consumer) for m in g.members))  # fmt: skip

    async def list_group_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None = None
    ) -> dict[TopicPartition, int]:
        """The group's committed offsets ({} for a group with none); -1: none committed."""

        async def ask(connection):
            try:
                return 0, await group_requests.offset_fetch(connection, group_id, partitions)
            except KafkaError as e:
                if isinstance(e, KafkaConnectionError):
                    raise
                return e.code, e

        return (await self._at_coordinator(group_id, ask))[1]

    async def alter_group_offsets(self, group_id: str,
                                  offsets: dict[TopicPartition, int]) -> None:  # fmt: skip
        """Commit offsets for a group with no members (the coordinator refuses otherwise:
        UNKNOWN_MEMBER_ID), as kafka-consumer-groups.sh --reset-offsets does."""

        async def ask(connection):
            errors = await group_requests.offset_commit(connection, group_id, offsets)
            failed = [(tp, code) for tp, code in sorted(errors.items()) if code]
            if not failed:
                return 0, None
            (topic, partition), code = failed[0]
            if code in COORDINATOR_ERRORS or code == ErrorCode.coordinator_load_in_progress:
                return code, None
            raise KafkaError.from_code(
                code, f"commit of {topic}-{partition} for group {group_id!r}"
            )

        await self._at_coordinator(group_id, ask)

    async def delete_group(self, group_id: str) -> None:
        """DeleteGroups: GROUP_ID_NOT_FOUND for no such group, NON_EMPTY_GROUP while it has
        members."""

        async def ask(connection):
            answer = await group_requests.call(connection, ApiKey.DELETE_GROUPS,
                                               {"groups_names": [group_id]})  # fmt: skip
            return int(answer.results[0].error_code), None

        await self._at_coordinator(group_id, ask)

    async def wait_for_leaders(self, name: str, timeout_s: float = 10.0) -> TopicDescription:
        """describe_topic until every partition has a leader (a new topic's first moments)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                description = await self.describe_topic(name)
                if description.partitions and all(p.leader >= 0 for p in description.partitions):
                    return description
            except KafkaError as e:
                if not e.retriable or loop.time() > deadline:
                    raise
            if loop.time() > deadline:
                raise KafkaError(f"topic {name!r} has partitions without a leader after {timeout_s} s",
                                 ErrorCode.leader_not_available, True)  # fmt: skip
            await asyncio.sleep(0.02)


class Admin:
    """Synchronous facade: an AsyncAdmin on an event loop in a background thread."""

    def __init__(self, config: Mapping | None = None, *, bootstrap_servers=None, cluster_dir=None,
                 **settings):  # fmt: skip
        self._thread = LoopThread("localcluster-admin")

        async def make():
            return await AsyncAdmin(config, bootstrap_servers=bootstrap_servers,
                                    cluster_dir=cluster_dir, **settings).start()  # fmt: skip

        try:
            self._admin = self._thread.run(make())
        except BaseException:
            self._thread.stop()
            raise

    def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                     config: Mapping[str, str] | None = None, **kwargs) -> None:  # fmt: skip
        self._thread.run(
            self._admin.create_topic(name, partitions, replication_factor, config, **kwargs)
        )

    def describe_cluster(self) -> ClusterDescription:
        return self._thread.run(self._admin.describe_cluster())

    def describe_topic(self, name: str) -> TopicDescription:
        return self._thread.run(self._admin.describe_topic(name))

    def describe_producers(self, name: str) -> dict[int, list[dict]]:
        return self._thread.run(self._admin.describe_producers(name))

    def list_topics(self) -> list[str]:
        return self._thread.run(self._admin.list_topics())

    def delete_topics(self, names: list[str], timeout_ms: int | None = None) -> None:
        self._thread.run(self._admin.delete_topics(names, timeout_ms))

    def describe_configs(self, topic: str) -> dict[str, ConfigValue]:
        return self._thread.run(self._admin.describe_configs(topic))

    def alter_topic_configs(self, topic: str, set_configs: Mapping[str, str],
                            delete: list[str] = ()) -> None:  # fmt: skip
        self._thread.run(self._admin.alter_topic_configs(topic, set_configs, delete))

    def describe_broker_configs(self, broker_id: int | None = None) -> dict[str, ConfigValue]:
        return self._thread.run(self._admin.describe_broker_configs(broker_id))

    def alter_broker_configs(self, broker_id: int | None, set_configs: Mapping[str, str],
                             delete: list[str] = ()) -> None:  # fmt: skip
        self._thread.run(self._admin.alter_broker_configs(broker_id, set_configs, delete))

    def delete_records(self, offsets: Mapping[TopicPartition, int],
                       timeout_ms: int | None = None) -> dict[TopicPartition, int]:  # fmt: skip
        return self._thread.run(self._admin.delete_records(offsets, timeout_ms))

    def elect_leaders(self, partitions: list[TopicPartition] | None = None, unclean: bool = False,
                      timeout_ms: int | None = None) -> dict[TopicPartition, int]:  # fmt: skip
        return self._thread.run(self._admin.elect_leaders(partitions, unclean, timeout_ms))

    def alter_partition_reassignments(self, targets: Mapping[TopicPartition, list[int] | None],
                                      timeout_ms: int | None = None) -> None:  # fmt: skip
        self._thread.run(self._admin.alter_partition_reassignments(targets, timeout_ms))

    def list_partition_reassignments(self) -> dict[TopicPartition, dict[str, list[int]]]:
        return self._thread.run(self._admin.list_partition_reassignments())

    def wait_for_leaders(self, name: str, timeout_s: float = 10.0) -> TopicDescription:
        return self._thread.run(self._admin.wait_for_leaders(name, timeout_s))

    def list_groups(self) -> list[GroupListing]:
        return self._thread.run(self._admin.list_groups())

    def describe_group(self, group_id: str) -> GroupDescription:
        return self._thread.run(self._admin.describe_group(group_id))

    def list_group_offsets(self, group_id: str,
                           partitions: list[TopicPartition] | None = None) -> dict[TopicPartition, int]:  # fmt: skip
        return self._thread.run(self._admin.list_group_offsets(group_id, partitions))

    def alter_group_offsets(self, group_id: str, offsets: dict[TopicPartition, int]) -> None:
        self._thread.run(self._admin.alter_group_offsets(group_id, offsets))

    def delete_group(self, group_id: str) -> None:
        self._thread.run(self._admin.delete_group(group_id))

    def close(self) -> None:
        try:
            self._thread.run(self._admin.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
