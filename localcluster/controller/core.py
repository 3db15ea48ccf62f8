"""ControllerCore: the controller's decisions, one event at a time, with no I/O (etcd raft's style).

`step(event) -> Ready`: the runtime (controller.py, or the simulator) feeds a controller event
(events.py), does the Ready's actions in order, and when the Ready names a store operation,
does it and steps the core with its result; until then the core takes no other event. Inside,
each event's handler is an Operation (actions.py): a generator that yields the store
operations it needs and goes on with their results, so a handler reads as Kafka's does.

Rules:
- One term per core: it is made when its broker wins /controller with the epoch it won, and a
  ControllerMoved (a fenced write, or the seat watch) ends it with Resign. Every write it asks
  for names that epoch's /controller_epoch version, every request carries the epoch.
- Startup (onControllerFailover) loads everything, elects, takes the replicas of brokers
  that died before it out of their ISRs, sends every live broker a full LeaderAndIsr and a
  full UpdateMetadata, and resumes pending deletions, reassignments and election requests.
- UpdateMetadata goes with every batch of requests sent: FULL to a broker that just
  registered (and to all at startup), else INCREMENTAL, the partitions that changed since the
  last one (request_batch.py's update_metadata).
- Broker membership (onBrokerStartup, onBrokerFailure), topics and ISR change notifications
  live here; topic administration in topic_operations.py; elections and partition state
  writes in partition_state_machine.py; ISR removals in replica_state_machine.py.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

from localcluster.controller import actions as act
from localcluster.controller import events as ev
from localcluster.controller.context import ControllerContext
from localcluster.controller.elections import PartitionLeaderElectionStrategy as Strategy
from localcluster.controller.partition_state_machine import PartitionStateMachine
from localcluster.controller.replica_state_machine import ReplicaStateMachine
from localcluster.controller.request_batch import (
    MetadataPicture,
    RequestBatch,
    metadata_picture,
    update_metadata,
)
from localcluster.controller.state_machines import PartitionState, ReplicaState
from localcluster.controller.topic_operations import TopicOperations
from localcluster.metadata_types import TopicPartition

log = logging.getLogger(__name__)

STORE_RESULTS = tuple(set(act.RESULT_OF.values()))


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    unclean_leader_election_enable: bool = False


class ControllerCore:
    def __init__(self, controller_id: int, epoch: int, epoch_zk_version: int,
                 settings: ControllerSettings | None = None):  # fmt: skip
        settings = settings or ControllerSettings()
        self.controller_id = controller_id
        self.ctx = ControllerContext(epoch=epoch, epoch_zk_version=epoch_zk_version)
        self._actions: list[act.Action] = []
        # what the live brokers' metadata holds (the last UpdateMetadata sent), and the
        # brokers that hold none of it yet (their next UpdateMetadata is FULL)
        self._published: MetadataPicture = {}
        self._metadata_full_to: set[int] = set()
        self.partitions = PartitionStateMachine(self.ctx, self._actions,
                                                settings.unclean_leader_election_enable)  # fmt: skip
        self.replicas = ReplicaStateMachine(self.partitions)
        self.topics = TopicOperations(self)
        self._operation: act.Operation | None = None
        self._expected: type | None = None  # the result type the operation waits for
        self.started = False
        self.resigned = False

    @property
    def waiting(self) -> bool:
        """True while a store operation is out: only its result may be stepped."""
        return self._operation is not None

    # -- the step loop ------------------------------------------------------------------------

    def step(self, event) -> act.Ready:
        assert not self.resigned, f"a resigned controller was stepped with {event!r}"
        if isinstance(event, ev.ControllerMoved):
            self._drop_operation()
            self.resigned = True
            self._actions.append(act.Resign(event.reason))
            return self._ready(None)
        if self._operation is not None:
            assert isinstance(event, self._expected), (
                f"waiting for {self._expected.__name__}, stepped with {event!r}")  # fmt: skip
            return self._advance(event)
        assert not isinstance(event, STORE_RESULTS), f"{event!r} answers nothing that was asked"
        assert self.started or isinstance(event, ev.Startup), f"{event!r} before Startup"
        self.started = True
        operation = self._handle(event)
        if not inspect.isgenerator(operation):
            return self._ready(None)
        self._operation = operation
        return self._advance(None)

    def abort(self, reason: str) -> act.Ready:
        """The runtime could not do the store operation: drop the event being handled (what
        it decided so far stays; what it had not sent yet is lost), as an exception would."""
        log.error("controller: dropping the event being handled: %s", reason)
        self._drop_operation()
        return self._ready(None)

    def _advance(self, result) -> act.Ready:
        try:
            operation = self._operation.send(result)
        except StopIteration:
            self._operation = self._expected = None
            return self._ready(None)
        except BaseException:  # the handler broke (a bug): it is over; the next event may run
            self._operation = self._expected = None
            self._actions.clear()
            raise
        self._expected = act.RESULT_OF[type(operation)]
        return self._ready(operation)

    def _ready(self, operation) -> act.Ready:
        actions = list(self._actions)
        self._actions.clear()
        return act.Ready(actions, operation)

    def _drop_operation(self) -> None:
        if self._operation is not None:
            self._operation.close()
        self._operation = self._expected = None

    def _handle(self, event):
        topics = self.topics
        match event:
            case ev.Startup():
                return self._on_startup()
            case ev.BrokerChange():
                return self._on_broker_change()
            case ev.TopicChange():
                return self._on_topic_change()
            case ev.PartitionModifications(topic=topic):
                return self._on_partition_modifications(topic)
            case ev.IsrChangeNotification():
                return self._on_isr_change()
            case ev.TopicDeletion():
                return topics.on_topic_deletion()
            case ev.PartitionReassignment():
                return topics.on_partition_reassignment()
            case ev.PreferredReplicaLeaderElection():
                return topics.on_preferred_replica_election()
            case ev.UncleanLeaderElection():
                return topics.on_unclean_leader_election()
            case ev.TopicUncleanLeaderElectionEnable(topic=topic):
                return self._on_topic_unclean_leader_election_enable(topic)
            case ev.AutoPreferredReplicaLeaderElection():
                return topics.check_leader_imbalance()
            case ev.ControlledShutdown():
                return topics.controlled_shutdown(event.broker_id, event.correlation_id)
            case ev.StopReplicaResponseReceived():
                return topics.on_stop_replica_response(event.broker_id, event.partition_errors)
        raise AssertionError(f"controller: no handler for {event!r}")

    # -- what handlers share ------------------------------------------------------------------

    def note(self, line: str, warning: bool = False) -> None:
        self._actions.append(act.Note(line, warning=warning))

    def emit(self, action: act.Action) -> None:
        self._actions.append(action)

    def new_batch(self) -> RequestBatch:
        return RequestBatch(self.controller_id, self.ctx)

    def send(self, batch: RequestBatch) -> None:
        """Send what an event decided, then every live broker's new metadata picture."""
        self._actions.extend(batch.actions())
        self.send_update_metadata()

    def metadata_missed(self, broker: int) -> None:
        """The runtime's report: an UpdateMetadata to `broker` was dropped or refused, so it
        holds less than the last one sent; its next one is FULL."""
        self._metadata_full_to.add(broker)

    def send_update_metadata(self) -> None:
        actions, self._published = update_metadata(self.controller_id, self.ctx, self._published,
                                                    self._metadata_full_to)  # fmt: skip
        self._metadata_full_to.clear()
        self._actions.extend(actions)

    # -- failover -----------------------------------------------------------------------------

    def _on_startup(self) -> act.Operation[None]:
        ctx = self.ctx
        brokers = yield act.ReadBrokers()
        ctx.live_brokers = dict(brokers.live)
        for _, registration in sorted(ctx.live_brokers.items()):
            self.emit(act.AddBroker(registration))
        names = yield act.ReadTopicNames()
        yield from self._load_topics(names.topics)
        for topic in sorted(ctx.topics() | set(ctx.unreadable_assignments)):
            self.emit(act.WatchTopic(topic))  # an unreadable one: to read it when rewritten
        self._initialize_states()
        # The brokers hold the previous controller's picture, as far as the store tells: the
        # elections' UpdateMetadata names the partitions they change, and the full picture
        # goes last (Kafka sends it before electing; sent last, the new leaders are known
        # everywhere before each broker decodes every partition: 0.1-0.3 s at 10,000).
        self._published = metadata_picture(ctx)
        # Every live broker hears every partition's state as the store held it (Kafka's full
        # LeaderAndIsr on failover), but after the elections' requests and the metadata, and
        # after the ISR removals are written (with their requests): the new leaders and the
        # brokers' metadata then wait for the partitions that changed only, not for each
        # broker going through all it hosts (6,000 of 10,000 with RF 3 on 5 brokers).
        batch = self.new_batch()
        elected = yield from self.partitions.trigger_online_partition_state_change(batch)
        if elected:  # the new leaders serve before the ISR removals below are written
            self.send(batch)
        current = self.new_batch()  # made after the elections' requests went: 10,000 states
        for tp in sorted(set(ctx.leadership).difference(elected)):  # theirs went in `batch`
            current.add_leader_and_isr(tp, ctx.assignments[tp])
        # Replicas on brokers that died before this failover leave the ISR now (Kafka's
        # ReplicaStateMachine.startup): no BrokerChange will ever report them dead to us.
        removals = [(tp, r) for tp, replicas in sorted(ctx.assignments.items())
                    for r in replicas if r not in ctx.live_brokers]  # fmt: skip
        self._metadata_full_to.update(ctx.live_brokers)  # the next UpdateMetadata is FULL
        yield from self._remove_from_isrs(removals, first=current)
        if self._metadata_full_to:  # there were no removals to send it with
            self.send_update_metadata()
        yield from self.topics.on_topic_deletion()
        yield from self.topics.on_partition_reassignment()
        yield from self.topics.on_preferred_replica_election()
        yield from self.topics.on_unclean_leader_election()

    def _load_topics(self, topics) -> act.Operation[list[TopicPartition]]:
        """Assignments, configs and state znodes of the partitions not known yet."""
        ctx = self.ctx
        if not topics:
            return []
        read = yield act.ReadTopics(tuple(topics))
        added = []
        for topic in topics:
            assignment = read.assignments.get(topic)
            if assignment is None:
                self._take_unreadable_assignment(topic, read.unreadable.get(topic))
                continue
            ctx.unreadable_assignments.pop(topic, None)
            self._take_config(read, topic)
            for p, replicas in sorted(assignment.partitions.items()):
                tp = (topic, p)
                if tp not in ctx.assignments:
                    ctx.assignments[tp] = tuple(replicas)
                    added.append(tp)
        yield from self.partitions.reload(added)
        return added

    def _take_config(self, read: ev.TopicsRead, topic: str) -> None:
        """Keep the topic's overrides as read; a config znode that does not decode leaves the
        topic without unclean election, said once until it decodes again."""
        ctx = self.ctx
        ctx.topic_configs[topic] = dict(read.configs.get(topic, {}))
        reason = read.unreadable.get(topic)
        if reason is None:
            ctx.unreadable_configs.pop(topic, None)
        elif ctx.unreadable_configs.get(topic) != reason:
            ctx.unreadable_configs[topic] = reason
            self.note(f"{topic}: its config cannot be read ({reason}); the topic goes on with "
                      "the broker's defaults and no unclean leader election. Write its config "
                      "again (localcluster topic alter) to fix it", warning=True)  # fmt: skip

    def _take_unreadable_assignment(self, topic: str, reason: str | None) -> None:
        """A topic whose assignment does not decode is left alone, said once per reason (a
        failover read of every topic raised on it until Dec 2026, and the controller
        resigned and won again ~100 times a second, electing for no topic at all)."""
        unreadable = self.ctx.unreadable_assignments
        if reason is None:
            unreadable.pop(topic, None)  # gone meanwhile
        elif unreadable.get(topic) != reason:
            unreadable[topic] = reason
            self.note(f"{topic}: its partitions cannot be read ({reason}); the controller "
                      "leaves the topic alone until that znode decodes: write it again in "
                      "Kafka's format, e.g. {\"version\":2,\"partitions\":{\"0\":[1,2]}} (a "
                      "deletion would leave its logs on the brokers)", warning=True)  # fmt: skip

    def _on_topic_unclean_leader_election_enable(self, topic: str) -> act.Operation[None]:
        """Read the topic's config again; if unclean election is on now, bring its offline
        partitions online with it (Kafka: onTopicUncleanLeaderElectionEnable)."""
        ctx = self.ctx
        if topic not in ctx.topics() or topic in ctx.topics_to_delete:
            return
        read = yield act.ReadTopics((topic,))
        if topic not in read.assignments:
            return
        self._take_config(read, topic)
        offline = sorted(tp for tp in ctx.partition_states.keys_in(PartitionState.OFFLINE)
                         if tp[0] == topic)  # fmt: skip
        if not offline or not ctx.unclean_enabled(offline[0], self.partitions.unclean_default):
            return
        self.note(f"{topic}: unclean.leader.election.enable is now true; electing for "
                  f"{len(offline)} offline partition(s)")  # fmt: skip
        batch = self.new_batch()
        yield from self.partitions.to_online(offline, Strategy.OFFLINE, batch)
        self.send(batch)

    def _initialize_states(self) -> None:
        """Kafka's initializeReplicaState and initializePartitionState: a replica is online
        when its broker is live; a partition without a state znode is new, one whose leader
        is live online, the others offline. Put, not moved: 80,000 checked transitions took
        a fifth of a 10,000-partition failover's work before its elections."""
        ctx = self.ctx
        live = set(ctx.live_brokers)
        for tp, replicas in ctx.assignments.items():
            for replica in replicas:
                ctx.replica_states.put((tp, replica), ReplicaState.ONLINE if replica in live
                                       else ReplicaState.OFFLINE)  # fmt: skip
            lead = ctx.leadership.get(tp)
            if lead is None:
                ctx.partition_states.put(tp, PartitionState.NEW)
            else:
                ctx.partition_states.put(tp, PartitionState.ONLINE if lead.state.leader in live
                                         else PartitionState.OFFLINE)  # fmt: skip

    # -- brokers ------------------------------------------------------------------------------

    def _on_broker_change(self) -> act.Operation[None]:
        ctx = self.ctx
        read = yield act.ReadBrokers()
        current = read.live
        bounced = {
            b for b, r in current.items() if b in ctx.live_brokers and r != ctx.live_brokers[b]
        }
        dead = (set(ctx.live_brokers) - set(current)) | bounced
        new = (set(current) - set(ctx.live_brokers)) | bounced
        ctx.live_brokers = dict(current)
        for broker in sorted(dead):
            ctx.shutting_down.discard(broker)
            self.emit(act.RemoveBroker(broker))
        for broker in sorted(new):
            self.emit(act.AddBroker(current[broker]))
            self._metadata_full_to.add(broker)
        if dead:
            self.note(f"broker(s) {sorted(dead)} died")
            yield from self._on_broker_failure(dead)
        if new:
            self.note(f"broker(s) {sorted(new)} registered")
            yield from self._on_broker_startup(new)

    def _on_broker_failure(self, dead: set[int]) -> act.Operation[None]:
        ctx = self.ctx
        batch = self.new_batch()
        for tp, lead in sorted(ctx.leadership.items()):
            if lead.state.leader in dead and tp[0] not in ctx.topics_to_delete:
                ctx.move_partition(tp, PartitionState.OFFLINE)
        yield from self.partitions.trigger_online_partition_state_change(batch)
        self.send(batch)  # as Kafka's onBrokerFailure: the elections' requests go out first
        removals = []
        for broker in sorted(dead):
            for tp in ctx.partitions_on(broker):
                ctx.move_replica(tp, broker, ReplicaState.OFFLINE)
                removals.append((tp, broker))
        yield from self._remove_from_isrs(removals)

    def _remove_from_isrs(self, removals: list[tuple[TopicPartition, int]],
                          first: RequestBatch | None = None) -> act.Operation[None]:  # fmt: skip
        """Dead replicas leave the ISRs, and the leaders and every broker hear of it (in
        requests of their own, after the elections': a failover's new leaders wait for the
        election writes only, not for these, which touch every partition the dead broker
        followed, twice as many as it led with RF 3). `first`'s requests go before theirs,
        without the partitions whose ISR shrank (their new state goes instead)."""
        batch = self.new_batch()
        shrunk = (
            (yield from self.replicas.remove_replicas_from_isr(removals, batch)) if removals else 0
        )
        if first is not None:
            first.drop_leader_and_isr(batch.leader_and_isr_partitions())
            self._actions.extend(first.actions())
        if shrunk:
            self.send(batch)

    def _on_broker_startup(self, new: set[int]) -> act.Operation[None]:
        ctx = self.ctx
        batch = self.new_batch()
        for broker in sorted(new):
            for tp in ctx.partitions_on(broker):
                ctx.move_replica(tp, broker, ReplicaState.ONLINE)
                if tp in ctx.leadership:
                    batch.add_leader_and_isr(tp, [broker])
        yield from self.partitions.trigger_online_partition_state_change(batch)
        self.send(batch)
        yield from self.topics.after_brokers_started()

    # -- topics -------------------------------------------------------------------------------

    def _on_topic_change(self) -> act.Operation[None]:
        ctx = self.ctx
        read = yield act.ReadTopicNames()
        in_store = set(read.topics)
        for topic in sorted(ctx.topics() - in_store):
            ctx.remove_topic(topic)
            self.emit(act.UnwatchTopic(topic))
        for topic in sorted(set(ctx.unreadable_assignments) - in_store):
            del ctx.unreadable_assignments[topic]
            self.emit(act.UnwatchTopic(topic))
        watched = ctx.topics() | set(ctx.unreadable_assignments)
        new_topics = sorted(in_store - ctx.topics())
        new_partitions = yield from self._load_topics(new_topics)
        for topic in new_topics:
            if topic not in watched:
                self.emit(act.WatchTopic(topic))
        yield from self.on_new_partitions(new_partitions)

    def _on_partition_modifications(self, topic: str) -> act.Operation[None]:
        known = topic in self.ctx.topics() or topic in self.ctx.unreadable_assignments
        if known and topic not in self.ctx.topics_to_delete:
            added = yield from self._load_topics([topic])
            yield from self.on_new_partitions(added)

    def on_new_partitions(self, partitions: list[TopicPartition]) -> act.Operation[None]:
        """New partitions: NonExistent -> New -> Online; their replicas New -> Online."""
        if not partitions:
            return
        ctx = self.ctx
        for tp in partitions:
            ctx.move_partition(tp, PartitionState.NEW)
            for replica in ctx.assignments[tp]:
                ctx.move_replica(tp, replica, ReplicaState.NEW)
        batch = self.new_batch()
        yield from self.partitions.to_online(partitions, Strategy.OFFLINE, batch)
        for tp in partitions:
            for replica in ctx.live_replicas(tp):
                ctx.move_replica(tp, replica, ReplicaState.ONLINE)
        self.send(batch)

    def _on_isr_change(self) -> act.Operation[None]:
        read = yield act.ConsumeIsrChangeNotifications()
        changed = set(read.partitions)
        yield from self.partitions.reload(changed)
        yield from self.topics.after_isr_change(changed)
        self.send_update_metadata()
