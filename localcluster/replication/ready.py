"""What one step of the replica core asks of its runtime: the `Ready` (etcd raft's name), and the
typed actions, requests and state changes it carries.

A step of `ReplicaCore` (an event and the time in, one Ready out) never does I/O; the runtime
carries the Ready out in the order of its fields, and reports what only I/O can tell (an
append's offsets, an ISR write's outcome, a leader's answer) as the next step:
1. `log_actions`, in order: AssignEpoch, TruncateTo, TruncateFullyAndStartAt,
   IncrementLogStartOffset, DeleteLog. The
   core has already counted their effect on the partition's offsets (a truncation's result is
   known), so they run before anything else and before the next step.
2. `follower_appends`: append each to the follower's log, then report it
   (`on_follower_appended`, or `on_follower_append_failed`: an append can fail).
3. `state_changes`: Leading, Following, Truncated, ... for the log (Kafka's state-change.log).
4. `isr_writes`: conditional writes of the partition state znode; report each outcome.
5. `produce_answers`: (key, error code) of parked produces that completed, keys as parked.
6. `wake_fetches`: the partitions whose log end, HW, log start, leadership or ISR moved:
   parked (long-polling) fetches watching them read again, and a fetch session reads them
   at its next fetch (it reads only what changed or what its follower names).
7. `fetch_sessions`: leaders whose fetch session may send now: poll them (a runtime starts a
   fetcher for a new one); `abandoned`: leaders whose request in flight the core gave up on
   (hang up, so a long poll does not hold the session back). `requests`: what a poll plans.
8. `wakeup_at_ms`: call `tick` no later than this (a produce's deadline, an ISR retry). A
   tick's own Ready names the next deadline still waiting, so one timer, re-armed only for an
   earlier time, serves them all.
9. `response`: the answer to the request this step handled (LeaderAndIsr, StopReplica,
   a produce answered at once).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from localcluster.replication.partition import IsrUpdate

TopicPartition = tuple[str, int]
LATEST_TIMESTAMP = -1  # ListOffsets: the log end (for a replica)
EARLIEST_TIMESTAMP = -2  # ListOffsets: the log start

# -- log actions --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AssignEpoch:
    """Record in the leader epoch cache that `leader_epoch` starts at `start_offset`."""

    tp: TopicPartition
    leader_epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class TruncateTo:
    """Cut the log's end to `offset` (below the current end, at or above the start)."""

    tp: TopicPartition
    offset: int


@dataclass(frozen=True, slots=True)
class TruncateFullyAndStartAt:
    """Empty the log; it continues at `offset`."""

    tp: TopicPartition
    offset: int


@dataclass(frozen=True, slots=True)
class IncrementLogStartOffset:
    """Move the log's start up to `offset` (at most the HW): DeleteRecords on the leader, the
    leader's start learnt from a fetch on a follower. The runtime checkpoints it."""

    tp: TopicPartition
    offset: int


@dataclass(frozen=True, slots=True)
class DeleteLog:
    """StopReplica with delete: remove the log and its files."""

    tp: TopicPartition


@dataclass(frozen=True, slots=True)
class FollowerAppend:
    """Append whole fetched batches (maybe none) to a follower's log, then report it."""

    tp: TopicPartition
    records: object  # bytes-like, whole batches only
    leader_high_watermark: int
    leader_log_start_offset: int = -1


# -- requests a fetch session sends to its leader, and what comes back ---------------------------
# An answer is reported with the plan object it answers: the session matches it by identity.


@dataclass(frozen=True, slots=True)
class FetchPartitionPlan:
    tp: TopicPartition
    fetch_offset: int  # the follower's log end
    current_leader_epoch: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class FetchRequestPlan:
    """Fetch(replica_id) of every partition of the session ready to fetch."""

    leader_id: int
    partitions: tuple[FetchPartitionPlan, ...]
    max_wait_ms: int


@dataclass(frozen=True, slots=True)
class EpochAsk:
    """Where does `leader_epoch` end in the leader's log of `tp`?"""

    tp: TopicPartition
    current_leader_epoch: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class EpochRequestPlan:
    """OffsetForLeaderEpoch(replica_id) of every partition of the session being truncated:
    one request for all of them, as Kafka's fetcher asks (a broker that follows a new leader
    in 2,000 partitions after a failover asks once, not 2,000 times one after the other)."""

    leader_id: int
    partitions: tuple[EpochAsk, ...]


@dataclass(frozen=True, slots=True)
class EpochAnswer:
    """One partition of an OffsetForLeaderEpoch answer, as a follower got it."""

    tp: TopicPartition
    error: int
    leader_epoch: int = -1
    end_offset: int = -1


@dataclass(frozen=True, slots=True)
class ListOffsetsPlan:
    """ListOffsets(replica_id) at LATEST_TIMESTAMP or EARLIEST_TIMESTAMP."""

    leader_id: int
    tp: TopicPartition
    timestamp: int


FetcherRequest = FetchRequestPlan | EpochRequestPlan | ListOffsetsPlan


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a Fetch answer, as a follower got it."""

    tp: TopicPartition
    error: int
    high_watermark: int = -1
    log_start_offset: int = -1
    records: object = b""


# -- answers ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaderAndIsrResult:
    """LeaderAndIsr's and StopReplica's answer: an error, or one error code per partition."""

    error: int
    partition_errors: tuple[tuple[TopicPartition, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ProduceAnswer:
    error: int
    message: str | None = None


# -- state changes (what Kafka writes to state-change.log) --------------------------------------


@dataclass(frozen=True, slots=True)
class Leading:
    tp: TopicPartition
    leader_epoch: int
    isr: tuple[int, ...]
    log_start_offset: int
    log_end_offset: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class Following:
    tp: TopicPartition
    leader: int
    leader_epoch: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class Truncated:
    tp: TopicPartition
    offset: int  # where the follower decided to cut
    previous_end_offset: int
    log_end_offset: int  # where the cut landed (whole batches go: at or below `offset`)


@dataclass(frozen=True, slots=True)
class StartingOver:
    """The leader's log starts past this follower's end: the follower empties its log."""

    tp: TopicPartition
    leader: int
    offset: int
    previous_end_offset: int


@dataclass(frozen=True, slots=True)
class EpochAnswered:
    """A leader's OffsetForLeaderEpoch answer, and where the follower cuts for it."""

    tp: TopicPartition
    leader: int
    asked_epoch: int
    leader_epoch: int
    end_offset: int
    cut_at: int
    next_epoch: int | None  # KIP-279: the epoch asked about next, None when done


@dataclass(frozen=True, slots=True)
class TruncationDone:
    tp: TopicPartition
    leader: int
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class OutOfRange:
    """The follower's fetch offset is outside the leader's log: it asks where the log ends."""

    tp: TopicPartition
    leader: int


@dataclass(frozen=True, slots=True)
class LeaderError:
    """A leader answered a follower's request with an error: the partition backs off."""

    tp: TopicPartition
    leader: int
    request: str  # "Fetch", "OffsetForLeaderEpoch", "ListOffsets"
    error: int


@dataclass(frozen=True, slots=True)
class AppendFailed:
    tp: TopicPartition
    reason: str


@dataclass(frozen=True, slots=True)
class IsrProposed:
    update: IsrUpdate
    isr: tuple[int, ...]  # the ISR before the change


@dataclass(frozen=True, slots=True)
class IsrChanged:
    tp: TopicPartition
    previous_isr: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Stopped:
    tp: TopicPartition
    deleted: bool


@dataclass(frozen=True, slots=True)
class LeaderAndIsrRejected:
    controller_epoch: int
    current_controller_epoch: int


@dataclass(frozen=True, slots=True)
class PartitionStateIgnored:
    tp: TopicPartition
    leader_epoch: int
    current_leader_epoch: int


# -- the Ready ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Ready:
    log_actions: list = field(default_factory=list)
    follower_appends: list[FollowerAppend] = field(default_factory=list)
    state_changes: list = field(default_factory=list)
    isr_writes: list[IsrUpdate] = field(default_factory=list)
    produce_answers: list[tuple[object, int]] = field(default_factory=list)
    wake_fetches: set[TopicPartition] = field(default_factory=set)
    fetch_sessions: set[int] = field(default_factory=set)
    abandoned: set[int] = field(default_factory=set)
    requests: list = field(default_factory=list)
    wakeup_at_ms: int | None = None
    response: object = None

    def wake_at(self, at_ms: int) -> None:
        if self.wakeup_at_ms is None or at_ms < self.wakeup_at_ms:
            self.wakeup_at_ms = at_ms


EMPTY = Ready()  # what a step that asks nothing returns; never filled in
