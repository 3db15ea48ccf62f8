"""KafkaZkClient: Kafka's znodes read and written by name, over any CoordinationClient.

The broker (registration, metadata, its ISR writes) and the controller (elections, topic
administration) both go through here, so each znode's layout and each conditional write is
written once. Calls block (a file read, or a round trip to ZooKeeper): runtimes call them from
a worker thread. Controller writes are fenced: they commit in a transaction that also checks
/controller_epoch's version, so a controller that lost its seat cannot overwrite anything.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Sequence

from localcluster.coord import paths
from localcluster.coord.interface import (
    BadPathError,
    BadVersionError,
    CoordinationClient,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistencyError,
)
from localcluster.coord.znode_data import (
    ZnodeDataError,
    decode_broker_registration,
    decode_leader_and_isr,
    decode_topic_assignment,
    decode_topic_config,
    encode_broker_registration,
    encode_leader_and_isr,
    encode_topic_assignment,
    encode_topic_config,
)
from localcluster.metadata_types import (
    BrokerRegistration,
    LeaderAndIsr,
    TopicAssignment,
    TopicPartition,
)

log = logging.getLogger(__name__)

CONFIG_TOPICS = "/config/topics"
CONFIG_CHANGES = "/config/changes"  # Kafka's change notifications: config_change_<seq>
MAX_CONFIG_CHANGES = 100  # older ones are deleted (Kafka expires them after 15 minutes)
CONFIG_BROKERS = "/config/brokers"  # dynamic broker configs: <id> and <default>
CONFIG_USERS = "/config/users"  # SCRAM credentials, as `kafka-configs.sh --entity-type users`
CLUSTER_ID = "/cluster/id"
# A leader's ISR writes per transaction, with one notification for them all: 200 state writes
# and their notification are ~60 KB, far below ZooKeeper's 1 MB request limit (jute.maxbuffer).
ISR_WRITES_PER_TRANSACTION = 200


class ControllerMovedError(Exception):
    """A fenced write: another controller holds a newer epoch."""


def config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS}/{topic}"


def broker_config_path(entity: str) -> str:
    return f"{CONFIG_BROKERS}/{entity}"


def user_config_path(user: str) -> str:
    return f"{CONFIG_USERS}/{user}"


class KafkaZkClient:
    def __init__(self, coord: CoordinationClient):
        self.coord = coord

    def ensure_persistent_paths(self) -> None:
        for path in paths.PERSISTENT_PATHS + (CONFIG_TOPICS, CONFIG_CHANGES):
            self.coord.ensure_path(path)

    # -- brokers ------------------------------------------------------------------------------

    def register_broker(self, registration: BrokerRegistration) -> None:
        """Create the ephemeral /brokers/ids/<id>; NodeExistsError when it is taken."""
        self.coord.create(paths.broker_path(registration.broker_id), encode_broker_registration(registration),
                          ephemeral=True)  # fmt: skip

    def broker(self, broker_id: int) -> BrokerRegistration | None:
        path = paths.broker_path(broker_id)
        try:
            data, _ = self.coord.get(path)
        except NoNodeError:
            return None
        return decode_broker_registration(broker_id, path, data)

    def broker_ids(self, watch=None) -> list[int]:
        try:
            children = self.coord.get_children(paths.BROKER_IDS, watch)
        except NoNodeError:  # a store no broker has registered in yet
            return []
        return sorted(int(c) for c in children if c.isdigit())

    def live_brokers(self) -> dict[int, BrokerRegistration]:
        out = {}
        for broker_id in self.broker_ids():
            registration = self.broker(broker_id)
            if registration is not None:
                out[broker_id] = registration
        return out

    def cluster_id(self) -> str:
        try:
            data, _ = self.coord.get(CLUSTER_ID)
            return json.loads(data)["id"]
        except NoNodeError:
            pass
        except (ValueError, KeyError):
            return "unknown"
        try:
            self.coord.create(CLUSTER_ID, json.dumps({"version": "1", "id": uuid.uuid4().hex[:22]}).encode(),
                              makepath=True)  # fmt: skip
        except NodeExistsError:
            pass
        return json.loads(self.coord.get(CLUSTER_ID)[0])["id"]

    # -- the controller seat ------------------------------------------------------------------

    def controller_id(self) -> int | None:
        try:
            data, _ = self.coord.get(paths.CONTROLLER)
            return int(json.loads(data)["brokerid"])
        except (NoNodeError, ValueError, KeyError, TypeError):
            return None

    def try_become_controller(self, broker_id: int) -> tuple[int, int] | None:
        """Create the ephemeral /controller, then bump /controller_epoch. Returns (epoch,
        its znode version) on a win, None when another broker holds the seat."""
        value = json.dumps({"version": 1, "brokerid": broker_id,
                            "timestamp": str(int(time.time() * 1000))}).encode()  # fmt: skip
        try:
            self.coord.create(paths.CONTROLLER, value, ephemeral=True)
        except NodeExistsError:
            return None
        while True:
            try:
                data, stat = self.coord.get(paths.CONTROLLER_EPOCH)
            except NoNodeError:
                try:
                    self.coord.create(paths.CONTROLLER_EPOCH, b"1")
                    return 1, 0
                except NodeExistsError:
                    continue
            epoch = int(data) + 1
            try:
                new_stat = self.coord.set(
                    paths.CONTROLLER_EPOCH, str(epoch).encode(), version=stat.version
                )
                return epoch, new_stat.version
            except BadVersionError:
                continue

    # -- topics -------------------------------------------------------------------------------

    def topics(self, watch=None) -> list[str]:
        try:
            return sorted(self.coord.get_children(paths.BROKER_TOPICS, watch))
        except NoNodeError:
            return []

    def assignment(self, topic: str, watch=None) -> TopicAssignment | None:
        path = paths.topic_path(topic)
        try:
            data, _ = self.coord.get(path, watch)
        except NoNodeError:
            return None
        return decode_topic_assignment(path, data)

    def assignments_and_configs(
        self, topics: Sequence[str]
    ) -> tuple[dict[str, TopicAssignment], dict[str, dict[str, str]], dict[str, str]]:
        """`assignment` and `topic_config` of many topics in ONE `get_many`: the topics
        that exist, their assignments, their overrides ({} when none) and, apart, the topics
        whose assignment or config znode does not decode, with why (a topic in the
        assignments: its config; not in them: its assignment). As Kafka's getLogConfigs, one
        topic's garbled znode fails that topic alone, not the read of every topic (a
        controller's failover read them all, and resigned)."""
        assignment_paths = [paths.topic_path(topic) for topic in topics]
        config_paths = [config_path(topic) for topic in topics]
        found = self.coord.get_many(assignment_paths + config_paths)
        assignments, configs, unreadable = {}, {}, {}
        for i, topic in enumerate(topics):
            assignment, config = found[i], found[len(topics) + i]
            if assignment is None:
                continue
            try:
                assignments[topic] = decode_topic_assignment(assignment_paths[i], assignment[0])
            except ZnodeDataError as e:
                unreadable[topic] = str(e)
                continue
            try:
                configs[topic] = (
                    {} if config is None else decode_topic_config(config_paths[i], config[0])
                )
            except ZnodeDataError as e:
                unreadable[topic] = str(e)
        return assignments, configs, unreadable

    # -- users (SCRAM credentials) ------------------------------------------------------------

    def user_config(self, user: str) -> dict[str, str]:
        """/config/users/<user>: {"SCRAM-SHA-256": "salt=...,stored_key=...,..."}, or {}."""
        try:
            data, _ = self.coord.get(user_config_path(user))
        except (NoNodeError, BadPathError):
            return {}
        return decode_topic_config(user_config_path(user), data)

    def set_user_config(self, user: str, config: dict[str, str]) -> None:
        path = user_config_path(user)
        self.coord.ensure_path(CONFIG_USERS)
        try:
            self.coord.set(path, encode_topic_config(config))
        except NoNodeError:
            self.coord.create(path, encode_topic_config(config))

    def topic_config(self, topic: str) -> dict[str, str]:
        return self._config_at(config_path(topic))

    def _config_at(self, path: str) -> dict[str, str]:
        """The overrides a /config/... znode holds ({} when it is missing)."""
        try:
            data, _ = self.coord.get(path)
        except NoNodeError:
            return {}
        return decode_topic_config(path, data)

    def change_topic_config(self, topic: str, config: dict[str, str]) -> None:
        """Replace the topic's overrides and announce it, in one transaction, as Kafka's
        AdminZkClient.changeTopicConfig does (a sequential /config/changes/config_change_
        naming the entity; every broker watches that list)."""
        self._change_config(config_path(topic), f"topics/{topic}", config, may_create=False)

    def broker_config(self, entity: str) -> dict[str, str]:
        """/config/brokers/<id> or /config/brokers/<default>: a dynamic broker layer, or {}."""
        return self._config_at(broker_config_path(entity))

    def change_broker_config(self, entity: str, config: dict[str, str]) -> None:
        """Replace a dynamic broker layer and announce it (AdminZkClient.changeBrokerConfig:
        the notification names brokers/<id> or brokers/<default>)."""
        self.coord.ensure_path(CONFIG_BROKERS)
        self._change_config(
            broker_config_path(entity), f"brokers/{entity}", config, may_create=True
        )

    def _change_config(self, path: str, entity_path: str, config: dict[str, str],
                       may_create: bool) -> None:  # fmt: skip
        self.coord.ensure_path(CONFIG_CHANGES)
        notice = json.dumps({"version": 2, "entity_path": entity_path}).encode()
        for attempt in range(2):  # a broker layer may be created by another writer meanwhile
            tx = self.coord.transaction()
            if may_create and self.coord.exists(path) is None:
                tx.create(path, encode_topic_config(config))
            else:
                tx.set_data(path, encode_topic_config(config))
            tx.create(f"{CONFIG_CHANGES}/config_change_", notice, sequence=True)
            failed = [r for r in tx.commit() if isinstance(r, Exception)]
            if not failed:
                break
            if attempt or not isinstance(failed[0], (NodeExistsError, NoNodeError)):
                raise failed[0]
        for old in self.config_changes()[:-MAX_CONFIG_CHANGES]:  # keep the list bounded
            try:
                self.coord.delete(f"{CONFIG_CHANGES}/{old}")
            except NoNodeError:
                pass

    def config_changes(self, watch=None) -> list[str]:
        """The notifications under /config/changes, oldest first."""
        return sorted(self.coord.get_children(CONFIG_CHANGES, watch))

    def config_change_entity(self, name: str) -> str | None:
        """The entity path ("topics/<name>", "brokers/<id>") a notification names; None when
        it is gone."""
        try:
            data, _ = self.coord.get(f"{CONFIG_CHANGES}/{name}")
            return str(json.loads(data)["entity_path"])
        except (NoNodeError, ValueError, KeyError, TypeError):
            return None

    def create_topic(
        self, topic: str, table: dict[int, tuple[int, ...]], config: dict[str, str]
    ) -> None:
        """Write config and assignment in one transaction (the controller does the rest)."""
        tx = self.coord.transaction()
        tx.create(config_path(topic), encode_topic_config(config))
        tx.create(paths.topic_path(topic), encode_topic_assignment(TopicAssignment(table)))
        results = tx.commit()
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise failed[0]

    def partition_state(self, topic: str, partition: int) -> tuple[LeaderAndIsr, int] | None:
        path = paths.partition_state_path(topic, partition)
        try:
            data, stat = self.coord.get(path)
        except NoNodeError:
            return None
        return decode_leader_and_isr(path, data), stat.version

    def partition_states(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, tuple[LeaderAndIsr, int] | None]:
        """partition_state of many partitions, read at once (coord.get_many)."""
        state_paths = [paths.partition_state_path(*tp) for tp in partitions]
        found = self.coord.get_many(state_paths)
        return {
            tp: None if read is None else (decode_leader_and_isr(path, read[0]), read[1].version)
            for tp, path, read in zip(partitions, state_paths, found, strict=True)
        }

    # -- writes fenced by the controller epoch -------------------------------------------------

    def _fenced(self, controller_epoch_version: int):
        tx = self.coord.transaction()
        tx.check(paths.CONTROLLER_EPOCH, controller_epoch_version)
        return tx

    def _commit_fenced(self, tx) -> list:
        """Commit; raise ControllerMovedError when the epoch check failed, else the first
        operation's own error, else return the operations' results (without the check's)."""
        outcome = _fenced_outcome(tx.commit())
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def create_partition_state(self, tp: TopicPartition, state: LeaderAndIsr,
                               controller_epoch_version: int) -> int:  # fmt: skip
        """Create .../partitions/P/state (and its parents); returns its version (0).
        NodeExistsError when it is there already."""
        if self.write_partition_states([(tp, state, None)], controller_epoch_version)[tp] is None:
            raise NodeExistsError(f"{paths.partition_state_path(*tp)} already exists")
        return 0

    def update_partition_state(self, tp: TopicPartition, state: LeaderAndIsr, zk_version: int,
                               controller_epoch_version: int) -> int | None:  # fmt: skip
        """Conditional update by the controller; the new version, or None on a version clash."""
        return self.write_partition_states([(tp, state, zk_version)], controller_epoch_version)[tp]

    def write_partition_states(
        self,
        writes: Sequence[tuple[TopicPartition, LeaderAndIsr, int | None]],
        controller_epoch_version: int,
    ) -> dict[TopicPartition, int | None]:
        """Many controller writes of partition-state znodes in ONE batch commit (Kafka's
        createTopicPartitionStatesRaw / updateLeaderAndIsr pipeline theirs): (tp, state, None)
        creates the znode (its parents first, unfenced, as the single form does), (tp, state,
        zk_version) updates it conditionally. Each write is its own fenced transaction, so
        the semantics are the single forms': each partition's new version, or None where the
        create found the znode or the update's version clashed (or the znode is gone).
        ControllerMovedError when an epoch check failed; any other error is raised."""
        transactions = self._partition_parent_creates(
            [tp for tp, _, zk_version in writes if zk_version is None]
        )
        parents = len(transactions)
        for tp, state, zk_version in writes:
            tx = self._fenced(controller_epoch_version)
            path, value = paths.partition_state_path(*tp), encode_leader_and_isr(state)
            if zk_version is None:
                tx.create(path, value)
            else:
                tx.set_data(path, value, version=zk_version)
            transactions.append(tx)
        answers = self.coord.commit_transactions(transactions)
        for results in answers[:parents]:
            if isinstance(results[0], Exception) and not isinstance(results[0], NodeExistsError):
                raise results[0]
        fenced = [_fenced_outcome(results) for results in answers[parents:]]
        moved = next((o for o in fenced if isinstance(o, ControllerMovedError)), None)
        if moved is not None:
            raise moved
        versions = {}
        for (tp, _, zk_version), outcome in zip(writes, fenced, strict=True):
            clash = NodeExistsError if zk_version is None else (BadVersionError, NoNodeError)
            if isinstance(outcome, clash):
                versions[tp] = None
            elif isinstance(outcome, Exception):
                raise outcome
            else:
                versions[tp] = 0 if zk_version is None else outcome[0].version
        return versions

    def _partition_parent_creates(self, created: list[TopicPartition]) -> list:
        """One single-create transaction per parent a new state znode may lack: .../partitions
        once per topic, then each .../partitions/P (a batch applies them in this order)."""
        topics = [paths.topic_partitions_path(t) for t in dict.fromkeys(t for t, _ in created)]
        return self._one_each("create", topics + [paths.partition_path(*tp) for tp in created])

    def _one_each(self, operation: str, znode_paths: Sequence[str]) -> list:
        """A transaction of the one operation ("create" or "delete") per path, for a batch."""
        transactions = []
        for path in znode_paths:
            tx = self.coord.transaction()
            getattr(tx, operation)(path)
            transactions.append(tx)
        return transactions

    def update_isrs_from_leader(
        self, writes: Sequence[tuple[TopicPartition, LeaderAndIsr, int]]
    ) -> list[int | None]:
        """Leaders' ISR changes (Kafka's updateLeaderAndIsr from the broker), each conditional
        on its zkVersion and written with an /isr_change_notification in the same transaction:
        the new version of each, or None where it clashed, as if written one by one. Up to
        ISR_WRITES_PER_TRANSACTION go in one transaction with ONE notification naming them all
        (as Kafka's brokers propagate ISR changes, many per notification): the controller
        then reads and deletes one znode, not one per partition, and still never sees a write
        without its notification. A transaction that fails (a clash, which is rare: the
        controller changed a state meanwhile) is redone with one transaction per partition;
        all go in one batch commit each time."""
        chunks = [list(range(start, min(start + ISR_WRITES_PER_TRANSACTION, len(writes))))
                  for start in range(0, len(writes), ISR_WRITES_PER_TRANSACTION)]  # fmt: skip
        versions: list[int | None] = [None] * len(writes)
        failed: list[int] = []
        answers = self.coord.commit_transactions([self._isr_transaction(writes, c) for c in chunks])
        for chunk, results in zip(chunks, answers, strict=True):
            if any(isinstance(r, Exception) for r in results):
                failed += chunk
            else:
                for i, result in zip(chunk, results, strict=False):
                    versions[i] = result.version
        if failed:
            answers = self.coord.commit_transactions(
                [self._isr_transaction(writes, [i]) for i in failed]
            )
            for i, results in zip(failed, answers, strict=True):
                if not any(isinstance(r, Exception) for r in results):
                    versions[i] = results[0].version
        return versions

    def _isr_transaction(self, writes, chosen: list[int]):
        """The conditional state writes of `writes[i]` for i in `chosen`, and one notification
        naming their partitions."""
        tx = self.coord.transaction()
        for i in chosen:
            tp, state, zk_version = writes[i]
            tx.set_data(
                paths.partition_state_path(*tp), encode_leader_and_isr(state), version=zk_version
            )
        notification = json.dumps({"version": 1, "partitions": [
            {"topic": writes[i][0][0], "partition": writes[i][0][1]} for i in chosen]})  # fmt: skip
        tx.create(paths.isr_change_notification_prefix(), notification.encode(), sequence=True)
        return tx

    def write_assignment(self, topic: str, assignment: TopicAssignment,
                         controller_epoch_version: int) -> None:  # fmt: skip
        tx = self._fenced(controller_epoch_version)
        tx.set_data(paths.topic_path(topic), encode_topic_assignment(assignment))
        self._commit_fenced(tx)

    def add_partitions(self, topic: str, added: dict[int, tuple[int, ...]]) -> bool:
        """Extend the topic's assignment with `added`, conditional on the version read (as
        Kafka's AdminZkClient.addPartitions); False when another writer changed it first."""
        path = paths.topic_path(topic)
        data, stat = self.coord.get(path)
        current = decode_topic_assignment(path, data)
        if set(added) & set(current.partitions):
            return False
        table = {**current.partitions, **added}
        try:
            self.coord.set(path, encode_topic_assignment(TopicAssignment(table)), stat.version)
        except BadVersionError:
            return False
        return True

    def delete_topic_znodes(self, topic: str) -> None:
        """Delete the topic's znodes (assignment and partition states, config, deletion
        request) in one batch commit, children first, with the layout known, rather than a
        recursive delete that lists and deletes node by node (a round trip each on ZooKeeper).
        A top-level znode the batch could not delete (a child it did not know of appeared)
        is then deleted recursively."""
        partitions_path = paths.topic_partitions_path(topic)
        try:
            partitions = self.coord.get_children(partitions_path)
        except NoNodeError:
            partitions = []
        doomed = []
        for name in partitions:
            partition = paths.join(partitions_path, name)
            doomed += [paths.join(partition, "state"), partition]
        tops = [paths.topic_path(topic), config_path(topic), paths.delete_topic_path(topic)]
        doomed += [partitions_path, *tops]
        answers = self.coord.commit_transactions(self._one_each("delete", doomed))
        outcome = dict(zip(doomed, answers, strict=True))
        for path in tops:
            (result,) = outcome[path]
            if isinstance(result, Exception) and not isinstance(result, NoNodeError):
                try:
                    self.coord.delete(path, recursive=True)
                except NoNodeError:
                    pass

    # -- admin requests and notifications -----------------------------------------------------

    def isr_change_notifications(self, watch=None) -> list[str]:
        return sorted(self.coord.get_children(paths.ISR_CHANGE_NOTIFICATION, watch))

    def consume_isr_change_notifications(self, names: Sequence[str]) -> list[TopicPartition]:
        """Read the named notifications at once, then delete them in one batch commit (one wake-up
        of the watchers of /isr_change_notification, not one per notification). The
        partitions they name; a notification already gone names none."""
        wanted = [f"{paths.ISR_CHANGE_NOTIFICATION}/{name}" for name in names]
        read = {
            path: found[0]
            for path, found in zip(wanted, self.coord.get_many(wanted), strict=True)
            if found is not None
        }
        answers = self.coord.commit_transactions(self._one_each("delete", list(read)))
        changed = []
        for (path, data), (result,) in zip(read.items(), answers, strict=True):
            if isinstance(result, NoNodeError):
                continue  # another controller consumed it meanwhile
            if isinstance(result, Exception):
                raise result
            changed += _notified_partitions(path, data)
        return changed

    def request_topic_deletion(self, topic: str) -> bool:
        """Ask the controller to delete `topic` (/admin/delete_topics/<topic>, as Kafka's
        TopicCommand does); False when a deletion was already pending."""
        try:
            self.coord.create(paths.delete_topic_path(topic), b"", makepath=True)
        except NodeExistsError:
            return False
        return True

    def topics_to_delete(self, watch=None) -> list[str]:
        return sorted(self.coord.get_children(paths.DELETE_TOPICS, watch))

    def _admin_partitions(self, path: str, watch=None) -> list[dict] | None:
        try:
            data, _ = self.coord.get(path, watch)
        except NoNodeError:
            if watch is not None:
                self.coord.exists(path, watch)
            return None
        try:
            return list(json.loads(data)["partitions"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring malformed %s: %r", path, data[:200])
            return []

    def reassignments(self, watch=None) -> dict[TopicPartition, tuple[int, ...]] | None:
        entries = self._admin_partitions(paths.REASSIGN_PARTITIONS, watch)
        if entries is None:
            return None
        return {
            (e["topic"], int(e["partition"])): tuple(int(r) for r in e["replicas"]) for e in entries
        }

    def update_reassignments(self, change, attempts: int = 100) -> dict:
        """Read /admin/reassign_partitions, apply `change` (dict -> dict) and write the result
        conditionally on the version read (deleting the znode when it is empty), again from
        the read while another writer got there first: AlterPartitionReassignments on any
        broker and the controller's removal of finished entries share the znode. The result."""
        path = paths.REASSIGN_PARTITIONS
        for _ in range(attempts):
            try:
                data, stat = self.coord.get(path)
                current, version = _decode_reassignments(data), stat.version
            except NoNodeError:
                current, version = {}, None
            wanted = change(dict(current))
            try:
                if version is None:
                    if wanted:
                        self.coord.create(path, _encode_reassignments(wanted), makepath=True)
                elif wanted:
                    self.coord.set(path, _encode_reassignments(wanted), version)
                else:
                    self.coord.delete(path, version)
                return wanted
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue
        raise BadVersionError(f"{path} kept changing over {attempts} attempts")

    def write_reassignments(self, remaining: dict[TopicPartition, tuple[int, ...]]) -> None:
        if not remaining:
            try:
                self.coord.delete(paths.REASSIGN_PARTITIONS)
            except NoNodeError:
                pass
            return
        value = json.dumps({"version": 1, "partitions": [
            {"topic": t, "partition": p, "replicas": list(r)} for (t, p), r in sorted(remaining.items())
        ]}).encode()  # fmt: skip
        try:
            self.coord.set(paths.REASSIGN_PARTITIONS, value)
        except NoNodeError:
            self.coord.create(paths.REASSIGN_PARTITIONS, value, makepath=True)

    def requested_elections(self, path: str, watch=None) -> list[TopicPartition] | None:
        """The partitions of an election request (/admin/preferred_replica_election or
        /admin/unclean_leader_election); None when there is no request."""
        entries = self._admin_partitions(path, watch)
        if entries is None:
            return None
        return [(e["topic"], int(e["partition"])) for e in entries]

    def delete_election_request(self, path: str) -> None:
        try:
            self.coord.delete(path)
        except NoNodeError:
            pass


def _notified_partitions(path: str, data: bytes) -> list[TopicPartition]:
    try:
        return [(p["topic"], int(p["partition"])) for p in json.loads(data)["partitions"]]
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring malformed ISR change notification %s: %r", path, data[:200])
        return []


def _fenced_outcome(results: list) -> list | Exception:
    """A fenced transaction's results: ControllerMovedError when its epoch check failed, else
    the first operation's own error, else the operations' results (without the check's)."""
    if isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
        return ControllerMovedError(f"/controller_epoch moved on ({results[0]}): another "
                                    "controller was elected")  # fmt: skip
    for r in results[1:]:
        if isinstance(r, Exception) and not isinstance(
            r, RolledBackError | RuntimeInconsistencyError
        ):
            return r
    return results[1:]


def _decode_reassignments(data: bytes) -> dict[TopicPartition, tuple[int, ...]]:
    try:
        entries = json.loads(data)["partitions"]
        return {(e["topic"], int(e["partition"])): tuple(int(r) for r in e["replicas"])
                for e in entries}  # fmt: skip
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring malformed %s: %r", paths.REASSIGN_PARTITIONS, data[:200])
        return {}


def _encode_reassignments(entries: dict[TopicPartition, tuple[int, ...]]) -> bytes:
    return json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": list(r)} for (t, p), r in sorted(entries.items())
    ]}).encode()  # fmt: skip
