"""A simulated ZooKeeper and controller: the glue of controller/controller.py and leadership.py.

`SimZk` holds what the real store holds for replication: topic assignments, each partition's
state znode (LeaderAndIsr with a version), broker registrations (ephemeral: a session that a
crash drops at once and a silent broker loses after `zookeeper.session.timeout.ms`), the
controller epoch (which fences every controller write) and ISR change notifications. A leader's
ISR write is `metadata.update_isr`: conditional on the zkVersion, with its notification.

`SimController` mirrors KafkaController's rules with the real cores: the partition and replica
state machines (state_machines.py) and the elections (elections.py). Elections write the state
znode with leader epoch + 1, conditionally on its version (re-read and retry on a clash); an
offline partition with no electable replica gets leader -1 and keeps its ISR; a dead broker is
removed from the ISR of what it follows (epoch + 1); a broker that comes back (or bounced: new
session) gets the current state of its partitions. Requests go per broker, one in flight,
retried until answered or the broker dies. A failover bumps the controller epoch, reloads
everything from the store and sends every live broker a full LeaderAndIsr.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from localcluster.controller.elections import (
    controlled_shutdown_partition_leader_election,
    offline_partition_leader_election,
    preferred_replica_partition_leader_election,
)
from localcluster.controller.state_machines import (
    IllegalStateTransition,
    PartitionState,
    ReplicaState,
    partition_states,
    replica_states,
)
from tests.sim import network as m

NO_LEADER = -1
CORR_PER_EPOCH = 1_000_000
MAX_WRITE_ATTEMPTS = 5
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ZkPartitionState:
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int


class ControllerMovedError(Exception):
    pass


@dataclass
class SimZk:
    sim: object
    assignments: dict[TopicPartition, tuple[int, ...]] = field(default_factory=dict)
    states: dict[TopicPartition, tuple[ZkPartitionState, int]] = field(default_factory=dict)
    brokers: dict[int, int] = field(default_factory=dict)  # /brokers/ids: broker -> session
    heartbeats: dict[int, int] = field(default_factory=dict)  # session -> last heartbeat
    isr_change_notifications: list[TopicPartition] = field(default_factory=list)
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

    def update_partition_state(self, tp, state: ZkPartitionState, version: int,
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
            state = ZkPartitionState(update.leader, update.leader_epoch, tuple(update.isr),
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
    session: int
    queue: deque = field(default_factory=deque)
    inflight: m.LeaderAndIsr | None = None
    deadline_ms: int = 0


class SimController:
    NAME = "controller"

    def __init__(self, sim):
        self.sim = sim
        self.zk: SimZk = sim.zk
        self.config = sim.config
        self.zk.controller_epoch += 1
        self.epoch = self.zk.controller_epoch
        self.active = True
        self.live: dict[int, int] = {}
        self.leadership: dict[TopicPartition, tuple[ZkPartitionState, int]] = {}
        self.assignments: dict[TopicPartition, tuple[int, ...]] = {}
        self.partition_states = partition_states()
        self.replica_states = replica_states()
        self.queues: dict[int, _BrokerQueue] = {}
        self.shutting_down: set[int] = set()
        self._stop_replica: dict[int, set] = {}
        self._corr = self.epoch * CORR_PER_EPOCH  # answers find their controller by corr
        self.notices_moved_at_ms = 0  # a zombie learns of its successor only at this time
        self._batch: dict[int, dict[TopicPartition, m.PartitionStateMsg]] = {}
        self.sim.trace(f"controller epoch {self.epoch} starts")
        self._failover()

    def now_ms(self) -> int:
        return self.sim.clock.now_ms()

    # -- failover (KafkaController._on_failover) ----------------------------------------------

    def _failover(self) -> None:
        self.live = dict(self.zk.brokers)
        for broker, session in self.live.items():
            self.queues[broker] = _BrokerQueue(session)
        for tp, replicas in sorted(self.zk.assignments.items()):
            self.assignments[tp] = replicas
            if tp in self.zk.states:
                self.leadership[tp] = self.zk.states[tp]
        for tp, replicas in self.assignments.items():
            for replica in replicas:
                self.replica_states.move((tp, replica), ReplicaState.NEW)
                self.replica_states.move((tp, replica), ReplicaState.ONLINE if replica in self.live
                                         else ReplicaState.OFFLINE)  # fmt: skip
            self.partition_states.move(tp, PartitionState.NEW)
            lead = self.leadership.get(tp)
            if lead is not None:
                led = lead[0].leader in self.live
                self.partition_states.move(
                    tp, PartitionState.ONLINE if led else PartitionState.OFFLINE
                )
        for tp in sorted(self.leadership):
            self._add_leader_and_isr(tp, self.assignments[tp])
        self._trigger_online_partition_state_change()
        # Replicas on brokers that died before this failover leave the ISR now (Kafka's
        # ReplicaStateMachine.startup): no broker change will ever report them dead to us.
        for tp, replicas in sorted(self.assignments.items()):
            for replica in replicas:
                if replica not in self.live:
                    self._remove_replica_from_isr(tp, replica)
        self._send_batch()

    # -- the event loop: each tick plays the watches that fired ---------------------------------

    def tick(self) -> None:
        if not self.active:
            return
        try:
            if self.zk.controller_epoch != self.epoch and self.now_ms() >= self.notices_moved_at_ms:
                raise ControllerMovedError("a newer controller exists")  # the /controller watch
            new_tps = sorted(tp for tp in self.zk.assignments if tp not in self.assignments)
            if new_tps:
                self._on_new_partitions(new_tps)
            if self.zk.brokers != self.live:
                self._on_broker_change()
            if self.zk.isr_change_notifications:
                changed = sorted(set(self.zk.isr_change_notifications))
                self.zk.isr_change_notifications.clear()
                for tp in changed:
                    if tp in self.zk.states:
                        self.leadership[tp] = self.zk.states[tp]
            self._pump_channels()
        except ControllerMovedError as e:
            self.sim.trace(f"controller epoch {self.epoch} resigns: {e}")
            self.active = False

    def _on_new_partitions(self, tps) -> None:
        for tp in tps:
            self.assignments[tp] = self.zk.assignments[tp]
            self._move_partition(tp, PartitionState.NEW)
            for replica in self.assignments[tp]:
                self._move_replica(tp, replica, ReplicaState.NEW)
        self._to_online(tps)
        for tp in tps:
            for replica in self._live_replicas(tp):
                self._move_replica(tp, replica, ReplicaState.ONLINE)
        self._send_batch()

    def _on_broker_change(self) -> None:
        current = dict(self.zk.brokers)
        bounced = {b for b, s in current.items() if b in self.live and s != self.live[b]}
        dead = (set(self.live) - set(current)) | bounced
        new = (set(current) - set(self.live)) | bounced
        self.live = current
        for broker in sorted(dead):
            self.shutting_down.discard(broker)
            self.queues.pop(broker, None)
        for broker in sorted(new):
            self.queues[broker] = _BrokerQueue(current[broker])
        if dead:
            self.sim.trace(f"controller: brokers {sorted(dead)} died")
            self._on_brokers_failed(dead)
        if new:
            self.sim.trace(f"controller: brokers {sorted(new)} registered")
            self._on_brokers_started(new)

    def _on_brokers_failed(self, dead) -> None:
        for tp, (state, _) in sorted(self.leadership.items()):
            if state.leader in dead:
                self._move_partition(tp, PartitionState.OFFLINE)
        self._trigger_online_partition_state_change()
        for broker in sorted(dead):
            for tp in self._partitions_on(broker):
                self._move_replica(tp, broker, ReplicaState.OFFLINE)
                self._remove_replica_from_isr(tp, broker)
        self._send_batch()

    def _on_brokers_started(self, new) -> None:
        for broker in sorted(new):
            for tp in self._partitions_on(broker):
                self._move_replica(tp, broker, ReplicaState.ONLINE)
                if tp in self.leadership:
                    self._add_leader_and_isr(tp, [broker])
        self._trigger_online_partition_state_change()
        self._send_batch()

    def controlled_shutdown(self, broker: int) -> list:
        """topic_operations.controlled_shutdown: move leadership off `broker`, take it out of
        every ISR (StopReplica without delete); answer what it still leads."""
        if not self.active or broker not in self.live:
            return []
        try:
            self.shutting_down.add(broker)
            self.sim.trace(f"controller: b{broker} is shutting down (controlled)")
            for tp in self._partitions_on(broker):
                lead = self.leadership.get(tp)
                if lead is None:
                    continue
                if lead[0].leader == broker:
                    if len(self.assignments[tp]) > 1:
                        self._elect(tp, "controlled shutdown")
                else:
                    self._remove_replica_from_isr(tp, broker)
                    self._stop_replica.setdefault(broker, set()).add(tp)
            self._send_batch()
        except ControllerMovedError:
            self.active = False
            return []
        return sorted(tp for tp, (st, _) in self.leadership.items() if st.leader == broker)

    def preferred_election(self, tp) -> None:
        """Run the preferred replica election for one partition (an admin request)."""
        if not self.active or tp not in self.leadership:
            return
        try:
            self._elect(tp, "preferred")
            self._send_batch()
        except ControllerMovedError:
            self.active = False

    # -- leadership (leadership.py) -----------------------------------------------------------------

    def _trigger_online_partition_state_change(self) -> None:
        candidates = self.partition_states.keys_in(PartitionState.NEW, PartitionState.OFFLINE)
        self._to_online(sorted(candidates))

    def _to_online(self, tps) -> None:
        for tp in tps:
            try:
                self.partition_states.check(tp, PartitionState.ONLINE)
            except IllegalStateTransition:
                continue
            if self.partition_states.state(tp) == PartitionState.NEW or tp not in self.leadership:
                ok = self._initialize_leader_and_isr(tp)
            else:
                ok = self._elect(tp, "offline")
            if ok:
                self.partition_states.move(tp, PartitionState.ONLINE)

    def _initialize_leader_and_isr(self, tp) -> bool:
        live = [r for r in self._live_replicas(tp) if r not in self.shutting_down]
        if not live:
            return False
        if tp in self.zk.states:
            self.leadership[tp] = self.zk.states[tp]
            return self._elect(tp, "offline")
        state = ZkPartitionState(live[0], 0, tuple(live), self.epoch)
        version = self.zk.update_partition_state(tp, state, -1, self.epoch)
        if version is None:
            return False
        self.leadership[tp] = (state, version)
        self._add_leader_and_isr(tp, self.assignments[tp])
        self.sim.trace(
            f"controller: {tp[0]}-{tp[1]} created: leader b{live[0]} epoch 0 isr {list(live)}"
        )
        return True

    def _decide(self, tp, election: str):
        current = self.leadership[tp][0]
        assignment = self.assignments[tp]
        live = set(self.live)
        if election == "offline":
            leader = offline_partition_leader_election(assignment, current.isr, live - self.shutting_down,
                                                       self.config.unclean_leader_election_enable)  # fmt: skip
            if leader is not None and leader not in current.isr:
                return leader, (leader,)
            return leader, tuple(r for r in current.isr if r in live)
        if election == "controlled shutdown":
            leader = controlled_shutdown_partition_leader_election(
                assignment, current.isr, live, self.shutting_down
            )
            return leader, tuple(r for r in current.isr if r not in self.shutting_down)
        if election == "preferred":
            return preferred_replica_partition_leader_election(
                assignment, current.isr, live
            ), current.isr
        raise AssertionError(election)

    def _elect(self, tp, election: str) -> bool:
        for _ in range(MAX_WRITE_ATTEMPTS):
            current = self.leadership[tp][0]
            leader, isr = self._decide(tp, election)
            if leader is None:
                if election == "offline":
                    self._mark_leaderless(tp)
                return False
            if election == "preferred" and leader == current.leader:
                return True
            state = ZkPartitionState(leader, current.leader_epoch + 1, tuple(isr), self.epoch)
            if self._write(tp, state):
                self._add_leader_and_isr(tp, self.assignments[tp])
                unclean = "" if leader in current.isr else " UNCLEAN"
                self.sim.trace(f"controller: {tp[0]}-{tp[1]} leader b{leader} ({election}) epoch "
                               f"{state.leader_epoch} isr {list(isr)}{unclean}")  # fmt: skip
                return True
        return False

    def _mark_leaderless(self, tp) -> None:
        current = self.leadership[tp][0]
        if current.leader != NO_LEADER:
            state = ZkPartitionState(NO_LEADER, current.leader_epoch + 1, current.isr, self.epoch)
            self._write(tp, state)
            self.sim.trace(
                f"controller: {tp[0]}-{tp[1]} offline, no live replica in isr {list(current.isr)}"
            )

    def _remove_replica_from_isr(self, tp, replica: int) -> None:
        for _ in range(MAX_WRITE_ATTEMPTS):
            lead = self.leadership.get(tp)
            if lead is None or replica not in lead[0].isr or lead[0].leader == replica:
                return
            if len(lead[0].isr) == 1:
                return  # the last member stays, to lead cleanly when it returns
            isr = tuple(r for r in lead[0].isr if r != replica)
            state = ZkPartitionState(lead[0].leader, lead[0].leader_epoch + 1, isr, self.epoch)
            if self._write(tp, state):
                self._add_leader_and_isr(tp, [r for r in self.assignments[tp] if r != replica])
                self.sim.trace(f"controller: {tp[0]}-{tp[1]} isr {list(isr)} (b{replica} is gone) "
                               f"epoch {state.leader_epoch}")  # fmt: skip
                return

    def _write(self, tp, state: ZkPartitionState) -> bool:
        lead = self.leadership.get(tp)
        version = self.zk.update_partition_state(tp, state, lead[1] if lead else -1, self.epoch)
        if version is not None:
            self.leadership[tp] = (state, version)
            return True
        if tp in self.zk.states:
            self.leadership[tp] = self.zk.states[tp]
        return False

    # -- helpers --------------------------------------------------------------------------------

    def _live_replicas(self, tp) -> list[int]:
        return [r for r in self.assignments.get(tp, ()) if r in self.live]

    def _partitions_on(self, broker: int):
        return sorted(tp for tp, replicas in self.assignments.items() if broker in replicas)

    def _move_partition(self, tp, target) -> None:
        try:
            self.partition_states.move(tp, target)
        except IllegalStateTransition:
            pass

    def _move_replica(self, tp, replica, target) -> None:
        try:
            self.replica_states.move((tp, replica), target)
        except IllegalStateTransition:
            pass

    # -- the channel (channel.py): per broker, in order, one in flight, retried ----------------

    def _add_leader_and_isr(self, tp, brokers) -> None:
        state, version = self.leadership[tp]
        msg = m.PartitionStateMsg(tp[0], tp[1], state.leader, state.leader_epoch, state.isr,
                                  version, self.assignments[tp])  # fmt: skip
        for broker in brokers:
            if broker in self.live:
                self._batch.setdefault(broker, {})[tp] = msg

    def _send_batch(self) -> None:
        for broker, states in sorted(self._batch.items()):
            queue = self.queues.get(broker)
            if queue is None:
                continue
            self._corr += 1
            queue.queue.append(m.LeaderAndIsr(self._corr, self.epoch,
                                              tuple(states[k] for k in sorted(states))))  # fmt: skip
        for broker, tps in sorted(self._stop_replica.items()):
            queue = self.queues.get(broker)
            if queue is not None:
                self._corr += 1
                queue.queue.append(m.StopReplica(self._corr, self.epoch, tuple(sorted(tps))))
        self._batch.clear()
        self._stop_replica.clear()
        self._pump_channels()

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
            queue = self.queues.get(src)
            if queue is not None and queue.inflight is not None and queue.inflight.corr == msg.corr:
                queue.inflight = None
                self._pump_channels()
            return True
        raise AssertionError(f"controller: unexpected {msg!r}")
