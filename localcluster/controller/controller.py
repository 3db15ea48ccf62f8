"""KafkaController: the runtime around the controller core. One broker wins /controller and
runs the cluster's control plane.

Rules:
- Watches and timers only enqueue events; one task takes them in order and steps the core
  (core.py) with each. The task does what each Ready says: sends requests through the
  channel, opens and closes channels, watches topics, and does the store operation the core
  waits for in a worker thread (zk_operations.py; store calls block), feeding the result back.
- Winning the seat bumps /controller_epoch and makes a new core for the term; the core fences
  every write with that epoch's version and stamps it on every request, and a fenced write
  (ZkOperations answers it ControllerMoved) tells the core, which resigns.
- Nothing here decides anything about partitions, replicas or brokers: that is the core's.
- The task never dies of a store error: a seat check that fails (the store unreadable for a
  moment: a ZooKeeper connection loss, a session being renewed) is logged and made again
  SEAT_RETRY_S later, as the watch that asked for it will not fire again; a term whose
  set-up fails after the seat was won resigns and frees the seat. Before, either killed the
  event task: the broker could hold /controller while handling no event at all (no
  election, and no LeaderAndIsr for a broker that registered) until its session ended.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from localcluster.broker.state_change_log import FILE_NAME as STATE_CHANGE_LOG
from localcluster.broker.state_change_log import SUMMARIZED_OVER, write_events
from localcluster.controller import actions as act
from localcluster.controller import events as ev
from localcluster.controller.channel import ControllerChannelManager
from localcluster.controller.core import ControllerCore, ControllerSettings
from localcluster.controller.zk_operations import ZkOperations
from localcluster.coord import ChildrenWatch, DataWatch, paths
from localcluster.coord.kafka_zk import KafkaZkClient
from localcluster.protocol import controller_requests as cr
from localcluster.protocol.api import ApiKey
from localcluster.tasks import cancel_and_wait

log = logging.getLogger(__name__)

EVENT_QUEUE_BOUND = 10_000
SEAT_RETRY_S = 1.0


class _SeatChange:
    """The /controller watch fired: elect ourselves if the seat is free, resign if it is not ours."""


def _routine(note: act.Note) -> bool:
    """A clean election or an ISR shrink: logged in a summary when one step makes many."""
    if note.event is None:
        return False
    kind, fields = note.event
    return kind == "isr_shrunk" or (kind == "elected" and not fields.get("unclean"))


class KafkaController:
    def __init__(
        self,
        broker_id: int,
        zk: KafkaZkClient,
        config,
        on_event: Callable[[str], None] | None = None,
    ):
        self.broker_id = broker_id
        self.zk = zk
        self.config = config
        self.on_event = on_event or (lambda line: None)
        self.core: ControllerCore | None = None
        self.channel: ControllerChannelManager | None = None
        self.connector = None  # InterBrokerConnector, set by the broker that hosts us
        self._store = ZkOperations(zk)
        self._queue: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._timers: list[asyncio.Task] = []
        self._watches: list = []
        self._seat_watch = None
        self._topic_watches: dict[str, DataWatch] = {}
        self._answers: dict[int, asyncio.Future] = {}  # controlled shutdowns awaiting the core
        self._next_correlation_id = 0

    @property
    def is_active(self) -> bool:
        return self.core is not None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue(EVENT_QUEUE_BOUND)
        self._task = self._loop.create_task(self._run())
        self._seat_watch = DataWatch(
            self.zk.coord, paths.CONTROLLER, lambda data, stat: self.enqueue(_SeatChange())
        )

    async def stop(self) -> None:
        if self._seat_watch is not None:
            self._seat_watch.stop()
        await cancel_and_wait(self._task)
        await self._resign()

    def enqueue(self, event) -> None:
        """Thread-safe: watches call this from the store's callback thread."""
        if self._loop is None or self._loop.is_closed():
            return

        def put():
            try:
                self._queue.put_nowait(event)
            except asyncio.QueueFull:
                log.error("controller event queue full (%d); dropped %s", EVENT_QUEUE_BOUND,
                          type(event).__name__)  # fmt: skip

        self._loop.call_soon_threadsafe(put)

    def enable_topic_unclean_leader_election(self, topic: str) -> None:
        """The broker saw `topic`'s unclean.leader.election.enable become true (Kafka's
        enableTopicUncleanLeaderElection): only an active controller acts on it."""
        if self.is_active:
            self.enqueue(ev.TopicUncleanLeaderElectionEnable(topic))

    def update_broker_config(self, config) -> None:
        """This broker's dynamic configs changed (broker/config_changes.py): a later term reads
        the new `config`; the active core takes unclean.leader.election.enable at once and, when
        it turned on, elects for every topic's offline partitions (Kafka's
        enableDefaultUncleanLeaderElection)."""
        enabled = config.unclean_leader_election_enable
        was, self.config = self.config.unclean_leader_election_enable, config
        if self.core is None:
            return
        # a flag the core reads at each election (one event loop: never mid-step); the
        # elections it now allows come as events, through the queue
        self.core.partitions.unclean_default = enabled
        if enabled and not was and self.is_active:
            for topic in sorted(self.core.ctx.topics()):
                self.enqueue(ev.TopicUncleanLeaderElectionEnable(topic))

    def request_controlled_shutdown(self, broker_id: int, answer: asyncio.Future) -> None:
        """`answer` gets (error code, partitions still led), or None when no core ran it."""
        self._next_correlation_id += 1
        self._answers[self._next_correlation_id] = answer
        self.enqueue(ev.ControlledShutdown(broker_id, self._next_correlation_id))

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            if isinstance(event, _SeatChange):
                try:
                    await self._maybe_elect()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("controller %d: checking /controller failed; checking again in "
                                  "%.1f s", self.broker_id, SEAT_RETRY_S)  # fmt: skip
                    self._loop.call_later(SEAT_RETRY_S, self.enqueue, _SeatChange())
                continue
            if self.core is None:
                if isinstance(event, ev.ControlledShutdown):
                    self._answer(event.correlation_id, None)
                continue
            try:
                await self._drive(event)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("controller %d: handling %s failed", self.broker_id,
                              type(event).__name__)  # fmt: skip
                if isinstance(event, ev.ControlledShutdown):
                    self._answer(event.correlation_id, None)  # the broker asks again

    def event(self, line: str, level: int = logging.INFO) -> None:
        log.log(level, "controller %d: %s", self.broker_id, line)
        self.on_event(line)

    # -- the step loop ------------------------------------------------------------------------

    async def _drive(self, event) -> None:
        """Step the core with `event` and carry out what it says until it waits for nothing.
        A store operation that fails drops the event (the core aborts it) and raises."""
        core = self.core
        ready = core.step(event)
        while True:
            await self._execute(ready.actions)
            if ready.store is None or self.core is not core:
                return
            try:
                result = await asyncio.to_thread(self._store.execute, ready.store)
            except Exception as e:
                await self._execute(core.abort(f"{type(ready.store).__name__} failed: {e}").actions)
                raise
            ready = core.step(result)

    async def _execute(self, actions: list[act.Action]) -> None:
        self._log_notes([action for action in actions if isinstance(action, act.Note)])
        for action in actions:
            match action:
                case act.Note():
                    pass  # logged above, before the requests they explain go out
                case act.SendLeaderAndIsr(broker_id=broker, request=request):
                    self.channel.send(
                        broker, ApiKey.LEADER_AND_ISR, cr.write_leader_and_isr(request)
                    )
                case act.SendStopReplica(broker_id=broker, request=request):
                    self.channel.send(broker, ApiKey.STOP_REPLICA, cr.write_stop_replica(request),
                                      lambda response, b=broker: self.enqueue(
                                          ev.StopReplicaResponseReceived(b, response.partitions)))  # fmt: skip
                case act.SendUpdateMetadata():
                    self._send_update_metadata(action)
                case act.AddBroker(registration=registration):
                    self.channel.add_broker(registration.broker_id, registration)
                case act.RemoveBroker(broker_id=broker):
                    await self.channel.remove_broker(broker)
                case act.WatchTopic(topic=topic):
                    self._watch_topic(topic)
                case act.UnwatchTopic(topic=topic):
                    watch = self._topic_watches.pop(topic, None)
                    if watch is not None:
                        watch.stop()
                case act.ReplyControlledShutdown():
                    self._answer(
                        action.correlation_id, (action.error_code, list(action.partitions_led))
                    )
                case act.Resign(reason=reason):
                    log.warning("controller %d: %s; resigning", self.broker_id, reason)
                    await self._resign()
                case _:
                    raise AssertionError(f"controller: no action {action!r}")

    def _log_notes(self, notes: list[act.Note]) -> None:
        """One step's notes: each with an event goes to the state-change log. The broker's
        log gets each line, unless more than SUMMARIZED_OVER are routine (a clean election, an
        ISR shrink: a failover of 10,000 partitions makes thousands): those get one line per
        kind, with the first as an example, and each one at DEBUG."""
        write_events([(note.event[0], note.event[1], f"controller {self.broker_id}: {note.line}")
                      for note in notes if note.event is not None])  # fmt: skip
        routine = [note for note in notes if _routine(note)]
        summarized = len(routine) > SUMMARIZED_OVER
        kinds: dict[str, list[act.Note]] = {}
        for note in notes:
            if summarized and _routine(note):
                kinds.setdefault(note.event[0], []).append(note)
                log.debug("controller %d: %s", self.broker_id, note.line)
            else:
                self.event(note.line, logging.WARNING if note.warning else logging.INFO)
        for kind, group in kinds.items():
            self.event(f"{len(group):,} partition(s) {kind.replace('_', ' ')}, e.g. "
                       f"{group[0].line}; each one is in {STATE_CHANGE_LOG}")  # fmt: skip

    def _send_update_metadata(self, action: act.SendUpdateMetadata) -> None:
        brokers = tuple(cr.MetadataBroker(r.broker_id, r.endpoints, r.rack, r.unix_socket)
                        for r in action.live_brokers)  # fmt: skip
        body = cr.write_update_metadata(cr.UpdateMetadataRequest(action.controller_id,
                                        action.controller_epoch, action.partitions,
                                        action.offline_replicas, brokers, action.type))  # fmt: skip
        for broker in action.broker_ids:
            # One dropped or refused makes the broker's next one FULL: an INCREMENTAL one
            # names only what changed since the last, which it then lacks.
            self.channel.send(broker, ApiKey.UPDATE_METADATA, body,
                              lambda error, b=broker: self._metadata_refused(b, error),
                              parse=cr.read_error_code,
                              on_dropped=lambda b=broker: self._metadata_missed(b))  # fmt: skip

    def _metadata_refused(self, broker: int, error_code: int) -> None:
        if error_code:
            self._metadata_missed(broker)

    def _metadata_missed(self, broker: int) -> None:
        if self.core is not None:
            self.core.metadata_missed(broker)

    def _answer(self, correlation_id: int, value) -> None:
        answer = self._answers.pop(correlation_id, None)
        if answer is not None and not answer.done():
            answer.set_result(value)

    # -- the seat -----------------------------------------------------------------------------

    async def _maybe_elect(self) -> None:
        holder = await asyncio.to_thread(self.zk.controller_id)
        if self.is_active and holder != self.broker_id:
            log.warning(
                "controller %d: /controller now names %s; resigning", self.broker_id, holder
            )
            await self._resign()
        if self.is_active or holder is not None:
            return
        won = await asyncio.to_thread(self.zk.try_become_controller, self.broker_id)
        if won is None:
            return
        epoch, version = won
        settings = ControllerSettings(self.config.unclean_leader_election_enable)
        self.core = ControllerCore(self.broker_id, epoch, version, settings)
        self.channel = ControllerChannelManager(self.broker_id, self.connector)
        self.event(f"broker {self.broker_id} is the controller (epoch {epoch})")
        try:
            self._register_watches()
            await self._drive(ev.Startup())
        except Exception:
            log.exception("controller %d: failover failed; resigning", self.broker_id)
            await self._resign(delete_seat=True)
            return
        interval_s = self.config.leader_imbalance_check_interval_seconds
        if self.is_active and self.config.auto_leader_rebalance_enable and interval_s > 0:
            self._timers.append(asyncio.get_running_loop().create_task(
                self._every(interval_s, ev.AutoPreferredReplicaLeaderElection())))  # fmt: skip

    async def _resign(self, delete_seat: bool = False) -> None:
        for watch in self._watches + list(self._topic_watches.values()):
            watch.stop()
        self._watches.clear()
        self._topic_watches.clear()
        await cancel_and_wait(*self._timers)
        self._timers.clear()
        if self.channel is not None:
            await self.channel.close()
        self.channel = None
        if self.core is not None and delete_seat:
            await asyncio.to_thread(self._delete_own_seat)
        self.core = None
        for correlation_id in list(self._answers):
            self._answer(correlation_id, None)

    def _delete_own_seat(self) -> None:
        try:
            _, stat = self.zk.coord.get(paths.CONTROLLER)
            if stat.ephemeralOwner == self.zk.coord.session_id:
                self.zk.coord.delete(paths.CONTROLLER, version=stat.version)
        except Exception as e:
            log.info("controller %d: could not give up /controller: %s", self.broker_id, e)

    async def _every(self, interval_s: float, event) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.enqueue(event)

    # -- watches ------------------------------------------------------------------------------

    def _register_watches(self) -> None:
        """Before the core loads anything (Kafka registers its handlers first): a change
        while it reads is an event after Startup, never lost. A recipe fires once at once."""
        coord = self.zk.coord
        self._watches = [
            ChildrenWatch(coord, paths.BROKER_IDS, lambda children: self.enqueue(ev.BrokerChange())),
            ChildrenWatch(coord, paths.BROKER_TOPICS, lambda children: self.enqueue(ev.TopicChange())),
            ChildrenWatch(coord, paths.DELETE_TOPICS, lambda children: self.enqueue(ev.TopicDeletion())),
            ChildrenWatch(coord, paths.ISR_CHANGE_NOTIFICATION, lambda children: self.enqueue(ev.IsrChangeNotification())),
            DataWatch(coord, paths.REASSIGN_PARTITIONS, lambda data, stat: self.enqueue(ev.PartitionReassignment())),
            DataWatch(coord, paths.PREFERRED_REPLICA_ELECTION, lambda data, stat: self.enqueue(ev.PreferredReplicaLeaderElection())),
            DataWatch(coord, paths.UNCLEAN_LEADER_ELECTION, lambda data, stat: self.enqueue(ev.UncleanLeaderElection())),
        ]  # fmt: skip

    def _watch_topic(self, topic: str) -> None:
        if topic not in self._topic_watches:
            # A callback of (data, stat) only: a third parameter (even one with a default, as
            # `t=topic` was) makes DataWatch pass the event there, as kazoo's does.
            self._topic_watches[topic] = DataWatch(
                self.zk.coord, paths.topic_path(topic),
                functools.partial(self._on_topic_data, topic))  # fmt: skip

    def _on_topic_data(self, topic: str, data, stat) -> None:
        self.enqueue(ev.PartitionModifications(topic))
