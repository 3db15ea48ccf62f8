"""ReplicaHost: the replica core over this broker's logs, without an event loop. What the broker
runtime (replica_manager.py) and the simulator's broker (tests/sim/broker.py) share.

It carries out a Ready's log actions and follower appends on the LogManager and reports each
outcome back to the core, then hands the rest of the Ready to its runtime through the hooks
below (ISR writes, produce answers, waking fetches, fetch sessions, a wake-up time). It also
does the steps that need the logs beside the core: opening the logs a LeaderAndIsr names, a
leader's append (the producer state's verdict and the log's errors as error codes), a fetch's
read, retention. Both runtimes also take from here what they would otherwise each state: the
core's and the logs' settings from a BrokerConfig, the table of periodic jobs, a Fetch's reads
with DelayedFetch's verdict, and the ISR write's sequence (the conditional write, a clash or a
lost answer read back once, then unknown: the core asks again). Rules: nothing here decides
(the core does), waits, sleeps or sends; time is the runtime's `now_ms`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from localcluster.broker.config import BrokerConfig
from localcluster.broker.log_manager import LogManager
from localcluster.replication import errors
from localcluster.replication import ready as r
from localcluster.replication.partition import FollowerFetchSession, IsrUpdate
from localcluster.replication.replica_core import (
    HostedReplica,
    ReplicaConfig,
    ReplicaCore,
    TopicSettings,
    fetch_answerable,
)
from localcluster.storage import (
    CorruptRecordError,
    LogConfig,
    LogDirectoryFullError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
)
from localcluster.storage.producer_state import DuplicateBatch, RejectedAppend
from localcluster.topic_config import TopicConfig

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# What the log's refusals of a client's batch answer (nothing is appended).
APPEND_ERRORS = ((CorruptRecordError, errors.CORRUPT_MESSAGE),
                 (RecordBatchTooLargeError, errors.MESSAGE_TOO_LARGE),
                 (LogDirectoryFullError, errors.KAFKA_STORAGE_ERROR))  # fmt: skip
# An ISR write's steps: the conditional write, then (its answer lost) reading the state back.
ISR_WRITE, ISR_READ_BACK = "write", "read back"


def replica_config(config: BrokerConfig) -> ReplicaConfig:
    return ReplicaConfig(config.replication_protocol, config.min_insync_replicas,
                         config.replica_lag_time_max_ms, config.replica_fetch_wait_max_ms,
                         message_max_bytes=config.message_max_bytes)  # fmt: skip


def log_config(topic: TopicConfig, segment_index_bytes: int) -> LogConfig:
    """A log's settings from its topic's config. Time and size retention apply only when
    cleanup.policy holds delete, as in Kafka."""
    return LogConfig(segment_bytes=topic.segment_bytes, segment_index_bytes=segment_index_bytes,
                     retention_bytes=topic.retention_bytes if topic.deletes else -1,
                     retention_ms=topic.retention_ms if topic.deletes else -1,
                     segment_ms=topic.segment_ms, log_append_time=topic.log_append_time,
                     reuse_segment_files=not topic.compacts)  # fmt: skip


def write_isr_update(update: IsrUpdate, read_state: Callable[[], tuple | None],
                     write: Callable[[object], int | None]) -> tuple[bool, int | None]:  # fmt: skip
    """The store's side of a leader's ISR write (Kafka's updateLeaderAndIsr): the new state
    keeps the znode's controller epoch, `write(state)` is conditional on the version the
    leader read (None on a clash; it raises when its answer is lost), and a clash is read
    back at once for `IsrUpdate.outcome`. (written, zk_version now)."""
    return write_isr_updates([update], lambda _: [read_state()],
                             lambda states: [write(states[0])])[0]  # fmt: skip


def write_isr_updates(updates: Sequence[IsrUpdate],
                      read_states: Callable[[Sequence[IsrUpdate]], Sequence[tuple | None]],
                      write: Callable[[list], Sequence[int | None]],
                      ) -> list[tuple[bool, int | None]]:  # fmt: skip
    """`write_isr_update` of many partitions at once: their states read together, written
    together (`write(states)`: each conditional on its own update's version, a version or
    None each; it raises when its answer is lost), the clashes read back together."""
    found = read_states(updates)
    versions = write([update.state(state[0].controller_epoch if state else 0)
                      for update, state in zip(updates, found, strict=True)])  # fmt: skip
    clashed = [update for update, version in zip(updates, versions, strict=True)
               if version is None]  # fmt: skip
    read_back = iter(read_states(clashed) if clashed else ())
    return [(True, version) if version is not None else update.outcome(next(read_back))
            for update, version in zip(updates, versions, strict=True)]  # fmt: skip


@dataclass(slots=True)
class LeaderAppendResult:
    """A client's batches on the leader: the answer's fields, what was appended (None when
    nothing was: refused, or a duplicate answered with its first offsets) and whether the
    answer waits for the HW (it comes as a produce answer under the key given)."""

    error: int
    message: str | None = None
    first_offset: int = -1
    log_start_offset: int = -1
    appended: object = None  # storage AppendInfo
    waiting: bool = False
    log_append_time_ms: int = -1  # the leader's stamp under message.timestamp.type=LogAppendTime


@dataclass(slots=True)
class PartitionRead:
    """One partition of a Fetch as the leader reads it."""

    error: int
    high_watermark: int = -1
    log_start_offset: int = -1
    records: tuple = ()  # the log's file slices
    unread: bool = False  # records were there, but the fetch's max_bytes was spent

    @property
    def size(self) -> int:
        return sum(s.length for s in self.records)


class FetchPosition(NamedTuple):
    """One partition of a Fetch: where to read and the most to read of it."""

    tp: TopicPartition
    fetch_offset: int
    current_leader_epoch: int
    log_start_offset: int  # the follower's (-1 from a consumer)
    max_bytes: int


@dataclass(slots=True)
class FetchRead:
    """A Fetch's partitions as the leader read them, in the request's order."""

    partitions: list[PartitionRead]
    bytes_read: int
    failed: bool

    def answerable(self, min_bytes: int) -> bool:
        """DelayedFetch: answer now, or wait (for appends, up to max_wait_ms) and read again."""
        return fetch_answerable(self.failed, self.bytes_read, min_bytes)


class ReplicaHost:
    def __init__(self, broker_id: int, config: ReplicaConfig, log_manager: LogManager):
        self.broker_id = broker_id
        self.core = ReplicaCore(broker_id, config)
        self.log_manager = log_manager

    @property
    def partitions(self) -> dict[TopicPartition, HostedReplica]:
        return self.core.partitions

    def now_ms(self) -> int:
        raise NotImplementedError

    # -- the runtime's hooks: what the rest of a Ready asks --------------------------------------

    def on_log_action(self, action) -> None:
        """Before a log action runs."""

    def on_state_changes(self, changes: list) -> None:
        """A step's state changes, in order (the broker logs many of them together)."""

    def write_isr(self, update: IsrUpdate) -> None:
        """Start the conditional write; report it with core.on_isr_write_result/unknown."""

    def answer_produce(self, key, error: int) -> None:
        pass

    def wake_fetches(self, tps: set[TopicPartition]) -> None:
        """`tps` moved (log end, HW, log start, leadership, ISR): waiting fetches on them read
        again."""

    def on_fetch_sessions(self, leaders: set[int], abandoned: set[int],
                          requests: list) -> None:  # fmt: skip
        """Sessions to poll (or start, or stop), requests in flight given up, requests planned."""

    def wake_at(self, at_ms: int) -> None:
        """Step `tick` no later than this."""

    def note(self, level: int, line: str, reason: object = None) -> None:
        """A line for the operator (the simulator's trace)."""
        log.log(level, "%s (%s)" if reason else "%s", line, *([reason] if reason else []))

    # -- carrying out a Ready --------------------------------------------------------------------

    def execute(self, ready: r.Ready) -> None:
        if ready is r.EMPTY:
            return
        for action in ready.log_actions:
            self.on_log_action(action)
            self.log_manager.apply(action)
        if self.log_manager.log_starts_moved:
            self.log_manager.log_starts_moved = False
            self.checkpoint_log_start_offsets()
        for append in ready.follower_appends:
            failure = self.log_manager.append_as_follower(append)
            self.execute(self.core.on_follower_append_failed(append.tp, failure, self.now_ms())
                         if failure else
                         self.core.on_follower_appended(append.tp, append.leader_high_watermark,
                                                        append.leader_log_start_offset))  # fmt: skip
        if ready.state_changes:
            self.on_state_changes(ready.state_changes)
        for update in ready.isr_writes:
            self.write_isr(update)
        for key, error in ready.produce_answers:
            self.answer_produce(key, error)
        if ready.wake_fetches:
            self.wake_fetches(ready.wake_fetches)
        if ready.fetch_sessions or ready.abandoned or ready.requests:
            self.on_fetch_sessions(ready.fetch_sessions, ready.abandoned, ready.requests)
        if ready.wakeup_at_ms is not None:
            self.wake_at(ready.wakeup_at_ms)

    def tick(self, now_ms: int) -> None:
        """A produce's deadline or an ISR write's retry may be due."""
        self.execute(self.core.expire_produces(now_ms))
        self.execute(self.core.retry_isr_writes(now_ms))

    def periodic_jobs(self, config: BrokerConfig) -> list[tuple[int, Callable[[], None]]]:
        """(interval ms, job): the broker's periodic work, which each runtime schedules."""
        return [(config.replica_high_watermark_checkpoint_interval_ms,
                 self.checkpoint_high_watermarks),
                # Kafka's recovery-point checkpoint: the HW has its own job above
                (config.log_flush_offset_checkpoint_interval_ms,
                 self.checkpoint_recovery_points),
                (self.core.config.isr_shrink_interval_ms, self.maybe_shrink_isr),
                (config.log_retention_check_interval_ms, self.check_retention)]  # fmt: skip

    def maybe_shrink_isr(self) -> None:
        self.execute(self.core.maybe_shrink_isr(self.now_ms()))

    # -- ISR writes ------------------------------------------------------------------------------

    def on_isr_write_answered(self, update: IsrUpdate, ok: bool, zk_version: int | None) -> None:
        self.execute(self.core.on_isr_write_result(update, ok, zk_version))

    def on_isr_write_unanswered(self, update: IsrUpdate, step: str, reason: object) -> str | None:
        """The store did not answer `step` (the write may have landed): after the write, read
        the state back (the next step, returned); after the read-back too, the outcome is
        unknown and the core asks again after isr_write_retry_ms (None: nothing to send)."""
        tp = f"{update.topic}-{update.partition}"
        if step == ISR_WRITE:
            self.note(logging.INFO, f"isr write {list(update.isr)} for {tp} unanswered: reading "
                      f"the state back", reason)  # fmt: skip
            return ISR_READ_BACK
        self.note(logging.WARNING, f"isr read-back for {tp} unanswered: outcome unknown, asking "
                  f"again", reason)  # fmt: skip
        self.execute(self.core.on_isr_write_unknown(update, self.now_ms()))
        return None

    # -- logs and checkpoints --------------------------------------------------------------------

    def open_logs(self, topic_configs: Mapping[str, TopicConfig] | None = None) -> None:
        """Open (and recover) every partition log in the data dir, each with its topic's
        config where `topic_configs` has it."""
        self.core.open_logs(self.log_manager.logs, self.log_manager.open_logs(topic_configs))

    def checkpoint_high_watermarks(self) -> None:
        self.log_manager.write_high_watermarks(self.core.checkpoint_high_watermarks())

    def checkpoint_recovery_points(self) -> None:
        self.log_manager.checkpoint_recovery_points()

    def checkpoint_log_start_offsets(self) -> None:
        """A log start moved: written at once, not only by the periodic checkpoint as Kafka
        does, so that a kill -9 right after a DeleteRecords answer does not bring the deleted
        records back (the runtime writes it on its checkpoint thread)."""
        self.log_manager.checkpoint_log_start_offsets()

    def close(self) -> None:
        """A clean shutdown: flush, both checkpoints, close every log."""
        self.log_manager.close(self.core.checkpoint_high_watermarks())
        self.partitions.clear()

    def check_retention(self) -> None:
        """Retention by the wall clock: segment timestamps are wall-clock (the runtime's)."""
        self.retention(self.log_manager.wall_clock_ms())

    def retention(self, now_ms: int) -> list[TopicPartition]:
        """Delete old segments below the HW (log.retention.*); the partitions whose start moved."""
        hws = {tp: h.state.high_watermark for tp, h in self.partitions.items()}
        moved = self.log_manager.delete_old_segments(now_ms, hws)
        for tp in moved:
            self.core.on_log_start_offset(tp)
            self.note(logging.INFO, f"{tp[0]}-{tp[1]}: retention moved the log start to "
                      f"{self.log_manager.logs[tp].log_start_offset}")  # fmt: skip
        if moved:
            self.wake_fetches(set(moved))  # the fetch sessions answer the new start
        self.log_manager.expire_producers()
        return moved

    # -- LeaderAndIsr and StopReplica ------------------------------------------------------------

    def topics_to_configure(self, partition_states: Iterable) -> set[str]:
        """The topics whose configs a LeaderAndIsr needs: those of the partitions this broker
        does not host yet (as Kafka reads a topic's config when it creates the partition).
        A hosted partition's configs are current: AlterConfigs reaches it through
        `apply_topic_config`. Reading every topic's config for every request made a new
        controller's full LeaderAndIsr wait for the store, behind the controller's own
        ISR writes, on every broker (0.3-0.6 s at 1,000 partitions)."""
        return {state.topic for state in partition_states
                if (state.topic, state.partition) not in self.partitions}  # fmt: skip

    def lead_or_follow(self, controller_epoch: int, partition_states: Iterable,
                       topic_configs: Mapping[str, TopicConfig] | None = None) -> r.LeaderAndIsrResult:  # fmt: skip
        """Open the logs the request starts hosting (with their topics' configs; a log opened
        at start-up gets its topic's config here), then the core's step with each topic's
        min.insync.replicas and max.message.bytes."""
        configs = topic_configs or {}
        states = tuple(partition_states)
        for tp in self.core.missing_logs(controller_epoch, states):
            self.core.add_log(tp, self.log_manager.get_or_create(tp, configs.get(tp[0])))
        for state in states:
            if state.topic in configs:
                self.log_manager.configure((state.topic, state.partition), configs[state.topic])
        settings = {topic: TopicSettings(c.min_insync_replicas, c.max_message_bytes)
                    for topic, c in configs.items()}  # fmt: skip
        ready = self.core.become_leader_or_follower(controller_epoch, states, self.now_ms(),
                                                    settings)  # fmt: skip
        self.execute(ready)
        return ready.response

    def apply_topic_config(self, topic: str, config: TopicConfig) -> None:
        """A live config change of `topic`: its logs (segment size, retention) and the core's
        per-topic settings take it."""
        for tp in [tp for tp in self.partitions if tp[0] == topic]:
            self.log_manager.configure(tp, config)
        self.core.update_topic_settings(topic, TopicSettings(config.min_insync_replicas,
                                                             config.max_message_bytes))  # fmt: skip

    def stop(self, controller_epoch: int, tps, delete: bool) -> r.LeaderAndIsrResult:
        ready = self.core.stop_replicas(controller_epoch, tps, delete, self.now_ms())
        self.execute(ready)
        return ready.response

    # -- leader: produce and fetch ---------------------------------------------------------------

    def append_to_leader(self, tp: TopicPartition, records, acks: int, timeout_ms: int,
                         key_for: Callable[[int], object]) -> LeaderAppendResult:  # fmt: skip
        """The core's checks, the producer state's verdict and the append; `key_for(first
        offset)` names the produce if it waits for the HW."""
        append = self.core.prepare_leader_append(tp, acks, records)
        if isinstance(append, r.ProduceAnswer):
            return LeaderAppendResult(append.error, append.message)
        try:
            info = self.log_manager.append_as_leader(tp, records, append.leader_epoch)
        except tuple(e for e, _ in APPEND_ERRORS) as e:
            log.info("%s-%d: batch refused: %s", *tp, e)
            return LeaderAppendResult(next(c for t, c in APPEND_ERRORS if isinstance(e, t)), str(e))
        if isinstance(info, RejectedAppend):
            return LeaderAppendResult(info.error_code, info.message)
        duplicate = isinstance(info, DuplicateBatch)
        if duplicate:
            # A retry of one of the producer's last 5 batches: nothing appended, answered with
            # the offsets it got the first time (with acks=all once those are committed).
            log.debug("%s-%d: producer %d resent the batch at %d; answered as a duplicate",
                      *tp, info.producer_id, info.first_offset)  # fmt: skip
        result = LeaderAppendResult(errors.NONE, None, info.first_offset,
                                    self.log_manager.logs[tp].log_start_offset,
                                    None if duplicate else info)  # fmt: skip
        if not duplicate and self.log_manager.logs[tp].config.log_append_time:
            result.log_append_time_ms = info.max_timestamp
        ready = self.core.on_leader_appended(append, acks, info.last_offset,
                                             key_for(info.first_offset),
                                             self.now_ms() + max(timeout_ms, 0))  # fmt: skip
        self.execute(ready)
        if ready.response is None:
            result.waiting = True
        else:
            result.error, result.message = ready.response.error, ready.response.message
        return result

    def read_fetch(self, replica_id: int, positions: Sequence[FetchPosition], max_bytes: int,
                   record: bool, session: FollowerFetchSession | None = None) -> FetchRead:  # fmt: skip
        """A Fetch's reads: a follower's (replica_id >= 0) to the log end, a consumer's to the
        HW; at most `max_bytes` in all (<= 0: no bound), at least one batch of the first
        partition with data (KIP-74). `record` (a fetch's first read, not a re-read after a
        wait): the follower's positions go to the core first, which may move the HW or
        expand the ISR. `session`: the follower's incremental fetch session, which names
        only what changed; its fetch counts for the partitions it holds idle too."""
        follower = replica_id >= 0
        if follower and record:
            fetched = ((p.tp, p.fetch_offset, p.current_leader_epoch, p.log_start_offset)
                       for p in positions)  # fmt: skip
            self.execute(self.core.record_follower_fetch(replica_id, fetched, self.now_ms(),
                                                         session))  # fmt: skip
        budget = max_bytes if max_bytes > 0 else 1 << 30
        out, total, failed = [], 0, False
        for p in positions:
            read = self.read_partition(p.tp, p.fetch_offset, min(p.max_bytes, budget), follower,
                                       p.current_leader_epoch, first=(total == 0))  # fmt: skip
            failed |= read.error != errors.NONE
            size = read.size
            total += size
            budget = max(budget - size, 0)
            out.append(read)
        return FetchRead(out, total, failed)

    def read_partition(self, tp: TopicPartition, fetch_offset: int, max_bytes: int,
                       follower: bool, current_leader_epoch: int, first: bool) -> PartitionRead:  # fmt: skip
        """Whole batches from `fetch_offset`: to the log end for a follower, the HW for a
        consumer; at least one batch when `first` (KIP-74), none when the budget is gone."""
        error, hosted = self.core.leader_for(tp, current_leader_epoch)
        if hosted is None:
            return PartitionRead(error)
        lg, hw = self.log_manager.logs[tp], hosted.state.high_watermark
        found = PartitionRead(errors.NONE, hw, lg.log_start_offset)
        end = lg.log_end_offset if follower else hw
        if fetch_offset == lg.log_end_offset:
            return found  # nothing to read: an idle partition costs no lookup
        if max_bytes <= 0 and not first:
            found.unread = fetch_offset < end
            return found
        try:
            result = lg.read(fetch_offset, max(max_bytes, 1), None if follower else hw, first)
        except OffsetOutOfRangeError:
            found.error = errors.OFFSET_OUT_OF_RANGE
            return found
        found.records = result.slices
        return found
