"""ClusterMetadata: what the coordination store says about brokers, topics and leaders.

Reads are answered from the store itself (a znode read is a file read with the embedded
backend), in a worker thread so a real ZooKeeper's latency never blocks the event loop.
Watches on /brokers/topics and the partition state znodes tell this broker which partitions it
leads; their callbacks only hand an event to the loop.

Until the controller exists (issue 6), topic creation also writes each new partition's first
state (leader = first live replica, ISR = the live replicas, epoch 0): the controller's
New -> Online transition. `_add_initial_states` is the one place to remove then.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from localcluster.coord import (
    BadVersionError,
    ChildrenWatch,
    CoordinationClient,
    NodeExistsError,
    NoNodeError,
    paths,
)
from localcluster.coord.znode_data import (
    BrokerRegistration,
    LeaderAndIsr,
    TopicAssignment,
    decode_topic_config,
    encode_topic_config,
)
from localcluster.controller.assignment import (
    InvalidReplicationFactorError,
    assign_replicas_to_brokers,
)

log = logging.getLogger(__name__)

LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
TOPIC_CONFIGS = {"segment.bytes", "retention.ms", "retention.bytes", "min.insync.replicas",
                 "unclean.leader.election.enable", "cleanup.policy", "max.message.bytes"}  # fmt: skip
CONFIG_TOPICS = "/config/topics"


def legal_topic(name: str | None) -> bool:
    """Kafka's Topic.validate: 1-249 of [a-zA-Z0-9._-], and neither '.' nor '..' (fullmatch:
    the pattern's $ would also match before a trailing newline)."""
    return bool(name) and name not in (".", "..") and LEGAL_TOPIC.fullmatch(name) is not None


class TopicCreationError(Exception):
    def __init__(self, error_code: ErrorCode, message: str):
        super().__init__(message)
        self.error_code = error_code


def config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS}/{topic}"


class ClusterMetadata:
    def __init__(self, coord: CoordinationClient, broker_id: int, defaults):
        self.coord = coord
        self.broker_id = broker_id
        self.defaults = defaults  # BrokerConfig: num.partitions, default.replication.factor
        self._watches: list = []

    async def _run(self, fn: Callable, *args):
        return await asyncio.to_thread(fn, *args)

    # -- brokers ------------------------------------------------------------------------------

    def register(self, registration: BrokerRegistration) -> None:
        for path in paths.PERSISTENT_PATHS + (CONFIG_TOPICS,):
            self.coord.ensure_path(path)
        try:
            self.coord.create(paths.broker_path(self.broker_id), registration.encode(),
                              ephemeral=True)  # fmt: skip
        except NodeExistsError:
            raise RuntimeError(self.duplicate_message()) from None

    def duplicate_message(self) -> str:
        holder = ""
        try:
            data, _ = self.coord.get(paths.broker_path(self.broker_id))
            other = BrokerRegistration.decode(self.broker_id, "", data)
            holder = f" by pid {other.pid} (listening on {other.host}:{other.port})"
        except Exception:
            pass  # the message stays useful without the holder's details
        return (f"broker id {self.broker_id} is already registered{holder}; stop that broker "
                "or pick another --id")  # fmt: skip

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
        try:
            data, _ = self.coord.get(paths.broker_path(self.broker_id))
            return BrokerRegistration.decode(self.broker_id, "", data).pid
        except Exception:
            return None

    def is_registered(self) -> bool:
        return self.coord.exists(paths.broker_path(self.broker_id)) is not None

    def live_brokers(self) -> dict[int, BrokerRegistration]:
        out = {}
        for child in self.coord.get_children(paths.BROKER_IDS):
            if not child.isdigit():
                continue
            path = paths.broker_path(int(child))
            try:
                data, _ = self.coord.get(path)
            except NoNodeError:
                continue
            out[int(child)] = BrokerRegistration.decode(int(child), path, data)
        return out

    def controller_id(self, live: dict[int, BrokerRegistration]) -> int:
        try:
            data, _ = self.coord.get(paths.CONTROLLER)
            return int(json.loads(data)["brokerid"])
        except (NoNodeError, ValueError, KeyError, TypeError):
            # No controller yet: name the lowest live broker, which can create topics too.
            return min(live) if live else -1

    # -- topics -------------------------------------------------------------------------------

    def topics(self) -> list[str]:
        return sorted(self.coord.get_children(paths.BROKER_TOPICS))

    def assignment(self, topic: str) -> TopicAssignment | None:
        path = paths.topic_path(topic)
        try:
            data, _ = self.coord.get(path)
        except NoNodeError:
            return None
        return TopicAssignment.decode(path, data)

    def partition_state(self, topic: str, partition: int) -> tuple[LeaderAndIsr, int] | None:
        path = paths.partition_state_path(topic, partition)
        try:
            data, stat = self.coord.get(path)
        except NoNodeError:
            return None
        return LeaderAndIsr.decode(path, data), stat.version

    def topic_config(self, topic: str) -> dict[str, str]:
        try:
            data, _ = self.coord.get(config_path(topic))
        except NoNodeError:
            return {}
        return decode_topic_config(config_path(topic), data)

    async def topic_configs(self, topics) -> dict[str, dict[str, str]]:
        return await self._run(lambda: {t: self.topic_config(t) for t in topics})

    async def describe(self, names: list[str] | None, allow_auto_create: bool) -> dict:
        return await self._run(self._describe, names, allow_auto_create)

    def _describe(self, names: list[str] | None, allow_auto_create: bool) -> dict:
        live = self.live_brokers()
        brokers = [{"node_id": b, "host": r.host, "port": r.port, "rack": r.rack}
                   for b, r in sorted(live.items())]  # fmt: skip
        wanted = self.topics() if names is None else names
        topics = []
        for name in wanted:
            topics.append(self._describe_topic(name, live, allow_auto_create and names is not None))
        return {"brokers": brokers, "cluster_id": self.cluster_id(),
                "controller_id": self.controller_id(live), "topics": topics}  # fmt: skip

    def _describe_topic(self, name: str, live, auto_create: bool) -> dict:
        auto_create = auto_create and self.defaults.auto_create_topics_enable
        if not legal_topic(name):
            # Never look an illegal name up: it is no znode path ('a\x10' is refused by the
            # store, 'a/b' names another node). Kafka's answers: INVALID_TOPIC_EXCEPTION when
            # it would have created the topic, else UNKNOWN_TOPIC_OR_PARTITION.
            code = ErrorCode.invalid_topic_exception if auto_create else ErrorCode.unknown_topic_or_partition
            return {"name": name, "error_code": code, "partitions": []}
        assignment = self.assignment(name)
        if assignment is None:
            if auto_create:
                try:
                    self._create_topic(name, -1, -1, {}, None, False)
                except TopicCreationError as e:
                    return {"name": name, "error_code": e.error_code, "partitions": []}
                return {"name": name, "error_code": ErrorCode.leader_not_available, "partitions": []}
            return {"name": name, "error_code": ErrorCode.unknown_topic_or_partition, "partitions": []}
        partitions = []
        for p, replicas in sorted(assignment.partitions.items()):
            found = self.partition_state(name, p)
            offline = [r for r in replicas if r not in live]
            if found is None or found[0].leader < 0 or found[0].leader not in live:
                state = found[0] if found else None
                partitions.append({"error_code": ErrorCode.leader_not_available,
                                   "partition_index": p, "leader_id": -1,
                                   "leader_epoch": state.leader_epoch if state else -1,
                                   "replica_nodes": list(replicas),
                                   "isr_nodes": list(state.isr) if state else [],
                                   "offline_replicas": offline})  # fmt: skip
                continue
            state = found[0]
            partitions.append({"error_code": 0, "partition_index": p, "leader_id": state.leader,
                               "leader_epoch": state.leader_epoch, "replica_nodes": list(replicas),
                               "isr_nodes": list(state.isr), "offline_replicas": offline})  # fmt: skip
        return {"name": name, "error_code": 0, "partitions": partitions}

    def cluster_id(self) -> str:
        import uuid

        try:
            data, _ = self.coord.get("/cluster/id")
            return json.loads(data)["id"]
        except NoNodeError:
            pass
        except (ValueError, KeyError):
            return "unknown"
        cluster_id = uuid.uuid4().hex[:22]
        try:
            self.coord.create("/cluster/id", json.dumps({"version": "1", "id": cluster_id}).encode(),
                              makepath=True)  # fmt: skip
        except NodeExistsError:
            data, _ = self.coord.get("/cluster/id")
            cluster_id = json.loads(data)["id"]
        return cluster_id

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
        unknown = sorted(set(configs) - TOPIC_CONFIGS)
        if unknown:
            raise TopicCreationError(ErrorCode.invalid_config,
                                     f"unknown topic config {', '.join(unknown)}; known: "
                                     f"{', '.join(sorted(TOPIC_CONFIGS))}")  # fmt: skip
        if self.coord.exists(paths.topic_path(name)) is not None:
            raise TopicCreationError(ErrorCode.topic_already_exists, f"topic {name!r} exists")
        live = self.live_brokers()
        if assignments:
            table = {p: tuple(r) for p, r in assignments.items()}
        else:
            partitions = self.defaults.num_partitions if num_partitions in (-1, None) else num_partitions
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
            table = {p: tuple(r) for p, r in table.items()}
        if validate_only:
            return
        tx = self.coord.transaction()
        tx.create(config_path(name), encode_topic_config(configs))
        tx.create(paths.topic_path(name), TopicAssignment(table).encode())
        self._add_initial_states(tx, name, table, live)
        try:
            tx.commit()
        except Exception as e:
            if self.coord.exists(paths.topic_path(name)) is not None:
                raise TopicCreationError(ErrorCode.topic_already_exists, f"topic {name!r} exists") from None
            raise TopicCreationError(ErrorCode.unknown_server_error, f"could not create {name!r}: {e}") from e
        log.info("created topic %s: %s", name, {p: list(r) for p, r in table.items()})

    @staticmethod
    def _add_initial_states(tx, topic: str, table: dict[int, tuple[int, ...]], live) -> None:
        """The controller's New -> Online until the controller exists (see module doc):
        written in the topic's own transaction, so a watcher sees topic and leaders at once."""
        tx.create(paths.topic_partitions_path(topic))
        for p, replicas in sorted(table.items()):
            alive = [r for r in replicas if r in live]
            state = LeaderAndIsr(alive[0] if alive else -1, 0, tuple(alive), 0)
            tx.create(paths.partition_path(topic, p))
            tx.create(paths.partition_state_path(topic, p), state.encode())

    async def wait_for_topics(self, names: list[str], deadline_ms: int) -> None:
        def ready() -> bool:
            for name in names:
                assignment = self.assignment(name)
                if assignment is None:
                    return False
                if any(self.partition_state(name, p) is None for p in assignment.partitions):
                    return False
            return True

        while names and not await self._run(ready):
            if time.monotonic() * 1000 >= deadline_ms:
                return
            await asyncio.sleep(0.01)

    # -- leadership watches -------------------------------------------------------------------

    def watch_topics(self, on_change: Callable[[], None]) -> None:
        """Call `on_change` (from the coord thread) when topics or their states change."""
        self._watches.append(ChildrenWatch(self.coord, paths.BROKER_TOPICS,
                                           lambda children: on_change()))  # fmt: skip

    def partitions_led_by_me(self) -> list[tuple[str, int, LeaderAndIsr, int, tuple[int, ...], dict]]:
        """(topic, partition, state, zk_version, replicas, topic config) of every partition
        whose state znode names this broker as leader."""
        out = []
        for topic in self.topics():
            assignment = self.assignment(topic)
            if assignment is None:
                continue
            config = None
            for p, replicas in sorted(assignment.partitions.items()):
                if self.broker_id not in replicas:
                    continue
                found = self.partition_state(topic, p)
                if found is not None and found[0].leader == self.broker_id:
                    if config is None:
                        config = self.topic_config(topic)
                    out.append((topic, p, found[0], found[1], replicas, config))
        return out

    # -- replication --------------------------------------------------------------------------

    def broker_socket(self, broker_id: int) -> str | None:
        path = paths.broker_path(broker_id)
        try:
            data, _ = self.coord.get(path)
        except NoNodeError:
            return None
        return BrokerRegistration.decode(broker_id, path, data).unix_socket or None

    def update_isr(self, update) -> tuple[bool, int | None]:
        """Write a leader's new ISR, conditional on the zkVersion it read (Kafka's
        updateLeaderAndIsr), and notify the controller through /isr_change_notification.
        Returns (written, zk_version now); zk_version None when the leader was fenced."""
        path = paths.partition_state_path(update.topic, update.partition)
        found = self.partition_state(update.topic, update.partition)
        controller_epoch = found[0].controller_epoch if found else 0
        state = LeaderAndIsr(update.leader, update.leader_epoch, tuple(update.isr), controller_epoch)
        notification = json.dumps({"version": 1, "partitions": [
            {"topic": update.topic, "partition": update.partition}]}).encode()  # fmt: skip
        tx = self.coord.transaction()
        tx.set_data(path, state.encode(), version=update.zk_version)
        tx.create(paths.isr_change_notification_prefix(), notification, sequence=True)
        try:
            results = tx.commit()
        except Exception as e:
            log.debug("ISR write for %s-%d failed: %s", update.topic, update.partition, e)
            results = [e]
        if any(isinstance(r, Exception) for r in results):
            found = self.partition_state(update.topic, update.partition)
            if found is None:
                return False, None
            current, version = found
            if current.leader == update.leader and current.leader_epoch == update.leader_epoch:
                return False, version  # only the version moved (e.g. the controller's write)
            return False, None
        stat = results[0]
        return True, stat.version
