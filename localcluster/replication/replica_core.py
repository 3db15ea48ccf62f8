"""ReplicaCore: what a broker decides about the partitions it hosts. Sans-I/O: the decisions of
Kafka's ReplicaManager (and ReplicaFetcherManager, through `FetchSessions`).

It holds a `Partition` per hosted replica (HW, ISR, epochs), the commit queue
(`ProducePurgatory`), the fetch sessions of the partitions it follows and the pending ISR
writes. Each step takes an event and the time and returns one `Ready` (ready.py says how the
runtime carries it out); the runtime (broker/replica_manager.py, replica_fetcher.py, or the
simulator in tests/sim) owns sockets, files, timers and the loop, and reports outcomes back as
the next step. The core reads a log only through `ReplicaLog` (as etcd raft reads its
Storage) and changes one only through log actions.

Rules it owns:
- LeaderAndIsr and StopReplica are fenced by the request's controller epoch (broker-wide, as
  ReplicaManager.becomeLeaderOrFollower), then each partition state by its leader epoch and
  zkVersion (`Partition.is_newer_state`); the Partition records the partition state's own
  controller epoch (Partition.makeLeader).
- A partition is created over its log with the checkpointed HW (`Partition.create`).
- Reads and OffsetForLeaderEpoch are fenced by the leader epoch the requester knows.
- A follower's fetch moves the leader's HW and may expand the ISR; ISR changes are
  conditional writes, and one whose outcome is unknown is asked again after
  `isr_write_retry_ms`, while the proposal stays pending (the HW counts the member it adds).
- acks=all produces wait in the purgatory until the HW passes them.
Appends are two steps: `prepare_leader_append` checks and says where to append,
`on_leader_appended` takes the outcome; a follower's fetched batches come back as
FollowerAppend and `on_follower_appended`. Per-partition producer state (issue 14) plugs in
there: the leader's check in `prepare_leader_append` (a rejection or a duplicate's answer
instead of a LeaderAppend), its update in `on_leader_appended` and `on_follower_appended`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from localcluster.replication import errors
from localcluster.replication.delayed_produce import ProducePurgatory, ProducePurgatoryFullError
from localcluster.replication.fetch_sessions import FetchSessions, truncate_follower
from localcluster.replication.partition import FollowerFetchSession, IsrUpdate, Partition
from localcluster.replication.ready import (
    EARLIEST_TIMESTAMP,
    EMPTY,
    LATEST_TIMESTAMP,
    AssignEpoch,
    DeleteLog,
    Following,
    IncrementLogStartOffset,
    IsrChanged,
    IsrProposed,
    LeaderAndIsrRejected,
    LeaderAndIsrResult,
    Leading,
    PartitionStateIgnored,
    ProduceAnswer,
    Ready,
    Stopped,
    TopicPartition,
)
from localcluster.storage import record_batch as rb

LEADER_EPOCH = "leader-epoch"
HW_TRUNCATION = "hw-truncation"
ANSWERED = ProduceAnswer(errors.NONE)


class ReplicaLog(Protocol):
    """What the core reads of a partition's log (offsets, the leader epoch cache, where a cut
    would land, the time index); storage.Log is one. Reads only: changes are log actions."""

    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def latest_epoch(self) -> int: ...
    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]: ...
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None: ...
    def truncation_offset(self, offset: int) -> int: ...


class PartitionStateLike(Protocol):
    """A LeaderAndIsr partition state (protocol.controller_requests.PartitionState is one)."""

    topic: str
    partition: int
    controller_epoch: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    zk_version: int
    replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """The broker settings the core decides with (Kafka's names; fetch_backoff_ms is
    replica.fetch.backoff.ms, scaled down as the fetcher always had it)."""

    replication_protocol: str = LEADER_EPOCH
    min_insync_replicas: int = 1
    replica_lag_time_max_ms: int = 30_000
    replica_fetch_wait_max_ms: int = 500
    fetch_backoff_ms: int = 50
    append_failure_backoff_ms: int = 1000
    isr_write_retry_ms: int = 500
    message_max_bytes: int = 1_048_588

    def __post_init__(self):
        assert self.replication_protocol in (LEADER_EPOCH, HW_TRUNCATION)

    @property
    def isr_shrink_interval_ms(self) -> int:
        """How often the leader looks for lagging followers (Kafka: lag max / 2)."""
        return max(self.replica_lag_time_max_ms // 2, 10)


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """A topic's settings the core enforces (from its TopicConfig)."""

    min_insync_replicas: int
    max_message_bytes: int


@dataclass(slots=True)
class HostedReplica:
    state: Partition
    log: ReplicaLog
    min_insync_replicas: int
    max_message_bytes: int


@dataclass(frozen=True, slots=True)
class LeaderAppend:
    """Go ahead: append to `tp`'s log as leader in `leader_epoch`, then report the outcome."""

    tp: TopicPartition
    leader_epoch: int


def fetch_answerable(has_error: bool, bytes_read: int, min_bytes: int) -> bool:
    """Kafka's DelayedFetch: answer at once on an error or once min_bytes (at least one) are
    there; otherwise the fetch waits until its max_wait_ms is over."""
    return has_error or bytes_read >= max(min_bytes, 1)


class ReplicaCore:
    def __init__(self, broker_id: int, config: ReplicaConfig):
        self.broker_id = broker_id
        self.config = config
        self.controller_epoch = -1
        self.partitions: dict[TopicPartition, HostedReplica] = {}
        self.purgatory = ProducePurgatory()
        self.fetch_sessions = FetchSessions(self.partitions, config.replica_fetch_wait_max_ms,
                                            config.fetch_backoff_ms,
                                            config.append_failure_backoff_ms)  # fmt: skip
        self._logs: dict[TopicPartition, ReplicaLog] = {}
        self._checkpointed_hw: dict[TopicPartition, int] = {}
        self._isr_retries: list[tuple[int, IsrUpdate]] = []  # (due ms, update), one per partition
        self._ready: Ready | None = None

    # -- the Ready accumulator -------------------------------------------------------------------

    def _out(self) -> Ready:
        if self._ready is None:
            self._ready = Ready()
        return self._ready

    def _take(self) -> Ready:
        ready, self._ready = self._ready, None
        return EMPTY if ready is None else ready

    # -- logs and checkpoints --------------------------------------------------------------------

    def open_logs(self, logs: Mapping[TopicPartition, ReplicaLog],
                  checkpointed_high_watermarks: Mapping[TopicPartition, int]) -> None:  # fmt: skip
        """At startup: the logs found on disk and the HW checkpoint file's contents."""
        self._logs.update(logs)
        self._checkpointed_hw.update(checkpointed_high_watermarks)

    def add_log(self, tp: TopicPartition, log: ReplicaLog) -> None:
        self._logs[tp] = log

    def update_topic_settings(self, topic: str, settings: TopicSettings) -> None:
        """A topic's config changed live (AlterConfigs): its hosted partitions enforce the new
        min.insync.replicas and max.message.bytes from the next produce on."""
        for tp, hosted in self.partitions.items():
            if tp[0] == topic:
                hosted.min_insync_replicas = settings.min_insync_replicas
                hosted.max_message_bytes = settings.max_message_bytes

    def missing_logs(self, controller_epoch: int,
                     partition_states: Iterable[PartitionStateLike]) -> list[TopicPartition]:  # fmt: skip
        """The partitions a LeaderAndIsr would start hosting that have no log yet: open them
        (`add_log`) before `become_leader_or_follower`."""
        if controller_epoch < self.controller_epoch:
            return []
        return [(s.topic, s.partition) for s in partition_states
                if self._applies(s) == errors.NONE and (s.topic, s.partition) not in self._logs]  # fmt: skip

    def checkpoint_high_watermarks(self) -> Mapping[TopicPartition, int]:
        """What the HW checkpoint file holds now: every hosted HW, and the checkpointed one of
        logs not hosted (yet)."""
        self._checkpointed_hw.update(
            {tp: h.state.high_watermark for tp, h in self.partitions.items()}
        )
        return self._checkpointed_hw

    def on_log_start_offset(self, tp: TopicPartition) -> None:
        """Retention moved the log's start (never past the HW)."""
        hosted = self.partitions[tp]
        hosted.state.on_log_start_offset(hosted.log.log_start_offset)

    # -- LeaderAndIsr and StopReplica ------------------------------------------------------------

    def become_leader_or_follower(self, controller_epoch: int,
                                  partition_states: Iterable[PartitionStateLike], now_ms: int,
                                  topic_settings: Mapping[str, TopicSettings] | None = None) -> Ready:  # fmt: skip
        """`topic_settings`: per topic, what overrides the broker's min.insync.replicas and
        message.max.bytes."""
        ready = self._out()
        if controller_epoch < self.controller_epoch:
            ready.state_changes.append(
                LeaderAndIsrRejected(controller_epoch, self.controller_epoch)
            )
            ready.response = LeaderAndIsrResult(errors.STALE_CONTROLLER_EPOCH)
            return self._take()
        self.controller_epoch = controller_epoch
        results = []
        for state in partition_states:
            tp = (state.topic, state.partition)
            error = self._applies(state)
            if error == errors.NONE:
                settings = (topic_settings or {}).get(state.topic)
                if state.leader == self.broker_id:
                    self._make_leader(tp, state, settings, now_ms, ready)
                else:
                    self._make_follower(tp, state, settings, ready)
            elif error == errors.STALE_CONTROLLER_EPOCH:
                ready.state_changes.append(PartitionStateIgnored(
                    tp, state.leader_epoch, self.partitions[tp].state.leader_epoch))  # fmt: skip
            results.append((tp, error))
        ready.response = LeaderAndIsrResult(errors.NONE, tuple(results))
        return self._take()

    def _applies(self, state: PartitionStateLike) -> int:
        hosted = self.partitions.get((state.topic, state.partition))
        if hosted is not None and not hosted.state.is_newer_state(state.leader_epoch,
                                                                  state.zk_version):  # fmt: skip
            return errors.STALE_CONTROLLER_EPOCH  # Kafka answers an old leader epoch so
        if self.broker_id not in state.replicas:
            return errors.UNKNOWN_TOPIC_OR_PARTITION
        return errors.NONE

    def _hosted(self, tp: TopicPartition, settings: TopicSettings | None) -> HostedReplica:
        hosted = self.partitions.get(tp)
        if hosted is None:
            lg = self._logs[tp]  # missing_logs named it; the runtime opened it
            state = Partition.create(tp[0], tp[1], self.broker_id, lg.log_start_offset,
                                     lg.log_end_offset, self._checkpointed_hw.get(tp, 0))  # fmt: skip
            hosted = HostedReplica(state, lg, self.config.min_insync_replicas,
                                   self.config.message_max_bytes)  # fmt: skip
            self.partitions[tp] = hosted
        if settings is not None:
            hosted.min_insync_replicas = settings.min_insync_replicas
            hosted.max_message_bytes = settings.max_message_bytes
        return hosted

    def _make_leader(
        self, tp, state: PartitionStateLike, settings, now_ms: int, ready: Ready
    ) -> None:
        hosted = self._hosted(tp, settings)
        self.fetch_sessions.remove_partition(tp, ready)
        lg, p = hosted.log, hosted.state
        if state.leader_epoch > lg.latest_epoch:
            ready.log_actions.append(AssignEpoch(tp, state.leader_epoch, lg.log_end_offset))
        moved = p.make_leader(state.leader_epoch, state.isr, state.replicas, state.zk_version,
                              lg.log_start_offset, lg.log_end_offset, p.high_watermark, now_ms,
                              state.controller_epoch)  # fmt: skip
        ready.state_changes.append(Leading(tp, state.leader_epoch, tuple(sorted(p.isr)),
                                           p.log_start_offset, p.log_end_offset, p.high_watermark))  # fmt: skip
        if moved:
            self._high_watermark_moved(hosted, ready)
        ready.wake_fetches.add(tp)

    def _make_follower(self, tp, state: PartitionStateLike, settings, ready: Ready) -> None:
        hosted = self._hosted(tp, settings)
        ready.produce_answers.extend(self.purgatory.on_leadership_lost(tp))
        lg, p = hosted.log, hosted.state
        p.make_follower(state.leader, state.leader_epoch, state.isr, state.replicas,
                        state.zk_version, lg.log_start_offset, lg.log_end_offset, p.high_watermark,
                        state.controller_epoch)  # fmt: skip
        leader_epoch_mode = self.config.replication_protocol == LEADER_EPOCH
        if not leader_epoch_mode:
            # The 0.8 design: cut to the local HW now (KIP-101 shows what this loses).
            truncate_follower(hosted, p.high_watermark, ready)
        ready.state_changes.append(Following(tp, state.leader, state.leader_epoch,
                                             p.log_start_offset, p.log_end_offset, p.high_watermark))  # fmt: skip
        self.fetch_sessions.add_partition(tp, state.leader, state.leader_epoch,
                                          truncating=leader_epoch_mode, ready=ready)  # fmt: skip
        ready.wake_fetches.add(tp)

    def stop_replicas(self, controller_epoch: int, tps: Iterable[TopicPartition], delete: bool,
                      now_ms: int) -> Ready:  # fmt: skip
        """Stop fetching and hosting `tps`; with `delete`, their logs go too."""
        ready = self._out()
        if controller_epoch < self.controller_epoch:
            ready.response = LeaderAndIsrResult(errors.STALE_CONTROLLER_EPOCH)
            return self._take()
        self.controller_epoch = controller_epoch
        results = []
        for tp in tps:
            self.fetch_sessions.remove_partition(tp, ready)
            ready.produce_answers.extend(self.purgatory.on_leadership_lost(tp))
            self.partitions.pop(tp, None)
            deleted = delete and self._logs.pop(tp, None) is not None
            if deleted:
                self._checkpointed_hw.pop(tp, None)
                ready.log_actions.append(DeleteLog(tp))
            ready.state_changes.append(Stopped(tp, deleted))
            ready.wake_fetches.add(tp)
            results.append((tp, errors.NONE))
        ready.response = LeaderAndIsrResult(errors.NONE, tuple(results))
        return self._take()

    # -- leader: produce -------------------------------------------------------------------------

    def prepare_leader_append(self, tp: TopicPartition, acks: int,
                              records) -> LeaderAppend | ProduceAnswer:  # fmt: skip
        """Whether a client's batches may go to this leader's log (issue 14: and the
        producer state's verdict on them)."""
        hosted = self.partitions.get(tp)
        if hosted is None:
            return ProduceAnswer(errors.UNKNOWN_TOPIC_OR_PARTITION)
        p = hosted.state
        if not p.is_leader:
            return ProduceAnswer(errors.NOT_LEADER_OR_FOLLOWER)
        if records is None or not len(records):
            return ProduceAnswer(errors.CORRUPT_MESSAGE, "no records")
        too_large = first_batch_over(records, hosted.max_message_bytes)
        if too_large is not None:
            return ProduceAnswer(errors.MESSAGE_TOO_LARGE, too_large)
        if acks == -1 and p.in_sync_count() < hosted.min_insync_replicas:
            return ProduceAnswer(errors.NOT_ENOUGH_REPLICAS, f"ISR {sorted(p.isr)} has fewer "
                                 f"than min.insync.replicas={hosted.min_insync_replicas}")  # fmt: skip
        return LeaderAppend(tp, p.leader_epoch)

    def on_leader_appended(self, append: LeaderAppend, acks: int, last_offset: int, key,
                           deadline_ms: int) -> Ready:  # fmt: skip
        """The batches are in the log up to `last_offset`. `response` is the answer now, or
        None when the produce waits for the HW (answered later as `key`)."""
        hosted = self.partitions[append.tp]
        p = hosted.state
        ready = self._out()
        if p.on_local_append(hosted.log.log_end_offset):
            self._high_watermark_moved(hosted, ready)
        ready.wake_fetches.add(append.tp)
        required = last_offset + 1
        if acks == -1 and p.high_watermark < required:
            try:
                self.purgatory.park(key, append.tp, required, deadline_ms)
                ready.wake_at(deadline_ms)
            except ProducePurgatoryFullError as e:
                ready.response = ProduceAnswer(errors.REQUEST_TIMED_OUT, str(e))
        else:
            ready.response = ANSWERED
        return self._take()

    def expire_produces(self, now_ms: int) -> Ready:
        """Time out the parked produces whose deadline passed; the Ready's wake-up is the next
        parked produce's deadline, so a runtime needs one timer, not one per produce."""
        expired = self.purgatory.expire(now_ms)
        if expired:
            self._out().produce_answers.extend(expired)
        next_deadline_ms = self.purgatory.next_deadline_ms()
        if next_deadline_ms is not None:
            self._out().wake_at(next_deadline_ms)
        return self._take()

    def _high_watermark_moved(self, hosted: HostedReplica, ready: Ready) -> None:
        p = hosted.state
        ready.produce_answers.extend(self.purgatory.on_high_watermark(
            p.tp, p.high_watermark, p.in_sync_count(), hosted.min_insync_replicas))  # fmt: skip
        ready.wake_fetches.add(p.tp)

    # -- leader: fetches and epochs --------------------------------------------------------------

    def record_follower_fetch(self, replica_id: int, partitions: Iterable[tuple],
                              now_ms: int, session: FollowerFetchSession | None = None) -> Ready:  # fmt: skip
        """A follower fetched (tp, fetch offset, the leader epoch it knows[, its log start
        offset]) for each partition. A moved follower start wakes DeleteRecords' waiters.
        `session`: the follower's incremental fetch session, whose fetch this is: the
        partitions it holds idle (named or not: it names only changes) were fetched too."""
        for tp, fetch_offset, current_leader_epoch, *start in partitions:
            hosted = self.partitions.get(tp)
            if hosted is None or not hosted.state.is_leader:
                continue
            if current_leader_epoch != hosted.state.leader_epoch:
                hosted.state.on_follower_forgot(replica_id)  # a fenced fetch counts for nothing
                continue
            follower = hosted.state.replicas.get(replica_id)
            log_start_offset = start[0] if start else -1
            if follower is not None and follower.log_start_offset != log_start_offset:
                self._out().wake_fetches.add(tp)
            moved, update = hosted.state.update_follower_fetch_state(
                replica_id, fetch_offset, now_ms, log_start_offset, session
            )
            if update is not None:
                self._write_isr(update, self._out())
            if moved:
                self._high_watermark_moved(hosted, self._out())
        if session is not None:  # after the partitions: theirs count from its previous fetch
            session.last_fetch_ms = max(session.last_fetch_ms, now_ms)
        return self._take()

    def on_fetch_session_forgot(self, replica_id: int, tps: Iterable[TopicPartition],
                                session: FollowerFetchSession) -> None:  # fmt: skip
        """The follower's `session` no longer names `tps` (it forgot them, or it ended): its
        fetches stop counting for them (another session of the follower's may hold them)."""
        for tp in tps:
            hosted = self.partitions.get(tp)
            if hosted is not None and hosted.state.is_leader:
                hosted.state.on_follower_forgot(replica_id, session)

    def leader_for(
        self, tp: TopicPartition, current_leader_epoch: int = -1
    ) -> tuple[int, HostedReplica | None]:
        """(error, hosted): whether this broker leads `tp` in the epoch the requester knows
        (-1: any). Reads, ListOffsets and OffsetForLeaderEpoch are fenced so."""
        hosted = self.partitions.get(tp)
        if hosted is None:
            return errors.UNKNOWN_TOPIC_OR_PARTITION, None
        if not hosted.state.is_leader:
            return errors.NOT_LEADER_OR_FOLLOWER, None
        epoch = hosted.state.leader_epoch
        if current_leader_epoch >= 0 and current_leader_epoch != epoch:
            return (errors.FENCED_LEADER_EPOCH if current_leader_epoch < epoch
                    else errors.UNKNOWN_LEADER_EPOCH), None  # fmt: skip
        return errors.NONE, hosted

    def end_offset_for_epoch(self, tp: TopicPartition, current_leader_epoch: int,
                             leader_epoch: int) -> tuple[int, int, int]:  # fmt: skip
        """OffsetForLeaderEpoch as the leader answers it: (error, epoch, end offset)."""
        error, hosted = self.leader_for(tp, current_leader_epoch)
        if hosted is None:
            return error, -1, -1
        return (errors.NONE, *hosted.log.end_offset_for_epoch(leader_epoch))

    def list_offset(self, tp: TopicPartition, timestamp: int,
                    consumer: bool) -> tuple[int, int, int]:  # fmt: skip
        """ListOffsets as the leader answers it: (error, timestamp, offset). A replica sees the
        log end as the latest offset, a consumer the HW, and finds no record at or past it."""
        error, hosted = self.leader_for(tp)
        if hosted is None:
            return error, -1, -1
        lg, hw = hosted.log, hosted.state.high_watermark
        if timestamp == EARLIEST_TIMESTAMP:
            return errors.NONE, -1, lg.log_start_offset
        if timestamp == LATEST_TIMESTAMP:
            return errors.NONE, -1, hw if consumer else lg.log_end_offset
        found = lg.offset_for_timestamp(timestamp)
        if found is None or (consumer and found[0] >= hw):
            return errors.NONE, -1, -1
        return errors.NONE, found[1], found[0]

    # -- ISR -------------------------------------------------------------------------------------

    def maybe_shrink_isr(self, now_ms: int) -> Ready:
        for hosted in self.partitions.values():
            update = hosted.state.maybe_shrink_isr(now_ms, self.config.replica_lag_time_max_ms)
            if update is not None:
                self._write_isr(update, self._out())
        return self._take()

    def _write_isr(self, update: IsrUpdate, ready: Ready) -> None:
        isr = tuple(sorted(self.partitions[(update.topic, update.partition)].state.isr))
        ready.state_changes.append(IsrProposed(update, isr))
        ready.isr_writes.append(update)

    def on_isr_write_result(self, update: IsrUpdate, written: bool,
                            zk_version: int | None) -> Ready:  # fmt: skip
        """The store answered: written at `zk_version`, or not (with the version now, or None
        when another leader or epoch is there)."""
        tp = (update.topic, update.partition)
        hosted = self.partitions.get(tp)
        if hosted is None or hosted.state.leader_epoch != update.leader_epoch:
            return EMPTY
        p = hosted.state
        ready = self._out()
        # A fetch session reads it again, so the follower's next fetch is recorded: an expansion
        # that did not land is proposed again there, as on every fetch in Kafka (a session holds
        # idle only members of the ISR).
        ready.wake_fetches.add(tp)
        if not written:
            if p.on_isr_update_failed(zk_version):
                self._high_watermark_moved(hosted, ready)
            return self._take()
        ready.state_changes.append(IsrChanged(tp, tuple(sorted(p.isr)), update.isr))
        if p.on_isr_update_succeeded(update.isr, zk_version):
            self._high_watermark_moved(hosted, ready)
        return self._take()

    def on_isr_write_unknown(self, update: IsrUpdate, now_ms: int) -> Ready:
        """The write and its read-back both failed: it may or may not have landed. Keep the
        proposal pending (the HW keeps counting any member it adds) and ask again later: the
        same conditional write either lands then or finds that it had landed."""
        due = now_ms + self.config.isr_write_retry_ms
        self._isr_retries.append((due, update))
        self._out().wake_at(due)
        return self._take()

    def retry_isr_writes(self, now_ms: int) -> Ready:
        if not self._isr_retries:
            return EMPTY
        due = [u for t, u in self._isr_retries if t <= now_ms]
        self._isr_retries = [(t, u) for t, u in self._isr_retries if t > now_ms]
        if self._isr_retries:
            self._out().wake_at(min(t for t, _ in self._isr_retries))
        for update in due:
            hosted = self.partitions.get((update.topic, update.partition))
            if hosted is not None and hosted.state.pending_isr == update.isr and (
                    hosted.state.leader_epoch == update.leader_epoch):  # fmt: skip
                self._write_isr(update, self._out())
        return self._take()

    # -- follower: fetch sessions ----------------------------------------------------------------

    def has_fetch_session(self, leader_id: int) -> bool:
        return self.fetch_sessions.has_session(leader_id)

    def fetch_session_leaders(self) -> list[int]:
        return list(self.fetch_sessions.sessions)

    def fetch_session_wakeup_ms(self, leader_id: int, now_ms: int) -> int | None:
        return self.fetch_sessions.wakeup_ms(leader_id, now_ms)

    def poll_fetch_session(self, leader_id: int, now_ms: int) -> Ready:
        """The next request to send to `leader_id`, in `requests` (none while one is in flight
        or every partition backs off)."""
        self.fetch_sessions.poll(leader_id, now_ms, self._out())
        return self._take()

    def on_epoch_response(self, request, answers, now_ms: int) -> Ready:
        """`answers`: an EpochAnswer per partition the leader answered."""
        self.fetch_sessions.on_epoch_response(request, answers, now_ms, self._out())
        return self._take()

    def on_fetch_response(self, request, fetched, now_ms: int) -> Ready:
        self.fetch_sessions.on_fetch_response(request, fetched, now_ms, self._out())
        return self._take()

    def on_list_offsets_response(self, request, error: int, offset: int, now_ms: int) -> Ready:
        self.fetch_sessions.on_list_offsets_response(request, error, offset, now_ms, self._out())
        return self._take()

    def on_fetch_request_failed(self, request, now_ms: int) -> Ready:
        self.fetch_sessions.on_request_failed(request, now_ms, self._out())
        return self._take()

    def on_follower_appended(self, tp: TopicPartition, leader_high_watermark: int,
                             leader_log_start_offset: int = -1) -> Ready:  # fmt: skip
        """A FollowerAppend is in the log: the HW follows the leader's, then the log start does
        (as Kafka's fetcher, up to the new HW: DeleteRecords on the leader reaches here)."""
        hosted = self.partitions.get(tp)
        if hosted is None or hosted.state.is_leader:
            return EMPTY
        p = hosted.state
        p.on_follower_append(hosted.log.log_end_offset, leader_high_watermark)
        ready = self._out()
        start = min(leader_log_start_offset, p.high_watermark)
        if start > p.log_start_offset:
            ready.log_actions.append(IncrementLogStartOffset(tp, start))
            p.on_log_start_offset(start)
        ready.wake_fetches.add(tp)
        return self._take()

    # -- DeleteRecords ---------------------------------------------------------------------------

    def delete_records(self, tp: TopicPartition, offset: int) -> tuple[int, int, Ready]:
        """The leader's step of DeleteRecords: (error, the offset to wait for, Ready). -1 means
        the HW, as in Kafka; past the HW is OFFSET_OUT_OF_RANGE; below the start moves nothing."""
        error, hosted = self.leader_for(tp)
        if hosted is None:
            return error, -1, EMPTY
        p = hosted.state
        target = p.high_watermark if offset == -1 else offset
        if not 0 <= target <= p.high_watermark:
            return errors.OFFSET_OUT_OF_RANGE, -1, EMPTY
        if target > p.log_start_offset:
            self._out().log_actions.append(IncrementLogStartOffset(tp, target))
            p.on_log_start_offset(target)
            self._out().wake_fetches.add(tp)  # followers learn it from their next fetch answer
        return errors.NONE, target, self._take()

    def low_watermark(self, tp: TopicPartition) -> int | None:
        """The ISR's lowest log start offset while this broker leads `tp`, else None."""
        hosted = self.partitions.get(tp)
        if hosted is None or not hosted.state.is_leader:
            return None
        return hosted.state.low_watermark()

    def on_follower_append_failed(self, tp: TopicPartition, reason: str, now_ms: int) -> Ready:
        self.fetch_sessions.on_append_failed(tp, reason, now_ms, self._out())
        return self._take()


def first_batch_over(records, limit: int) -> str | None:
    """message.max.bytes: the first batch larger than `limit`, described, or None."""
    for _, size in rb.batch_spans(memoryview(records)):
        if size > limit:
            return f"batch of {size} bytes exceeds message.max.bytes={limit}"
    return None  # a batch cut short or malformed is the log's to refuse (CORRUPT_MESSAGE)
