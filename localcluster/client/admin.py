"""The admin client: create topics, describe the cluster and its topics, list topics.

Descriptions come from Metadata requests (never auto-creating a topic): brokers and the
controller for `describe_cluster`, leader, leader epoch, replicas, ISR and offline replicas
per partition for `describe_topic`. `create_topic` sends CreateTopics to the controller (any
broker when the controller is unknown or unreachable; every broker here can create topics)
and raises KafkaError with the broker's error code and message on failure
(TOPIC_ALREADY_EXISTS is code 36). `Admin` is the synchronous facade.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

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
from localcluster.client.metadata import BrokerInfo, Cluster, PartitionInfo, TopicInfo
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey

DEFAULTS = {
    "client.id": DEFAULT_CLIENT_ID,
    "request.timeout.ms": 30_000,
    "reconnect.backoff.ms": 50,
    "metadata.max.age.ms": 300_000,
    **SECURITY_DEFAULTS,
}


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerInfo, ...]


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partitions: tuple[PartitionInfo, ...]


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

    def wait_for_leaders(self, name: str, timeout_s: float = 10.0) -> TopicDescription:
        return self._thread.run(self._admin.wait_for_leaders(name, timeout_s))

    def close(self) -> None:
        try:
            self._thread.run(self._admin.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
