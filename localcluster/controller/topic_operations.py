"""Topic administration by the controller: deletion, reassignment, preferred election,
auto-rebalance and controlled shutdown. Each runs inside the controller's event loop.

Deletion: replicas Offline -> ReplicaDeletionStarted (StopReplica with delete) ->
ReplicaDeletionSuccessful when the broker answers, then the topic's znodes go. A replica on a
dead broker makes the deletion wait (ReplicaDeletionIneligible) until the broker returns.

Reassignment (the ZK-era algorithm): AR becomes OAR + RAR and every replica hears the next
epoch; once every target replica is in the ISR, the leader is kept or re-elected from RAR, the
removed replicas get StopReplica with delete, AR becomes RAR, and the request leaves
/admin/reassign_partitions.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from localcluster.controller.leadership import CONTROLLED_SHUTDOWN, PREFERRED, REASSIGN, UNCLEAN
from localcluster.controller.state_machines import PartitionState, ReplicaState
from localcluster.coord import paths
from localcluster.coord.znode_data import TopicAssignment

log = logging.getLogger(__name__)

IMBALANCE_PERCENTAGE = 10  # leader.imbalance.per.broker.percentage


class TopicOperations:
    def __init__(self, controller):
        self.c = controller
        self.ctx = controller.ctx
        self.zk = controller.zk
        self.run = controller.run_blocking
        self._pending_deletes: dict[str, set[tuple]] = {}  # topic -> (tp, replica) awaiting answers

    async def handle(self, kind: str, args) -> None:
        if kind == "deletions":
            await self.on_deletion_requests()
        elif kind == "deletion_answer":
            await self._on_deletion_answer(*args)
        elif kind == "reassignments":
            await self.on_reassignment_requests()
        elif kind == "preferred":
            await self.on_preferred_requests()
        elif kind == "unclean":
            await self.on_unclean_requests()
        elif kind == "rebalance":
            await self.check_leader_imbalance()
        elif kind == "controlled_shutdown":
            await self.controlled_shutdown(*args)
        else:
            log.error("controller: unknown event %s", kind)

    async def after_brokers_started(self) -> None:
        await self.on_deletion_requests()
        for tp in sorted(self.ctx.reassignments):
            await self._maybe_complete_reassignment(tp)

    async def after_isr_change(self, changed) -> None:
        for tp in sorted(set(changed) & set(self.ctx.reassignments)):
            await self._maybe_complete_reassignment(tp)

    # -- deletion -----------------------------------------------------------------------------

    async def on_deletion_requests(self) -> None:
        ctx = self.ctx
        for topic in await self.run(self.zk.topics_to_delete):
            if topic not in ctx.topics():
                await self.run(self.zk.delete_topic_znodes, topic)
                continue
            ctx.topics_to_delete.add(topic)
        for topic in sorted(ctx.topics_to_delete - set(self._pending_deletes)):
            await self._try_delete(topic)

    async def _try_delete(self, topic: str) -> None:
        ctx = self.ctx
        replicas = [(tp, r) for tp in ctx.partitions_of(topic) for r in ctx.assignments[tp]]
        dead = sorted({r for _, r in replicas if r not in ctx.live_brokers})
        if dead:
            for tp, r in replicas:
                if r in dead:
                    self.ctx.move_replica(tp, r, ReplicaState.OFFLINE)
                    self.ctx.move_replica(tp, r, ReplicaState.DELETION_INELIGIBLE)
            self.c.event(f"deletion of topic {topic} waits for broker(s) {dead} to return")
            return
        batch = self.c.new_batch()
        for tp in ctx.partitions_of(topic):
            self.ctx.move_partition(tp, PartitionState.OFFLINE)
        for tp, r in replicas:
            self.ctx.move_replica(tp, r, ReplicaState.OFFLINE)
            self.ctx.move_replica(tp, r, ReplicaState.DELETION_STARTED)
            batch.add_stop_replica(r, tp, delete=True)
        self._pending_deletes[topic] = set(replicas)
        self.c.send(batch)

    def on_stop_replica_response(self, broker: int, response) -> None:
        self.c.enqueue("deletion_answer", broker, response)

    async def _on_deletion_answer(self, broker: int, response) -> None:
        for topic, partition, error in response.partitions:
            pending = self._pending_deletes.get(topic)
            if pending is None:
                continue
            key = ((topic, partition), broker)
            if error == ErrorCode.none and key in pending:
                pending.discard(key)
                self.ctx.move_replica(*key, ReplicaState.DELETION_SUCCESSFUL)
        for topic, pending in list(self._pending_deletes.items()):
            if not pending:
                del self._pending_deletes[topic]
                await self._finish_delete(topic)

    async def _finish_delete(self, topic: str) -> None:
        ctx = self.ctx
        for tp in ctx.partitions_of(topic):
            for r in ctx.assignments[tp]:
                self.ctx.move_replica(tp, r, ReplicaState.NON_EXISTENT)
            self.ctx.move_partition(tp, PartitionState.NON_EXISTENT)
        await self.run(self.zk.delete_topic_znodes, topic)
        ctx.remove_topic(topic)
        self.c.send_update_metadata()
        self.c.event(f"topic {topic} deleted")

    # -- reassignment -------------------------------------------------------------------------

    async def on_reassignment_requests(self) -> None:
        ctx = self.ctx
        requested = await self.run(self.zk.reassignments) or {}
        finished_at_once = []
        for tp, target in sorted(requested.items()):
            if tp in ctx.reassignments:
                continue
            if tp not in ctx.assignments or not target or len(set(target)) != len(target):
                log.warning("controller: ignoring reassignment of %s to %s (unknown partition or "
                            "bad replica list)", tp, list(target))  # fmt: skip
                finished_at_once.append(tp)
                continue
            unknown = [r for r in target if r not in ctx.live_brokers]
            if unknown:
                log.warning("controller: reassignment of %s-%d names brokers %s that are not "
                            "live; it waits for them", *tp, unknown)  # fmt: skip
            if tuple(target) == ctx.assignments[tp]:
                finished_at_once.append(tp)
                continue
            await self._start_reassignment(tp, tuple(target))
        if finished_at_once:
            remaining = {tp: r for tp, r in requested.items() if tp not in finished_at_once}
            await self.run(self.zk.write_reassignments, remaining)

    async def _start_reassignment(self, tp, target: tuple[int, ...]) -> None:
        ctx = self.ctx
        current = ctx.assignments[tp]
        adding = tuple(r for r in target if r not in current)
        union = current + adding
        ctx.reassignments[tp] = target
        ctx.assignments[tp] = union
        await self._write_assignment(tp[0], adding={tp: adding},
                                     removing={tp: tuple(r for r in current if r not in target)})  # fmt: skip
        for r in adding:
            self.ctx.move_replica(tp, r, ReplicaState.NEW)
        batch = self.c.new_batch()
        await self.c.leadership.bump_epoch(tp, batch)
        for r in adding:
            if r in ctx.live_brokers:
                self.ctx.move_replica(tp, r, ReplicaState.ONLINE)
        self.c.send(batch)
        self.c.event(f"{tp[0]}-{tp[1]}: reassignment {list(current)} -> {list(target)} started")
        await self._maybe_complete_reassignment(tp)

    async def _maybe_complete_reassignment(self, tp) -> None:
        ctx = self.ctx
        target = ctx.reassignments.get(tp)
        lead = ctx.leadership.get(tp)
        if target is None or lead is None or not all(r in lead.state.isr for r in target):
            return
        union = ctx.assignments[tp]
        removed = [r for r in union if r not in target]
        batch = self.c.new_batch()
        leader = lead.state.leader
        ctx.assignments[tp] = target  # LeaderAndIsr now names only the target replicas
        if leader not in target or leader not in ctx.live_brokers:
            await self.c.leadership.elect(tp, REASSIGN, batch)
        else:
            await self.c.leadership.bump_epoch(
                tp, batch, isr=[r for r in lead.state.isr if r in target]
            )
        for r in removed:
            self.ctx.move_replica(tp, r, ReplicaState.OFFLINE)
            self.ctx.move_replica(tp, r, ReplicaState.DELETION_STARTED)
            batch.add_stop_replica(r, tp, delete=True)
            self.ctx.move_replica(tp, r, ReplicaState.DELETION_SUCCESSFUL)
            self.ctx.move_replica(tp, r, ReplicaState.NON_EXISTENT)
        self.c.send(batch)
        del ctx.reassignments[tp]
        await self._write_assignment(tp[0])
        requested = await self.run(self.zk.reassignments) or {}
        requested.pop(tp, None)
        await self.run(self.zk.write_reassignments, requested)
        self.c.event(f"{tp[0]}-{tp[1]}: reassignment to {list(target)} completed")

    async def _write_assignment(self, topic: str, adding=None, removing=None) -> None:
        ctx = self.ctx
        table = {tp[1]: replicas for tp, replicas in ctx.assignments.items() if tp[0] == topic}
        assignment = TopicAssignment(table, {tp[1]: r for tp, r in (adding or {}).items() if r},
                                     {tp[1]: r for tp, r in (removing or {}).items() if r})  # fmt: skip
        await self.run(self.zk.write_assignment, topic, assignment, ctx.epoch_zk_version)

    # -- preferred election and rebalance -----------------------------------------------------

    async def on_preferred_requests(self) -> None:
        requested = await self.run(self.zk.requested_elections, paths.PREFERRED_REPLICA_ELECTION)
        if requested is None:
            return
        await self._elect_preferred([tp for tp in requested if tp in self.ctx.assignments])
        await self.run(self.zk.delete_election_request, paths.PREFERRED_REPLICA_ELECTION)

    async def on_unclean_requests(self) -> None:
        """An unclean election on request (Kafka's ElectLeaders with UNCLEAN): only for
        partitions without a live leader; any live replica of AR may take over."""
        requested = await self.run(self.zk.requested_elections, paths.UNCLEAN_LEADER_ELECTION)
        if requested is None:
            return
        ctx = self.ctx
        offline = [tp for tp in sorted(set(requested)) if tp in ctx.leadership
                   and ctx.leadership[tp].state.leader not in ctx.live_brokers]  # fmt: skip
        batch = self.c.new_batch()
        for tp in offline:
            ctx.move_partition(tp, PartitionState.OFFLINE)
        await self.c.leadership.to_online(offline, UNCLEAN, batch)
        self.c.send(batch)
        await self.run(self.zk.delete_election_request, paths.UNCLEAN_LEADER_ELECTION)

    async def _elect_preferred(self, partitions) -> None:
        ctx = self.ctx
        batch = self.c.new_batch()
        for tp in sorted(partitions):
            lead = ctx.leadership.get(tp)
            if (
                lead is None
                or ctx.assignments[tp][0] == lead.state.leader
                or tp in ctx.reassignments
            ):
                continue
            await self.c.leadership.elect(tp, PREFERRED, batch)
        self.c.send(batch)

    async def check_leader_imbalance(self) -> None:
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
                self.c.event(f"broker {broker} leads {len(preferred) - len(not_led)} of its "
                             f"{len(preferred)} preferred partitions; rebalancing")  # fmt: skip
                await self._elect_preferred(not_led)

    # -- controlled shutdown ------------------------------------------------------------------

    async def controlled_shutdown(self, broker: int, answer) -> None:
        """Move leadership off `broker`, take it out of every ISR, and answer with the
        partitions it still leads (those with no other replica to take over)."""
        ctx = self.ctx
        if broker not in ctx.live_brokers:
            answer.set_result((ErrorCode.broker_not_available, []))
            return
        ctx.shutting_down.add(broker)
        self.c.event(f"broker {broker} is shutting down (controlled)")
        batch = self.c.new_batch()
        for tp in ctx.partitions_on(broker):
            lead = ctx.leadership.get(tp)
            if lead is None:
                continue
            if lead.state.leader == broker:
                if len(ctx.assignments[tp]) > 1 and await self.c.leadership.elect(
                    tp, CONTROLLED_SHUTDOWN, batch
                ):
                    batch.add_stop_replica(broker, tp, delete=False)  # it leads no more
            else:
                await self.c.leadership.remove_replica_from_isr(tp, broker, batch)
                batch.add_stop_replica(broker, tp, delete=False)
        self.c.send(batch)
        answer.set_result((ErrorCode.none, ctx.partitions_led_by(broker)))
