"""The runtime glue that drives the controller core over the simulated network.

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
from tests.sim import network as m
from tests.sim.store import SimZk

CONTROLLER_ID = 0  # the simulated controller runs on no broker
CORR_PER_EPOCH = 1_000_000


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
            ready = self.core.step(self._store.execute(ready.store))
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
