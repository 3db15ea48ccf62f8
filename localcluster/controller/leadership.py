"""Partition leadership changes: the controller's writes of partition state, and what it sends.

Every change follows Kafka's ZK-era order: compute the new LeaderAndIsr (a pure election from
elections.py), write it to the partition state znode conditionally on the version we hold
(and fenced by the controller epoch), and only then tell the replicas with LeaderAndIsr. A
version clash means a leader changed its ISR meanwhile: re-read and decide again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from localcluster.controller.channel import RequestBatch
from localcluster.controller.context import ControllerContext, Leadership, TopicPartition
from localcluster.controller.elections import (
    controlled_shutdown_partition_leader_election,
    offline_partition_leader_election,
    preferred_replica_partition_leader_election,
    reassign_partition_leader_election,
)
from localcluster.controller.state_machines import IllegalStateTransition, PartitionState
from localcluster.coord.kafka_zk import KafkaZkClient
from localcluster.coord.znode_data import LeaderAndIsr
from localcluster.protocol import controller_requests as cr

log = logging.getLogger(__name__)

MAX_WRITE_ATTEMPTS = 5
NO_LEADER = -1

OFFLINE = "offline"
REASSIGN = "reassign"
PREFERRED = "preferred"
CONTROLLED_SHUTDOWN = "controlled shutdown"
UNCLEAN = "unclean (requested)"


class PartitionLeadership:
    def __init__(self, ctx: ControllerContext, zk: KafkaZkClient, run: Callable[..., Awaitable],
                 unclean_default: bool, events: Callable[[str], None]):  # fmt: skip
        self.ctx = ctx
        self.zk = zk
        self.run = run  # runs a blocking store call off the event loop
        self.unclean_default = unclean_default
        self.events = events  # a one-line description of each change, for the event log

    def add_leader_and_isr(self, batch: RequestBatch, tp: TopicPartition, brokers: Iterable[int],
                           is_new: bool = False) -> None:  # fmt: skip
        lead = self.ctx.leadership[tp]
        state = cr.PartitionState(tp[0], tp[1], self.ctx.epoch, lead.state.leader,
                                  lead.state.leader_epoch, lead.state.isr, lead.zk_version,
                                  self.ctx.assignments[tp], is_new)  # fmt: skip
        # Not to brokers shutting down (Kafka's isReplicaOnline): one told to follow would
        # fetch, catch up and be taken back into the ISR it is leaving.
        ctx = self.ctx
        batch.add_leader_and_isr(
            [b for b in brokers if b in ctx.live_brokers and b not in ctx.shutting_down], state
        )

    async def trigger_online_partition_state_change(self, batch: RequestBatch) -> None:
        """Bring every New or Offline partition (not being deleted) online if it can be."""
        ctx = self.ctx
        candidates = [tp for tp in ctx.partition_states.keys_in(PartitionState.NEW, PartitionState.OFFLINE)
                      if tp[0] not in ctx.topics_to_delete]  # fmt: skip
        await self.to_online(sorted(candidates), OFFLINE, batch)

    async def to_online(self, partitions: Iterable[TopicPartition], election: str,
                        batch: RequestBatch) -> list[TopicPartition]:  # fmt: skip
        """Move partitions to OnlinePartition, electing with `election`; returns those moved."""
        moved = []
        for tp in partitions:
            table = self.ctx.partition_states
            try:
                table.check(tp, PartitionState.ONLINE)
            except IllegalStateTransition as e:
                log.warning("controller: %s; left as it is", e)
                continue
            if table.state(tp) == PartitionState.NEW or tp not in self.ctx.leadership:
                ok = await self.initialize_leader_and_isr(tp, batch)
            else:
                ok = await self.elect(tp, election, batch)
            if ok:
                table.move(tp, PartitionState.ONLINE)
                moved.append(tp)
        return moved

    async def initialize_leader_and_isr(self, tp: TopicPartition, batch: RequestBatch) -> bool:
        """New -> Online: the first live replica of AR leads, the live replicas are the ISR."""
        live = [r for r in self.ctx.live_replicas(tp) if r not in self.ctx.shutting_down]
        if not live:
            log.warning("controller: %s-%d has no live replica among %s; it stays new", *tp,
                        list(self.ctx.assignments[tp]))  # fmt: skip
            return False
        state = LeaderAndIsr(live[0], 0, tuple(live), self.ctx.epoch)
        found = await self.run(self.zk.partition_state, *tp)
        if found is not None:  # written by an earlier controller: elect from what is there
            self.ctx.leadership[tp] = Leadership(*found)
            return await self.elect(tp, OFFLINE, batch)
        version = await self.run(
            self.zk.create_partition_state, tp, state, self.ctx.epoch_zk_version
        )
        self.ctx.leadership[tp] = Leadership(state, version)
        self.add_leader_and_isr(batch, tp, self.ctx.assignments[tp], is_new=True)
        self.events(
            f"{tp[0]}-{tp[1]}: leader {state.leader} elected (new partition), ISR {list(state.isr)}"
        )
        return True

    def _decide(self, tp: TopicPartition, election: str) -> tuple[int | None, tuple[int, ...]]:
        ctx = self.ctx
        current = ctx.leadership[tp].state
        assignment = ctx.assignments[tp]
        live = set(ctx.live_brokers)
        isr = current.isr
        if election in (OFFLINE, UNCLEAN):
            unclean = election == UNCLEAN or ctx.unclean_enabled(tp, self.unclean_default)
            leader = offline_partition_leader_election(assignment, isr, live - ctx.shutting_down,
                                                       unclean)  # fmt: skip
            if leader is not None and leader not in isr:
                return leader, (leader,)  # unclean: the ISR starts over with the new leader
            return leader, tuple(r for r in isr if r in live)
        if election == REASSIGN:
            target = ctx.reassignments.get(tp, assignment)
            return reassign_partition_leader_election(target, isr, live), tuple(
                r for r in isr if r in target
            )
        if election == PREFERRED:
            return preferred_replica_partition_leader_election(assignment, isr, live), isr
        if election == CONTROLLED_SHUTDOWN:
            leader = controlled_shutdown_partition_leader_election(
                assignment, isr, live, ctx.shutting_down
            )
            return leader, tuple(r for r in isr if r not in ctx.shutting_down)
        raise AssertionError(f"unknown election {election}")

    async def elect(self, tp: TopicPartition, election: str, batch: RequestBatch) -> bool:
        for _ in range(MAX_WRITE_ATTEMPTS):
            current = self.ctx.leadership[tp].state
            leader, isr = self._decide(tp, election)
            if leader is None:
                if election == OFFLINE:
                    await self._mark_leaderless(tp)
                return False
            if election == PREFERRED and leader == current.leader:
                return True
            state = LeaderAndIsr(leader, current.leader_epoch + 1, isr, self.ctx.epoch)
            if await self._write(tp, state):
                self.add_leader_and_isr(batch, tp, self.ctx.assignments[tp])
                unclean = (
                    ""
                    if leader in current.isr
                    else " UNCLEAN (not in the ISR: records may be lost)"
                )
                self.events(f"{tp[0]}-{tp[1]}: leader {leader} elected ({election}) in epoch "
                            f"{state.leader_epoch}, ISR {list(isr)}{unclean}")  # fmt: skip
                return True
        log.error(
            "controller: %s-%d: gave up electing after %d version clashes", *tp, MAX_WRITE_ATTEMPTS
        )
        return False

    async def _mark_leaderless(self, tp: TopicPartition) -> None:
        """No replica may lead: record leader -1 and keep the ISR, so that its last member
        can lead cleanly when it returns (Kafka does the same)."""
        current = self.ctx.leadership[tp].state
        if current.leader != NO_LEADER:
            state = LeaderAndIsr(NO_LEADER, current.leader_epoch + 1, current.isr, self.ctx.epoch)
            await self._write(tp, state)
            self.events(f"{tp[0]}-{tp[1]}: OFFLINE, no live replica in ISR {list(current.isr)} "
                        "(unclean.leader.election.enable=false)")  # fmt: skip

    async def remove_replica_from_isr(
        self, tp: TopicPartition, replica: int, batch: RequestBatch
    ) -> None:
        """Drop a replica that went away from the ISR, but never the last member (Kafka's
        rule): a leaderless partition keeps it, so it can lead cleanly when it returns."""
        for _ in range(MAX_WRITE_ATTEMPTS):
            lead = self.ctx.leadership.get(tp)
            if lead is None or replica not in lead.state.isr or lead.state.leader == replica:
                return
            if len(lead.state.isr) == 1:
                return
            isr = tuple(r for r in lead.state.isr if r != replica)
            state = LeaderAndIsr(
                lead.state.leader, lead.state.leader_epoch + 1, isr, self.ctx.epoch
            )
            if await self._write(tp, state):
                self.add_leader_and_isr(
                    batch, tp, [r for r in self.ctx.assignments[tp] if r != replica]
                )
                self.events(
                    f"{tp[0]}-{tp[1]}: ISR shrank to {list(isr)} (broker {replica} is gone)"
                )
                return

    async def bump_epoch(self, tp: TopicPartition, batch: RequestBatch, isr=None) -> bool:
        """Same leader, next epoch (reassignment tells every replica of the new AR)."""
        for _ in range(MAX_WRITE_ATTEMPTS):
            current = self.ctx.leadership[tp].state
            state = LeaderAndIsr(current.leader, current.leader_epoch + 1,
                                 tuple(current.isr if isr is None else isr), self.ctx.epoch)  # fmt: skip
            if await self._write(tp, state):
                self.add_leader_and_isr(batch, tp, self.ctx.assignments[tp])
                return True
        return False

    async def _write(self, tp: TopicPartition, state: LeaderAndIsr) -> bool:
        """Conditional write; on a clash, re-read the znode into the context and say False."""
        lead = self.ctx.leadership[tp]
        version = await self.run(self.zk.update_partition_state, tp, state, lead.zk_version,
                                 self.ctx.epoch_zk_version)  # fmt: skip
        if version is not None:
            self.ctx.leadership[tp] = Leadership(state, version)
            return True
        found = await self.run(self.zk.partition_state, *tp)
        if found is not None:
            self.ctx.leadership[tp] = Leadership(*found)
        return False

    async def reload(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            if tp in self.ctx.assignments:
                found = await self.run(self.zk.partition_state, *tp)
                if found is not None:
                    self.ctx.leadership[tp] = Leadership(*found)
