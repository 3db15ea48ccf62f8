"""A simulated broker: the replica core (replication/replica_core.py) and the ReplicaHost around
it (broker/replica_host.py), the same the broker runtime drives, over the simulated network,
real logs on disk and the simulator's clock. Beside it the GroupHost of broker/group_host.py,
the runtime's too: the group coordinator shards of the offsets partitions this broker leads.

Every replication rule is the core's, and every step between the core and the logs is the
ReplicaHost's, including what both runtimes would otherwise each state: the cores' and logs'
settings from a BrokerConfig (SimConfig builds one, scaled down), the periodic jobs, a Fetch's
reads and whether to answer it, and the ISR write's sequence (write, read back once, unknown).
What is left here is what the runtime's event loop and sockets do: requests and answers as
messages, long-polling fetches parked until the core wakes them or their wait ends, requests
timed out (an ISR write's step unanswered goes back to the ReplicaHost), the periodic jobs and
the session's heartbeat run on ticks, and for the groups: a load steps one chunk of the replay
per tick, shard deadlines are polled. The node that crashes, pauses and resumes a broker is
tests/sim/node.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from localcluster.broker.config import BrokerConfig
from localcluster.broker.group_host import CommitWait, GroupHost, group_config
from localcluster.broker.log_manager import LogManager
from localcluster.broker.replica_host import (
    ISR_WRITE,
    FetchPosition,
    ReplicaHost,
    log_config,
    replica_config,
)
from localcluster.replication import ready as r
from localcluster.replication.state_changes import describe
from localcluster.topic_config import resolve_broker_defaults
from tests.sim import network as m


@dataclass
class SimConfig:
    """Broker settings, scaled down so that a run covers many timeouts in few steps."""

    # BrokerConfig's settings (the runtime's names and mapping to the cores' and logs' configs)
    replication_protocol: str = "leader-epoch"
    min_insync_replicas: int = 2
    unclean_leader_election_enable: bool = False
    replica_lag_time_max_ms: int = 300
    replica_fetch_wait_max_ms: int = 60
    replica_high_watermark_checkpoint_interval_ms: int = 50
    log_flush_offset_checkpoint_interval_ms: int = 200
    zookeeper_session_timeout_ms: int = 200
    log_segment_bytes: int = 1024
    log_retention_bytes: int = -1  # (time-based retention is off)
    log_retention_check_interval_ms: int = 100
    offsets_commit_timeout_ms: int = 500
    group_min_session_timeout_ms: int = 100
    group_initial_rebalance_delay_ms: int = 20

    # the simulator's own
    heartbeat_interval_ms: int = 40
    request_timeout_ms: int = 150  # an unanswered request is retried after this
    fetch_max_bytes: int = 400  # per partition, small: catching up takes several fetches
    tick_ms: int = 10
    offsets_partitions: int = 3  # a small __consumer_offsets

    def broker_config(self, broker_id: int) -> BrokerConfig:
        own = {"heartbeat_interval_ms", "request_timeout_ms", "fetch_max_bytes", "tick_ms",
               "offsets_partitions"}  # fmt: skip
        given = {k: v for k, v in vars(self).items() if k not in own}
        return BrokerConfig(broker_id=broker_id, log_retention_ms=-1, log_index_size_max_bytes=4096,
                            offsets_topic_num_partitions=self.offsets_partitions, **given)  # fmt: skip


def truncated(lg) -> None:
    """Tell the invariant checker's cached view of `lg` to read it again."""
    lg.sim_truncations = getattr(lg, "sim_truncations", 0) + 1


@dataclass(slots=True)
class ParkedFetch:
    src: object
    request: m.Fetch
    positions: list[FetchPosition]
    deadline_ms: int


@dataclass(slots=True)
class Pending:
    """A request in flight: to a leader (a fetch session's plan) or to the store (a step of an
    ISR write: replica_host.ISR_WRITE or ISR_READ_BACK)."""

    kind: str  # "fetcher" | ISR_WRITE | ISR_READ_BACK
    subject: object  # the request plan, or the IsrUpdate
    dst: object
    deadline_ms: int


_DONE = object()


class SimGroupHost(GroupHost):
    """The shared GroupHost with the simulator's hooks: a load is a generator the broker's
    ticks step, replies are messages, a commit's key is the CommitWait itself (answer_produce
    routes it back), deadlines are polled on ticks."""

    def __init__(self, broker: SimBroker, new_uuid):
        config = broker.broker_config
        super().__init__(broker, group_config(config), config.offsets_commit_timeout_ms,
                         config.offsets_topic_num_partitions)  # fmt: skip
        self.new_uuid = new_uuid

    def start_load(self, partition: int, epoch: int):
        return self.load(partition, epoch)

    def cancel_load(self, handle) -> None:
        handle.close()

    def deliver(self, reply_to, response) -> None:
        src, corr = reply_to
        self.replicas.send(src, m.GroupResponse(corr, response))

    def tick(self, now_ms: int) -> None:
        for partition, steps in sorted(self.loads.items()):
            if next(steps, _DONE) is _DONE:
                del self.loads[partition]
        self.tick_due(now_ms)


class SimBroker(ReplicaHost):
    """One incarnation of a broker process: the shared ReplicaHost with the simulator's hooks."""

    def __init__(self, broker_id: int, config: SimConfig, directory: Path, clock, send, trace,
                 observer, corr_base: int = 0, new_uuid=None):  # fmt: skip
        self.broker_config = broker = config.broker_config(broker_id)
        defaults = resolve_broker_defaults(broker)
        super().__init__(broker_id, replica_config(broker),
                         LogManager(directory, directory,
                                    lambda topic: replace(log_config(topic or defaults,
                                                                     broker.log_index_size_max_bytes)),
                                    clock.now_ms, broker.producer_id_expiration_ms))  # fmt: skip
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
        # [due ms, interval ms, job]: the runtime's periodic jobs, then the session's heartbeat
        now = self.now_ms()
        self.timers = [[now + interval, interval, job]
                       for interval, job in self.periodic_jobs(broker)]  # fmt: skip
        self.timers.append([now, config.heartbeat_interval_ms,
                            lambda: self.send("zk", m.Heartbeat(self.session))])  # fmt: skip
        self.open_logs()
        self.groups = SimGroupHost(self, new_uuid)

    def now_ms(self) -> int:
        return self.clock.now_ms()

    # -- the Ready's hooks ------------------------------------------------------------------------

    def on_log_action(self, action) -> None:
        if isinstance(action, (r.TruncateTo, r.TruncateFullyAndStartAt)):
            truncated(self.logs[action.tp])

    def on_state_changes(self, changes: list) -> None:
        for change in changes:
            if isinstance(change, r.Leading):
                self.observer.on_leader(self.broker_id, change.tp, change.leader_epoch)
            self.trace(f"b{self.broker_id} {describe(change)[1]}")

    def write_isr(self, update, step: str = ISR_WRITE) -> None:
        message = m.IsrWrite if step == ISR_WRITE else m.IsrReadBack
        self._request("zk", step, update, lambda corr: message(corr, update))

    def answer_produce(self, key, error: int) -> None:
        if isinstance(key, CommitWait):
            self.groups.on_commit_answered(key, error)
            return
        src, corr, tp, base_offset = key
        self.send(src, m.ProduceResponse(corr, tp, error, base_offset))

    def wake_fetches(self, tps) -> None:
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
            make = lambda corr: m.OffsetForLeaderEpoch(corr, me, plan.partitions)  # noqa: E731
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

    def note(self, level: int, line: str, reason: object = None) -> None:
        self.trace(f"b{self.broker_id} {line}")

    def _timed_out(self, pending: Pending) -> None:
        if pending.kind == "fetcher":
            self.execute(self.core.on_fetch_request_failed(pending.subject, self.now_ms()))
        elif step := self.on_isr_write_unanswered(pending.subject, pending.kind, "timed out"):
            self.write_isr(pending.subject, step)

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
            self.on_isr_write_answered(plan, msg.ok, msg.zk_version)
        elif isinstance(msg, m.FetchResponse):
            self.execute(core.on_fetch_response(plan, msg.partitions, now))
        elif isinstance(msg, m.OffsetForLeaderEpochResponse):
            self.execute(core.on_epoch_response(plan, msg.partitions, now))
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
        positions = [FetchPosition(p.tp, p.fetch_offset, p.current_leader_epoch,
                                   p.log_start_offset, self.config.fetch_max_bytes)
                     for p in request.partitions]  # fmt: skip
        read = self.read_fetch(request.replica_id, positions, 0, record=True)
        if read.answerable(1) or request.max_wait_ms <= 0:
            self._answer_fetch(src, request, read)
        else:
            self.parked.append(ParkedFetch(src, request, positions,
                                           self.now_ms() + request.max_wait_ms))  # fmt: skip

    def wake_parked(self, force_until: int | None = None) -> None:
        """Read parked fetches again: answer those that now have data or an error (or whose
        wait is over)."""
        keep = []
        for parked in self.parked:
            read = self.read_fetch(parked.request.replica_id, parked.positions, 0, record=False)
            if read.answerable(1) or (
                force_until is not None and parked.deadline_ms <= force_until
            ):
                self._answer_fetch(parked.src, parked.request, read)
            else:
                keep.append(parked)
        self.parked = keep

    def _answer_fetch(self, src, request: m.Fetch, read) -> None:
        out = tuple(r.FetchedPartition(p.tp, pr.error, pr.high_watermark, pr.log_start_offset,
                                       b"".join(s.tobytes() for s in pr.records))
                    for p, pr in zip(request.partitions, read.partitions, strict=True))  # fmt: skip
        self.send(src, m.FetchResponse(request.corr, out))

    def handle_offset_for_leader_epoch(self, src, msg: m.OffsetForLeaderEpoch) -> None:
        answers = tuple(r.EpochAnswer(ask.tp, *self.core.end_offset_for_epoch(ask.tp, ask.current_leader_epoch,
                                                                              ask.leader_epoch))
                        for ask in msg.partitions)  # fmt: skip
        self.send(src, m.OffsetForLeaderEpochResponse(msg.corr, answers))

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
