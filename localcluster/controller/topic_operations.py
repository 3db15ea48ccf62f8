"""Topic administration by the controller core: deletion, reassignment, preferred and unclean
elections on request, auto-rebalance and controlled shutdown. No I/O: each handler is an
Operation of the core (core.py) and yields the store operations it needs.

Deletion: replicas Offline -> ReplicaDeletionStarted (StopReplica with delete) ->
ReplicaDeletionSuccessful when the broker answers, then the topic's znodes go. A replica on a
dead broker makes the deletion wait (ReplicaDeletionIneligible) until the broker returns.

Reassignment (the ZK-era algorithm): AR becomes OAR + RAR and every replica hears the next
epoch; once every target replica is in the ISR, the leader is kept or re-elected from RAR, the
removed replicas get StopReplica with delete, AR becomes RAR, and the request leaves
/admin/reassign_partitions. A new target for a partition under way (AlterPartitionReassignments'
cancel names the original replicas) starts over from the replicas it has then.

Controlled shutdown: leadership moves off the broker, the broker leaves every ISR and stops
its replicas (StopReplica without delete); the answer names what it still leads.
"""

from __future__ import annotations

import logging

from localcluster.controller import actions as act
from localcluster.controller.elections import PartitionLeaderElectionStrategy as Strategy
from localcluster.controller.state_machines import PartitionState, ReplicaState
from localcluster.metadata_types import TopicAssignment, TopicPartition

log = logging.getLogger(__name__)

IMBALANCE_PERCENTAGE = 10  # leader.imbalance.per.broker.percentage


class TopicOperations:
    def __init__(self, core):
        self.core = core
        self.ctx = core.ctx
        self._pending_deletes: dict[str, set[tuple]] = {}  # topic -> (tp, replica) awaiting answers

    def after_brokers_started(self) -> act.Operation[None]:
        self.try_topic_deletion()
        for tp in sorted(self.ctx.reassignments):
            yield from self._maybe_complete_reassignment(tp)

    def after_isr_change(self, changed) -> act.Operation[None]:
        for tp in sorted(set(changed) & set(self.ctx.reassignments)):
            yield from self._maybe_complete_reassignment(tp)

    # -- deletion -----------------------------------------------------------------------------

    def on_topic_deletion(self) -> act.Operation[None]:
        ctx = self.ctx
        read = yield act.ReadTopicDeletions()
        for topic in read.topics:
            if topic not in ctx.topics():
                yield act.DeleteTopicZnodes(topic)
                continue
            ctx.topics_to_delete.add(topic)
        self.try_topic_deletion()

    def try_topic_deletion(self) -> None:
        for topic in sorted(self.ctx.topics_to_delete - set(self._pending_deletes)):
            self._try_delete(topic)

    def _try_delete(self, topic: str) -> None:
        ctx = self.ctx
        replicas = [(tp, r) for tp in ctx.partitions_of(topic) for r in ctx.assignments[tp]]
        dead = sorted({r for _, r in replicas if r not in ctx.live_brokers})
        if dead:
            for tp, r in replicas:
                if r in dead:
                    ctx.move_replica(tp, r, ReplicaState.OFFLINE)
                    ctx.move_replica(tp, r, ReplicaState.DELETION_INELIGIBLE)
            self.core.note(f"deletion of topic {topic} waits for broker(s) {dead} to return")
            return
        batch = self.core.new_batch()
        for tp in ctx.partitions_of(topic):
            ctx.move_partition(tp, PartitionState.OFFLINE)
        for tp, r in replicas:
            ctx.move_replica(tp, r, ReplicaState.OFFLINE)
            ctx.move_replica(tp, r, ReplicaState.DELETION_STARTED)
            batch.add_stop_replica(r, tp, delete=True)
        self._pending_deletes[topic] = set(replicas)
        self.core.send(batch)

    def on_stop_replica_response(self, broker: int, partition_errors) -> act.Operation[None]:
        for topic, partition, error in partition_errors:
            pending = self._pending_deletes.get(topic)
            if pending is None:
                continue
            key = ((topic, partition), broker)
            if error == act.NONE and key in pending:
                pending.discard(key)
                self.ctx.move_replica(*key, ReplicaState.DELETION_SUCCESSFUL)
        for topic, pending in list(self._pending_deletes.items()):
            if not pending:
                del self._pending_deletes[topic]
                yield from self._finish_delete(topic)

    def _finish_delete(self, topic: str) -> act.Operation[None]:
        ctx = self.ctx
        for tp in ctx.partitions_of(topic):
            for r in ctx.assignments[tp]:
                ctx.move_replica(tp, r, ReplicaState.NON_EXISTENT)
            ctx.move_partition(tp, PartitionState.NON_EXISTENT)
        yield act.DeleteTopicZnodes(topic)
        ctx.remove_topic(topic)
        self.core.emit(act.UnwatchTopic(topic))
        self.core.send_update_metadata()
        self.core.note(f"topic {topic} deleted")

    # -- reassignment -------------------------------------------------------------------------

    def on_partition_reassignment(self) -> act.Operation[None]:
        ctx = self.ctx
        read = yield act.ReadReassignments()
        finished_at_once = []
        for tp, target in sorted((read.requested or {}).items()):
            if ctx.reassignments.get(tp) == tuple(target):
                continue  # already under way
            if tp not in ctx.assignments or not target or len(set(target)) != len(target):
                log.warning("controller: ignoring reassignment of %s to %s (unknown partition or "
                            "bad replica list)", tp, list(target))  # fmt: skip
                finished_at_once.append(tp)
                continue
            unknown = [r for r in target if r not in ctx.live_brokers]
            if unknown:
                log.warning("controller: reassignment of %s-%d names brokers %s that are not "
                            "live; it waits for them", *tp, unknown)  # fmt: skip
            if tuple(target) == ctx.assignments[tp] and tp not in ctx.reassignments:
                finished_at_once.append(tp)
                continue
            # A new target for a partition under way (AlterPartitionReassignments may, and its
            # cancel asks for the original replicas) starts again from the replicas it has now.
            yield from self._start_reassignment(tp, tuple(target))
        if finished_at_once:
            yield act.RemoveReassignments(tuple(finished_at_once))

    def _start_reassignment(
        self, tp: TopicPartition, target: tuple[int, ...]
    ) -> act.Operation[None]:
        ctx = self.ctx
        current = ctx.assignments[tp]
        adding = tuple(r for r in target if r not in current)
        earlier, _ = ctx.reassignment_changes.get(tp, ((), ()))
        ctx.reassignments[tp] = target
        ctx.reassignment_changes[tp] = (tuple(r for r in earlier if r in target) + adding,
                                        tuple(r for r in current if r not in target))  # fmt: skip
        ctx.assignments[tp] = current + adding
        yield from self._write_assignment(tp[0])
        for r in adding:
            ctx.move_replica(tp, r, ReplicaState.NEW)
        batch = self.core.new_batch()
        yield from self.core.partitions.bump_epoch(tp, batch)
        for r in adding:
            if r in ctx.live_brokers:
                ctx.move_replica(tp, r, ReplicaState.ONLINE)
        self.core.send(batch)
        self.core.note(f"{tp[0]}-{tp[1]}: reassignment {list(current)} -> {list(target)} started")
        yield from self._maybe_complete_reassignment(tp)

    def _maybe_complete_reassignment(self, tp: TopicPartition) -> act.Operation[None]:
        ctx = self.ctx
        target = ctx.reassignments.get(tp)
        lead = ctx.leadership.get(tp)
        if target is None or lead is None or not all(r in lead.state.isr for r in target):
            return
        removed = [r for r in ctx.assignments[tp] if r not in target]
        batch = self.core.new_batch()
        leader = lead.state.leader
        ctx.assignments[tp] = target  # LeaderAndIsr now names only the target replicas
        if leader not in target or leader not in ctx.live_brokers:
            yield from self.core.partitions.elect([tp], Strategy.REASSIGN, batch)
        else:
            yield from self.core.partitions.bump_epoch(
                tp, batch, isr=[r for r in lead.state.isr if r in target]
            )
        for r in removed:
            ctx.move_replica(tp, r, ReplicaState.OFFLINE)
            ctx.move_replica(tp, r, ReplicaState.DELETION_STARTED)
            batch.add_stop_replica(r, tp, delete=True)
            ctx.move_replica(tp, r, ReplicaState.DELETION_SUCCESSFUL)
            ctx.move_replica(tp, r, ReplicaState.NON_EXISTENT)
        self.core.send(batch)
        del ctx.reassignments[tp]
        ctx.reassignment_changes.pop(tp, None)
        yield from self._write_assignment(tp[0])
        yield act.RemoveReassignments((tp,))
        self.core.note(f"{tp[0]}-{tp[1]}: reassignment to {list(target)} completed")

    def _write_assignment(self, topic: str) -> act.Operation[None]:
        """The topic's znode: AR per partition, and adding/removing of those under way."""
        ctx = self.ctx
        table = {tp[1]: replicas for tp, replicas in ctx.assignments.items() if tp[0] == topic}
        changes = {tp[1]: c for tp, c in ctx.reassignment_changes.items() if tp[0] == topic}
        assignment = TopicAssignment(table, {p: a for p, (a, _) in changes.items() if a},
                                     {p: r for p, (_, r) in changes.items() if r})  # fmt: skip
        yield act.WriteAssignment(topic, assignment, ctx.epoch_zk_version)

    # -- preferred and unclean elections on request, and rebalance ----------------------------

    def on_preferred_replica_election(self) -> act.Operation[None]:
        read = yield act.ReadElectionRequest(act.ElectionRequest.PREFERRED)
        if read.partitions is None:
            return
        yield from self._elect_preferred(
            [tp for tp in read.partitions if tp in self.ctx.assignments]
        )
        yield act.DeleteElectionRequest(act.ElectionRequest.PREFERRED)

    def on_unclean_leader_election(self) -> act.Operation[None]:
        """An unclean election on request (Kafka's ElectLeaders with UNCLEAN): only for
        partitions without a live leader; any live replica of AR may take over."""
        read = yield act.ReadElectionRequest(act.ElectionRequest.UNCLEAN)
        if read.partitions is None:
            return
        ctx = self.ctx
        offline = [tp for tp in sorted(set(read.partitions)) if tp in ctx.leadership
                   and ctx.leadership[tp].state.leader not in ctx.live_brokers]  # fmt: skip
        batch = self.core.new_batch()
        for tp in offline:
            ctx.move_partition(tp, PartitionState.OFFLINE)
        yield from self.core.partitions.to_online(offline, Strategy.UNCLEAN, batch)
        self.core.send(batch)
        yield act.DeleteElectionRequest(act.ElectionRequest.UNCLEAN)

    def _elect_preferred(self, partitions) -> act.Operation[None]:
        ctx = self.ctx
        batch = self.core.new_batch()
        chosen = []
        for tp in sorted(partitions):
            lead = ctx.leadership.get(tp)
            if (
                lead is None
                or ctx.assignments[tp][0] == lead.state.leader
                or tp in ctx.reassignments
            ):
                continue
            chosen.append(tp)
        yield from self.core.partitions.elect(chosen, Strategy.PREFERRED, batch)
        self.core.send(batch)

    def check_leader_imbalance(self) -> act.Operation[None]:
        """auto.leader.rebalance.enable: move leadership back to preferred replicas on
        brokers whose share of lost preferred leaderships is over 10%."""
        ctx = self.ctx
        for broker in sorted(ctx.live_ids):
            preferred = [tp for tp, r in ctx.assignments.items() if r and r[0] == broker
                         and tp in ctx.leadership and tp[0] not in ctx.topics_to_delete]  # fmt: skip
            if not preferred:
                continue
            not_led = [tp for tp in preferred if ctx.leadership[tp].state.leader != broker]
            if 100 * len(not_led) / len(preferred) > IMBALANCE_PERCENTAGE:
                self.core.note(f"broker {broker} leads {len(preferred) - len(not_led)} of its "
                               f"{len(preferred)} preferred partitions; rebalancing")  # fmt: skip
                yield from self._elect_preferred(not_led)

    # -- controlled shutdown ------------------------------------------------------------------

    def controlled_shutdown(self, broker: int, correlation_id: int) -> act.Operation[None]:
        """Move leadership off `broker`, take it out of every ISR, and answer with the
        partitions it still leads (those with no other replica to take over)."""
        ctx = self.ctx
        if broker not in ctx.live_brokers:
            self.core.emit(act.ReplyControlledShutdown(correlation_id, act.BROKER_NOT_AVAILABLE))
            return
        ctx.shutting_down.add(broker)
        self.core.note(f"broker {broker} is shutting down (controlled)")
        batch = self.core.new_batch()
        led, followed = [], []
        for tp in ctx.partitions_on(broker):
            lead = ctx.leadership.get(tp)
            if lead is None:
                continue
            if lead.state.leader == broker:
                if len(ctx.assignments[tp]) > 1:
                    led.append(tp)
            else:
                followed.append(tp)
        moved = yield from self.core.partitions.elect(led, Strategy.CONTROLLED_SHUTDOWN, batch)
        yield from self.core.replicas.remove_replicas_from_isr(
            [(tp, broker) for tp in followed], batch
        )
        for tp in moved + followed:
            batch.add_stop_replica(broker, tp, delete=False)  # it leads or follows them no more
        self.core.send(batch)
        self.core.emit(act.ReplyControlledShutdown(correlation_id, act.NONE,
                                                   tuple(ctx.partitions_led_by(broker))))  # fmt: skip
