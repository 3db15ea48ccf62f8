"""The in-memory network: messages between nodes with seeded delay, loss, reordering (two
messages on one link may arrive in either order) and partitions that cut links until healed.

Nodes are names: broker ids (ints), "controller", "zk", "client", "member" (a consumer group
member). A message is lost when it
is dropped at random, when its link is cut at send or at delivery, or when its receiver has
crashed; a paused receiver (SIGSTOP) holds it until it resumes. The messages are the
inter-broker and controller requests of the real runtime, reduced to their fields.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tests.sim.clock import Scheduler

# -- messages -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    corr: int
    controller_epoch: int
    partitions: tuple  # protocol.controller_requests.PartitionState, as the controller sent them


@dataclass(frozen=True, slots=True)
class StopReplica:
    """Stop fetching and hosting these partitions (and delete their logs if told)."""

    corr: int
    controller_epoch: int
    partitions: tuple[tuple[str, int], ...]
    delete_partitions: bool = False


@dataclass(frozen=True, slots=True)
class LeaderAndIsrResponse:
    corr: int
    error: int
    partition_errors: tuple[tuple[tuple[str, int], int], ...] = ()


@dataclass(frozen=True, slots=True)
class Fetch:
    """A follower's Fetch of every partition its session fetches from this leader."""

    corr: int
    replica_id: int
    partitions: tuple  # replication.ready.FetchPartitionPlan
    max_wait_ms: int


@dataclass(frozen=True, slots=True)
class FetchResponse:
    corr: int
    partitions: tuple  # replication.ready.FetchedPartition


@dataclass(frozen=True, slots=True)
class OffsetForLeaderEpoch:
    """A follower's question about every partition it is truncating from this leader."""

    corr: int
    replica_id: int
    partitions: tuple  # replication.ready.EpochAsk


@dataclass(frozen=True, slots=True)
class OffsetForLeaderEpochResponse:
    corr: int
    partitions: tuple  # replication.ready.EpochAnswer


@dataclass(frozen=True, slots=True)
class ListOffsets:
    corr: int
    replica_id: int
    tp: tuple[str, int]
    timestamp: int  # -1 latest (the log end, for a replica), -2 earliest


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse:
    corr: int
    tp: tuple[str, int]
    error: int
    offset: int


@dataclass(frozen=True, slots=True)
class Produce:
    corr: int
    tp: tuple[str, int]
    records: bytes  # one RecordBatch v2, as a client sends it
    acks: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    corr: int
    tp: tuple[str, int]
    error: int
    base_offset: int = -1


@dataclass(frozen=True, slots=True)
class IsrWrite:
    """A leader's conditional ISR write (with its isr_change_notification) to the store."""

    corr: int
    update: object  # replication.partition.IsrUpdate


@dataclass(frozen=True, slots=True)
class IsrReadBack:
    """The leader reads the state back after its ISR write raised (the answer was lost)."""

    corr: int
    update: object


@dataclass(frozen=True, slots=True)
class IsrWriteResponse:
    corr: int
    ok: bool
    zk_version: int | None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    session: int


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    session: int
    expired: bool


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """A consumer group member's request to a broker: one of group/messages.py's requests."""

    corr: int
    request: object


@dataclass(frozen=True, slots=True)
class GroupResponse:
    corr: int
    response: object  # the shard's answer (group/messages.py)


# -- the network ----------------------------------------------------------------------------


@dataclass
class NetworkStats:
    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    cut: int = 0
    to_dead: int = 0


@dataclass
class Network:
    rng: random.Random
    scheduler: Scheduler
    min_delay_ms: int = 1
    max_delay_ms: int = 4
    drop_rate: float = 0.0
    # Senders whose messages are never lost: the store's answers, by default. The file-backed
    # store answers a local call; the runtime treats a store call that raised as a write that
    # did not land, which is wrong when only the answer was lost (a kazoo ConnectionLoss).
    reliable_senders: set = field(default_factory=lambda: {"zk"})
    lost_senders: set = field(default_factory=set)  # scripted: every message from these is lost
    # Nodes whose links keep their order, as one TCP connection does (the client's: its
    # producer counts on a broker answering one connection's requests in order; so does the
    # group member's).
    ordered: set = field(default_factory=lambda: {"client", "member"})
    _last_delivery: dict = field(default_factory=dict)  # (src, dst) -> ms, of ordered links
    nodes: dict = field(default_factory=dict)  # name -> node with .receive(src, msg)
    cut_links: set = field(default_factory=set)  # frozenset({a, b})
    stats: NetworkStats = field(default_factory=NetworkStats)

    def attach(self, name, node) -> None:
        self.nodes[name] = node

    def is_cut(self, a, b) -> bool:
        return frozenset((a, b)) in self.cut_links

    def cut(self, a, b) -> None:
        self.cut_links.add(frozenset((a, b)))

    def isolate(self, name) -> None:
        for other in self.nodes:
            if other != name:
                self.cut(name, other)

    def heal(self) -> None:
        self.cut_links.clear()

    def send(self, src, dst, msg) -> None:
        self.stats.sent += 1
        if src in self.lost_senders:
            self.stats.dropped += 1
            return
        if src in self.reliable_senders:
            delay = self.rng.randint(self.min_delay_ms, self.max_delay_ms)
            self.scheduler.after(delay, self._deliver, src, dst, msg)
            return
        if self.is_cut(src, dst):
            self.stats.cut += 1
            return
        if self.drop_rate and self.rng.random() < self.drop_rate:
            self.stats.dropped += 1
            return
        delay = self.rng.randint(self.min_delay_ms, self.max_delay_ms)
        if src in self.ordered or dst in self.ordered:
            at_ms = max(
                self.scheduler.clock.now_ms() + delay, self._last_delivery.get((src, dst), 0)
            )
            self._last_delivery[(src, dst)] = at_ms
            self.scheduler.at(at_ms, self._deliver, src, dst, msg)
            return
        self.scheduler.after(delay, self._deliver, src, dst, msg)

    def _deliver(self, src, dst, msg) -> None:
        if self.is_cut(src, dst) and src not in self.reliable_senders:
            self.stats.cut += 1
            return
        node = self.nodes.get(dst)
        if node is None or not node.receive(src, msg):
            self.stats.to_dead += 1
            return
        self.stats.delivered += 1
