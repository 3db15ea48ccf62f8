"""Partition: one replica's view of a partition's replication state. Sans-I/O.

It holds the leader, leader epoch, ISR and assignment this broker was told about, the high
watermark, and (when leading) what it knows of each follower's log end offset. It never reads
a clock, a file or a socket: the runtime feeds it events (`make_leader`, `on_local_append`,
`update_follower_fetch_state`) with the current time and the log's offsets, and applies what
it answers (e.g. a new high watermark that frees parked produce requests).

Invariants, asserted at every exit that changes state:
    log_start_offset <= high_watermark <= log_end_offset
    a leader is in its own ISR
    the high watermark never moves backwards within a leader epoch
"""

from __future__ import annotations

from dataclasses import dataclass, field


class NotLeaderError(Exception):
    """This broker does not lead the partition (NOT_LEADER_OR_FOLLOWER)."""


@dataclass(slots=True)
class ReplicaState:
    """A follower as the leader sees it, from its fetches."""

    log_end_offset: int = -1
    last_caught_up_time_ms: int = 0


@dataclass(slots=True)
class Partition:
    topic: str
    partition: int
    local_broker_id: int
    assignment: tuple[int, ...] = ()
    leader_id: int = -1
    leader_epoch: int = -1
    isr: frozenset[int] = frozenset()
    high_watermark: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0
    replicas: dict[int, ReplicaState] = field(default_factory=dict)

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_broker_id

    def make_leader(self, leader_epoch: int, isr: frozenset[int], assignment: tuple[int, ...],
                    log_start_offset: int, log_end_offset: int, high_watermark: int,
                    now_ms: int) -> None:  # fmt: skip
        """Become the leader in `leader_epoch` (from a controller's LeaderAndIsr).

        `high_watermark` is the checkpointed or last known one, capped by the log end.
        """
        assert leader_epoch >= self.leader_epoch, (leader_epoch, self.leader_epoch)
        self.leader_id = self.local_broker_id
        self.leader_epoch = leader_epoch
        self.isr = frozenset(isr) | {self.local_broker_id}
        self.assignment = tuple(assignment)
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        self.high_watermark = max(log_start_offset, min(high_watermark, log_end_offset))
        self.replicas = {
            r: ReplicaState(last_caught_up_time_ms=now_ms)
            for r in self.assignment if r != self.local_broker_id
        }  # fmt: skip
        self.maybe_increment_leader_hw()
        self._check()

    def on_local_append(self, log_end_offset: int) -> bool:
        """The leader appended; True when the high watermark moved."""
        if not self.is_leader:
            raise NotLeaderError(f"{self.topic}-{self.partition} is led by {self.leader_id}")
        assert log_end_offset >= self.log_end_offset
        self.log_end_offset = log_end_offset
        moved = self.maybe_increment_leader_hw()
        self._check()
        return moved

    def on_log_start_offset(self, log_start_offset: int) -> None:
        """Retention moved the log start (never past the high watermark)."""
        assert log_start_offset <= self.high_watermark
        self.log_start_offset = log_start_offset
        self._check()

    def maybe_increment_leader_hw(self) -> bool:
        """HW = the smallest log end offset in the ISR; it only moves forward."""
        if not self.is_leader:
            return False
        ends = [self.log_end_offset]
        for replica in self.isr:
            if replica != self.local_broker_id:
                ends.append(self.replicas.get(replica, ReplicaState()).log_end_offset)
        candidate = min(ends)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    def _check(self) -> None:
        assert self.log_start_offset <= self.high_watermark <= self.log_end_offset, (
            self.topic, self.partition, self.log_start_offset, self.high_watermark,
            self.log_end_offset,
        )  # fmt: skip
        assert not self.is_leader or self.local_broker_id in self.isr
