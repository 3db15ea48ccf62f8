"""A simulated ZooKeeper: the fake store of tests/sim.

`SimZk` holds what the real store holds for replication: topic assignments, each partition's
state znode (LeaderAndIsr with a version), broker registrations (ephemeral: a session that a
crash drops at once and a silent broker loses after `zookeeper.session.timeout.ms`), the
controller epoch (which fences every controller write), ISR change notifications and a
preferred election request. It answers KafkaZkClient's calls (coord/kafka_zk.py) for those, so
the controller's store operations are carried out by the runtime's own ZkOperations
(controller/zk_operations.py); a leader's ISR write is broker/replica_host.write_isr_update
over its conditional write, as broker/metadata.update_isr makes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from localcluster.broker.replica_host import write_isr_update
from localcluster.coord import NodeExistsError, paths
from localcluster.coord.kafka_zk import ControllerMovedError
from localcluster.metadata_types import (
    BrokerRegistration,
    EndPoint,
    LeaderAndIsr,
    TopicAssignment,
    TopicPartition,
)
from tests.sim import network as m


@dataclass
class SimZk:
    sim: object
    assignments: dict[TopicPartition, tuple[int, ...]] = field(default_factory=dict)
    states: dict[TopicPartition, tuple[LeaderAndIsr, int]] = field(default_factory=dict)
    brokers: dict[int, int] = field(default_factory=dict)  # /brokers/ids: broker -> session
    heartbeats: dict[int, int] = field(default_factory=dict)  # session -> last heartbeat
    isr_changes: dict[str, TopicPartition] = field(default_factory=dict)
    preferred_election: tuple[TopicPartition, ...] | None = None  # the admin request
    controller_epoch: int = 0
    _session: int = 0
    _sequence: int = 0

    def now_ms(self) -> int:
        return self.sim.clock.now_ms()

    # -- sessions and registrations -------------------------------------------------------------

    def register(self, broker_id: int) -> int:
        old = self.brokers.get(broker_id)
        if old is not None:
            self.heartbeats.pop(old, None)
        self._session += 1
        self.brokers[broker_id] = self._session
        self.heartbeats[self._session] = self.now_ms()
        return self._session

    def drop_session(self, broker_id: int) -> None:
        session = self.brokers.pop(broker_id, None)
        if session is not None:
            self.heartbeats.pop(session, None)

    def expire_sessions(self) -> None:
        timeout = self.sim.config.zookeeper_session_timeout_ms
        for broker_id, session in list(self.brokers.items()):
            if self.now_ms() - self.heartbeats.get(session, -(10**9)) > timeout:
                self.sim.trace(f"zk: session of b{broker_id} expired")
                self.drop_session(broker_id)

    def live_brokers(self) -> dict[int, BrokerRegistration]:
        # A new session is a new registration, as a restarted broker's is (a new pid).
        return {b: BrokerRegistration(b, (EndPoint("PLAINTEXT", "sim", 0),), "", pid=session)
                for b, session in sorted(self.brokers.items())}  # fmt: skip

    # -- topics and partition state (KafkaZkClient's calls) ------------------------------------

    def create_topic(self, topic: str, assignment: dict[int, list[int]]) -> None:
        for p, replicas in assignment.items():
            self.assignments[(topic, p)] = tuple(replicas)

    def topics(self) -> list[str]:
        return sorted({topic for topic, _ in self.assignments})

    def assignment(self, topic: str) -> TopicAssignment | None:
        found = {p: r for (t, p), r in self.assignments.items() if t == topic}
        return TopicAssignment(found) if found else None

    def topic_config(self, topic: str) -> dict[str, str]:
        return {}

    def assignments_and_configs(self, topics) -> tuple[dict, dict, dict]:
        found = {topic: self.assignment(topic) for topic in topics}
        assignments = {topic: a for topic, a in found.items() if a is not None}
        return assignments, {topic: self.topic_config(topic) for topic in assignments}, {}

    def partition_state(self, topic: str, partition: int) -> tuple[LeaderAndIsr, int] | None:
        return self.states.get((topic, partition))

    def partition_states(self, partitions) -> dict:
        return {tp: self.states.get(tp) for tp in partitions}

    def _fence(self, controller_epoch: int) -> None:
        if controller_epoch != self.controller_epoch:
            raise ControllerMovedError(
                f"controller epoch {controller_epoch} is not {self.controller_epoch}"
            )

    def create_partition_state(self, tp, state: LeaderAndIsr, controller_epoch: int) -> int:
        self._fence(controller_epoch)
        if tp in self.states:
            raise NodeExistsError(str(tp))
        self.states[tp] = (state, 0)
        return 0

    def update_partition_state(self, tp, state: LeaderAndIsr, version: int,
                               controller_epoch: int) -> int | None:  # fmt: skip
        """The controller's conditional write, fenced by the controller epoch."""
        self._fence(controller_epoch)
        return self._set_state(tp, state, version)

    def write_partition_states(self, writes, controller_epoch: int) -> dict:
        """KafkaZkClient's batch of the two writes above: None where a write clashed."""
        versions = {}
        for tp, state, version in writes:
            if version is not None:
                versions[tp] = self.update_partition_state(tp, state, version, controller_epoch)
                continue
            try:
                versions[tp] = self.create_partition_state(tp, state, controller_epoch)
            except NodeExistsError:
                versions[tp] = None
        return versions

    def _set_state(self, tp, state: LeaderAndIsr, version: int) -> int | None:
        current = self.states.get(tp)
        if current is None or current[1] != version:
            return None
        self.states[tp] = (state, version + 1)
        return version + 1

    def isr_change_notifications(self) -> list[str]:
        return sorted(self.isr_changes)

    def consume_isr_change_notifications(self, names) -> list[TopicPartition]:
        return [self.isr_changes.pop(name) for name in names if name in self.isr_changes]

    def topics_to_delete(self) -> list[str]:
        return []

    def reassignments(self) -> None:
        return None

    def requested_elections(self, path: str) -> list[TopicPartition] | None:
        found = self.preferred_election if path == paths.PREFERRED_REPLICA_ELECTION else None
        return None if found is None else list(found)

    def delete_election_request(self, path: str) -> None:
        if path == paths.PREFERRED_REPLICA_ELECTION:
            self.preferred_election = None

    # -- a leader's ISR write (broker/metadata.update_isr) --------------------------------------

    def update_isr(self, update) -> tuple[bool, int | None]:
        tp = (update.topic, update.partition)
        return write_isr_update(update, lambda: self.states.get(tp),
                                lambda state: self._write_isr(tp, state, update))  # fmt: skip

    def _write_isr(self, tp, state: LeaderAndIsr, update) -> int | None:
        """The conditional write and its notification, in one transaction."""
        version = self._set_state(tp, state, update.zk_version)
        if version is not None:
            self._sequence += 1
            self.isr_changes[f"{paths.ISR_CHANGE_PREFIX}{self._sequence:010d}"] = tp
            self.sim.trace(f"zk: {tp[0]}-{tp[1]} isr {list(update.isr)} by leader "
                           f"b{update.leader} (v{version})")  # fmt: skip
        return version

    # -- the network node -----------------------------------------------------------------------

    def receive(self, src, msg) -> bool:
        if isinstance(msg, m.Heartbeat):
            alive = self.brokers.get(src) == msg.session
            if alive:
                self.heartbeats[msg.session] = self.now_ms()
            self.sim.network.send("zk", src, m.HeartbeatResponse(msg.session, not alive))
        elif isinstance(msg, (m.IsrWrite, m.IsrReadBack)):
            ok, version = (self.update_isr(msg.update) if isinstance(msg, m.IsrWrite)
                           else msg.update.outcome(self.states.get((msg.update.topic, msg.update.partition))))  # fmt: skip
            self.sim.network.send("zk", src, m.IsrWriteResponse(msg.corr, ok, version))
        else:
            raise AssertionError(f"zk: unexpected {msg!r}")
        return True
