"""ClusterMetadata: the broker's view of brokers, topics and leaders, for Metadata and admin.

Metadata is answered from the MetadataCache that the controller's UpdateMetadata requests
fill, as in Kafka. Until the first one arrives (or where no broker runs a controller) it is
read from the store through KafkaZkClient, in a worker thread so a real ZooKeeper's latency
never blocks the event loop.

CreateTopics only validates and writes the topic's config and assignment: the controller sees
the new topic, elects its leaders and writes their state (New -> Online).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from localcluster import topic_config
from localcluster.broker.metadata_cache import MetadataCache
from localcluster.broker.network import ListenerInfo
from localcluster.broker.replica_host import ISR_READ_BACK, ISR_WRITE, write_isr_updates
from localcluster.controller.assignment import (
    InvalidReplicationFactorError,
    assign_replicas_to_brokers,
)
from localcluster.coord import CoordinationClient, NodeExistsError, NoNodeError, paths
from localcluster.coord.kafka_zk import KafkaZkClient
from localcluster.coord.znode_data import BrokerRegistration, LeaderAndIsr, ZnodeDataError
from localcluster.metadata_types import OFFSETS_TOPIC

log = logging.getLogger(__name__)

LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def legal_topic(name: str | None) -> bool:
    """Kafka's Topic.validate: 1-249 of [a-zA-Z0-9._-], and neither '.' nor '..' (fullmatch:
    the pattern's $ would also match before a trailing newline)."""
    return bool(name) and name not in (".", "..") and LEGAL_TOPIC.fullmatch(name) is not None


class TopicCreationError(Exception):
    def __init__(self, error_code: ErrorCode, message: str):
        super().__init__(message)
        self.error_code = error_code


def check_replica_assignment(table: dict[int, tuple[int, ...]]) -> None:
    """Kafka's checks of a manual assignment (AdminZkClient.validateTopicCreate): partitions
    0..n-1, each with the same number (at least one) of distinct replicas. Brokers need not
    be alive, as in Kafka's ZK mode."""
    if set(table) != set(range(len(table))):
        raise TopicCreationError(ErrorCode.invalid_replica_assignment,
                                 f"partitions {sorted(table)} should be a consecutive 0-based "
                                 "integer sequence")  # fmt: skip
    for partition, replicas in sorted(table.items()):
        if not replicas or len(set(replicas)) != len(replicas):
            raise TopicCreationError(ErrorCode.invalid_replica_assignment,
                                     f"partition {partition}: replicas {list(replicas)} must be "
                                     "distinct and at least one")  # fmt: skip
    if len({len(r) for r in table.values()}) != 1:
        raise TopicCreationError(ErrorCode.invalid_replica_assignment,
                                 "all partitions should have the same number of replicas")  # fmt: skip


def _validated(configs, replication_factor: int | None) -> dict[str, str]:
    try:
        return topic_config.validate(configs, replication_factor)
    except topic_config.TopicConfigError as e:
        raise TopicCreationError(ErrorCode(e.error_code), str(e)) from None


class ClusterMetadata:
    _cluster_id: str | None = None  # read once, by cluster_id()

    def __init__(self, coord: CoordinationClient, broker_id: int, defaults, cache: MetadataCache):
        self.coord = coord
        self.cache = cache
        self.zk = KafkaZkClient(coord)
        self.broker_id = broker_id
        self.defaults = defaults  # BrokerConfig: num.partitions, default.replication.factor
        self.static = defaults  # as started; `defaults` adds the dynamic layers (config_changes)

    async def _run(self, fn: Callable, *args):
        return await asyncio.to_thread(fn, *args)

    # -- this broker's registration -----------------------------------------------------------

    def register(self, registration: BrokerRegistration) -> None:
        self.zk.ensure_persistent_paths()
        try:
            self.zk.register_broker(registration)
        except NodeExistsError:
            raise RuntimeError(self.duplicate_message()) from None

    def duplicate_message(self) -> str:
        other = self._registration()
        where = ", ".join(str(e) for e in other.endpoints) if other else ""
        holder = f" by pid {other.pid} (listening on {where})" if other else ""
        return (f"broker id {self.broker_id} is already registered{holder}; stop that broker "
                "or pick another --id")  # fmt: skip

    def _registration(self) -> BrokerRegistration | None:
        try:
            return self.zk.broker(self.broker_id)
        except Exception:
            return None  # unreadable: the caller's message stays useful without it

    def deregister(self) -> None:
        try:
            _, stat = self.coord.get(paths.broker_path(self.broker_id))
            if stat.ephemeralOwner == self.coord.session_id:
                self.coord.delete(paths.broker_path(self.broker_id))
        except NoNodeError:
            pass
        except Exception as e:
            log.warning("could not remove the registration of broker %d: %s", self.broker_id, e)

    def registered_pid(self) -> int | None:
        other = self._registration()
        return other.pid if other else None

    def is_registered(self) -> bool:
        return self.coord.exists(paths.broker_path(self.broker_id)) is not None

    def cluster_id(self) -> str:
        """The cluster's id, read (or created) once, as Kafka's broker does at start-up: it never
        changes. Read per Metadata answer, it made every answer wait for the store's lock behind
        whatever batch held it (1.3 s while a new controller wrote 400 ISR removals)."""
        if self._cluster_id is None:
            found = self.zk.cluster_id()
            if found == "unknown":  # unreadable: say so, and read it again next time
                return found
            self._cluster_id = found
        return self._cluster_id

    async def offsets_partition_count(self) -> int:
        """How many partitions `__consumer_offsets` has (groups map onto them)."""
        assignment = await self._run(self.zk.assignment, OFFSETS_TOPIC)
        assert assignment is not None, "an offsets partition is led here, so the topic exists"
        return len(assignment.partitions)

    # -- Metadata -----------------------------------------------------------------------------

    async def topic_configs(self, topics) -> dict[str, topic_config.TopicConfig]:
        """Each topic's effective config: its stored overrides over the broker's defaults."""
        if not topics:
            return {}
        stored = await self._run(lambda: {t: self.zk.topic_config(t) for t in topics})
        return {t: topic_config.resolve(overrides, self.defaults, t)
                for t, overrides in stored.items()}  # fmt: skip

    async def describe(self, names: list[str] | None, allow_auto_create: bool,
                       listener: ListenerInfo) -> dict:  # fmt: skip
        data = await self._run(self._describe, names, allow_auto_create, listener)
        for topic in data["topics"]:
            topic["is_internal"] = topic["name"] == OFFSETS_TOPIC
        return data

    @staticmethod
    def brokers_on(listener: ListenerInfo, brokers) -> tuple[list[dict], set[int]]:
        """Each broker's endpoint of the listener the request came in on (Kafka answers per
        listener); a broker without that listener is left out. A Unix-socket client is told
        each broker's first advertised endpoint."""
        out = []
        for broker_id, b in sorted(brokers.items()):
            endpoint = (
                b.endpoints[0] if listener.is_unix and b.endpoints else b.endpoint(listener.name)
            )
            if endpoint is not None:
                out.append({"node_id": broker_id, "host": endpoint.host, "port": endpoint.port,
                            "rack": b.rack})  # fmt: skip
        return out, {b["node_id"] for b in out}

    def _describe(self, names: list[str] | None, allow_auto_create: bool,
                  listener: ListenerInfo) -> dict:  # fmt: skip
        if self.cache.ready:
            return self._describe_from_cache(names, allow_auto_create, listener)
        brokers, live = self.brokers_on(listener, self.zk.live_brokers())
        wanted = self.zk.topics() if names is None else names
        topics = [self._describe_topic(name, live, allow_auto_create and names is not None)
                  for name in wanted]  # fmt: skip
        controller = self.zk.controller_id()
        return {"brokers": brokers, "cluster_id": self.cluster_id(),
                "controller_id": controller if controller is not None else -1, "topics": topics}  # fmt: skip

    def _describe_from_cache(self, names: list[str] | None, allow_auto_create: bool,
                             listener: ListenerInfo) -> dict:  # fmt: skip
        cache = self.cache
        brokers, _ = self.brokers_on(listener, cache.listed_brokers())
        live = {b for b in cache.brokers if b in {listed["node_id"] for listed in brokers}}
        topics = []
        for name in cache.topics() if names is None else names:
            partitions = cache.partitions_of(name) if legal_topic(name) else {}
            if not partitions:  # unknown to the controller (yet): the store decides
                topics.append(
                    self._describe_topic(name, live, allow_auto_create and names is not None)
                )
                continue
            topics.append({"name": name, "error_code": 0, "partitions": [
                self._partition_entry(p, c.leader, c.leader_epoch, c.isr, c.replicas, live)
                for p, c in sorted(partitions.items())]})  # fmt: skip
        return {"brokers": brokers, "cluster_id": self.cluster_id(),
                "controller_id": cache.controller_id, "topics": topics}  # fmt: skip

    @staticmethod
    def _partition_entry(partition, leader, leader_epoch, isr, replicas, live) -> dict:
        led = leader >= 0 and leader in live
        return {"error_code": 0 if led else ErrorCode.leader_not_available,
                "partition_index": partition, "leader_id": leader if led else -1,
                "leader_epoch": leader_epoch, "replica_nodes": list(replicas),
                "isr_nodes": list(isr), "offline_replicas": [r for r in replicas if r not in live]}  # fmt: skip

    def _describe_topic(self, name: str, live, auto_create: bool) -> dict:
        auto_create = auto_create and self.defaults.auto_create_topics_enable
        if not legal_topic(name):
            # Never look an illegal name up: it is no znode path ('a\x10' is refused by the
            # store, 'a/b' names another node). Kafka's answers: INVALID_TOPIC_EXCEPTION when
            # it would have created the topic, else UNKNOWN_TOPIC_OR_PARTITION.
            code = (
                ErrorCode.invalid_topic_exception
                if auto_create
                else ErrorCode.unknown_topic_or_partition
            )
            return {"name": name, "error_code": code, "partitions": []}
        try:
            assignment = self.zk.assignment(name)
        except ZnodeDataError:  # the controller leaves it alone and its log says why
            return {"name": name, "error_code": ErrorCode.unknown_topic_or_partition,
                    "partitions": []}  # fmt: skip
        if assignment is None:
            if auto_create:
                try:
                    self._create_topic(name, -1, -1, {}, None, False)
                except TopicCreationError as e:
                    return {"name": name, "error_code": e.error_code, "partitions": []}
                return {
                    "name": name,
                    "error_code": ErrorCode.leader_not_available,
                    "partitions": [],
                }
            return {
                "name": name,
                "error_code": ErrorCode.unknown_topic_or_partition,
                "partitions": [],
            }
        return {"name": name, "error_code": 0, "partitions": [
            self._describe_partition(name, p, replicas, live)
            for p, replicas in sorted(assignment.partitions.items())]}  # fmt: skip

    def _describe_partition(self, topic: str, partition: int, replicas, live) -> dict:
        found = self.zk.partition_state(topic, partition)
        if found is None:
            return self._partition_entry(partition, -1, -1, (), replicas, live)
        state: LeaderAndIsr = found[0]
        return self._partition_entry(
            partition, state.leader, state.leader_epoch, state.isr, replicas, live
        )

    # -- CreateTopics -------------------------------------------------------------------------

    async def create_topic(self, name, num_partitions, replication_factor, configs,
                           assignments, validate_only=False) -> None:  # fmt: skip
        await self._run(self._create_topic, name, num_partitions, replication_factor, configs,
                        assignments, validate_only)  # fmt: skip

    def _create_topic(self, name, num_partitions, replication_factor, configs, assignments,
                      validate_only) -> None:  # fmt: skip
        if not legal_topic(name):
            raise TopicCreationError(ErrorCode.invalid_topic_exception,
                                     f"topic name {name!r} must be 1-249 of [a-zA-Z0-9._-], "
                                     "not '.' or '..'")  # fmt: skip
        configs = _validated(configs, None)  # names and values before anything else
        if self.zk.assignment(name) is not None:
            raise TopicCreationError(ErrorCode.topic_already_exists, f"topic {name!r} exists")
        if assignments:
            if num_partitions not in (-1, None) or replication_factor not in (-1, None):
                raise TopicCreationError(ErrorCode.invalid_request,
                                         "both num_partitions or replication_factor and a replica "
                                         "assignment were given; send -1 with an assignment")  # fmt: skip
            table = {p: tuple(r) for p, r in assignments.items()}
            check_replica_assignment(table)
        else:
            table = self._assign(num_partitions, replication_factor)
        configs = _validated(configs, len(next(iter(table.values()))))
        if validate_only:
            return
        try:
            self.zk.create_topic(name, table, configs)
        except NodeExistsError:
            raise TopicCreationError(
                ErrorCode.topic_already_exists, f"topic {name!r} exists"
            ) from None
        except Exception as e:
            raise TopicCreationError(
                ErrorCode.unknown_server_error, f"could not create {name!r}: {e}"
            ) from e
        log.info("created topic %s: %s", name, {p: list(r) for p, r in table.items()})

    def _assign(self, num_partitions, replication_factor) -> dict[int, tuple[int, ...]]:
        live = self.zk.live_brokers()
        partitions = (
            self.defaults.num_partitions if num_partitions in (-1, None) else num_partitions
        )
        rf = (self.defaults.default_replication_factor if replication_factor in (-1, None)
              else replication_factor)  # fmt: skip
        if partitions < 1:
            raise TopicCreationError(ErrorCode.invalid_partitions,
                                     f"number of partitions must be at least 1, got {partitions}")  # fmt: skip
        try:
            table = assign_replicas_to_brokers(sorted(live), partitions, rf,
                                               racks={b: r.rack for b, r in live.items()})  # fmt: skip
        except InvalidReplicationFactorError as e:
            raise TopicCreationError(ErrorCode.invalid_replication_factor, str(e)) from None
        return {p: tuple(r) for p, r in table.items()}

    async def wait_for_topics(self, names: list[str], deadline_ms: int,
                              counts: dict[str, int] | None = None) -> None:  # fmt: skip
        """Wait (up to the request's timeout) until the controller has elected every new
        partition's leader, so a client's next Metadata finds them (`counts`: at least that
        many partitions, for CreatePartitions)."""
        counts = counts or {}

        def ready() -> bool:
            if self.cache.ready:
                return all(len(self.cache.partitions_of(name)) >= counts.get(name, 1)
                           for name in names)  # fmt: skip
            for name in names:
                assignment = self.zk.assignment(name)
                if assignment is None or any(self.zk.partition_state(name, p) is None
                                             for p in assignment.partitions):  # fmt: skip
                    return False
            return True

        while names and not await self._run(ready):
            if time.monotonic() * 1000 >= deadline_ms:
                return
            await asyncio.sleep(0.01)

    # -- the leader's ISR writes ----------------------------------------------------------------

    def update_isr(self, updates, step: str = ISR_WRITE) -> list[tuple[bool, int | None]]:
        """One step of leaders' ISR writes (replica_host.py states the sequence), many
        partitions at once: the writes, each conditional on the zkVersion its leader read, in
        one batch commit, or reading the states back after the writes' answer was lost.
        (written, zk_version now) each, zk_version None where the leader was fenced; raises
        when the store does not answer (a real ZooKeeper's connection loss)."""

        def read_states(some) -> list:
            states = self.zk.partition_states([(u.topic, u.partition) for u in some])
            return [states[u.topic, u.partition] for u in some]

        def write(states) -> list[int | None]:
            pairs = zip(updates, states, strict=True)
            return self.zk.update_isrs_from_leader(
                [((u.topic, u.partition), state, u.zk_version) for u, state in pairs]
            )

        if step == ISR_READ_BACK:
            return [u.outcome(s) for u, s in zip(updates, read_states(updates), strict=True)]
        return write_isr_updates(updates, read_states, write)
