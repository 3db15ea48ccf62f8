"""Partition: one replica's view of a partition's replication state. Sans-I/O.

It holds the leader, leader epoch, ISR and assignment this broker was told about, the high
watermark, and (when leading) what it knows of each follower from its fetches. It never reads a
clock, a file or a socket: the runtime feeds it events with the current time and the log's
offsets, and carries out what it answers:
- `IsrUpdate`: write the new ISR to the partition state znode, conditional on `zk_version`;
  report back with `on_isr_update_succeeded` / `on_isr_update_failed`. Until it lands, the
  high watermark waits for the maximal ISR, the committed one plus any member being added
  (KIP-497): a shrink never raises the HW before ZooKeeper agrees, and an expand that
  ZooKeeper may already hold never lets the HW pass a member the controller could elect.
- a moved high watermark (returned as True): complete parked produces, wake fetches.

Invariants, asserted at every exit that changes state:
    log_start_offset <= high_watermark <= log_end_offset
    a leader is in its own ISR, and its ISR is a subset of its assignment
    the high watermark never moves backwards while this replica leads one epoch
"""

from __future__ import annotations

from dataclasses import dataclass, field

from localcluster.metadata_types import LeaderAndIsr


class NotLeaderError(Exception):
    """This broker does not lead the partition (NOT_LEADER_OR_FOLLOWER)."""


@dataclass(frozen=True, slots=True)
class IsrUpdate:
    """Ask the runtime to write `isr` to the state znode at `zk_version`."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    zk_version: int
    reason: str

    def state(self, controller_epoch: int) -> LeaderAndIsr:
        """The znode's new value (the controller epoch stays the one the znode holds)."""
        return LeaderAndIsr(self.leader, self.leader_epoch, tuple(self.isr), controller_epoch)

    def outcome(self, found: tuple[LeaderAndIsr, int] | None) -> tuple[bool, int | None]:
        """What the znode's value and version after a failed (or unanswered) write say of it,
        as `on_isr_update_*` take it: (True, version) it landed (the answer was lost), (False,
        version) only the version moved (propose again with it), (False, None) fenced: another
        leader or epoch is there."""
        if found is None:
            return False, None
        current, version = found
        if (current.leader, current.leader_epoch) != (self.leader, self.leader_epoch):
            return False, None
        return tuple(current.isr) == tuple(self.isr), version


@dataclass(slots=True, eq=False)
class FollowerFetchSession:
    """A follower's incremental fetch session as a leader's ISR rules see it: the time of its
    last fetch. Every fetch of the session counts, at the same position, for each partition it
    holds idle at the leader's end (`ReplicaState.fetch_session`): Kafka records a caught-up
    time per partition on every fetch; one clock per session does the same without a write
    per idle partition per fetch. The runtime names the session's fetches
    (`record_follower_fetch`) and the partitions it forgets; once it ends, its clock stops and
    the partitions it held fall behind as a follower that stopped fetching them."""

    last_fetch_ms: int = 0


@dataclass(slots=True)
class ReplicaState:
    """A follower as the leader sees it, from its fetches (Kafka's Replica on the leader)."""

    log_end_offset: int = -1
    last_caught_up_time_ms: int = 0
    last_fetch_leader_log_end_offset: int = -1
    last_fetch_time_ms: int = 0
    log_start_offset: int = -1  # from its fetches: DeleteRecords waits for it (low watermark)
    # The session that fetches this partition idle: a member of the ISR at the leader's end,
    # whose position nothing has changed since. Its fetches count as this partition's
    # (`caught_up_time_ms`) until `unpark` writes them in (an append, a fetch that names it).
    fetch_session: FollowerFetchSession | None = None

    def caught_up_time_ms(self) -> int:
        session = self.fetch_session
        return self.last_caught_up_time_ms if session is None else max(
            self.last_caught_up_time_ms, session.last_fetch_ms)  # fmt: skip

    def unpark(self) -> None:
        """The session's last fetch, written in as this partition's: Kafka's values after it
        (the leader's end has not moved while the partition was held)."""
        session = self.fetch_session
        if session is not None:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, session.last_fetch_ms)
            self.last_fetch_time_ms = max(self.last_fetch_time_ms, session.last_fetch_ms)
            self.fetch_session = None


@dataclass(slots=True)
class Partition:
    topic: str
    partition: int
    local_broker_id: int
    assignment: tuple[int, ...] = ()
    leader_id: int = -1
    leader_epoch: int = -1
    isr: frozenset[int] = frozenset()
    zk_version: int = -1  # version of the partition state znode our ISR came from
    controller_epoch: int = -1
    high_watermark: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0
    leader_epoch_start_offset: int = 0  # where this leader's epoch began in its log
    replicas: dict[int, ReplicaState] = field(default_factory=dict)
    pending_isr: tuple[int, ...] | None = None  # an IsrUpdate in flight

    @classmethod
    def create(cls, topic: str, partition: int, local_broker_id: int, log_start_offset: int,
               log_end_offset: int, checkpointed_high_watermark: int) -> Partition:  # fmt: skip
        """A partition over an existing log, before any LeaderAndIsr: its offsets are the log's
        and its HW the checkpointed one, within the log (a log cut by recovery can end below
        it; retention can have moved its start past it)."""
        created = cls(topic, partition, local_broker_id, log_start_offset=log_start_offset,
                      log_end_offset=log_end_offset,
                      high_watermark=max(log_start_offset,
                                         min(checkpointed_high_watermark, log_end_offset)))  # fmt: skip
        created._check()
        return created

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_broker_id

    @property
    def tp(self) -> tuple[str, int]:
        return self.topic, self.partition

    # -- role changes (from LeaderAndIsr) ---------------------------------------------------

    def is_newer_state(self, leader_epoch: int, zk_version: int) -> bool:
        """Whether a LeaderAndIsr partition state should be applied: a newer leader epoch, or
        in the same epoch a newer znode version (the ISR changed). Older or equal: stale."""
        return leader_epoch > self.leader_epoch or (
            leader_epoch == self.leader_epoch and zk_version > self.zk_version
        )

    def make_leader(self, leader_epoch: int, isr, assignment, zk_version: int,
                    log_start_offset: int, log_end_offset: int, high_watermark: int,
                    now_ms: int, controller_epoch: int = -1) -> bool:  # fmt: skip
        """Become the leader in `leader_epoch`. `high_watermark` is the last known one (a
        follower's or the checkpoint's), capped by the log end. True when the HW moved."""
        assert leader_epoch >= self.leader_epoch, (leader_epoch, self.leader_epoch)
        new_epoch = leader_epoch != self.leader_epoch or not self.is_leader
        self.leader_id = self.local_broker_id
        self.leader_epoch = leader_epoch
        self.controller_epoch = controller_epoch
        self.assignment = tuple(assignment)
        self.isr = frozenset(isr) | {self.local_broker_id}
        self.zk_version = zk_version
        self.pending_isr = None
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        if new_epoch:
            self.leader_epoch_start_offset = log_end_offset
            self.high_watermark = max(log_start_offset, min(high_watermark, log_end_offset))
            # Every follower gets a fresh lag clock: it has replica.lag.time.max.ms to fetch.
            self.replicas = {r: ReplicaState(last_caught_up_time_ms=now_ms)
                             for r in self.assignment if r != self.local_broker_id}  # fmt: skip
        moved = self.maybe_increment_leader_hw()
        self._check()
        return moved

    def make_follower(self, leader_id: int, leader_epoch: int, isr, assignment, zk_version: int,
                      log_start_offset: int, log_end_offset: int, high_watermark: int,
                      controller_epoch: int = -1) -> None:  # fmt: skip
        assert leader_id != self.local_broker_id
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.controller_epoch = controller_epoch
        self.assignment = tuple(assignment)
        self.isr = frozenset(isr)
        self.zk_version = zk_version
        self.pending_isr = None
        self.replicas = {}
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        self.high_watermark = max(log_start_offset, min(high_watermark, log_end_offset))
        self._check()

    # -- leader: appends and follower fetches -------------------------------------------------

    def on_local_append(self, log_end_offset: int) -> bool:
        """The leader appended; True when the high watermark moved."""
        if not self.is_leader:
            raise NotLeaderError(f"{self.topic}-{self.partition} is led by {self.leader_id}")
        assert log_end_offset >= self.log_end_offset
        if log_end_offset != self.log_end_offset:
            for replica in self.replicas.values():  # no longer at the end: each fetch counts
                replica.unpark()
        self.log_end_offset = log_end_offset
        moved = self.maybe_increment_leader_hw()
        self._check()
        return moved

    def update_follower_fetch_state(self, replica_id: int, fetch_offset: int, now_ms: int,
                                    log_start_offset: int = -1,
                                    session: FollowerFetchSession | None = None,
                                    ) -> tuple[bool, IsrUpdate | None]:  # fmt: skip
        """A follower fetched at `fetch_offset` (its log end offset). Returns (HW moved, ISR
        expansion to write or None). As Kafka's updateFetchState: a follower is caught up
        when it reaches the leader's end, or the end the leader had at its previous fetch.
        With `session` (its incremental fetch session), a member of the ISR left at the
        leader's end is held by the session: its later fetches count for this partition
        without naming it (FollowerFetchSession)."""
        if not self.is_leader:
            raise NotLeaderError(f"{self.topic}-{self.partition} is led by {self.leader_id}")
        replica = self.replicas.get(replica_id)
        if replica is None:
            return False, None  # not an assigned replica (e.g. removed by reassignment)
        replica.unpark()  # its session's earlier fetches first: this one follows them
        if (fetch_offset == replica.log_end_offset >= self.log_end_offset
                and log_start_offset == replica.log_start_offset and replica_id in self.isr):  # fmt: skip
            # An idle partition of a sessionless fetch (which names them all): a member
            # still at the leader's end. Only its times move; the HW and the ISR cannot.
            replica.last_caught_up_time_ms = max(replica.last_caught_up_time_ms, now_ms)
            replica.last_fetch_leader_log_end_offset = self.log_end_offset
            replica.last_fetch_time_ms = now_ms
            replica.fetch_session = session
            return False, None
        if fetch_offset >= self.log_end_offset:
            replica.last_caught_up_time_ms = max(replica.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= replica.last_fetch_leader_log_end_offset:
            replica.last_caught_up_time_ms = max(replica.last_caught_up_time_ms,
                                                 replica.last_fetch_time_ms)  # fmt: skip
        replica.last_fetch_leader_log_end_offset = self.log_end_offset
        replica.last_fetch_time_ms = now_ms
        replica.log_end_offset = fetch_offset
        replica.log_start_offset = log_start_offset
        update = self.maybe_expand_isr(replica_id)
        moved = self.maybe_increment_leader_hw()
        if fetch_offset >= self.log_end_offset and replica_id in self.isr:
            replica.fetch_session = session
        self._check()
        return moved, update

    def on_follower_forgot(self, replica_id: int,
                           session: FollowerFetchSession | None = None) -> None:  # fmt: skip
        """The follower's `session` (None: any) no longer names this partition: its fetches
        stop counting for it."""
        replica = self.replicas.get(replica_id)
        if replica is not None and (session is None or replica.fetch_session is session):
            replica.unpark()

    def maybe_expand_isr(self, replica_id: int) -> IsrUpdate | None:
        """Add a follower that reached the HW and the start of this leader's epoch."""
        if replica_id in self.isr or self.pending_isr is not None:
            return None
        replica = self.replicas.get(replica_id)
        if replica is None or replica.log_end_offset < self.high_watermark:
            return None
        if replica.log_end_offset < self.leader_epoch_start_offset:
            return None  # it must have replicated this epoch's start (TLA+ rule, KIP-320)
        return self._propose(sorted(self.isr | {replica_id}),
                             f"replica {replica_id} caught up to {replica.log_end_offset}")  # fmt: skip

    def maybe_shrink_isr(self, now_ms: int, lag_time_max_ms: int) -> IsrUpdate | None:
        """Drop followers that have not caught up for `replica.lag.time.max.ms`."""
        if not self.is_leader or self.pending_isr is not None:
            return None
        out = sorted(r for r in self.isr if r != self.local_broker_id and
                     now_ms - self.replicas.get(r, ReplicaState()).caught_up_time_ms()
                     > lag_time_max_ms)  # fmt: skip
        if not out:
            return None
        return self._propose(sorted(self.isr - set(out)),
                             f"replicas {out} lagged more than {lag_time_max_ms} ms")  # fmt: skip

    def _propose(self, isr: list[int], reason: str) -> IsrUpdate:
        self.pending_isr = tuple(isr)
        return IsrUpdate(self.topic, self.partition, self.local_broker_id, self.leader_epoch,
                         tuple(isr), self.zk_version, reason)  # fmt: skip

    def on_isr_update_succeeded(self, isr: tuple[int, ...], zk_version: int) -> bool:
        """The znode now holds `isr` at `zk_version`. True when the HW moved."""
        self.pending_isr = None
        if not self.is_leader:
            return False
        self.isr = frozenset(isr)
        self.zk_version = zk_version
        moved = self.maybe_increment_leader_hw()
        self._check()
        return moved

    def on_isr_update_failed(self, zk_version: int | None = None) -> bool:
        """The conditional write lost (the controller changed the state): retry later with
        the version re-read, or wait for the controller's LeaderAndIsr. A failed expansion no
        longer holds the HW to the member it would have added: recomputed now (True when it
        moved), as the next append or moving fetch would; members idle at the leader's end
        take the shortcut in update_follower_fetch_state and never recompute it, so a
        failed expansion of a replica that then died left the HW, and acks=all produces,
        waiting for the next append."""
        self.pending_isr = None
        if zk_version is not None:
            self.zk_version = zk_version
        return self.maybe_increment_leader_hw()

    def maybe_increment_leader_hw(self) -> bool:
        """HW = the smallest log end offset in the maximal ISR (the committed ISR and any
        member a pending expansion adds); it only moves forward. Counting the pending member:
        once the write lands the controller may elect it, so it must hold everything below
        the HW (it had reached the HW when proposed, so this never lowers the HW)."""
        if not self.is_leader:
            return False
        candidate = self.log_end_offset
        for r in self.isr.union(self.pending_isr or ()):
            if r != self.local_broker_id:
                candidate = min(candidate, self.replicas.get(r, ReplicaState()).log_end_offset)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    # -- follower ------------------------------------------------------------------------------

    def on_follower_append(self, log_end_offset: int, leader_high_watermark: int) -> bool:
        """The follower appended what it fetched: HW = min(leader's HW, own log end)."""
        assert not self.is_leader
        self.log_end_offset = log_end_offset
        # It may move back: a new leader can know a lower HW than the follower was told.
        new_hw = max(self.log_start_offset, min(leader_high_watermark, log_end_offset))
        moved = new_hw != self.high_watermark
        self.high_watermark = new_hw
        self._check()
        return moved

    def on_follower_truncated(self, log_start_offset: int, log_end_offset: int) -> None:
        assert not self.is_leader
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        self.high_watermark = max(log_start_offset, min(self.high_watermark, log_end_offset))
        self._check()

    def on_log_start_offset(self, log_start_offset: int) -> None:
        """Retention or DeleteRecords moved the log start (never past the high watermark)."""
        assert log_start_offset <= self.high_watermark
        self.log_start_offset = log_start_offset
        self._check()

    def low_watermark(self) -> int:
        """Kafka's low watermark as DeleteRecords waits for it: the lowest log start offset
        of the ISR's replicas (this leader's own, and each follower's from its last fetch)."""
        assert self.is_leader
        starts = [self.log_start_offset]
        starts += [self.replicas[b].log_start_offset for b in self.isr
                   if b != self.local_broker_id and b in self.replicas]  # fmt: skip
        return min(starts)

    def in_sync_count(self) -> int:
        return len(self.isr)

    def _check(self) -> None:
        assert self.log_start_offset <= self.high_watermark <= self.log_end_offset, (
            self.topic, self.partition, self.log_start_offset, self.high_watermark,
            self.log_end_offset,
        )  # fmt: skip
        if self.is_leader:
            assert self.local_broker_id in self.isr, (self.tp, self.isr)
            assert not self.assignment or self.isr <= set(self.assignment), (self.tp, self.isr)
