"""KafkaController: one broker wins /controller and runs the cluster's control plane.

Rules:
- Watches and timers only enqueue events; one task handles them, in order, against the
  ControllerContext. Store calls block, so they run in a worker thread, one at a time.
- Winning the seat bumps /controller_epoch; every write is fenced by its version and every
  request carries the epoch, so a deposed controller changes nothing.
- On failover the new controller reloads everything from the store, sends every live broker a
  full LeaderAndIsr, and resumes pending deletions and reassignments.
Topic administration (deletion, reassignment, preferred election, rebalance, controlled
shutdown) lives in topic_operations.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from localcluster.controller.channel import ControllerChannelManager, RequestBatch
from localcluster.controller.context import ControllerContext, Leadership
from localcluster.controller.leadership import OFFLINE, PartitionLeadership
from localcluster.controller.state_machines import PartitionState, ReplicaState
from localcluster.controller.topic_operations import TopicOperations
from localcluster.coord import ChildrenWatch, DataWatch, paths
from localcluster.coord.kafka_zk import ControllerMovedError, KafkaZkClient
from localcluster.protocol import controller_requests as cr
from localcluster.protocol.api import ApiKey
from localcluster.tasks import cancel_and_wait

log = logging.getLogger(__name__)

EVENT_QUEUE_BOUND = 10_000


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
        self.ctx: ControllerContext | None = None
        self.channel: ControllerChannelManager | None = None
        self.connector = None  # InterBrokerConnector, set by the broker that hosts us
        self._queue: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._timers: list[asyncio.Task] = []
        self._watches: list = []
        self._seat_watch = None
        self._topic_watches: dict[str, DataWatch] = {}

    @property
    def is_active(self) -> bool:
        return self.ctx is not None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue(EVENT_QUEUE_BOUND)
        self._task = self._loop.create_task(self._run())
        self._seat_watch = DataWatch(
            self.zk.coord, paths.CONTROLLER, lambda data, stat: self.enqueue("seat")
        )

    async def stop(self) -> None:
        if self._seat_watch is not None:
            self._seat_watch.stop()
        await cancel_and_wait(self._task)
        await self._resign()

    def enqueue(self, kind: str, *args) -> None:
        """Thread-safe: watches call this from the store's callback thread."""
        if self._loop is None or self._loop.is_closed():
            return

        def put():
            try:
                self._queue.put_nowait((kind, *args))
            except asyncio.QueueFull:
                log.error("controller event queue full (%d); dropped %s", EVENT_QUEUE_BOUND, kind)

        self._loop.call_soon_threadsafe(put)

    async def _run(self) -> None:
        while True:
            kind, *args = await self._queue.get()
            if kind != "seat" and not self.is_active:
                if kind == "controlled_shutdown":
                    args[1].set_result(None)
                continue
            try:
                await self._handle(kind, args)
            except ControllerMovedError as e:
                log.warning("controller %d: %s; resigning", self.broker_id, e)
                await self._resign()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("controller %d: handling %s failed", self.broker_id, kind)

    async def run_blocking(self, fn, *args):
        return await asyncio.to_thread(fn, *args)

    def event(self, line: str) -> None:
        log.info("controller %d: %s", self.broker_id, line)
        self.on_event(line)

    async def _handle(self, kind: str, args) -> None:
        if kind == "seat":
            await self._maybe_elect()
        elif kind == "brokers":
            await self._on_broker_change()
        elif kind == "topics":
            await self._on_topic_change()
        elif kind == "partitions":
            await self._on_partition_modification(args[0])
        elif kind == "isr_change":
            await self._on_isr_change()
        else:
            await self.operations.handle(kind, args)

    # -- the seat -----------------------------------------------------------------------------

    async def _maybe_elect(self) -> None:
        holder = await self.run_blocking(self.zk.controller_id)
        if self.is_active and holder != self.broker_id:
            log.warning(
                "controller %d: /controller now names %s; resigning", self.broker_id, holder
            )
            await self._resign()
        if self.is_active or holder is not None:
            return
        won = await self.run_blocking(self.zk.try_become_controller, self.broker_id)
        if won is None:
            return
        epoch, version = won
        self.ctx = ControllerContext(epoch=epoch, epoch_zk_version=version)
        self.event(f"broker {self.broker_id} is the controller (epoch {epoch})")
        try:
            await self._on_failover()
        except ControllerMovedError:
            raise
        except Exception:
            log.exception("controller %d: failover failed; resigning", self.broker_id)
            await self._resign(delete_seat=True)

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
        if self.ctx is not None and delete_seat:
            await self.run_blocking(self._delete_own_seat)
        self.ctx = None

    def _delete_own_seat(self) -> None:
        try:
            _, stat = self.zk.coord.get(paths.CONTROLLER)
            if stat.ephemeralOwner == self.zk.coord.session_id:
                self.zk.coord.delete(paths.CONTROLLER, version=stat.version)
        except Exception as e:
            log.info("controller %d: could not give up /controller: %s", self.broker_id, e)

    async def _on_failover(self) -> None:
        ctx = self.ctx
        self.channel = ControllerChannelManager(self.broker_id, self.connector)
        self.leadership = PartitionLeadership(ctx, self.zk, self.run_blocking,
                                              self.config.unclean_leader_election_enable, self.event)  # fmt: skip
        self.operations = TopicOperations(self)
        ctx.live_brokers = await self.run_blocking(self.zk.live_brokers)
        for broker, registration in ctx.live_brokers.items():
            self.channel.add_broker(broker, registration)
        for topic in await self.run_blocking(self.zk.topics):
            await self._load_topic(topic)
        self._initialize_states()
        self._register_watches()
        batch = self.new_batch()
        for tp in sorted(ctx.leadership):
            self.leadership.add_leader_and_isr(batch, tp, ctx.assignments[tp])
        await self.leadership.trigger_online_partition_state_change(batch)
        # Replicas on brokers that died before this failover leave the ISR now (Kafka's
        # ReplicaStateMachine.startup): no BrokerChange will ever report them dead to us.
        for tp, replicas in sorted(ctx.assignments.items()):
            for replica in replicas:
                if replica not in ctx.live_brokers:
                    await self.leadership.remove_replica_from_isr(tp, replica, batch)
        self.send(batch)
        for kind in ("deletions", "reassignments", "preferred", "unclean"):
            self.enqueue(kind)
        interval_s = self.config.leader_imbalance_check_interval_seconds
        if self.config.auto_leader_rebalance_enable and interval_s > 0:
            self._timers.append(
                asyncio.get_running_loop().create_task(self._every(interval_s, "rebalance"))
            )

    async def _every(self, interval_s: float, kind: str) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.enqueue(kind)

    async def _load_topic(self, topic: str) -> list:
        ctx = self.ctx
        assignment = await self.run_blocking(self.zk.assignment, topic)
        if assignment is None:
            return []
        ctx.topic_configs[topic] = await self.run_blocking(self.zk.topic_config, topic)
        added = []
        for p, replicas in sorted(assignment.partitions.items()):
            tp = (topic, p)
            if tp in ctx.assignments:
                continue
            ctx.assignments[tp] = tuple(replicas)
            found = await self.run_blocking(self.zk.partition_state, topic, p)
            if found is not None:
                ctx.leadership[tp] = Leadership(*found)
            added.append(tp)
        return added

    def _initialize_states(self) -> None:
        ctx = self.ctx
        live = set(ctx.live_brokers)
        for tp, replicas in ctx.assignments.items():
            for replica in replicas:
                ctx.replica_states.move((tp, replica), ReplicaState.NEW)
                ctx.replica_states.move((tp, replica), ReplicaState.ONLINE if replica in live
                                        else ReplicaState.OFFLINE)  # fmt: skip
            ctx.partition_states.move(tp, PartitionState.NEW)
            lead = ctx.leadership.get(tp)
            if lead is not None:
                led = lead.state.leader in live
                ctx.partition_states.move(
                    tp, PartitionState.ONLINE if led else PartitionState.OFFLINE
                )

    def _register_watches(self) -> None:
        coord = self.zk.coord
        self._watches = [
            ChildrenWatch(coord, paths.BROKER_IDS, lambda children: self.enqueue("brokers")),
            ChildrenWatch(coord, paths.BROKER_TOPICS, lambda children: self.enqueue("topics")),
            ChildrenWatch(coord, paths.DELETE_TOPICS, lambda children: self.enqueue("deletions")),
            ChildrenWatch(coord, paths.ISR_CHANGE_NOTIFICATION, lambda children: self.enqueue("isr_change")),
            DataWatch(coord, paths.REASSIGN_PARTITIONS, lambda data, stat: self.enqueue("reassignments")),
            DataWatch(coord, paths.PREFERRED_REPLICA_ELECTION, lambda data, stat: self.enqueue("preferred")),
            DataWatch(coord, paths.UNCLEAN_LEADER_ELECTION, lambda data, stat: self.enqueue("unclean")),
        ]  # fmt: skip
        for topic in self.ctx.topics():
            self._watch_topic(topic)

    def _watch_topic(self, topic: str) -> None:
        if topic not in self._topic_watches:
            self._topic_watches[topic] = DataWatch(
                self.zk.coord, paths.topic_path(topic),
                lambda data, stat, t=topic: self.enqueue("partitions", t))  # fmt: skip

    def new_batch(self) -> RequestBatch:
        return RequestBatch(self.broker_id, self.ctx.epoch)

    def send(self, batch: RequestBatch) -> None:
        """Send what an event decided, then every live broker's new metadata picture."""
        batch.send(self.channel, self.operations.on_stop_replica_response)
        self.send_update_metadata()

    def send_update_metadata(self) -> None:
        """A full picture (live brokers, every partition's leadership) to every live broker:
        simpler than Kafka's incremental updates and never wrong; its size grows with the
        partition count, which a single host keeps small."""
        ctx = self.ctx
        live = ctx.live_brokers
        states, offline = [], []
        for tp, lead in sorted(ctx.leadership.items()):
            if tp not in ctx.assignments or tp[0] in ctx.topics_to_delete:
                continue
            replicas = ctx.assignments[tp]
            states.append(cr.PartitionState(tp[0], tp[1], ctx.epoch, lead.state.leader,
                                            lead.state.leader_epoch, lead.state.isr,
                                            lead.zk_version, replicas))  # fmt: skip
            offline.append(tuple(r for r in replicas if r not in live))
        brokers = tuple(cr.MetadataBroker(b, r.endpoints, r.rack, r.unix_socket)
                        for b, r in sorted(live.items()))  # fmt: skip
        body = cr.write_update_metadata(cr.UpdateMetadataRequest(
            self.broker_id, ctx.epoch, tuple(states), tuple(offline), brokers))  # fmt: skip
        for broker in sorted(live):
            self.channel.send(broker, ApiKey.UPDATE_METADATA, body, parse=cr.read_error_code)

    # -- brokers ------------------------------------------------------------------------------

    async def _on_broker_change(self) -> None:
        ctx = self.ctx
        current = await self.run_blocking(self.zk.live_brokers)
        bounced = {
            b for b, r in current.items() if b in ctx.live_brokers and r != ctx.live_brokers[b]
        }
        dead = (set(ctx.live_brokers) - set(current)) | bounced
        new = (set(current) - set(ctx.live_brokers)) | bounced
        ctx.live_brokers = current
        for broker in sorted(dead):
            ctx.shutting_down.discard(broker)
            await self.channel.remove_broker(broker)
        for broker in sorted(new):
            self.channel.add_broker(broker, current[broker])
        if dead:
            self.event(f"broker(s) {sorted(dead)} died")
            await self._on_brokers_failed(dead)
        if new:
            self.event(f"broker(s) {sorted(new)} registered")
            await self._on_brokers_started(new)

    async def _on_brokers_failed(self, dead: set[int]) -> None:
        ctx = self.ctx
        batch = self.new_batch()
        for tp, lead in sorted(ctx.leadership.items()):
            if lead.state.leader in dead and tp[0] not in ctx.topics_to_delete:
                self.ctx.move_partition(tp, PartitionState.OFFLINE)
        await self.leadership.trigger_online_partition_state_change(batch)
        for broker in sorted(dead):
            for tp in ctx.partitions_on(broker):
                self.ctx.move_replica(tp, broker, ReplicaState.OFFLINE)
                await self.leadership.remove_replica_from_isr(tp, broker, batch)
        self.send(batch)

    async def _on_brokers_started(self, new: set[int]) -> None:
        ctx = self.ctx
        batch = self.new_batch()
        for broker in sorted(new):
            for tp in ctx.partitions_on(broker):
                self.ctx.move_replica(tp, broker, ReplicaState.ONLINE)
                if tp in ctx.leadership:
                    self.leadership.add_leader_and_isr(batch, tp, [broker])
        await self.leadership.trigger_online_partition_state_change(batch)
        self.send(batch)
        await self.operations.after_brokers_started()

    # -- topics -------------------------------------------------------------------------------

    async def _on_topic_change(self) -> None:
        ctx = self.ctx
        in_store = set(await self.run_blocking(self.zk.topics))
        for topic in sorted(ctx.topics() - in_store):
            ctx.remove_topic(topic)
            watch = self._topic_watches.pop(topic, None)
            if watch is not None:
                watch.stop()
        new_partitions = []
        for topic in sorted(in_store - ctx.topics()):
            new_partitions += await self._load_topic(topic)
            self._watch_topic(topic)
        await self.on_new_partitions(new_partitions)

    async def _on_partition_modification(self, topic: str) -> None:
        if topic in self.ctx.topics() and topic not in self.ctx.topics_to_delete:
            await self.on_new_partitions(await self._load_topic(topic))

    async def on_new_partitions(self, partitions: list) -> None:
        """New partitions: NonExistent -> New -> Online; their replicas New -> Online."""
        if not partitions:
            return
        ctx = self.ctx
        for tp in partitions:
            self.ctx.move_partition(tp, PartitionState.NEW)
            for replica in ctx.assignments[tp]:
                self.ctx.move_replica(tp, replica, ReplicaState.NEW)
        batch = self.new_batch()
        await self.leadership.to_online(partitions, OFFLINE, batch)
        for tp in partitions:
            for replica in ctx.live_replicas(tp):
                self.ctx.move_replica(tp, replica, ReplicaState.ONLINE)
        self.send(batch)

    async def _on_isr_change(self) -> None:
        changed = set()
        for name in await self.run_blocking(self.zk.isr_change_notifications):
            changed.update(await self.run_blocking(self.zk.consume_isr_change_notification, name))
        await self.leadership.reload(sorted(changed))
        await self.operations.after_isr_change(changed)
        self.send_update_metadata()
