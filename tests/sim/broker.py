"""A simulated broker: the replica core (replication/replica_core.py) and the ReplicaHost around
it (broker/replica_host.py: log actions, follower appends, a leader's append and reads, the
logs a LeaderAndIsr opens, retention), the same the broker runtime drives, over the simulated
network, real logs on disk and the simulator's clock. Beside it the GroupHost of
broker/group_host.py, the runtime's too: the group coordinator shards of the offsets partitions
this broker leads, loaded by replaying their logs, their commits appended with acks=all.

Every replication rule is the core's, and every step between the core and the logs is the
ReplicaHost's. What is left here is what the runtime's event loop and sockets do: requests and
answers as messages, ISR writes to the simulated store (read back when the answer is lost, as
broker/metadata.update_isr does), long-polling fetches parked, requests timed out, and the
broker's timers run on ticks (HW checkpoint, flush, ISR shrink, retention, heartbeats), and
for the groups: a load steps one chunk of the replay per tick, shard deadlines are polled.

A `BrokerHost` is the network node: it outlives crashes. A crash drops the `SimBroker` (every
in-memory object) without closing its logs (kill -9: what was written survives, as page cache
does); a restart opens a new `SimBroker` that recovers its logs and reads its checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localcluster.broker.group_host import OFFSETS_TOPIC, CommitWait, GroupHost
from localcluster.broker.log_manager import LogManager
from localcluster.broker.replica_host import ReplicaHost
from localcluster.group import GroupConfig
from localcluster.replication import ready as r
from localcluster.replication.replica_core import ReplicaConfig, fetch_answerable
from localcluster.replication.state_changes import describe
from localcluster.storage import LogConfig
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

    # the group coordinator: a small __consumer_offsets, short timeouts
    offsets_partitions: int = 3
    offsets_commit_timeout_ms: int = 500
    group_min_session_timeout_ms: int = 100
    group_initial_rebalance_delay_ms: int = 20

    def log_config(self) -> LogConfig:
        return LogConfig(segment_bytes=self.segment_bytes, segment_index_bytes=4096,
                         retention_bytes=self.retention_bytes, retention_ms=-1,
                         prefault_bytes=0)  # fmt: skip

    def group_config(self) -> GroupConfig:
        return GroupConfig(group_min_session_timeout_ms=self.group_min_session_timeout_ms,
                           group_initial_rebalance_delay_ms=self.group_initial_rebalance_delay_ms)  # fmt: skip

    def replica_config(self) -> ReplicaConfig:
        return ReplicaConfig(self.replication_protocol, self.min_insync_replicas,
                             self.replica_lag_time_max_ms, self.replica_fetch_wait_max_ms,
                             self.fetch_backoff_ms)  # fmt: skip


def truncated(lg) -> None:
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


_DONE = object()


class SimGroupHost(GroupHost):
    """The shared GroupHost with the simulator's hooks: a load is a generator the broker's
    ticks step, replies are messages, a commit's key is the CommitWait itself (answer_produce
    routes it back), deadlines are polled on ticks."""

    def __init__(self, broker: SimBroker, new_uuid):
        config = broker.config
        super().__init__(broker, config.group_config(), config.offsets_commit_timeout_ms,
                         config.offsets_partitions)  # fmt: skip
        self.broker = broker
        self.new_uuid = new_uuid

    def start_load(self, partition: int, epoch: int):
        self.broker.trace(f"b{self.broker.broker_id} loading {OFFSETS_TOPIC}-{partition} "
                          f"(coordinator epoch {epoch})")  # fmt: skip
        return self.load(partition, epoch)

    def cancel_load(self, handle) -> None:
        handle.close()

    def unload(self, partition: int) -> None:
        if partition in self.shards:
            self.broker.trace(f"b{self.broker.broker_id} unloading {OFFSETS_TOPIC}-{partition}")
        super().unload(partition)

    def deliver(self, reply_to, response) -> None:
        src, corr = reply_to
        self.broker.send(src, m.GroupResponse(corr, response))

    def tick(self, now_ms: int) -> None:
        for partition, steps in sorted(self.loads.items()):
            if next(steps, _DONE) is _DONE:
                del self.loads[partition]
                shard = self.shards.get(partition)
                if shard is not None:
                    self.broker.trace(f"b{self.broker.broker_id} coordinator of "
                                      f"{OFFSETS_TOPIC}-{partition}: {len(shard.groups)} group(s) "
                                      f"loaded")  # fmt: skip
        self.tick_due(now_ms)


class SimBroker(ReplicaHost):
    """One incarnation of a broker process: the shared ReplicaHost with the simulator's hooks."""

    def __init__(self, broker_id: int, config: SimConfig, directory: Path, clock, send, trace,
                 observer, corr_base: int = 0, new_uuid=None):  # fmt: skip
        super().__init__(broker_id, config.replica_config(),
                         LogManager(directory, directory, lambda _: config.log_config(),
                                    clock.now_ms))  # fmt: skip
        self.config, self.clock, self.send, self.trace = config, clock, send, trace
        self.observer = observer
        self.logs = self.log_manager.logs  # what the invariant checker reads
        self.parked: list[ParkedFetch] = []
        self.pending: dict[int, Pending] = {}
        self.session = -1
        # Correlation ids are per connection in the runtime: an answer never reaches another
        # process. Here they are unique across incarnations, and answers must come from where
        # the request went.
        self._corr = corr_base
        self.timers = self._timers()
        self.open_logs()
        self.groups = SimGroupHost(self, new_uuid)

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def _timers(self) -> list[list]:
        """[due ms, interval ms, job]: the broker's periodic work, as server.py runs it."""
        c, now = self.config, self.now_ms()
        jobs = [(c.replica_high_watermark_checkpoint_interval_ms, self.checkpoint_high_watermarks),
                (c.log_flush_offset_checkpoint_interval_ms, self.log_manager.checkpoint_recovery_points),
                (self.core.config.isr_shrink_interval_ms,
                 lambda: self.execute(self.core.maybe_shrink_isr(self.now_ms()))),
                (c.log_retention_check_interval_ms, self.retention_now),
                (c.heartbeat_interval_ms, lambda: self.send("zk", m.Heartbeat(self.session)))]  # fmt: skip
        return [[now + (interval if i < 4 else 0), interval, job]
                for i, (interval, job) in enumerate(jobs)]  # fmt: skip

    # -- the Ready's hooks ------------------------------------------------------------------------

    def on_log_action(self, action) -> None:
        if isinstance(action, (r.TruncateTo, r.TruncateFullyAndStartAt)):
            truncated(self.logs[action.tp])

    def on_state_change(self, change) -> None:
        if isinstance(change, r.Leading):
            self.observer.on_leader(self.broker_id, change.tp, change.leader_epoch)
        self.trace(f"b{self.broker_id} {describe(change)[1]}")

    def write_isr(self, update) -> None:
        self._request("zk", "isr", update, lambda corr: m.IsrWrite(corr, update))

    def answer_produce(self, key, error: int) -> None:
        if isinstance(key, CommitWait):
            self.groups.on_commit_answered(key, error)
            return
        src, corr, tp, base_offset = key
        self.send(src, m.ProduceResponse(corr, tp, error, base_offset))

    def wake_fetches(self) -> None:
        self.wake_parked()

    def on_fetch_sessions(self, leaders, abandoned, requests) -> None:
        for leader in sorted(leaders):
            self.execute(self.core.poll_fetch_session(leader, self.now_ms()))
        for plan in requests:
            self._send_to_leader(plan)

    # -- requests in flight -----------------------------------------------------------------------

    def _request(self, dst, kind: str, subject, make) -> None:
        self._corr += 1
        deadline = self.now_ms() + self.config.request_timeout_ms
        if isinstance(subject, r.FetchRequestPlan):
            deadline += self.config.replica_fetch_wait_max_ms
        self.pending[self._corr] = Pending(kind, subject, dst, deadline)
        self.send(dst, make(self._corr))

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

    def tick(self) -> None:
        now = self.now_ms()
        super().tick(now)
        self.groups.tick(now)
        for corr, pending in list(self.pending.items()):
            if pending.deadline_ms <= now:
                del self.pending[corr]
                self._timed_out(pending)
        if self.parked:
            self.wake_parked(force_until=now)
        for leader in self.core.fetch_session_leaders():
            self.execute(self.core.poll_fetch_session(leader, now))
        for timer in self.timers:
            if now >= timer[0]:
                timer[2]()
                timer[0] = now + timer[1]

    def retention_now(self) -> None:
        for tp in self.retention(self.now_ms()):
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
            self.execute(self.core.on_isr_write_unknown(update, self.now_ms()))
        else:
            self.execute(self.core.on_fetch_request_failed(pending.subject, self.now_ms()))

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
            self.execute(core.on_isr_write_result(plan, msg.ok, msg.zk_version))
        elif isinstance(msg, m.FetchResponse):
            self.execute(core.on_fetch_response(plan, msg.partitions, now))
        elif isinstance(msg, m.OffsetForLeaderEpochResponse):
            self.execute(
                core.on_epoch_response(plan, msg.error, msg.leader_epoch, msg.end_offset, now)
            )
        elif isinstance(msg, m.ListOffsetsResponse):
            self.execute(core.on_list_offsets_response(plan, msg.error, msg.offset, now))
        else:
            raise AssertionError(f"broker {self.broker_id}: unexpected message {msg!r}")

    def handle_leader_and_isr(self, src, request: m.LeaderAndIsr) -> None:
        result = self.lead_or_follow(request.controller_epoch, request.partitions)
        self.groups.on_replicas_changed()
        self.send(src, m.LeaderAndIsrResponse(request.corr, result.error, result.partition_errors))

    def handle_stop_replica(self, src, request: m.StopReplica) -> None:
        result = self.stop(request.controller_epoch, request.partitions, request.delete_partitions)
        self.groups.on_replicas_changed()
        self.send(src, m.LeaderAndIsrResponse(request.corr, result.error))

    # -- leader: fetches, epochs, offsets, produce ------------------------------------------------

    def handle_fetch(self, src, request: m.Fetch) -> None:
        fetched = ((p.tp, p.fetch_offset, p.current_leader_epoch) for p in request.partitions)
        self.execute(self.core.record_follower_fetch(request.replica_id, fetched, self.now_ms()))
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
        out = []
        for p in request.partitions:
            read = self.read_partition(p.tp, p.fetch_offset, self.config.fetch_max_bytes, True,
                                       p.current_leader_epoch, first=True)  # fmt: skip
            data = b"".join(s.tobytes() for s in read.records)
            out.append(r.FetchedPartition(p.tp, read.error, read.high_watermark,
                                          read.log_start_offset, data))  # fmt: skip
        failed = any(f.error for f in out)
        size = sum(len(f.records) for f in out)
        return m.FetchResponse(request.corr, tuple(out)), fetch_answerable(failed, size, 1)

    def handle_offset_for_leader_epoch(self, src, msg: m.OffsetForLeaderEpoch) -> None:
        error, epoch, end = self.core.end_offset_for_epoch(msg.tp, msg.current_leader_epoch,
                                                           msg.leader_epoch)  # fmt: skip
        self.send(src, m.OffsetForLeaderEpochResponse(msg.corr, msg.tp, error, epoch, end))

    def handle_list_offsets(self, src, msg: m.ListOffsets) -> None:
        error, _, offset = self.core.list_offset(msg.tp, msg.timestamp, consumer=False)
        self.send(src, m.ListOffsetsResponse(msg.corr, msg.tp, error, offset))

    def handle_produce(self, src, msg: m.Produce) -> None:
        result = self.append_to_leader(msg.tp, msg.records, msg.acks, msg.timeout_ms,
                                       lambda first_offset: (src, msg.corr, msg.tp, first_offset))  # fmt: skip
        if not result.waiting:
            self.send(src, m.ProduceResponse(msg.corr, msg.tp, result.error, result.first_offset))

    def handle_group_request(self, src, msg: m.GroupRequest) -> None:
        """FindCoordinator is the member's (the leader of the group's offsets partition);
        every other group request goes to the shard, which answers NOT_COORDINATOR if the
        group is not coordinated here."""
        group_id = _group_of(msg.request)
        self.groups.submit(self.groups.serving_shard(group_id), msg.request, (src, msg.corr))

    _REQUESTS = {m.Fetch: handle_fetch, m.Produce: handle_produce,
                 m.GroupRequest: handle_group_request,
                 m.LeaderAndIsr: handle_leader_and_isr, m.StopReplica: handle_stop_replica,
                 m.OffsetForLeaderEpoch: handle_offset_for_leader_epoch,
                 m.ListOffsets: handle_list_offsets}  # fmt: skip


def _group_of(request) -> str:
    groups = getattr(request, "groups", None)  # OffsetFetch: the member sends one group
    return groups[0].group_id if groups else request.group_id


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
                           sim.trace, sim.observer, self.generation * 1_000_000_000,
                           sim.new_uuid)  # fmt: skip
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
