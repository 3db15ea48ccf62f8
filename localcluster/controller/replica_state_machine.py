"""ReplicaStateMachine's one write: taking replicas that went away out of their ISRs.

A replica moving to OfflineReplica (its broker died or is shutting down) leaves the ISR of
each partition it follows, with the next leader epoch, and the remaining replicas hear it. Never
the leader (an election moves it) and never the last member (Kafka's rule): a leaderless
partition keeps it, so it can lead cleanly when it returns. Removals are written in rounds:
each round takes one replica off each partition, in the order given, so a partition losing
several replicas loses them in that order whatever the batching.
"""

from __future__ import annotations

from collections.abc import Iterable

from localcluster.controller import actions as act
from localcluster.controller.partition_state_machine import (
    MAX_WRITE_ATTEMPTS,
    PartitionStateMachine,
)
from localcluster.controller.request_batch import RequestBatch
from localcluster.metadata_types import LeaderAndIsr, TopicPartition


class ReplicaStateMachine:
    def __init__(self, partitions: PartitionStateMachine):
        self.partitions = partitions
        self.ctx = partitions.ctx

    def remove_replicas_from_isr(self, removals: Iterable[tuple[TopicPartition, int]],
                                 batch: RequestBatch) -> act.Operation[int]:  # fmt: skip
        """Take each (partition, replica) out of the partition's ISR; how many ISRs shrank."""
        queues: dict[TopicPartition, list[int]] = {}
        for tp, replica in removals:
            queues.setdefault(tp, []).append(replica)
        shrunk = 0
        while queues:
            round_ = {tp: replicas.pop(0) for tp, replicas in queues.items()}
            queues = {tp: replicas for tp, replicas in queues.items() if replicas}
            shrunk += yield from self._remove_round(round_, batch)
        return shrunk

    def _remove_round(self, removals: dict[TopicPartition, int],
                      batch: RequestBatch) -> act.Operation[int]:  # fmt: skip
        ctx = self.ctx
        shrunk = 0
        for _ in range(MAX_WRITE_ATTEMPTS):
            writes = {}
            for tp, replica in removals.items():
                lead = ctx.leadership.get(tp)
                if lead is None or replica not in lead.state.isr or lead.state.leader == replica:
                    continue
                if len(lead.state.isr) == 1:
                    continue
                isr = tuple(r for r in lead.state.isr if r != replica)
                writes[tp] = LeaderAndIsr(lead.state.leader, lead.state.leader_epoch + 1, isr,
                                          ctx.epoch)  # fmt: skip
            written, conflicts = yield from self.partitions.write(writes)
            shrunk += len(written)
            for tp in written:
                replica = removals[tp]
                batch.add_leader_and_isr(tp, [r for r in ctx.assignments[tp] if r != replica])
                state = writes[tp]
                self.partitions.note(f"{tp[0]}-{tp[1]}: ISR shrank to {list(state.isr)} "
                                     f"(broker {replica} is gone)",
                                     ("isr_shrunk", {"topic": tp[0], "partition": tp[1],
                                                     "leader": state.leader,
                                                     "leader_epoch": state.leader_epoch,
                                                     "isr": list(state.isr), "removed": replica}))  # fmt: skip
            removals = {tp: removals[tp] for tp in conflicts}
            if not removals:
                return shrunk
        return shrunk  # the rest clashed every time: left for the next event
