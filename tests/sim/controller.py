"""A simulated ZooKeeper, and the runtime glue that drives the controller core over the network.

`SimZk` holds what the real store holds for replication: topic assignments, each partition's
state znode (LeaderAndIsr with a version), broker registrations (ephemeral: a session that a
crash drops at once and a silent broker loses after `zookeeper.session.timeout.ms`), the
controller epoch (which fences every controller write), ISR change notifications and a
preferred election request. It answers KafkaZkClient's calls (coord/kafka_zk.py) for those, so
the controller's store operations are carried out by the runtime's own ZkOperations
(controller/zk_operations.py); a leader's ISR write is IsrUpdate's rules over the conditional
write, as broker/metadata.update_isr.

`SimController` is controller/controller.py for the simulator: it steps the real ControllerCore
(controller/core.py) with what its emulated watches see, does the core's store operations at
once, and carries the requests the core hands back over the network: per broker, in order,
one in flight, retried until answered or the broker dies. Every decision is the core's;
nothing here knows an election or a state transition.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from localcluster.controller import actions as act
from localcluster.controller import events as ev
from localcluster.controller.core import ControllerCore, ControllerSettings
from localcluster.controller.zk_operations import ZkOperations
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

CONTROLLER_ID = 0  # the simulated controller runs on no broker
CORR_PER_EPOCH = 1_000_000


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

    def partition_state(self, topic: str, partition: int) -> tuple[LeaderAndIsr, int] | None:
        return self.states.get((topic, partition))

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

    def _set_state(self, tp, state: LeaderAndIsr, version: int) -> int | None:
        current = self.states.get(tp)
        if current is None or current[1] != version:
            return None
        self.states[tp] = (state, version + 1)
        return version + 1

    def isr_change_notifications(self) -> list[str]:
        return sorted(self.isr_changes)

    def consume_isr_change_notification(self, name: str) -> list[TopicPartition]:
        return [self.isr_changes.pop(name)]

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
        """The conditional write plus its notification; a clash is read back at once."""
        tp = (update.topic, update.partition)
        found = self.states.get(tp)
        version = (
            self._set_state(tp, update.state(found[0].controller_epoch), update.zk_version)
            if found
            else None
        )
        if version is None:
            return update.outcome(self.states.get(tp))
        self._sequence += 1
        self.isr_changes[f"{paths.ISR_CHANGE_PREFIX}{self._sequence:010d}"] = tp
        self.sim.trace(f"zk: {tp[0]}-{tp[1]} isr {list(update.isr)} by leader b{update.leader} "
                       f"(v{version})")  # fmt: skip
        return True, version

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


@dataclass(slots=True)
class _BrokerQueue:
    queue: deque = field(default_factory=deque)
    inflight: m.LeaderAndIsr | m.StopReplica | None = None
    deadline_ms: int = 0


class SimController:
    NAME = "controller"

    def __init__(self, sim):
        self.sim = sim
        self.zk: SimZk = sim.zk
        self.config = sim.config
        self.zk.controller_epoch += 1
        self.epoch = self.zk.controller_epoch  # its znode's version, here the epoch itself
        self.core = ControllerCore(CONTROLLER_ID, self.epoch, self.epoch,
                                   ControllerSettings(self.config.unclean_leader_election_enable))  # fmt: skip
        self.active = True
        self.queues: dict[int, _BrokerQueue] = {}
        self._corr = self.epoch * CORR_PER_EPOCH  # answers find their controller by corr
        self.notices_moved_at_ms = 0  # a zombie learns of its successor only at this time
        self._store = ZkOperations(self.zk)
        self._answers: dict[int, tuple] = {}  # controlled shutdown answers by correlation id
        self._correlation_id = 0
        # The watches: what the store held when this controller last looked.
        self._seen_brokers = dict(self.zk.brokers)
        self._seen_topics = self.zk.topics()
        self.sim.trace(f"controller epoch {self.epoch} starts")
        self._step(ev.Startup())

    def now_ms(self) -> int:
        return self.sim.clock.now_ms()

    # -- the event loop: each tick plays the watches that fired ---------------------------------

    def tick(self) -> None:
        if not self.active:
            return
        if self.zk.controller_epoch != self.epoch and self.now_ms() >= self.notices_moved_at_ms:
            self._step(ev.ControllerMoved("a newer controller exists"))  # the /controller watch
            return
        if self.zk.topics() != self._seen_topics:
            self._seen_topics = self.zk.topics()
            self._step(ev.TopicChange())
        if self.active and self.zk.brokers != self._seen_brokers:
            self._seen_brokers = dict(self.zk.brokers)
            self._step(ev.BrokerChange())
        if self.active and self.zk.isr_changes:
            self._step(ev.IsrChangeNotification())
        self._pump_channels()

    def controlled_shutdown(self, broker: int) -> list:
        """The broker's ControlledShutdown request; answers what it still leads."""
        if not self.active:
            return []
        self._correlation_id += 1
        self._step(ev.ControlledShutdown(broker, self._correlation_id))
        error, led = self._answers.pop(self._correlation_id, (None, ()))
        return list(led) if error == act.NONE else []

    def preferred_election(self, tp) -> None:
        """An admin's preferred replica election for one partition (its znode, then the watch)."""
        if self.active:
            self.zk.preferred_election = (tp,)
            self._step(ev.PreferredReplicaLeaderElection())

    def _step(self, event) -> None:
        """Step the core and do what it says; the store answers at once."""
        ready = self.core.step(event)
        while True:
            self._execute(ready.actions)
            if not self.active or ready.store is None:
                break
            try:
                result = self._store.execute(ready.store)
            except ControllerMovedError as e:
                result = ev.ControllerMoved(str(e))
            ready = self.core.step(result)
        self._pump_channels()

    def _execute(self, actions) -> None:
        for action in actions:
            match action:
                case act.Note(line=line):
                    self.sim.trace(f"controller: {line}")
                case act.SendLeaderAndIsr(broker_id=broker, request=request):
                    self._enqueue(
                        broker, m.LeaderAndIsr, request.controller_epoch, request.partitions
                    )
                case act.SendStopReplica(broker_id=broker, request=request):
                    assert not request.delete_partitions, "the simulator deletes no replica"
                    self._enqueue(
                        broker, m.StopReplica, request.controller_epoch, request.partitions
                    )
                case act.AddBroker(registration=registration):
                    self.queues[registration.broker_id] = _BrokerQueue()
                case act.RemoveBroker(broker_id=broker):
                    self.queues.pop(broker, None)
                case act.ReplyControlledShutdown():
                    self._answers[action.correlation_id] = (
                        action.error_code,
                        action.partitions_led,
                    )
                case act.Resign(reason=reason):
                    self.sim.trace(f"controller epoch {self.epoch} resigns: {reason}")
                    self.active = False
                case act.SendUpdateMetadata() | act.WatchTopic() | act.UnwatchTopic():
                    pass  # simulated brokers keep no metadata cache; tick() plays the watches
                case _:
                    raise AssertionError(f"controller: no action {action!r}")

    # -- the channel (channel.py): per broker, in order, one in flight, retried ----------------

    def _enqueue(self, broker: int, message_type, *fields) -> None:
        queue = self.queues.get(broker)
        if queue is not None:
            self._corr += 1
            queue.queue.append(message_type(self._corr, *fields))

    def _pump_channels(self) -> None:
        now = self.now_ms()
        for broker, queue in sorted(self.queues.items()):
            if queue.inflight is not None and queue.deadline_ms <= now:
                self.sim.network.send(self.NAME, broker, queue.inflight)  # retry
                queue.deadline_ms = now + self.config.request_timeout_ms
            if queue.inflight is None and queue.queue:
                queue.inflight = queue.queue.popleft()
                queue.deadline_ms = now + self.config.request_timeout_ms
                self.sim.network.send(self.NAME, broker, queue.inflight)

    def owns(self, corr: int) -> bool:
        return corr // CORR_PER_EPOCH == self.epoch

    def receive(self, src, msg) -> bool:
        if not self.active:
            return False
        if isinstance(msg, m.LeaderAndIsrResponse):
            # StopReplica answers too; the core hears of them only for deletions, which the
            # simulator does not make.
            queue = self.queues.get(src)
            if queue is not None and queue.inflight is not None and queue.inflight.corr == msg.corr:
                queue.inflight = None
                self._pump_channels()
            return True
        raise AssertionError(f"controller: unexpected {msg!r}")
