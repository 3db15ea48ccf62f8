"""A simulated ZooKeeper, and the runtime glue that drives the controller core over the network.

`SimZk` holds what the real store holds for replication: topic assignments, each partition's
state znode (LeaderAndIsr with a version), broker registrations (ephemeral: a session that a
crash drops at once and a silent broker loses after `zookeeper.session.timeout.ms`), the
controller epoch (which fences every controller write), ISR change notifications and a
preferred election request. A leader's ISR write is `metadata.update_isr`: conditional on the
zkVersion, with its notification. `execute` does the controller core's store operations as
controller/zk_operations.py does them against the real store.

`SimController` is controller/controller.py for the simulator: it steps the real ControllerCore
(controller/core.py) with what its emulated watches see, answers the core's store operations
from SimZk at once, and carries the requests the core hands back over the network: per broker,
in order, one in flight, retried until answered or the broker dies. Every decision is the
core's; nothing here knows an election or a state transition.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from localcluster.controller import actions as act
from localcluster.controller import events as ev
from localcluster.controller.context import Leadership
from localcluster.controller.core import ControllerCore, ControllerSettings
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


class ControllerMovedError(Exception):
    pass


@dataclass
class SimZk:
    sim: object
    assignments: dict[TopicPartition, tuple[int, ...]] = field(default_factory=dict)
    states: dict[TopicPartition, tuple[LeaderAndIsr, int]] = field(default_factory=dict)
    brokers: dict[int, int] = field(default_factory=dict)  # /brokers/ids: broker -> session
    heartbeats: dict[int, int] = field(default_factory=dict)  # session -> last heartbeat
    isr_change_notifications: list[TopicPartition] = field(default_factory=list)
    preferred_election: tuple[TopicPartition, ...] | None = None  # the admin request
    controller_epoch: int = 0
    _session: int = 0

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

    # -- partition state ---------------------------------------------------------------------

    def create_topic(self, topic: str, assignment: dict[int, list[int]]) -> None:
        for p, replicas in assignment.items():
            self.assignments[(topic, p)] = tuple(replicas)

    def update_partition_state(self, tp, state: LeaderAndIsr, version: int,
                               controller_epoch: int) -> int | None:  # fmt: skip
        """The controller's conditional write, fenced by the controller epoch."""
        if controller_epoch != self.controller_epoch:
            raise ControllerMovedError(
                f"controller epoch {controller_epoch} is not {self.controller_epoch}"
            )
        current = self.states.get(tp)
        if current is None:
            if version != -1:
                return None
            self.states[tp] = (state, 0)
            return 0
        if current[1] != version:
            return None
        self.states[tp] = (state, version + 1)
        return version + 1

    def update_isr(self, update) -> tuple[bool, int | None]:
        """metadata.update_isr: a leader's conditional write plus its notification."""
        tp = (update.topic, update.partition)
        found = self.states.get(tp)
        if found is None:
            return False, None
        current, version = found
        if version == update.zk_version:
            state = LeaderAndIsr(update.leader, update.leader_epoch, tuple(update.isr),
                                 current.controller_epoch)  # fmt: skip
            self.states[tp] = (state, version + 1)
            self.isr_change_notifications.append(tp)
            self.sim.trace(f"zk: {tp[0]}-{tp[1]} isr {list(update.isr)} by leader b{update.leader} "
                           f"(v{version + 1})")  # fmt: skip
            return True, version + 1
        if current.leader == update.leader and current.leader_epoch == update.leader_epoch:
            return False, version
        return False, None

    def read_back(self, update) -> tuple[bool, int | None]:
        """metadata.update_isr after its write raised: did the write land?"""
        found = self.states.get((update.topic, update.partition))
        if found is None:
            return False, None
        current, version = found
        if (current.leader, current.leader_epoch, current.isr) == (
                update.leader, update.leader_epoch, tuple(update.isr)):  # fmt: skip
            return True, version  # it landed: the answer was lost on the way back
        if current.leader == update.leader and current.leader_epoch == update.leader_epoch:
            return False, version
        return False, None

    # -- the controller core's store operations ------------------------------------------------

    def topics(self) -> list[str]:
        return sorted({topic for topic, _ in self.assignments})

    def execute(self, operation) -> ev.StoreResult | ev.ControllerMoved:
        match operation:
            case act.ReadBrokers():
                return ev.BrokersRead({b: self.registration(b) for b in sorted(self.brokers)})
            case act.ReadTopicNames():
                return ev.TopicNamesRead(tuple(self.topics()))
            case act.ReadTopics(topics=topics):
                found = {t: TopicAssignment({p: r for (t2, p), r in self.assignments.items() if t2 == t})
                         for t in topics if t in self.topics()}  # fmt: skip
                return ev.TopicsRead(found, {t: {} for t in found})
            case act.ReadPartitionStates(partitions=partitions):
                return ev.PartitionStatesRead({tp: self._leadership(tp) for tp in partitions})
            case act.WritePartitionStates():
                return self._write_states(operation)
            case act.ConsumeIsrChangeNotifications():
                changed = tuple(sorted(set(self.isr_change_notifications)))
                self.isr_change_notifications.clear()
                return ev.IsrChangesRead(changed)
            case act.ReadTopicDeletions():
                return ev.TopicDeletionsRead(())
            case act.ReadReassignments():
                return ev.ReassignmentsRead(None)
            case act.ReadElectionRequest(kind=kind):
                request = self.preferred_election if kind == act.ElectionRequest.PREFERRED else None
                return ev.ElectionRequestRead(request)
            case act.DeleteElectionRequest(kind=kind):
                if kind == act.ElectionRequest.PREFERRED:
                    self.preferred_election = None
                return ev.StoreWritten()
        raise AssertionError(f"zk: the simulator neither deletes nor reassigns: {operation!r}")

    def registration(self, broker_id: int) -> BrokerRegistration:
        # A new session is a new registration, as a restarted broker's is (a new pid).
        return BrokerRegistration(broker_id, (EndPoint("PLAINTEXT", "sim", 0),), "",
                                  pid=self.brokers[broker_id])  # fmt: skip

    def _leadership(self, tp) -> Leadership | None:
        found = self.states.get(tp)
        return None if found is None else Leadership(*found)

    def _write_states(self, operation: act.WritePartitionStates):
        versions, conflicts = {}, []
        for write in operation.writes:
            try:
                version = self.update_partition_state(write.tp, write.state,
                                                      -1 if write.zk_version is None else write.zk_version,
                                                      operation.controller_epoch_zk_version)  # fmt: skip
            except ControllerMovedError as e:
                return ev.ControllerMoved(str(e))
            if version is None:
                conflicts.append(write.tp)
            else:
                versions[write.tp] = version
        return ev.PartitionStatesWritten(versions, tuple(conflicts))

    # -- the network node -----------------------------------------------------------------------

    def receive(self, src, msg) -> bool:
        if isinstance(msg, m.Heartbeat):
            alive = self.brokers.get(src) == msg.session
            if alive:
                self.heartbeats[msg.session] = self.now_ms()
            self.sim.network.send("zk", src, m.HeartbeatResponse(msg.session, not alive))
        elif isinstance(msg, m.IsrWrite):
            ok, version = self.update_isr(msg.update)
            self.sim.network.send("zk", src, m.IsrWriteResponse(msg.corr, ok, version))
        elif isinstance(msg, m.IsrReadBack):
            ok, version = self.read_back(msg.update)
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
        if self.active and self.zk.isr_change_notifications:
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
            ready = self.core.step(self.zk.execute(ready.store))
        self._pump_channels()

    def _execute(self, actions) -> None:
        for action in actions:
            match action:
                case act.Note(line=line):
                    self.sim.trace(f"controller: {line}")
                case act.SendLeaderAndIsr(broker_id=broker, request=request):
                    states = tuple(m.PartitionStateMsg(p.topic, p.partition, p.leader, p.leader_epoch,
                                                       p.isr, p.zk_version, p.replicas)
                                   for p in request.partitions)  # fmt: skip
                    self._enqueue(broker, m.LeaderAndIsr, request.controller_epoch, states)
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
