"""PartitionStateMachine: moving partitions online, electing their leaders, writing their state.

Every change follows Kafka's ZK-era order: decide the new LeaderAndIsr from the context (a pure
election from elections.py), write it to the partition state znode conditionally on the
version the context holds (fenced by the controller epoch), and only then tell the replicas
with LeaderAndIsr. Writes go as one batch per round (WritePartitionStates); a version clash
means a leader changed its ISR meanwhile: the clashing partitions are re-read in one batch and
decided again, for at most MAX_WRITE_ATTEMPTS rounds. No I/O here: each method is an
Operation that yields the store operations it needs (actions.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from localcluster.controller import actions as act
from localcluster.controller.context import ControllerContext, Leadership
from localcluster.controller.elections import (
    PartitionLeaderElectionStrategy,
    controlled_shutdown_partition_leader_election,
    offline_partition_leader_election,
    preferred_replica_partition_leader_election,
    reassign_partition_leader_election,
)
from localcluster.controller.request_batch import RequestBatch
from localcluster.controller.state_machines import IllegalStateTransition, PartitionState
from localcluster.metadata_types import NO_LEADER, LeaderAndIsr, TopicPartition

log = logging.getLogger(__name__)

MAX_WRITE_ATTEMPTS = 5
Strategy = PartitionLeaderElectionStrategy


class PartitionStateMachine:
    def __init__(self, ctx: ControllerContext, notes: list[act.Action], unclean_default: bool):
        self.ctx = ctx
        self.notes = notes  # where event-log lines go (the core's pending actions)
        self.unclean_default = unclean_default

    def note(self, line: str, event: tuple[str, dict] | None = None) -> None:
        self.notes.append(act.Note(line, event))

    # -- state changes ------------------------------------------------------------------------

    def trigger_online_partition_state_change(self, batch: RequestBatch) -> act.Operation[list]:
        """Bring every New or Offline partition (not being deleted) online if it can be."""
        ctx = self.ctx
        candidates = [tp for tp in ctx.partition_states.keys_in(PartitionState.NEW, PartitionState.OFFLINE)
                      if tp[0] not in ctx.topics_to_delete]  # fmt: skip
        return (yield from self.to_online(sorted(candidates), Strategy.OFFLINE, batch))

    def to_online(self, partitions: Iterable[TopicPartition], strategy: Strategy,
                  batch: RequestBatch) -> act.Operation[list[TopicPartition]]:  # fmt: skip
        """Move partitions to OnlinePartition, electing with `strategy`; returns those moved.
        A New partition (or one without a state znode) gets its first LeaderAndIsr."""
        table = self.ctx.partition_states
        valid = []
        for tp in partitions:
            try:
                table.check(tp, PartitionState.ONLINE)
            except IllegalStateTransition as e:
                log.warning("controller: %s; left as it is", e)
                continue
            valid.append(tp)
        new = [
            tp
            for tp in valid
            if table.state(tp) == PartitionState.NEW or tp not in self.ctx.leadership
        ]
        moved = yield from self.initialize_leader_and_isr(new, batch)
        moved += yield from self.elect([tp for tp in valid if tp not in new], strategy, batch)
        for tp in moved:
            table.move(tp, PartitionState.ONLINE)
        return sorted(moved)

    def initialize_leader_and_isr(self, partitions: list[TopicPartition],
                                  batch: RequestBatch) -> act.Operation[list[TopicPartition]]:  # fmt: skip
        """New -> Online: the first live replica of AR leads, the live replicas are the ISR.
        A partition whose state znode an earlier controller already wrote is elected from it."""
        ctx = self.ctx
        live = {}
        for tp in partitions:
            live[tp] = [r for r in ctx.live_replicas(tp) if r not in ctx.shutting_down]
            if not live[tp]:
                log.warning("controller: %s-%d has no live replica among %s; it stays new", *tp,
                            list(ctx.assignments[tp]))  # fmt: skip
                del live[tp]
        if not live:
            return []
        read = yield act.ReadPartitionStates(tuple(live))
        found = [tp for tp in live if read.states.get(tp) is not None]
        for tp in found:
            ctx.leadership[tp] = read.states[tp]
        creates = {tp: LeaderAndIsr(replicas[0], 0, tuple(replicas), ctx.epoch)
                   for tp, replicas in live.items() if tp not in found}  # fmt: skip
        created, _ = yield from self.write(creates, create=True)
        for tp in created:
            state = ctx.leadership[tp].state
            batch.add_leader_and_isr(tp, ctx.assignments[tp], is_new=True)
            self.note(f"{tp[0]}-{tp[1]}: leader {state.leader} elected (new partition), "
                      f"ISR {list(state.isr)}",
                      ("elected", {"topic": tp[0], "partition": tp[1], "leader": state.leader,
                                   "leader_epoch": state.leader_epoch, "isr": list(state.isr),
                                   "election": "new partition", "unclean": False}))  # fmt: skip
        elected = yield from self.elect(found, Strategy.OFFLINE, batch)
        return created + elected

    # -- elections ----------------------------------------------------------------------------

    def elect(self, partitions: Iterable[TopicPartition], strategy: Strategy,
              batch: RequestBatch) -> act.Operation[list[TopicPartition]]:  # fmt: skip
        """Elect with `strategy`; returns the partitions that have a leader it chose. An
        offline election that finds nobody marks the partition leaderless."""
        ctx = self.ctx
        elected: list[TopicPartition] = []
        remaining = list(partitions)
        for _ in range(MAX_WRITE_ATTEMPTS):
            if not remaining:
                return elected
            writes, leaderless, previous = {}, {}, {}
            for tp in remaining:
                current = ctx.leadership[tp].state
                leader, isr = self._decide(tp, strategy)
                if leader is None:
                    if strategy == Strategy.OFFLINE and current.leader != NO_LEADER:
                        leaderless[tp] = LeaderAndIsr(
                            NO_LEADER, current.leader_epoch + 1, current.isr, ctx.epoch
                        )
                    continue
                if strategy == Strategy.PREFERRED and leader == current.leader:
                    elected.append(tp)
                    continue
                writes[tp] = LeaderAndIsr(leader, current.leader_epoch + 1, isr, ctx.epoch)
                previous[tp] = current
            written, conflicts = yield from self.write({**writes, **leaderless})
            for tp in sorted(leaderless):
                self.note(f"{tp[0]}-{tp[1]}: OFFLINE, no live replica in ISR {list(leaderless[tp].isr)} "
                          "(unclean.leader.election.enable=false)")  # fmt: skip
            for tp in written:
                if tp in writes:
                    self._elected(tp, strategy, previous[tp], batch)
                    elected.append(tp)
            remaining = [tp for tp in conflicts if tp in writes]  # leaderless marks are not retried
        for tp in remaining:
            log.error("controller: %s-%d: gave up electing after %d version clashes", *tp,
                      MAX_WRITE_ATTEMPTS)  # fmt: skip
        return elected

    def _elected(self, tp: TopicPartition, strategy: Strategy, previous: LeaderAndIsr,
                 batch: RequestBatch) -> None:  # fmt: skip
        state = self.ctx.leadership[tp].state
        batch.add_leader_and_isr(tp, self.ctx.assignments[tp])
        clean = state.leader in previous.isr
        unclean = "" if clean else " UNCLEAN (not in the ISR: records may be lost)"
        self.note(f"{tp[0]}-{tp[1]}: leader {state.leader} elected ({strategy.value}) in epoch "
                  f"{state.leader_epoch}, ISR {list(state.isr)}{unclean}",
                  ("elected", {"topic": tp[0], "partition": tp[1], "leader": state.leader,
                               "leader_epoch": state.leader_epoch, "isr": list(state.isr),
                               "election": strategy.value, "unclean": not clean}))  # fmt: skip

    def _decide(self, tp: TopicPartition, strategy: Strategy) -> tuple[int | None, tuple[int, ...]]:
        """The leader `strategy` elects (None: nobody qualifies) and the ISR it leads."""
        ctx = self.ctx
        current = ctx.leadership[tp].state
        assignment = ctx.assignments[tp]
        live = set(ctx.live_brokers)
        isr = current.isr
        if strategy in (Strategy.OFFLINE, Strategy.UNCLEAN):
            unclean = strategy == Strategy.UNCLEAN or ctx.unclean_enabled(tp, self.unclean_default)
            leader = offline_partition_leader_election(assignment, isr, live - ctx.shutting_down,
                                                       unclean)  # fmt: skip
            if leader is not None and leader not in isr:
                return leader, (leader,)  # unclean: the ISR starts over with the new leader
            return leader, tuple(r for r in isr if r in live)
        if strategy == Strategy.REASSIGN:
            target = ctx.reassignments.get(tp, assignment)
            leader = reassign_partition_leader_election(target, isr, live)
            return leader, tuple(r for r in isr if r in target)
        if strategy == Strategy.PREFERRED:
            return preferred_replica_partition_leader_election(assignment, isr, live), isr
        assert strategy == Strategy.CONTROLLED_SHUTDOWN, strategy
        leader = controlled_shutdown_partition_leader_election(assignment, isr, live,
                                                               ctx.shutting_down)  # fmt: skip
        return leader, tuple(r for r in isr if r not in ctx.shutting_down)

    def bump_epoch(self, tp: TopicPartition, batch: RequestBatch,
                   isr: Iterable[int] | None = None) -> act.Operation[bool]:  # fmt: skip
        """Same leader, next epoch (and `isr` if given), to every replica of AR: a
        reassignment tells the replicas it adds, and those it keeps, of the new AR."""
        ctx = self.ctx
        fixed_isr = None if isr is None else tuple(isr)
        for _ in range(MAX_WRITE_ATTEMPTS):
            current = ctx.leadership[tp].state
            state = LeaderAndIsr(current.leader, current.leader_epoch + 1,
                                 current.isr if fixed_isr is None else fixed_isr, ctx.epoch)  # fmt: skip
            written, _ = yield from self.write({tp: state})
            if written:
                batch.add_leader_and_isr(tp, ctx.assignments[tp])
                return True
        return False

    # -- the writes ---------------------------------------------------------------------------

    def write(self, states: dict[TopicPartition, LeaderAndIsr],
              create: bool = False) -> act.Operation[tuple[list, list]]:  # fmt: skip
        """Write each state conditionally on the version the context holds (or create it);
        what was written goes into the context, and each clash is re-read into it.
        Returns (written, clashed), both sorted."""
        ctx = self.ctx
        if not states:
            return [], []
        writes = tuple(act.PartitionStateWrite(tp, state, None if create else ctx.leadership[tp].zk_version)
                       for tp, state in sorted(states.items()))  # fmt: skip
        result = yield act.WritePartitionStates(writes, ctx.epoch_zk_version)
        for tp, version in result.versions.items():
            ctx.leadership[tp] = Leadership(states[tp], version)
        conflicts = sorted(result.conflicts)
        if conflicts:
            read = yield act.ReadPartitionStates(tuple(conflicts))
            for tp, found in read.states.items():
                if found is not None:
                    ctx.leadership[tp] = found
        return sorted(result.versions), conflicts

    def reload(self, partitions: Iterable[TopicPartition]) -> act.Operation[None]:
        """Re-read the state of these partitions (a leader changed their ISR)."""
        known = tuple(sorted(tp for tp in partitions if tp in self.ctx.assignments))
        if not known:
            return
        read = yield act.ReadPartitionStates(known)
        for tp, found in read.states.items():
            if found is not None:
                self.ctx.leadership[tp] = found
