"""A simulated broker: the runtime glue of broker/replica_manager.py and replica_fetcher.py over
the sans-I/O cores, driven by messages and ticks instead of sockets and asyncio.

Each hosted partition is a `Partition` (replication/partition.py) with a real `Log` on disk.
Every decision is the cores': HW and ISR (`Partition`), where a follower truncates
(`follower_truncation`), when a produce is answered (`ProducePurgatory`), offsets and epochs
(`Log`, `LeaderEpochCache`). This module only carries messages in and out, with the runtime's
rules: LeaderAndIsr fenced by controller epoch and leader epoch, one request in flight per
followed partition, fetches long-polled until data arrives, HW checkpointed on a timer,
`maybe_shrink_isr` every `replica.lag.time.max.ms / 2`, ISR writes conditional on zkVersion.

A `BrokerHost` is the network node: it outlives crashes. A crash drops the `SimBroker` (every
in-memory object) without closing its logs (kill -9: what was written survives, as page cache
does); a restart opens a new `SimBroker` that recovers its logs and reads its checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kio.schema.errors import ErrorCode

from localcluster.broker.replica_manager import complete_batches, parse_partition_dir
from localcluster.replication.delayed_produce import ProducePurgatory
from localcluster.replication.follower_truncation import (
    first_epoch_to_ask,
    hw_truncation,
    leader_epoch_truncation,
)
from localcluster.replication.partition import IsrUpdate, Partition
from localcluster.storage import (
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    Log,
    LogConfig,
    OffsetOutOfRangeError,
    Record,
    UnexpectedAppendOffsetError,
    encode_batch,
    read_partition_offsets,
    write_partition_offsets,
)
from tests.sim import network as m

TopicPartition = tuple[str, int]
NONE = ErrorCode.none


ISR_WRITE_RETRY_MS = 500  # ReplicaManager's ISR_WRITE_RETRY_S


@dataclass
class SimConfig:
    """Broker settings, scaled down so that a run covers many timeouts in few steps."""

    replication_protocol: str = "leader-epoch"
    min_insync_replicas: int = 2
    unclean_leader_election_enable: bool = False
    replica_lag_time_max_ms: int = 300
    replica_fetch_wait_max_ms: int = 60
    replica_high_watermark_checkpoint_interval_ms: int = 50
    log_flush_offset_checkpoint_interval_ms: int = 200
    zookeeper_session_timeout_ms: int = 200
    heartbeat_interval_ms: int = 40
    request_timeout_ms: int = 150  # an unanswered request is retried after this
    fetch_backoff_ms: int = 50
    fetch_max_bytes: int = 400  # small: catching up takes several fetches
    tick_ms: int = 10
    segment_bytes: int = 1024

    retention_bytes: int = -1  # log.retention.bytes (time-based retention is off)
    log_retention_check_interval_ms: int = 100

    def log_config(self) -> LogConfig:
        return LogConfig(segment_bytes=self.segment_bytes, segment_index_bytes=4096,
                         retention_bytes=self.retention_bytes, retention_ms=-1,
                         prefault_bytes=0)  # fmt: skip


def truncated(lg: Log) -> None:
    """Tell the invariant checker's cached view of `lg` to read it again."""
    lg.sim_truncations = getattr(lg, "sim_truncations", 0) + 1


@dataclass(slots=True)
class Hosted:
    state: Partition
    log: Log


@dataclass(slots=True, eq=False)
class Followed:
    """A partition this broker fetches (the runtime's FollowedPartition plus its in-flight
    request, since the simulator has no fetcher task to hold it)."""

    leader: int
    leader_epoch: int
    truncating: bool
    ask_epoch: int | None = None  # KIP-279: the next epoch to ask about
    inflight: int | None = None  # correlation id of the request in flight
    deadline_ms: int = 0
    backoff_until_ms: int = 0


@dataclass(slots=True)
class ParkedFetch:
    src: object
    request: m.Fetch
    deadline_ms: int


RESPONSES = (m.FetchResponse, m.OffsetForLeaderEpochResponse, m.ListOffsetsResponse,
             m.IsrWriteResponse)  # fmt: skip


class SimBroker:
    """One incarnation of a broker process."""

    def __init__(self, broker_id: int, config: SimConfig, directory: Path, clock, send, trace,
                 observer, corr_base: int = 0):  # fmt: skip
        self.broker_id = broker_id
        self.config = config
        self.directory = directory
        self.clock = clock
        self._send = send  # (dst, msg)
        self.trace = trace
        self.observer = observer
        self.partitions: dict[TopicPartition, Hosted] = {}
        self.logs: dict[TopicPartition, Log] = {}
        self.purgatory = ProducePurgatory()
        self.controller_epoch = -1
        self.followed: dict[TopicPartition, Followed] = {}
        self.parked: list[ParkedFetch] = []
        self.pending: dict[int, tuple] = {}  # corr -> (kind, tp or update, Followed, deadline)
        self.checkpointed_hw: dict[TopicPartition, int] = {}
        self.session = -1
        # Correlation ids are per connection in the runtime: an answer never reaches another
        # process. Here they are unique across incarnations, and answers must come from where
        # the request went.
        self._corr = corr_base
        now = clock.now_ms()
        self.next_hw_checkpoint_ms = now + config.replica_high_watermark_checkpoint_interval_ms
        self.next_flush_ms = now + config.log_flush_offset_checkpoint_interval_ms
        self.next_shrink_ms = now + max(config.replica_lag_time_max_ms // 2, 10)
        self.next_retention_ms = now + config.log_retention_check_interval_ms
        self.next_heartbeat_ms = now
        self.isr_retries: list[tuple[int, IsrUpdate]] = []  # (due ms, update) of unknown outcome
        self.open_logs()

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def send(self, dst, msg) -> None:
        self._send(dst, msg)

    def next_corr(self) -> int:
        self._corr += 1
        return self._corr

    # -- startup and checkpoints (ReplicaManager.open_logs / checkpoint_*) ---------------------

    def open_logs(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        recovery_points = read_partition_offsets(self.directory / RECOVERY_POINT_OFFSET_CHECKPOINT)
        self.checkpointed_hw = read_partition_offsets(
            self.directory / REPLICATION_OFFSET_CHECKPOINT
        )
        for path in sorted(self.directory.iterdir()):
            tp = parse_partition_dir(path.name) if path.is_dir() else None
            if tp is not None:
                self.logs[tp] = Log.open(path, self.config.log_config(),
                                         recovery_point=recovery_points.get(tp, 0))  # fmt: skip

    def checkpoint_high_watermarks(self) -> None:
        self.checkpointed_hw.update(
            {tp: h.state.high_watermark for tp, h in self.partitions.items()}
        )
        write_partition_offsets(
            self.directory / REPLICATION_OFFSET_CHECKPOINT, self.checkpointed_hw
        )

    def checkpoint_recovery_points(self) -> None:
        points = {tp: lg.flush() for tp, lg in self.logs.items()}
        write_partition_offsets(self.directory / RECOVERY_POINT_OFFSET_CHECKPOINT, points)

    def get_or_create_log(self, tp: TopicPartition) -> Log:
        lg = self.logs.get(tp)
        if lg is None:
            lg = Log.open(self.directory / f"{tp[0]}-{tp[1]}", self.config.log_config())
            self.logs[tp] = lg
        return lg

    # -- ticks ----------------------------------------------------------------------------------

    def tick(self) -> None:
        now = self.now_ms()
        self._complete(self.purgatory.expire(now))
        for corr, (kind, subject, followed, deadline, _) in list(self.pending.items()):
            if deadline <= now:
                del self.pending[corr]
                self._on_request_timeout(kind, subject, followed)
        if self.parked:
            self.wake_parked(force_until=now)
        for tp in list(self.followed):
            self.pump(tp)
        if now >= self.next_hw_checkpoint_ms:
            self.checkpoint_high_watermarks()
            self.next_hw_checkpoint_ms = (
                now + self.config.replica_high_watermark_checkpoint_interval_ms
            )
        if now >= self.next_flush_ms:
            self.checkpoint_recovery_points()
            self.next_flush_ms = now + self.config.log_flush_offset_checkpoint_interval_ms
        if now >= self.next_shrink_ms:
            self.maybe_shrink_isr()
            self.next_shrink_ms = now + max(self.config.replica_lag_time_max_ms // 2, 10)
        if now >= self.next_retention_ms:
            self.retention()
            self.next_retention_ms = now + self.config.log_retention_check_interval_ms
        if now >= self.next_heartbeat_ms:
            self.send("zk", m.Heartbeat(self.session))
            self.next_heartbeat_ms = now + self.config.heartbeat_interval_ms
        due = [u for t, u in self.isr_retries if t <= now]
        self.isr_retries = [(t, u) for t, u in self.isr_retries if t > now]
        for update in due:  # ReplicaManager._retry_isr_write
            hosted = self.partitions.get((update.topic, update.partition))
            if hosted is not None and hosted.state.pending_isr == update.isr and (
                    hosted.state.leader_epoch == update.leader_epoch):  # fmt: skip
                self.write_isr(update)

    def retention(self) -> None:
        """server._retention: delete old segments below the HW; the log start moves."""
        for tp, hosted in self.partitions.items():
            if hosted.log.delete_old_segments(self.now_ms(), hosted.state.high_watermark):
                hosted.state.on_log_start_offset(hosted.log.log_start_offset)
                self.trace(f"b{self.broker_id} {tp[0]}-{tp[1]}: retention moved the log start "
                           f"to {hosted.log.log_start_offset}")  # fmt: skip

    def _on_request_timeout(self, kind, subject, followed) -> None:
        if kind == "isr":
            # metadata.update_isr: the write raised (its answer may be lost while it landed):
            # read the state back.
            self.trace(f"b{self.broker_id} isr write {list(subject.isr)} for {subject.topic}-"
                       f"{subject.partition} unanswered: reading the state back")  # fmt: skip
            corr = self.next_corr()
            deadline = self.now_ms() + self.config.request_timeout_ms
            self.pending[corr] = ("isr-read", subject, None, deadline, "zk")
            self.send("zk", m.IsrReadBack(corr, subject))
            return
        if kind == "isr-read":
            # The read raised too: the outcome is unknown. ReplicaManager._apply_isr_write keeps
            # the proposal pending (the HW keeps counting a member it adds) and asks again.
            self.trace(f"b{self.broker_id} isr read-back for {subject.topic}-{subject.partition} "
                       f"unanswered: outcome unknown, asking again")  # fmt: skip
            self.isr_retries.append((self.now_ms() + ISR_WRITE_RETRY_MS, subject))
            return
        if followed is not None and followed.inflight is not None:
            followed.inflight = None
            followed.backoff_until_ms = self.now_ms() + self.config.fetch_backoff_ms
            if kind == "epoch":
                followed.ask_epoch = None

    # -- dispatch -------------------------------------------------------------------------------

    def handle(self, src, msg) -> None:
        if isinstance(msg, RESPONSES):
            pending = self.pending.get(msg.corr)
            if pending is None or pending[4] != src:
                return  # not an answer to a request of ours in flight to `src` (a connection's)
        if isinstance(msg, m.Fetch):
            self.handle_fetch(src, msg)
        elif isinstance(msg, m.FetchResponse):
            self.on_fetch_response(msg)
        elif isinstance(msg, m.Produce):
            self.handle_produce(src, msg)
        elif isinstance(msg, m.LeaderAndIsr):
            self.send(src, self.become_leader_or_follower(msg))
        elif isinstance(msg, m.StopReplica):
            self.send(src, self.stop_replicas(msg))
        elif isinstance(msg, m.OffsetForLeaderEpoch):
            self.send(src, self.handle_offset_for_leader_epoch(msg))
        elif isinstance(msg, m.OffsetForLeaderEpochResponse):
            self.on_epoch_response(msg)
        elif isinstance(msg, m.ListOffsets):
            self.send(src, self.handle_list_offsets(msg))
        elif isinstance(msg, m.ListOffsetsResponse):
            self.on_list_offsets_response(msg)
        elif isinstance(msg, m.IsrWriteResponse):
            pending = self.pending.pop(msg.corr, None)
            if pending is not None:
                self._apply_isr_result(pending[1], msg.ok, msg.zk_version)
        else:
            raise AssertionError(f"broker {self.broker_id}: unexpected message {msg!r}")

    # -- LeaderAndIsr (become_leader_or_follower) ----------------------------------------------

    def become_leader_or_follower(self, request: m.LeaderAndIsr) -> m.LeaderAndIsrResponse:
        if request.controller_epoch < self.controller_epoch:
            self.trace(f"b{self.broker_id} rejects LeaderAndIsr of controller epoch "
                       f"{request.controller_epoch} (< {self.controller_epoch})")  # fmt: skip
            return m.LeaderAndIsrResponse(request.corr, ErrorCode.stale_controller_epoch)
        self.controller_epoch = request.controller_epoch
        errors = tuple((s.tp, self._apply_partition_state(s)) for s in request.partitions)
        return m.LeaderAndIsrResponse(request.corr, NONE, errors)

    def _apply_partition_state(self, state: m.PartitionStateMsg) -> int:
        hosted = self.partitions.get(state.tp)
        if hosted is not None and not hosted.state.is_newer_state(
            state.leader_epoch, state.zk_version
        ):
            return ErrorCode.stale_controller_epoch
        if self.broker_id not in state.replicas:
            return ErrorCode.unknown_topic_or_partition
        if state.leader == self.broker_id:
            self.make_leader(state)
        else:
            self.make_follower(state)
        return NONE

    def stop_replicas(self, request: m.StopReplica) -> m.LeaderAndIsrResponse:
        """ReplicaManager.stop_replicas without delete: stop fetching and hosting; keep the log."""
        if request.controller_epoch < self.controller_epoch:
            return m.LeaderAndIsrResponse(request.corr, ErrorCode.stale_controller_epoch)
        self.controller_epoch = request.controller_epoch
        for tp in request.partitions:
            self.followed.pop(tp, None)
            self._complete(self.purgatory.on_leadership_lost(tp))
            self.partitions.pop(tp, None)
            self.trace(f"b{self.broker_id} stopped replica {tp[0]}-{tp[1]}")
        self.wake_parked()
        return m.LeaderAndIsrResponse(request.corr, NONE)

    def close(self) -> None:
        """Clean shutdown (ReplicaManager.close): flush, checkpoint, close every log."""
        self.checkpoint_recovery_points()
        self.checkpoint_high_watermarks()
        for lg in self.logs.values():
            lg.close()

    def _hosted(self, tp: TopicPartition) -> Hosted:
        hosted = self.partitions.get(tp)
        if hosted is None:
            lg = self.get_or_create_log(tp)
            hosted = Hosted(Partition(tp[0], tp[1], self.broker_id), lg)
            hosted.state.high_watermark = max(
                lg.log_start_offset, min(self.checkpointed_hw.get(tp, 0), lg.log_end_offset)
            )
            hosted.state.log_start_offset = lg.log_start_offset
            hosted.state.log_end_offset = lg.log_end_offset
            self.partitions[tp] = hosted
        return hosted

    def make_leader(self, state: m.PartitionStateMsg) -> None:
        tp = state.tp
        hosted = self._hosted(tp)
        self.followed.pop(tp, None)
        lg = hosted.log
        if state.leader_epoch > lg.leader_epoch_cache.latest_epoch:
            lg.leader_epoch_cache.assign(state.leader_epoch, lg.log_end_offset)
        moved = hosted.state.make_leader(state.leader_epoch, state.isr, state.replicas,
                                         state.zk_version, lg.log_start_offset, lg.log_end_offset,
                                         hosted.state.high_watermark, self.now_ms(),
                                         self.controller_epoch)  # fmt: skip
        self.observer.on_leader(self.broker_id, tp, state.leader_epoch)
        self.trace(f"b{self.broker_id} leads {tp[0]}-{tp[1]} epoch {state.leader_epoch} "
                   f"isr {sorted(hosted.state.isr)} leo {lg.log_end_offset} "
                   f"hw {hosted.state.high_watermark}")  # fmt: skip
        if moved:
            self.on_high_watermark_moved(tp)
        self.wake_parked()

    def make_follower(self, state: m.PartitionStateMsg) -> None:
        tp = state.tp
        hosted = self._hosted(tp)
        self._complete(self.purgatory.on_leadership_lost(tp))
        lg = hosted.log
        hosted.state.make_follower(state.leader, state.leader_epoch, state.isr, state.replicas,
                                   state.zk_version, lg.log_start_offset, lg.log_end_offset,
                                   hosted.state.high_watermark, self.controller_epoch)  # fmt: skip
        hw_mode = self.config.replication_protocol == "hw-truncation"
        if hw_mode:
            self.truncate_follower(tp, hosted.state.high_watermark)
        self.trace(f"b{self.broker_id} follows b{state.leader} for {tp[0]}-{tp[1]} epoch "
                   f"{state.leader_epoch} leo {lg.log_end_offset} hw {hosted.state.high_watermark}")  # fmt: skip
        self.followed[tp] = Followed(state.leader, state.leader_epoch, truncating=not hw_mode)
        self.wake_parked()
        self.pump(tp)

    # -- follower: truncation and fetching (ReplicaFetcher) ------------------------------------

    def truncate_follower(self, tp: TopicPartition, offset: int) -> None:
        hosted = self.partitions[tp]
        lg = hosted.log
        truncated(lg)
        if offset < lg.log_start_offset:
            lg.truncate_fully_and_start_at(offset)
        elif offset < lg.log_end_offset:
            self.trace(f"b{self.broker_id} truncates {tp[0]}-{tp[1]} to {offset} "
                       f"(leo was {lg.log_end_offset})")  # fmt: skip
            lg.truncate_to(offset)
        hosted.state.on_follower_truncated(lg.log_start_offset, lg.log_end_offset)

    def _still_following(self, tp, followed: Followed) -> bool:
        hosted = self.partitions.get(tp)
        return (
            self.followed.get(tp) is followed and hosted is not None and not hosted.state.is_leader
        )

    def _request(self, kind, tp, followed: Followed, msg_factory) -> None:
        corr = self.next_corr()
        followed.inflight = corr
        deadline = self.now_ms() + self.config.request_timeout_ms
        if kind == "fetch":
            deadline += self.config.replica_fetch_wait_max_ms
        self.pending[corr] = (kind, tp, followed, deadline, followed.leader)
        self.send(followed.leader, msg_factory(corr))

    def pump(self, tp: TopicPartition) -> None:
        """Send the next request of a followed partition, if none is in flight."""
        followed = self.followed.get(tp)
        hosted = self.partitions.get(tp)
        if (followed is None or hosted is None or followed.inflight is not None
                or followed.backoff_until_ms > self.now_ms() or hosted.state.is_leader):  # fmt: skip
            return
        lg = hosted.log
        if followed.truncating:
            if followed.ask_epoch is None:
                epoch = first_epoch_to_ask(lg.leader_epoch_cache.latest_epoch)
                if epoch is None:
                    decision = hw_truncation(hosted.state.high_watermark, lg.log_end_offset)
                    if decision.offset < lg.log_end_offset:
                        self.truncate_follower(tp, decision.offset)
                    followed.truncating = False
                else:
                    followed.ask_epoch = epoch
            if followed.truncating:
                self._request("epoch", tp, followed, lambda corr: m.OffsetForLeaderEpoch(
                    corr, self.broker_id, tp, followed.leader_epoch, followed.ask_epoch))  # fmt: skip
                return
        self._request("fetch", tp, followed, lambda corr: m.Fetch(
            corr, self.broker_id, tp, lg.log_end_offset, followed.leader_epoch,
            self.config.replica_fetch_wait_max_ms))  # fmt: skip

    def _take_pending(self, corr: int, tp):
        pending = self.pending.pop(corr, None)
        if pending is None:
            return None  # timed out already, or from an earlier incarnation's request
        followed = pending[2]
        if followed.inflight == corr:
            followed.inflight = None
        if not self._still_following(tp, followed):
            return None
        return followed

    def on_epoch_response(self, msg: m.OffsetForLeaderEpochResponse) -> None:
        followed = self._take_pending(msg.corr, msg.tp)
        if followed is None:
            return
        tp = msg.tp
        if msg.error != NONE:
            followed.ask_epoch = None
            followed.backoff_until_ms = self.now_ms() + self.config.fetch_backoff_ms
            return
        hosted = self.partitions[tp]
        lg = hosted.log
        decision = leader_epoch_truncation(msg.leader_epoch, msg.end_offset, lg.end_offset_for_epoch,
                                           lg.log_end_offset, hosted.state.high_watermark)  # fmt: skip
        self.trace(f"b{self.broker_id} {tp[0]}-{tp[1]}: asked b{followed.leader} where epoch "
                   f"{followed.ask_epoch} ends: epoch {msg.leader_epoch} ends at {msg.end_offset}; "
                   f"cut at {decision.offset}"
                   + ("" if decision.done else f", then ask about epoch {decision.next_epoch}"))  # fmt: skip
        if decision.offset < lg.log_end_offset:
            self.truncate_follower(tp, decision.offset)
        if decision.done:
            followed.truncating = False
            followed.ask_epoch = None
        else:
            followed.ask_epoch = decision.next_epoch
        self.pump(tp)

    def on_fetch_response(self, msg: m.FetchResponse) -> None:
        followed = self._take_pending(msg.corr, msg.tp)
        if followed is None:
            return
        tp = msg.tp
        if msg.error == NONE:
            hosted = self.partitions[tp]
            whole = complete_batches(msg.records)
            try:
                if len(whole):
                    hosted.log.append_as_follower(whole)
            except UnexpectedAppendOffsetError as e:  # the runtime logs it and retries later
                self.trace(f"b{self.broker_id} {tp[0]}-{tp[1]}: {e}")
                followed.backoff_until_ms = self.now_ms() + 1000
                return
            hosted.state.on_follower_append(hosted.log.log_end_offset, msg.high_watermark)
            self.wake_parked()
            self.pump(tp)
            return
        if msg.error == ErrorCode.offset_out_of_range:
            self.trace(f"b{self.broker_id} {tp[0]}-{tp[1]}: fetch offset out of leader "
                       f"b{followed.leader}'s range; asking its log end")  # fmt: skip
            self._request(
                "end", tp, followed, lambda corr: m.ListOffsets(corr, self.broker_id, tp, -1)
            )
            return
        followed.backoff_until_ms = self.now_ms() + self.config.fetch_backoff_ms

    def on_list_offsets_response(self, msg: m.ListOffsetsResponse) -> None:
        pending = self.pending.get(msg.corr)
        kind = pending[0] if pending else None
        followed = self._take_pending(msg.corr, msg.tp)
        if followed is None:
            return
        tp = msg.tp
        if msg.error != NONE:
            followed.backoff_until_ms = self.now_ms() + self.config.fetch_backoff_ms
            return
        lg = self.partitions[tp].log
        if kind == "end":
            if lg.log_end_offset > msg.offset >= 0:
                self.truncate_follower(tp, msg.offset)
                self.pump(tp)
            else:
                self._request(
                    "start", tp, followed, lambda corr: m.ListOffsets(corr, self.broker_id, tp, -2)
                )
            return
        self.trace(f"b{self.broker_id} {tp[0]}-{tp[1]}: leader's log starts at {msg.offset}, "
                   f"past our end {lg.log_end_offset}: starting over")  # fmt: skip
        truncated(lg)
        lg.truncate_fully_and_start_at(msg.offset)
        self.partitions[tp].state.on_follower_truncated(lg.log_start_offset, lg.log_end_offset)
        self.pump(tp)

    # -- leader: fetches, epochs, offsets --------------------------------------------------------

    def handle_fetch(self, src, request: m.Fetch) -> None:
        self._record_follower_fetch(request)
        response = self._read_partition(request)
        if response.error != NONE or response.records or request.max_wait_ms <= 0:
            self.send(src, response)
        else:
            self.parked.append(ParkedFetch(src, request, self.now_ms() + request.max_wait_ms))

    def wake_parked(self, force_until: int | None = None) -> None:
        """Answer parked fetches that now have data or an error (or whose wait is over)."""
        keep = []
        for parked in self.parked:
            response = self._read_partition(parked.request)
            expired = force_until is not None and parked.deadline_ms <= force_until
            if response.error != NONE or response.records or expired:
                self.send(parked.src, response)
            else:
                keep.append(parked)
        self.parked = keep

    def _record_follower_fetch(self, request: m.Fetch) -> None:
        hosted = self.partitions.get(request.tp)
        if hosted is None or not hosted.state.is_leader:
            return
        if request.current_leader_epoch != hosted.state.leader_epoch:
            return
        moved, update = hosted.state.update_follower_fetch_state(request.replica_id,
                                                                 request.fetch_offset, self.now_ms())  # fmt: skip
        if update is not None:
            self.write_isr(update)
        if moved:
            self.on_high_watermark_moved(request.tp)

    def _leader_error(self, tp, current_leader_epoch: int) -> tuple[Hosted | None, int]:
        hosted = self.partitions.get(tp)
        if hosted is None:
            return None, ErrorCode.unknown_topic_or_partition
        if not hosted.state.is_leader:
            return None, ErrorCode.not_leader_or_follower
        epoch = hosted.state.leader_epoch
        if current_leader_epoch >= 0 and current_leader_epoch != epoch:
            return None, (ErrorCode.fenced_leader_epoch if current_leader_epoch < epoch
                          else ErrorCode.unknown_leader_epoch)  # fmt: skip
        return hosted, NONE

    def _read_partition(self, request: m.Fetch) -> m.FetchResponse:
        hosted, error = self._leader_error(request.tp, request.current_leader_epoch)
        if hosted is None:
            return m.FetchResponse(request.corr, request.tp, error)
        lg = hosted.log
        hw = hosted.state.high_watermark
        try:
            result = lg.read(request.fetch_offset, self.config.fetch_max_bytes, None, True)
        except OffsetOutOfRangeError:
            return m.FetchResponse(request.corr, request.tp, ErrorCode.offset_out_of_range, hw,
                                   lg.log_start_offset)  # fmt: skip
        return m.FetchResponse(request.corr, request.tp, NONE, hw, lg.log_start_offset,
                               result.tobytes())  # fmt: skip

    def handle_offset_for_leader_epoch(
        self, msg: m.OffsetForLeaderEpoch
    ) -> m.OffsetForLeaderEpochResponse:
        hosted, error = self._leader_error(msg.tp, msg.current_leader_epoch)
        if hosted is None:
            return m.OffsetForLeaderEpochResponse(msg.corr, msg.tp, error, -1, -1)
        epoch, end = hosted.log.end_offset_for_epoch(msg.leader_epoch)
        return m.OffsetForLeaderEpochResponse(msg.corr, msg.tp, NONE, epoch, end)

    def handle_list_offsets(self, msg: m.ListOffsets) -> m.ListOffsetsResponse:
        hosted, error = self._leader_error(msg.tp, -1)
        if hosted is None:
            return m.ListOffsetsResponse(msg.corr, msg.tp, error, -1)
        lg = hosted.log
        offset = lg.log_start_offset if msg.timestamp == -2 else lg.log_end_offset
        return m.ListOffsetsResponse(msg.corr, msg.tp, NONE, offset)

    # -- leader: produce --------------------------------------------------------------------------

    def handle_produce(self, src, msg: m.Produce) -> None:
        response, required = self._append_to_leader(src, msg)
        if required is None:
            self.send(src, response)
            return
        key = (src, msg.corr, msg.tp, response.base_offset)
        self.purgatory.park(key, msg.tp, required, self.now_ms() + msg.timeout_ms)

    def _append_to_leader(self, src, msg: m.Produce):
        hosted = self.partitions.get(msg.tp)
        if hosted is None:
            return m.ProduceResponse(msg.corr, msg.tp, ErrorCode.unknown_topic_or_partition), None
        state = hosted.state
        if not state.is_leader:
            return m.ProduceResponse(msg.corr, msg.tp, ErrorCode.not_leader_or_follower), None
        if msg.acks == -1 and state.in_sync_count() < self.config.min_insync_replicas:
            return m.ProduceResponse(msg.corr, msg.tp, ErrorCode.not_enough_replicas), None
        info = hosted.log.append(encode_batch([Record(v) for v in msg.values]), state.leader_epoch)
        if state.on_local_append(hosted.log.log_end_offset):
            self.on_high_watermark_moved(msg.tp)
        self.wake_parked()
        response = m.ProduceResponse(msg.corr, msg.tp, NONE, info.first_offset)
        required = info.last_offset + 1
        if msg.acks == -1 and state.high_watermark < required:
            return response, required
        return response, None

    def on_high_watermark_moved(self, tp: TopicPartition) -> None:
        hosted = self.partitions[tp]
        self._complete(self.purgatory.on_high_watermark(tp, hosted.state.high_watermark,
                                                        hosted.state.in_sync_count(),
                                                        self.config.min_insync_replicas))  # fmt: skip

    def _complete(self, completions) -> None:
        for (src, corr, tp, base_offset), error in completions:
            self.send(src, m.ProduceResponse(corr, tp, error, base_offset))

    # -- ISR ----------------------------------------------------------------------------------------

    def maybe_shrink_isr(self) -> None:
        now = self.now_ms()
        for hosted in list(self.partitions.values()):
            update = hosted.state.maybe_shrink_isr(now, self.config.replica_lag_time_max_ms)
            if update is not None:
                self.write_isr(update)

    def write_isr(self, update: IsrUpdate) -> None:
        self.trace(f"b{self.broker_id} proposes isr {list(update.isr)} for "
                   f"{update.topic}-{update.partition} ({update.reason})")  # fmt: skip
        corr = self.next_corr()
        deadline = self.now_ms() + self.config.request_timeout_ms
        self.pending[corr] = ("isr", update, None, deadline, "zk")
        self.send("zk", m.IsrWrite(corr, update))

    def _apply_isr_result(self, update: IsrUpdate, ok: bool, version: int | None) -> None:
        tp = (update.topic, update.partition)
        hosted = self.partitions.get(tp)
        if hosted is None or hosted.state.leader_epoch != update.leader_epoch:
            return
        if ok:
            if hosted.state.on_isr_update_succeeded(update.isr, version):
                self.on_high_watermark_moved(tp)
        else:
            hosted.state.on_isr_update_failed(version)


@dataclass
class BrokerHost:
    """The network node of one broker id: its current incarnation, or none while crashed."""

    broker_id: int
    config: SimConfig
    directory: Path
    sim: object  # the Simulator: clock, scheduler, network, zk, trace, observer
    incarnation: SimBroker | None = None
    paused: bool = False
    held: list = field(default_factory=list)  # messages that arrived while paused
    generation: int = 0

    @property
    def alive(self) -> bool:
        return self.incarnation is not None

    def start(self) -> None:
        assert self.incarnation is None
        self.generation += 1
        sim = self.sim
        broker = SimBroker(self.broker_id, self.config, self.directory, sim.clock,
                           lambda dst, msg: sim.network.send(self.broker_id, dst, msg),
                           sim.trace, sim.observer, self.generation * 1_000_000_000)  # fmt: skip
        self.incarnation = broker
        broker.session = sim.zk.register(self.broker_id)
        self.paused = False
        self.held.clear()
        self._schedule_tick(broker)

    def crash(self) -> None:
        """kill -9: drop every in-memory object; the files stay as they are."""
        self.incarnation = None
        self.paused = False
        self.held.clear()
        self.sim.zk.drop_session(self.broker_id)  # the kernel drops the session's lock

    def shutdown(self) -> None:
        """A clean shutdown: checkpoints written, logs closed (no recovery on restart)."""
        if self.incarnation is not None:
            self.incarnation.close()
        self.crash()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        held, self.held = self.held, []
        for src, msg in held:
            if self.incarnation is None:
                break
            self._handle(src, msg)

    def _schedule_tick(self, broker: SimBroker) -> None:
        self.sim.scheduler.after(self.config.tick_ms, self._tick, broker)

    def _tick(self, broker: SimBroker) -> None:
        if self.incarnation is not broker:
            return  # an earlier incarnation's timer
        if not self.paused:
            broker.tick()
        self._schedule_tick(broker)

    def receive(self, src, msg) -> bool:
        if self.incarnation is None:
            return False
        if self.paused:
            self.held.append((src, msg))
            return True
        self._handle(src, msg)
        return True

    def _handle(self, src, msg) -> None:
        broker = self.incarnation
        if isinstance(msg, m.HeartbeatResponse):
            if msg.session == broker.session and msg.expired:
                broker.session = self.sim.zk.register(self.broker_id)  # re-register, as Kafka does
                self.sim.trace(f"b{self.broker_id} session expired; re-registered")
            return
        broker.handle(src, msg)
