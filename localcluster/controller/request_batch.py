"""The requests one controller event sends (Kafka's ControllerBrokerRequestBatch), and the
UpdateMetadata picture. Pure: the batch turns into send actions, the runtime sends them.

A batch collects LeaderAndIsr partition states and StopReplica partitions per broker while an
event is handled, and becomes one request of each kind per broker (partitions sorted, brokers
in order), LeaderAndIsr first. LeaderAndIsr goes only to live brokers that are not shutting
down (Kafka's isReplicaOnline): one told to follow would fetch, catch up and be taken back
into the ISR it is leaving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from localcluster.controller import actions as act
from localcluster.controller.context import ControllerContext
from localcluster.metadata_types import TopicPartition
from localcluster.protocol import controller_requests as cr


class RequestBatch:
    def __init__(self, controller_id: int, ctx: ControllerContext):
        self.controller_id = controller_id
        self.ctx = ctx
        self.leader_and_isr: dict[int, dict[TopicPartition, cr.PartitionState]] = {}
        self.stop_replica: dict[tuple[int, bool], set[TopicPartition]] = {}

    def add_leader_and_isr(self, tp: TopicPartition, brokers: Iterable[int],
                           is_new: bool = False) -> None:  # fmt: skip
        """The partition's current state (as the context holds it) to `brokers`."""
        ctx = self.ctx
        lead = ctx.leadership[tp]
        state = cr.PartitionState(tp[0], tp[1], ctx.epoch, lead.state.leader,
                                  lead.state.leader_epoch, lead.state.isr, lead.zk_version,
                                  ctx.assignments[tp], is_new)  # fmt: skip
        for broker in brokers:
            if broker in ctx.live_brokers and broker not in ctx.shutting_down:
                self.leader_and_isr.setdefault(broker, {})[tp] = state

    def drop_leader_and_isr(self, partitions: Iterable[TopicPartition]) -> None:
        """Send these partitions to nobody after all (a later batch carries their new state)."""
        dropped = set(partitions)  # read once: an iterator would be spent by the first broker
        for states in self.leader_and_isr.values():
            for tp in dropped:
                states.pop(tp, None)
        for broker in [b for b, states in self.leader_and_isr.items() if not states]:
            del self.leader_and_isr[broker]

    def leader_and_isr_partitions(self) -> set[TopicPartition]:
        """The partitions whose state goes to some broker."""
        return {tp for states in self.leader_and_isr.values() for tp in states}

    def add_stop_replica(self, broker: int, tp: TopicPartition, delete: bool) -> None:
        self.stop_replica.setdefault((broker, delete), set()).add(tp)

    def actions(self) -> list[act.Action]:
        """The requests, and the batch empty again."""
        out: list[act.Action] = []
        epoch = self.ctx.epoch
        for broker, states in sorted(self.leader_and_isr.items()):
            request = cr.LeaderAndIsrRequest(self.controller_id, epoch,
                                             tuple(states[k] for k in sorted(states)))  # fmt: skip
            out.append(act.SendLeaderAndIsr(broker, request))
        for (broker, delete), tps in sorted(self.stop_replica.items()):
            request = cr.StopReplicaRequest(self.controller_id, epoch, delete, tuple(sorted(tps)))
            out.append(act.SendStopReplica(broker, request))
        self.leader_and_isr.clear()
        self.stop_replica.clear()
        return out


MetadataPicture = dict[TopicPartition, tuple[cr.PartitionState, tuple[int, ...]]]


def metadata_picture(ctx: ControllerContext) -> MetadataPicture:
    """What the brokers' metadata should hold: each partition's leadership and replicas (and
    those of them that are offline), leaving out the topics being deleted."""
    live = ctx.live_brokers
    picture = {}
    for tp, lead in sorted(ctx.leadership.items()):
        if tp not in ctx.assignments or tp[0] in ctx.topics_to_delete:
            continue
        replicas = ctx.assignments[tp]
        state = cr.PartitionState(tp[0], tp[1], ctx.epoch, lead.state.leader,
                                  lead.state.leader_epoch, lead.state.isr, lead.zk_version,
                                  replicas)  # fmt: skip
        picture[tp] = (state, tuple(r for r in replicas if r not in live))
    return picture


def update_metadata(controller_id: int, ctx: ControllerContext, published: MetadataPicture,
                    full_to: set[int]) -> tuple[list[act.SendUpdateMetadata], MetadataPicture]:  # fmt: skip
    """The live brokers' metadata brought up to date (Kafka's sendUpdateMetadataRequest), and
    the picture they then hold. The brokers in `full_to` get all of it (FULL); the others,
    which hold `published`, get the partitions whose entry changed since, and those gone with
    the leader LEADER_DURING_DELETE (INCREMENTAL). Both carry every live broker. At 10,000
    partitions a full picture takes each broker 0.1-0.3 s of CPU to decode, and every
    controller event used to send one to every broker."""
    picture = metadata_picture(ctx)
    registrations = tuple(r for _, r in sorted(ctx.live_brokers.items()))
    full = tuple(sorted(b for b in ctx.live_brokers if b in full_to))
    incremental = tuple(sorted(b for b in ctx.live_brokers if b not in full_to))
    out = []
    if full:
        out.append(_send(full, controller_id, ctx, list(picture.values()), registrations, cr.FULL))
    if incremental:
        rows = [row for tp, row in picture.items() if published.get(tp) != row]
        rows += [(dataclasses.replace(state, leader=cr.LEADER_DURING_DELETE), offline)
                 for tp, (state, offline) in sorted(published.items()) if tp not in picture]  # fmt: skip
        out.append(_send(incremental, controller_id, ctx, rows, registrations, cr.INCREMENTAL))
    return out, picture


def _send(broker_ids, controller_id: int, ctx: ControllerContext, rows, registrations,
          update_type: int) -> act.SendUpdateMetadata:  # fmt: skip
    return act.SendUpdateMetadata(broker_ids, controller_id, ctx.epoch,
                                  tuple(state for state, _ in rows),
                                  tuple(offline for _, offline in rows), registrations, update_type)  # fmt: skip
