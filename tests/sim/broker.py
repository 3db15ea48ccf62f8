"""A simulated broker: the replica core the broker runtime drives (replication/replica_core.py),
over the simulated network, real logs on disk and the simulator's clock.

Every replication rule is the core's. This module is the simulator's runtime, as
broker/replica_manager.py and replica_fetcher.py are the real one: it turns messages into core
steps and carries out each Ready (log actions on the Log, requests and answers as messages,
ISR writes to the simulated store), parks long-polling fetches, times requests out, and runs
the broker's timers on ticks (HW checkpoint, flush, ISR shrink, retention, heartbeats). Its
store client reads an ISR write back when the answer is lost, as broker/metadata.update_isr.

A `BrokerHost` is the network node: it outlives crashes. A crash drops the `SimBroker` (every
in-memory object) without closing its logs (kill -9: what was written survives, as page cache
does); a restart opens a new `SimBroker` that recovers its logs and reads its checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localcluster.broker.log_manager import LogManager
from localcluster.replication import errors
from localcluster.replication import ready as r
from localcluster.replication.replica_core import ReplicaConfig, ReplicaCore, fetch_answerable
from localcluster.storage import Log, LogConfig, OffsetOutOfRangeError, Record, encode_batch
from tests.sim import network as m

TopicPartition = tuple[str, int]


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

    def replica_config(self) -> ReplicaConfig:
        return ReplicaConfig(self.replication_protocol, self.min_insync_replicas,
                             self.replica_lag_time_max_ms, self.replica_fetch_wait_max_ms,
                             self.fetch_backoff_ms)  # fmt: skip


def truncated(lg: Log) -> None:
    """Tell the invariant checker's cached view of `lg` to read it again."""
    lg.sim_truncations = getattr(lg, "sim_truncations", 0) + 1


@dataclass(slots=True)
class ParkedFetch:
    src: object
    request: m.Fetch
    deadline_ms: int


@dataclass(slots=True)
class Pending:
    """A request in flight: to a leader (a fetch session's plan) or to the store (an ISR
    write, or its read-back after the answer was lost)."""

    kind: str  # "fetcher" | "isr" | "isr-read"
    subject: object  # the request plan, or the IsrUpdate
    dst: object
    deadline_ms: int


# How the simulator's trace shows the core's state changes (None: not shown).
TRACE = {
    r.Leading: lambda c: (f"leads {c.tp[0]}-{c.tp[1]} epoch {c.leader_epoch} isr {list(c.isr)} "
                          f"leo {c.log_end_offset} hw {c.high_watermark}"),
    r.Following: lambda c: (f"follows b{c.leader} for {c.tp[0]}-{c.tp[1]} epoch {c.leader_epoch} "
                            f"leo {c.log_end_offset} hw {c.high_watermark}"),
    r.Truncated: lambda c: (f"truncates {c.tp[0]}-{c.tp[1]} to {c.offset} "
                            f"(leo was {c.previous_end_offset})"),
    r.EpochAnswered: lambda c: (
        f"{c.tp[0]}-{c.tp[1]}: asked b{c.leader} where epoch {c.asked_epoch} ends: epoch "
        f"{c.leader_epoch} ends at {c.end_offset}; cut at {c.cut_at}"
        + ("" if c.next_epoch is None else f", then ask about epoch {c.next_epoch}")),
    r.OutOfRange: lambda c: (f"{c.tp[0]}-{c.tp[1]}: fetch offset out of leader b{c.leader}'s "
                             "range; asking its log end"),
    r.StartingOver: lambda c: (f"{c.tp[0]}-{c.tp[1]}: leader's log starts at {c.offset}, past "
                               f"our end {c.previous_end_offset}: starting over"),
    r.AppendFailed: lambda c: f"{c.tp[0]}-{c.tp[1]}: {c.reason}",
    r.IsrProposed: lambda c: (f"proposes isr {list(c.update.isr)} for {c.update.topic}-"
                              f"{c.update.partition} ({c.update.reason})"),
    r.Stopped: lambda c: f"stopped replica {c.tp[0]}-{c.tp[1]}",
    r.LeaderAndIsrRejected: lambda c: (f"rejects LeaderAndIsr of controller epoch "
                                       f"{c.controller_epoch} (< {c.current_controller_epoch})"),
}  # fmt: skip


class SimBroker:
    """One incarnation of a broker process."""

    def __init__(self, broker_id: int, config: SimConfig, directory: Path, clock, send, trace,
                 observer, corr_base: int = 0):  # fmt: skip
        self.broker_id = broker_id
        self.config = config
        self.directory = directory
        self.clock = clock
        self.send = send  # (dst, msg)
        self.trace = trace
        self.observer = observer
        self.core = ReplicaCore(broker_id, config.replica_config())
        self.partitions = self.core.partitions  # what the invariant checker reads
        self.parked: list[ParkedFetch] = []
        self.pending: dict[int, Pending] = {}
        self.session = -1
        # Correlation ids are per connection in the runtime: an answer never reaches another
        # process. Here they are unique across incarnations, and answers must come from where
        # the request went.
        self._corr = corr_base
        now = clock.now_ms()
        self.next_hw_checkpoint_ms = now + config.replica_high_watermark_checkpoint_interval_ms
        self.next_flush_ms = now + config.log_flush_offset_checkpoint_interval_ms
        self.next_shrink_ms = now + self.core.config.isr_shrink_interval_ms
        self.next_retention_ms = now + config.log_retention_check_interval_ms
        self.next_heartbeat_ms = now
        self.open_logs()

    def now_ms(self) -> int:
        return self.clock.now_ms()

    # -- logs and checkpoints (broker/log_manager.py, as the runtime keeps them) --------------

    def open_logs(self) -> None:
        self.log_manager = LogManager(self.directory, self.directory,
                                      lambda _: self.config.log_config(), self.now_ms)  # fmt: skip
        self.logs = self.log_manager.logs  # what the invariant checker reads
        self.core.open_logs(self.logs, self.log_manager.open_logs())

    def close(self) -> None:
        """Clean shutdown: flush, checkpoint, close every log."""
        self.log_manager.close(self.core.checkpoint_high_watermarks())

    # -- carrying out a Ready -------------------------------------------------------------------

    def run(self, ready: r.Ready) -> None:
        if ready is r.EMPTY:
            return
        for action in ready.log_actions:
            if isinstance(action, (r.TruncateTo, r.TruncateFullyAndStartAt)):
                truncated(self.logs[action.tp])
            self.log_manager.apply(action)
        for append in ready.follower_appends:
            failure = self.log_manager.append_as_follower(append)
            self.run(self.core.on_follower_append_failed(append.tp, failure, self.now_ms())
                     if failure else
                     self.core.on_follower_appended(append.tp, append.leader_high_watermark))  # fmt: skip
        for change in ready.state_changes:
            if isinstance(change, r.Leading):
                self.observer.on_leader(self.broker_id, change.tp, change.leader_epoch)
            if (describe := TRACE.get(type(change))) is not None:
                self.trace(f"b{self.broker_id} {describe(change)}")
        for update in ready.isr_writes:
            self._request("zk", "isr", update, lambda corr, u=update: m.IsrWrite(corr, u))
        for (src, corr, tp, base_offset), error in ready.produce_answers:
            self.send(src, m.ProduceResponse(corr, tp, error, base_offset))
        if ready.wake_fetches:
            self.wake_parked()
        for leader in sorted(ready.fetch_sessions):
            self.run(self.core.poll_fetch_session(leader, self.now_ms()))
        for plan in ready.requests:
            self._send_to_leader(plan)

    def next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def _request(self, dst, kind: str, subject, make) -> None:
        corr = self.next_corr()
        deadline = self.now_ms() + self.config.request_timeout_ms
        if isinstance(subject, r.FetchRequestPlan):
            deadline += self.config.replica_fetch_wait_max_ms
        self.pending[corr] = Pending(kind, subject, dst, deadline)
        self.send(dst, make(corr))

    def _send_to_leader(self, plan) -> None:
        me = self.broker_id
        if isinstance(plan, r.FetchRequestPlan):
            make = lambda corr: m.Fetch(corr, me, plan.partitions, plan.max_wait_ms)  # noqa: E731
        elif isinstance(plan, r.EpochRequestPlan):
            make = lambda corr: m.OffsetForLeaderEpoch(corr, me, plan.tp,  # noqa: E731
                                                       plan.current_leader_epoch, plan.leader_epoch)  # fmt: skip
        else:
            make = lambda corr: m.ListOffsets(corr, me, plan.tp, plan.timestamp)  # noqa: E731
        self._request(plan.leader_id, "fetcher", plan, make)

    # -- ticks ----------------------------------------------------------------------------------

    def tick(self) -> None:
        now = self.now_ms()
        core, config = self.core, self.config
        self.run(core.expire_produces(now))
        for corr, pending in list(self.pending.items()):
            if pending.deadline_ms <= now:
                del self.pending[corr]
                self._timed_out(pending)
        if self.parked:
            self.wake_parked(force_until=now)
        for leader in core.fetch_session_leaders():
            self.run(core.poll_fetch_session(leader, now))
        if now >= self.next_hw_checkpoint_ms:
            self.log_manager.write_high_watermarks(core.checkpoint_high_watermarks())
            self.next_hw_checkpoint_ms = now + config.replica_high_watermark_checkpoint_interval_ms
        if now >= self.next_flush_ms:
            self.log_manager.checkpoint_recovery_points()
            self.next_flush_ms = now + config.log_flush_offset_checkpoint_interval_ms
        if now >= self.next_shrink_ms:
            self.run(core.maybe_shrink_isr(now))
            self.next_shrink_ms = now + core.config.isr_shrink_interval_ms
        if now >= self.next_retention_ms:
            self.retention()
            self.next_retention_ms = now + config.log_retention_check_interval_ms
        if now >= self.next_heartbeat_ms:
            self.send("zk", m.Heartbeat(self.session))
            self.next_heartbeat_ms = now + config.heartbeat_interval_ms
        self.run(core.retry_isr_writes(now))

    def retention(self) -> None:
        """server._retention: delete old segments below the HW; the log start moves."""
        hws = {tp: hosted.state.high_watermark for tp, hosted in self.partitions.items()}
        for tp in self.log_manager.delete_old_segments(self.now_ms(), hws):
            self.core.on_log_start_offset(tp)
            self.trace(f"b{self.broker_id} {tp[0]}-{tp[1]}: retention moved the log start "
                       f"to {self.logs[tp].log_start_offset}")  # fmt: skip

    def _timed_out(self, pending: Pending) -> None:
        update = pending.subject
        if pending.kind == "isr":
            # metadata.update_isr: the write raised (its answer may be lost while it landed):
            # read the state back.
            self.trace(f"b{self.broker_id} isr write {list(update.isr)} for {update.topic}-"
                       f"{update.partition} unanswered: reading the state back")  # fmt: skip
            self._request("zk", "isr-read", update, lambda corr: m.IsrReadBack(corr, update))
        elif pending.kind == "isr-read":
            self.trace(f"b{self.broker_id} isr read-back for {update.topic}-{update.partition} "
                       f"unanswered: outcome unknown, asking again")  # fmt: skip
            self.run(self.core.on_isr_write_unknown(update, self.now_ms()))
        else:
            self.run(self.core.on_fetch_request_failed(pending.subject, self.now_ms()))

    # -- dispatch -------------------------------------------------------------------------------

    def handle(self, src, msg) -> None:
        handler = self._REQUESTS.get(type(msg))
        if handler is not None:
            handler(self, src, msg)
            return
        pending = self.pending.get(msg.corr)
        if pending is None or pending.dst != src:
            return  # not an answer to a request of ours in flight to `src` (a connection's)
        del self.pending[msg.corr]
        core, plan, now = self.core, pending.subject, self.now_ms()
        if isinstance(msg, m.IsrWriteResponse):
            self.run(core.on_isr_write_result(plan, msg.ok, msg.zk_version))
        elif isinstance(msg, m.FetchResponse):
            self.run(core.on_fetch_response(plan, msg.partitions, now))
        elif isinstance(msg, m.OffsetForLeaderEpochResponse):
            self.run(core.on_epoch_response(plan, msg.error, msg.leader_epoch, msg.end_offset, now))
        elif isinstance(msg, m.ListOffsetsResponse):
            self.run(core.on_list_offsets_response(plan, msg.error, msg.offset, now))
        else:
            raise AssertionError(f"broker {self.broker_id}: unexpected message {msg!r}")

    def handle_leader_and_isr(self, src, request: m.LeaderAndIsr) -> None:
        core = self.core
        for tp in core.missing_logs(request.controller_epoch, request.partitions):
            core.add_log(tp, self.log_manager.get_or_create(tp))
        ready = core.become_leader_or_follower(request.controller_epoch, request.partitions,
                                               self.now_ms())  # fmt: skip
        self.run(ready)
        result = ready.response
        self.send(src, m.LeaderAndIsrResponse(request.corr, result.error, result.partition_errors))

    def handle_stop_replica(self, src, request: m.StopReplica) -> None:
        ready = self.core.stop_replicas(request.controller_epoch, request.partitions,
                                        request.delete_partitions, self.now_ms())  # fmt: skip
        self.run(ready)
        self.send(src, m.LeaderAndIsrResponse(request.corr, ready.response.error))

    # -- leader: fetches, epochs, offsets, produce ------------------------------------------------

    def handle_fetch(self, src, request: m.Fetch) -> None:
        fetched = ((p.tp, p.fetch_offset, p.current_leader_epoch) for p in request.partitions)
        self.run(self.core.record_follower_fetch(request.replica_id, fetched, self.now_ms()))
        response, answerable = self._read(request)
        if answerable or request.max_wait_ms <= 0:
            self.send(src, response)
        else:
            self.parked.append(ParkedFetch(src, request, self.now_ms() + request.max_wait_ms))

    def wake_parked(self, force_until: int | None = None) -> None:
        """Answer parked fetches that now have data or an error (or whose wait is over)."""
        keep = []
        for parked in self.parked:
            response, answerable = self._read(parked.request)
            if answerable or (force_until is not None and parked.deadline_ms <= force_until):
                self.send(parked.src, response)
            else:
                keep.append(parked)
        self.parked = keep

    def _read(self, request: m.Fetch) -> tuple[m.FetchResponse, bool]:
        out, failed, size = [], False, 0
        for p in request.partitions:
            error, hosted = self.core.leader_for(p.tp, p.current_leader_epoch)
            if hosted is None:
                out.append(r.FetchedPartition(p.tp, error))
                failed = True
                continue
            lg, hw = self.logs[p.tp], hosted.state.high_watermark
            try:
                data = lg.read(p.fetch_offset, self.config.fetch_max_bytes, None, True).tobytes()
            except OffsetOutOfRangeError:
                out.append(r.FetchedPartition(p.tp, errors.OFFSET_OUT_OF_RANGE, hw,
                                              lg.log_start_offset))  # fmt: skip
                failed = True
                continue
            out.append(r.FetchedPartition(p.tp, errors.NONE, hw, lg.log_start_offset, data))
            size += len(data)
        return m.FetchResponse(request.corr, tuple(out)), fetch_answerable(failed, size, 1)

    def handle_offset_for_leader_epoch(self, src, msg: m.OffsetForLeaderEpoch) -> None:
        error, epoch, end = self.core.end_offset_for_epoch(msg.tp, msg.current_leader_epoch,
                                                           msg.leader_epoch)  # fmt: skip
        self.send(src, m.OffsetForLeaderEpochResponse(msg.corr, msg.tp, error, epoch, end))

    def handle_list_offsets(self, src, msg: m.ListOffsets) -> None:
        error, _, offset = self.core.list_offset(msg.tp, msg.timestamp, consumer=False)
        self.send(src, m.ListOffsetsResponse(msg.corr, msg.tp, error, offset))

    def handle_produce(self, src, msg: m.Produce) -> None:
        records = encode_batch([Record(v) for v in msg.values])
        append = self.core.prepare_leader_append(msg.tp, msg.acks, records)
        if isinstance(append, r.ProduceAnswer):
            self.send(src, m.ProduceResponse(msg.corr, msg.tp, append.error))
            return
        info = self.log_manager.append_as_leader(msg.tp, records, append.leader_epoch)
        key = (src, msg.corr, msg.tp, info.first_offset)
        ready = self.core.on_leader_appended(append, msg.acks, info.last_offset, key,
                                             self.now_ms() + msg.timeout_ms)  # fmt: skip
        self.run(ready)
        if ready.response is not None:
            self.send(src, m.ProduceResponse(msg.corr, msg.tp, ready.response.error,
                                             info.first_offset))  # fmt: skip

    _REQUESTS = {m.Fetch: handle_fetch, m.Produce: handle_produce,
                 m.LeaderAndIsr: handle_leader_and_isr, m.StopReplica: handle_stop_replica,
                 m.OffsetForLeaderEpoch: handle_offset_for_leader_epoch,
                 m.ListOffsets: handle_list_offsets}  # fmt: skip


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
