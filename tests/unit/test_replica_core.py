"""ReplicaCore driven directly, as etcd's interaction tests drive RawNode: each step's Ready is
carried out by a tiny runtime over in-memory logs and written down as text, and a test reads
as the conversation: event, then what the core asked for."""

from __future__ import annotations

from dataclasses import dataclass
from textwrap import dedent

import pytest

from localcluster.replication import errors
from localcluster.replication import ready as r
from localcluster.replication.fetch_sessions import LEADER_BEHIND_BACKOFF_MS
from localcluster.replication.partition import FollowerFetchSession
from localcluster.replication.replica_core import ReplicaConfig, ReplicaCore
from localcluster.storage import Record, encode_batch, iter_batches
from localcluster.storage.leader_epoch_cache import LeaderEpochCache
from localcluster.storage.record_batch import BatchSpec

TP = ("t", 0)
NAMES = errors.NAMES


class MemoryLog:
    """A log's offsets and leader epoch cache, in memory (what the core reads)."""

    def __init__(self, start: int = 0, epochs=()):
        self.log_start_offset = self.log_end_offset = start
        self.leader_epoch_cache = LeaderEpochCache(None)
        for epoch, count in epochs:  # (epoch, records written in it)
            self.append(count, epoch)

    @property
    def latest_epoch(self) -> int:
        return self.leader_epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.leader_epoch_cache.end_offset_for(epoch, self.log_end_offset)

    def truncation_offset(self, offset: int) -> int:
        return offset  # one record a batch

    def append(self, count: int, epoch: int) -> None:
        self.leader_epoch_cache.assign(epoch, self.log_end_offset)
        self.log_end_offset += count


@dataclass(frozen=True)
class State:
    """A LeaderAndIsr partition state."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    zk_version: int = 0
    replicas: tuple[int, ...] = (1, 2, 3)
    topic: str = "t"
    partition: int = 0
    controller_epoch: int = 1


def batch(values: int, base_offset: int = 0, epoch: int = 0) -> bytes:
    return encode_batch([Record(b"v%d" % i) for i in range(values)],
                        BatchSpec(base_offset=base_offset, partition_leader_epoch=epoch))  # fmt: skip


def describe(x) -> str:
    if isinstance(x, r.FetchRequestPlan):
        parts = " ".join(f"{p.tp[0]}-{p.tp[1]}@{p.fetch_offset}:e{p.current_leader_epoch}"
                         for p in x.partitions)  # fmt: skip
        return f"Fetch to {x.leader_id}: {parts} wait {x.max_wait_ms}"
    if isinstance(x, r.EpochRequestPlan):
        asks = ", ".join(f"{a.tp[0]}-{a.tp[1]} epoch {a.leader_epoch}" for a in x.partitions)
        return f"OffsetForLeaderEpoch to {x.leader_id}: {asks}"
    if isinstance(x, r.ListOffsetsPlan):
        return f"ListOffsets to {x.leader_id}: {'latest' if x.timestamp == -1 else 'earliest'}"
    if isinstance(x, r.IsrProposed):
        return f"IsrProposed {list(x.isr)} -> {list(x.update.isr)} at v{x.update.zk_version}"
    fields = [f"{k}={v}" for k, v in vars(x).items() if k != "tp"] if hasattr(x, "__dict__") else [
        f"{k}={getattr(x, k)}" for k in x.__slots__ if k != "tp"]  # fmt: skip
    return " ".join([type(x).__name__, *fields])


class Runtime:
    """Carries out Readys over MemoryLogs and writes each one down."""

    def __init__(self, protocol: str = "leader-epoch", broker_id: int = 1, **settings):
        self.core = ReplicaCore(broker_id, ReplicaConfig(protocol, **settings))
        self.logs: dict = {}
        self.lines: list[str] = []
        self.requests: list = []
        self.isr_writes: list = []

    def open(self, tp=TP, log: MemoryLog | None = None, checkpointed_hw: int = 0) -> MemoryLog:
        self.logs[tp] = log or MemoryLog()
        self.core.open_logs({tp: self.logs[tp]}, {tp: checkpointed_hw})
        return self.logs[tp]

    def run(self, ready: r.Ready) -> r.Ready:
        out = self.lines
        for action in ready.log_actions:
            out.append(f"log {describe(action)}")
            lg = self.logs[action.tp]
            if isinstance(action, r.AssignEpoch):
                lg.leader_epoch_cache.assign(action.leader_epoch, action.start_offset)
            elif isinstance(action, r.TruncateTo):
                lg.log_end_offset = action.offset
                lg.leader_epoch_cache.truncate_from_end(action.offset)
            elif isinstance(action, r.TruncateFullyAndStartAt):
                lg.log_start_offset = lg.log_end_offset = action.offset
                lg.leader_epoch_cache.clear()
        for append in ready.follower_appends:
            lg = self.logs[append.tp]
            for _, header in iter_batches(bytes(append.records)):
                lg.append(header.records_count, header.partition_leader_epoch)
            out.append(f"append {append.tp[0]}-{append.tp[1]} to {lg.log_end_offset}")
            self.run(self.core.on_follower_appended(append.tp, append.leader_high_watermark))
        out += [f"state {describe(c)}" for c in ready.state_changes]
        out += [f"isr-write {list(u.isr)} at v{u.zk_version}" for u in ready.isr_writes]
        self.isr_writes += ready.isr_writes
        out += [f"answer {key} {NAMES[error]}" for key, error in ready.produce_answers]
        if ready.wake_fetches:
            out.append("wake fetches")
        if ready.abandoned:
            out.append(f"abandon {sorted(ready.abandoned)}")
        if ready.fetch_sessions:
            out.append(f"poll {sorted(ready.fetch_sessions)}")
        for request in ready.requests:
            out.append(f"send {describe(request)}")
            self.requests.append(request)
        if ready.wakeup_at_ms is not None:
            out.append(f"wakeup at {ready.wakeup_at_ms}")
        if isinstance(ready.response, r.LeaderAndIsrResult):
            codes = ", ".join(
                f"{tp[0]}-{tp[1]} {NAMES[e]}" for tp, e in ready.response.partition_errors
            )
            out.append(f"response {NAMES[ready.response.error]} [{codes}]")
        elif ready.response is not None:
            out.append(f"response {NAMES[ready.response.error]}")
        return ready

    def step(self, ready: r.Ready) -> str:
        """Run `ready` and return what it asked, one line per item."""
        self.lines = []
        self.run(ready)
        return "\n".join(self.lines)

    def leader_and_isr(self, *states, controller_epoch: int = 1, now_ms: int = 0) -> str:
        for tp in self.core.missing_logs(controller_epoch, states):
            self.logs[tp] = MemoryLog()
            self.core.add_log(tp, self.logs[tp])
        return self.step(self.core.become_leader_or_follower(controller_epoch, states, now_ms))

    def poll(self, leader: int, now_ms: int = 0) -> str:
        return self.step(self.core.poll_fetch_session(leader, now_ms))

    def produce(self, key, values: int, acks: int = -1, now_ms: int = 0, tp=TP) -> str:
        append = self.core.prepare_leader_append(tp, acks, batch(values))
        if isinstance(append, r.ProduceAnswer):
            return f"rejected {NAMES[append.error]}"
        self.logs[tp].append(values, append.leader_epoch)
        return self.step(self.core.on_leader_appended(append, acks, self.logs[tp].log_end_offset - 1,
                                                      key, now_ms + 1000))  # fmt: skip


def expect(text: str) -> str:
    return dedent(text).strip("\n")


def hw(rt: Runtime, tp=TP) -> int:
    return rt.core.partitions[tp].state.high_watermark


# -- LeaderAndIsr fencing --------------------------------------------------------------------


def test_a_leader_and_isr_of_an_older_controller_changes_nothing():
    rt = Runtime()
    rt.leader_and_isr(State(1, 3, (1, 2)), controller_epoch=5)
    assert rt.core.missing_logs(4, [State(1, 4, (1,), topic="u")]) == []
    assert rt.leader_and_isr(State(2, 4, (2,)), controller_epoch=4) == expect("""
        state LeaderAndIsrRejected controller_epoch=4 current_controller_epoch=5
        response STALE_CONTROLLER_EPOCH []""")
    assert rt.core.partitions[TP].state.leader_epoch == 3 and rt.core.partitions[TP].state.is_leader


def test_a_partition_state_of_an_old_leader_epoch_is_refused_and_a_newer_zk_version_applies():
    rt = Runtime()
    rt.leader_and_isr(State(1, 3, (1, 2, 3), zk_version=7))
    assert rt.leader_and_isr(State(2, 2, (2,), zk_version=9), controller_epoch=2) == expect("""
        state PartitionStateIgnored leader_epoch=2 current_leader_epoch=3
        response NONE [t-0 STALE_CONTROLLER_EPOCH]""")
    assert rt.leader_and_isr(State(1, 3, (1, 2, 3), zk_version=7), controller_epoch=2).endswith(
        "t-0 STALE_CONTROLLER_EPOCH]"
    )  # the same state again: not newer
    # Same epoch, newer znode version (the controller shrank the ISR): applied. The partition
    # keeps the partition state's controller epoch (who decided), not the request's.
    rt.leader_and_isr(State(1, 3, (1, 2), zk_version=8), controller_epoch=2)
    p = rt.core.partitions[TP].state
    assert (p.isr, p.zk_version, p.controller_epoch, rt.core.controller_epoch) == ({1, 2}, 8, 1, 2)


def test_a_state_that_does_not_name_this_broker_is_unknown_here():
    rt = Runtime()
    assert rt.core.missing_logs(1, [State(2, 1, (2, 3), replicas=(2, 3))]) == []
    assert rt.leader_and_isr(State(2, 1, (2, 3), replicas=(2, 3))) == expect("""
        response NONE [t-0 UNKNOWN_TOPIC_OR_PARTITION]""")
    assert TP not in rt.core.partitions


# -- becoming leader or follower ----------------------------------------------------------------


def test_become_leader_over_a_log_with_its_checkpointed_hw_and_a_new_epoch():
    rt = Runtime()
    rt.open(log=MemoryLog(epochs=[(1, 6)]), checkpointed_hw=9)  # the HW is capped by the log end
    assert rt.core.missing_logs(1, [State(1, 2, (1, 2))]) == []
    assert rt.leader_and_isr(State(1, 2, (1, 2))) == expect("""
        log AssignEpoch leader_epoch=2 start_offset=6
        state Leading leader_epoch=2 isr=(1, 2) log_start_offset=0 log_end_offset=6 high_watermark=6
        wake fetches
        response NONE [t-0 NONE]""")
    assert rt.logs[TP].latest_epoch == 2


def test_become_follower_asks_the_leader_where_its_epoch_ends_then_fetches():
    rt = Runtime()
    rt.open(log=MemoryLog(epochs=[(1, 3), (2, 4)]), checkpointed_hw=2)
    assert rt.leader_and_isr(State(2, 3, (2, 1))) == expect("""
        state Following leader=2 leader_epoch=3 log_start_offset=0 log_end_offset=7 high_watermark=2
        wake fetches
        poll [2]
        response NONE [t-0 NONE]""")
    assert rt.poll(2) == "send OffsetForLeaderEpoch to 2: t-0 epoch 2"
    asked = rt.requests[-1]
    assert rt.poll(2) == ""  # one request in flight per session
    # The leader's epoch 2 ended at 5: offsets 5 and 6 are ours alone.
    assert rt.step(
        rt.core.on_epoch_response(asked, [r.EpochAnswer(TP, errors.NONE, 2, 5)], now_ms=1)
    ) == expect("""
        log TruncateTo offset=5
        state EpochAnswered leader=2 asked_epoch=2 leader_epoch=2 end_offset=5 cut_at=5 next_epoch=None
        state Truncated offset=5 previous_end_offset=7 log_end_offset=5
        state TruncationDone leader=2 log_end_offset=5
        poll [2]""")
    assert rt.poll(2, now_ms=1) == "send Fetch to 2: t-0@5:e3 wait 500"


def test_every_partition_truncating_from_one_leader_is_asked_in_one_request():
    # After a failover a broker follows a new leader in thousands of partitions: one
    # OffsetForLeaderEpoch for all of them, as Kafka's fetcher asks, not one after the other.
    rt = Runtime()
    parts = [("t", p) for p in range(3)]
    for tp in parts:
        rt.open(tp, log=MemoryLog(epochs=[(1, 3), (2, 4)]), checkpointed_hw=2)
    rt.leader_and_isr(*(State(2, 3, (2, 1), partition=p) for _, p in parts))
    assert rt.poll(2) == "send OffsetForLeaderEpoch to 2: t-0 epoch 2, t-1 epoch 2, t-2 epoch 2"
    asked = rt.requests[-1]
    # t-0 answered, t-1 refused, t-2 left out of the answer: each goes its own way.
    assert rt.step(rt.core.on_epoch_response(asked, [
        r.EpochAnswer(("t", 0), errors.NONE, 2, 5),
        r.EpochAnswer(("t", 1), errors.NOT_LEADER_OR_FOLLOWER)], now_ms=1)) == expect("""
        log TruncateTo offset=5
        state EpochAnswered leader=2 asked_epoch=2 leader_epoch=2 end_offset=5 cut_at=5 next_epoch=None
        state Truncated offset=5 previous_end_offset=7 log_end_offset=5
        state TruncationDone leader=2 log_end_offset=5
        state LeaderError leader=2 request=OffsetForLeaderEpoch error=6
        poll [2]""")  # fmt: skip
    assert rt.poll(2, now_ms=1) == "send OffsetForLeaderEpoch to 2: t-2 epoch 2"  # t-1 backs off
    rt.step(
        rt.core.on_epoch_response(rt.requests[-1], [r.EpochAnswer(("t", 2), errors.NONE, 2, 7)], 2)
    )
    # t-1 still backs off (until 51): the long poll ends when it may ask again
    assert rt.poll(2, now_ms=2) == "send Fetch to 2: t-0@5:e3 t-2@7:e3 wait 49"


def test_a_leader_that_has_not_taken_our_epoch_yet_is_asked_again_soon():
    # The controller sent both LeaderAndIsr requests; ours came first. UNKNOWN_LEADER_EPOCH
    # means the leader is behind us: ask again after LEADER_BEHIND_BACKOFF_MS, not the full
    # replica.fetch.backoff.ms (which a failover's acks=all writes waited out). Other errors
    # still wait the full backoff.
    rt = Runtime(fetch_backoff_ms=50)
    rt.open(log=MemoryLog(epochs=[(1, 3), (2, 4)]), checkpointed_hw=2)
    rt.leader_and_isr(State(2, 3, (2, 1)))
    assert rt.poll(2, 100) == "send OffsetForLeaderEpoch to 2: t-0 epoch 2"
    rt.step(
        rt.core.on_epoch_response(
            rt.requests[-1], [r.EpochAnswer(TP, errors.UNKNOWN_LEADER_EPOCH, -1, -1)], 100
        )
    )
    assert rt.poll(2, 104) == ""
    assert rt.core.fetch_session_wakeup_ms(2, 104) == 100 + LEADER_BEHIND_BACKOFF_MS
    assert rt.poll(2, 105) == "send OffsetForLeaderEpoch to 2: t-0 epoch 2"
    rt.step(
        rt.core.on_epoch_response(
            rt.requests[-1], [r.EpochAnswer(TP, errors.NOT_LEADER_OR_FOLLOWER, -1, -1)], 105
        )
    )
    assert rt.core.fetch_session_wakeup_ms(2, 106) == 155
    assert rt.poll(2, 155) == "send OffsetForLeaderEpoch to 2: t-0 epoch 2"
    asked = rt.requests[-1]
    rt.step(rt.core.on_epoch_response(asked, [r.EpochAnswer(TP, errors.NONE, 2, 5)], 155))
    rt.poll(2, 155)
    fetched = [r.FetchedPartition(TP, errors.UNKNOWN_LEADER_EPOCH)]
    rt.step(rt.core.on_fetch_response(rt.requests[-1], fetched, 160))
    assert rt.core.fetch_session_wakeup_ms(2, 160) == 160 + LEADER_BEHIND_BACKOFF_MS


def test_hw_truncation_cuts_to_the_hw_on_becoming_follower():
    rt = Runtime("hw-truncation")
    rt.open(log=MemoryLog(epochs=[(1, 5)]), checkpointed_hw=3)
    assert rt.leader_and_isr(State(2, 2, (2, 1))) == expect("""
        log TruncateTo offset=3
        state Truncated offset=3 previous_end_offset=5 log_end_offset=3
        state Following leader=2 leader_epoch=2 log_start_offset=0 log_end_offset=3 high_watermark=3
        wake fetches
        poll [2]
        response NONE [t-0 NONE]""")
    assert rt.poll(2) == "send Fetch to 2: t-0@3:e2 wait 500"


def test_kip279_a_leader_epoch_the_follower_never_had_takes_two_rounds():
    rt = Runtime()
    rt.open(log=MemoryLog(epochs=[(1, 2), (3, 3)]))  # epochs 1 (0-1) and 3 (2-4)
    rt.leader_and_isr(State(2, 5, (2, 1)))
    assert rt.poll(2) == "send OffsetForLeaderEpoch to 2: t-0 epoch 3"
    # Asked about 3, the leader answers epoch 2 (it never had 3), ending at 4.
    assert rt.step(
        rt.core.on_epoch_response(rt.requests[-1], [r.EpochAnswer(TP, errors.NONE, 2, 4)], 0)
    ) == expect("""
        log TruncateTo offset=2
        state EpochAnswered leader=2 asked_epoch=3 leader_epoch=2 end_offset=4 cut_at=2 next_epoch=1
        state Truncated offset=2 previous_end_offset=5 log_end_offset=2
        poll [2]""")
    assert rt.poll(2) == "send OffsetForLeaderEpoch to 2: t-0 epoch 1"
    assert rt.step(
        rt.core.on_epoch_response(rt.requests[-1], [r.EpochAnswer(TP, errors.NONE, 1, 2)], 0)
    ).endswith("state TruncationDone leader=2 log_end_offset=2\npoll [2]")


def test_a_follower_with_no_epoch_history_cuts_to_its_hw_without_asking():
    rt = Runtime()
    log = rt.open(checkpointed_hw=0)
    log.log_end_offset = 4  # batches without epochs (written before any leader epoch)
    rt.leader_and_isr(State(2, 1, (2, 1)))
    assert rt.poll(2) == expect("""
        log TruncateTo offset=0
        state Truncated offset=0 previous_end_offset=4 log_end_offset=0
        state TruncationDone leader=2 log_end_offset=0
        send Fetch to 2: t-0@0:e1 wait 500""")


# -- the leader: follower fetches, ISR, purgatory --------------------------------------------------


def leading(isr=(1,), lag_ms: int = 1000, **settings) -> Runtime:
    rt = Runtime(replica_lag_time_max_ms=lag_ms, **settings)
    rt.leader_and_isr(State(1, 1, isr, replicas=(1, 2)))
    return rt


def test_a_follower_fetch_moves_the_hw_and_expands_the_isr():
    rt = leading(isr=(1,))
    rt.produce("p1", 3, acks=1)
    fetched = [(TP, 3, 1)]
    assert rt.step(rt.core.record_follower_fetch(2, fetched, now_ms=10)) == expect("""
        state IsrProposed [1] -> [1, 2] at v0
        isr-write [1, 2] at v0""")
    assert hw(rt) == 3  # the leader alone was the ISR
    assert rt.core.partitions[TP].state.pending_isr == (1, 2)
    written = rt.step(rt.core.on_isr_write_result(rt.isr_writes[-1], True, 1))
    assert written == expect("""
        state IsrChanged previous_isr=(1,) isr=(1, 2)
        wake fetches""")  # a fetch session reads it again: the follower's next fetch records it
    p = rt.core.partitions[TP].state
    assert (p.isr, p.zk_version, p.pending_isr) == ({1, 2}, 1, None)


def test_an_acks_all_produce_waits_for_the_hw_and_completes_when_the_follower_fetches():
    rt = leading(isr=(1, 2), min_insync_replicas=2)
    assert rt.produce("p1", 2) == expect("""
        wake fetches
        wakeup at 1000""")  # parked: answered as p1 later
    assert rt.step(rt.core.record_follower_fetch(2, [(TP, 1, 1)], 5)) == expect("""
        wake fetches""")  # HW 1: not yet past p1's last offset
    assert rt.step(rt.core.record_follower_fetch(2, [(TP, 2, 1)], 6)) == expect("""
        answer p1 NONE
        wake fetches""")
    assert (
        rt.produce("p2", 1)
        and rt.step(rt.core.expire_produces(1000)) == "answer p2 REQUEST_TIMED_OUT"
    )


def test_a_failed_isr_expansion_releases_the_hw_and_answers_the_produces_it_held():
    """A proposed member counts for the HW until its write lands (KIP-497); when the write
    fails, the HW is the committed ISR's at once (until Dec 2026 it waited for the next append
    or a fetch that moved: a member idle at the leader's end never recomputes it)."""
    rt = Runtime(replica_lag_time_max_ms=1000, min_insync_replicas=2)
    rt.leader_and_isr(State(1, 1, (1, 2), replicas=(1, 2, 3)))
    rt.produce("p1", 2)
    assert "isr-write [1, 2, 3] at v0" in rt.step(
        rt.core.record_follower_fetch(3, [(TP, 0, 1)], 5))  # fmt: skip
    rt.step(rt.core.record_follower_fetch(2, [(TP, 2, 1)], 6))
    assert hw(rt) == 0  # held by replica 3, proposed
    assert rt.step(rt.core.on_isr_write_result(rt.isr_writes[-1], False, 3)) == expect("""
        answer p1 NONE
        wake fetches""")
    assert hw(rt) == 2


def test_expiring_produces_names_the_next_deadline_of_a_produce_still_waiting():
    # A runtime keeps one timer for all parked produces: each tick's Ready says when the next
    # one is due, skipping produces already answered.
    rt = leading(isr=(1, 2), min_insync_replicas=2)
    rt.produce("p1", 1)  # parked until 1000 (the harness's timeout)
    rt.produce("p2", 1, now_ms=400)  # parked until 1400
    rt.step(rt.core.record_follower_fetch(2, [(TP, 1, 1)], 401))  # answers p1 only
    assert rt.step(rt.core.expire_produces(500)) == "wakeup at 1400"
    assert rt.step(rt.core.expire_produces(1400)) == "answer p2 REQUEST_TIMED_OUT"


def test_a_produce_answered_at_once_and_the_checks_before_an_append():
    rt = leading(isr=(1, 2), min_insync_replicas=2)
    assert rt.produce("p", 1, acks=1) == "wake fetches\nresponse NONE"
    assert (
        rt.core.prepare_leader_append(("t", 9), 1, batch(1)).error
        == errors.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert rt.core.prepare_leader_append(TP, 1, b"").error == errors.CORRUPT_MESSAGE
    small = Runtime(message_max_bytes=10)
    small.leader_and_isr(State(1, 1, (1,), replicas=(1, 2)))
    assert small.core.prepare_leader_append(TP, 1, batch(1)).error == errors.MESSAGE_TOO_LARGE
    # The controller shrinks the ISR below min.insync.replicas: acks=all is refused.
    rt.leader_and_isr(State(1, 1, (1,), zk_version=1, replicas=(1, 2)))
    assert rt.produce("q", 1) == "rejected NOT_ENOUGH_REPLICAS"


def test_the_isr_shrinks_a_lagging_follower_and_a_fenced_write_changes_nothing():
    rt = leading(isr=(1, 2), lag_ms=100)
    assert rt.step(rt.core.maybe_shrink_isr(50)) == ""  # it has lag max to fetch
    assert rt.step(rt.core.maybe_shrink_isr(101)) == expect("""
        state IsrProposed [1, 2] -> [1] at v0
        isr-write [1] at v0""")
    assert rt.step(rt.core.maybe_shrink_isr(102)) == ""  # one proposal at a time
    # Another leader or epoch is in the store (a conflicting write won): nothing applied (the
    # fetch sessions read the partition again: a follower's next fetch may propose again).
    assert rt.step(rt.core.on_isr_write_result(rt.isr_writes[-1], False, None)) == "wake fetches"
    p = rt.core.partitions[TP].state
    assert (p.isr, p.pending_isr, p.zk_version) == ({1, 2}, None, 0)
    # Only the version moved: the next proposal uses it.
    rt.step(rt.core.maybe_shrink_isr(103))
    rt.step(rt.core.on_isr_write_result(rt.isr_writes[-1], False, 4))
    assert rt.step(rt.core.maybe_shrink_isr(104)).endswith("isr-write [1] at v4")


def test_an_idle_partition_held_by_a_fetch_session_stays_in_sync_while_the_session_fetches():
    # A fetch session names only what changed: an ISR member at the leader's end is held by
    # its session, whose every fetch counts for the partition (Kafka records a caught-up time
    # on every fetch), and which stops counting when the session stops fetching.
    rt = leading(isr=(1, 2), lag_ms=1000)
    session = FollowerFetchSession()
    rt.step(rt.core.record_follower_fetch(2, [(TP, 0, 1)], 10, session))
    for now_ms in (900, 1800, 2700):  # fetches that do not name it
        rt.step(rt.core.record_follower_fetch(2, [], now_ms, session))
    assert rt.step(rt.core.maybe_shrink_isr(3500)) == ""
    assert rt.step(rt.core.maybe_shrink_isr(3701)) == expect("""
        state IsrProposed [1, 2] -> [1] at v0
        isr-write [1] at v0""")  # the session's last fetch was 2700


def test_an_append_or_a_forgotten_partition_ends_the_hold_with_the_session_fetches_written_in():
    rt = leading(isr=(1, 2), lag_ms=1000)
    session = FollowerFetchSession()
    rt.step(rt.core.record_follower_fetch(2, [(TP, 0, 1)], 10, session))
    rt.step(rt.core.record_follower_fetch(2, [], 1800, session))
    rt.produce("p", 3, acks=1, now_ms=2000)  # no longer at the end: the fetches count one by one
    follower = rt.core.partitions[TP].state.replicas[2]
    assert (follower.fetch_session, follower.last_caught_up_time_ms) == (None, 1800)
    rt.step(rt.core.record_follower_fetch(2, [], 2500, session))  # not its fetch any more
    # named at 2600, still at 0: caught up when it last fetched (1800), as Kafka's rule says
    rt.step(rt.core.record_follower_fetch(2, [(TP, 0, 1)], 2600, session))
    assert follower.last_caught_up_time_ms == 1800
    rt.step(rt.core.record_follower_fetch(2, [(TP, 3, 1)], 2700, session))
    assert follower.fetch_session is session and follower.last_caught_up_time_ms == 2700
    rt.core.on_fetch_session_forgot(2, [TP], FollowerFetchSession())  # another session's: kept
    assert follower.fetch_session is session
    rt.core.on_fetch_session_forgot(2, [TP], session)
    rt.step(rt.core.record_follower_fetch(2, [], 3500, session))
    assert follower.fetch_session is None and follower.last_caught_up_time_ms == 2700
    assert rt.step(rt.core.maybe_shrink_isr(3701)).endswith("isr-write [1] at v0")


def test_an_isr_write_of_unknown_outcome_is_asked_again_while_it_is_pending():
    rt = leading(isr=(1, 2), lag_ms=100)
    rt.step(rt.core.maybe_shrink_isr(101))
    update = rt.isr_writes[-1]
    assert rt.step(rt.core.on_isr_write_unknown(update, 200)) == "wakeup at 700"
    # not due yet: nothing is written, and the retry's time is named again
    assert rt.step(rt.core.retry_isr_writes(699)) == "wakeup at 700"
    assert rt.step(rt.core.retry_isr_writes(700)) == expect("""
        state IsrProposed [1, 2] -> [1] at v0
        isr-write [1] at v0""")
    rt.step(rt.core.on_isr_write_unknown(update, 800))
    rt.leader_and_isr(State(1, 2, (1,), replicas=(1, 2)))  # a new epoch: the retry is moot
    assert rt.step(rt.core.retry_isr_writes(1300)) == ""


def test_reads_and_epoch_answers_are_fenced_by_the_leader_epoch_the_requester_knows():
    rt = leading()
    rt.produce("p", 4, acks=1)
    assert rt.core.leader_for(TP, 0)[0] == errors.FENCED_LEADER_EPOCH
    assert rt.core.leader_for(TP, 2)[0] == errors.UNKNOWN_LEADER_EPOCH
    assert rt.core.leader_for(TP, -1)[0] == errors.NONE
    assert rt.core.leader_for(("t", 5))[0] == errors.UNKNOWN_TOPIC_OR_PARTITION
    assert rt.core.end_offset_for_epoch(TP, 1, 1) == (errors.NONE, 1, 4)
    assert rt.core.end_offset_for_epoch(TP, 0, 1) == (errors.FENCED_LEADER_EPOCH, -1, -1)
    follower = Runtime()
    follower.leader_and_isr(State(2, 1, (2, 1)))
    assert follower.core.leader_for(TP)[0] == errors.NOT_LEADER_OR_FOLLOWER


# -- fetch sessions --------------------------------------------------------------------------------


def following_two(protocol: str = "hw-truncation") -> Runtime:
    rt = Runtime(protocol, replica_fetch_wait_max_ms=500, fetch_backoff_ms=50)
    rt.leader_and_isr(State(2, 1, (2, 1)), State(2, 1, (2, 1), partition=1))
    return rt


def test_one_fetch_carries_the_sessions_partitions_and_appends_what_comes_back():
    rt = following_two()
    assert rt.poll(2) == "send Fetch to 2: t-0@0:e1 t-1@0:e1 wait 500"
    fetch = rt.requests[-1]
    answer = [r.FetchedPartition(TP, errors.NONE, 2, 0, batch(3, epoch=1)),
              r.FetchedPartition(("t", 1), errors.NONE, 0, 0, b"")]  # fmt: skip
    assert rt.step(rt.core.on_fetch_response(fetch, answer, 10)) == expect("""
        append t-0 to 3
        wake fetches
        append t-1 to 0
        wake fetches
        poll [2]""")
    assert hw(rt) == 2  # min(leader's HW, own log end)
    assert rt.poll(2, 10) == "send Fetch to 2: t-0@3:e1 t-1@0:e1 wait 500"


def test_an_error_backs_one_partition_off_and_the_long_poll_ends_with_its_backoff():
    rt = following_two()
    rt.poll(2)
    answer = [r.FetchedPartition(TP, errors.NONE, 0, 0, b""),
              r.FetchedPartition(("t", 1), errors.NOT_LEADER_OR_FOLLOWER)]  # fmt: skip
    rt.step(rt.core.on_fetch_response(rt.requests[-1], answer, 100))
    assert rt.poll(2, 120) == "send Fetch to 2: t-0@0:e1 wait 30"  # t-1 may again at 150
    rt.step(rt.core.on_fetch_request_failed(rt.requests[-1], 130))  # t-0 backs off too
    assert rt.poll(2, 140) == ""
    assert rt.core.fetch_session_wakeup_ms(2, 140) == 150
    assert rt.poll(2, 150) == "send Fetch to 2: t-1@0:e1 wait 30"  # t-0 may again at 180


def test_a_partition_joining_a_session_abandons_its_request_in_flight():
    rt = following_two()
    rt.poll(2)
    stale = rt.requests[-1]
    assert rt.leader_and_isr(State(2, 2, (2, 1)), controller_epoch=2) == expect("""
        state Following leader=2 leader_epoch=2 log_start_offset=0 log_end_offset=0 high_watermark=0
        wake fetches
        abandon [2]
        poll [2]
        response NONE [t-0 NONE]""")
    # The abandoned fetch's answer (or failure) is ignored; the session asks afresh.
    assert rt.step(rt.core.on_fetch_response(stale, [r.FetchedPartition(TP, errors.NONE)], 5)) == ""
    assert rt.step(rt.core.on_fetch_request_failed(stale, 5)) == ""
    assert rt.poll(2, 5) == "send Fetch to 2: t-1@0:e1 t-0@0:e2 wait 500"


def test_out_of_range_asks_the_leader_where_its_log_ends_then_starts():
    rt = following_two()
    rt.poll(2)
    rt.step(rt.core.on_fetch_response(rt.requests[-1],
                                      [r.FetchedPartition(TP, errors.OFFSET_OUT_OF_RANGE)], 1))  # fmt: skip
    assert rt.poll(2, 1) == "send ListOffsets to 2: latest"
    rt.step(rt.core.on_list_offsets_response(rt.requests[-1], errors.NONE, 40, 2))  # past our end
    assert rt.poll(2, 2) == "send ListOffsets to 2: earliest"
    assert rt.step(rt.core.on_list_offsets_response(rt.requests[-1], errors.NONE, 30, 3)) == expect("""
        log TruncateFullyAndStartAt offset=30
        state StartingOver leader=2 offset=30 previous_end_offset=0
        poll [2]""")
    assert rt.poll(2, 3) == "send Fetch to 2: t-0@30:e1 t-1@0:e1 wait 500"


def test_becoming_leader_leaves_the_fetch_session():
    rt = following_two()
    rt.leader_and_isr(State(1, 2, (1, 2)), State(1, 2, (1, 2), partition=1), controller_epoch=2)
    assert not rt.core.has_fetch_session(2) and rt.poll(2) == ""


# -- StopReplica -----------------------------------------------------------------------------------


def test_stop_replica_with_delete_answers_parked_produces_and_forgets_the_log():
    rt = leading(isr=(1, 2))
    rt.produce("p1", 1)
    assert rt.step(rt.core.stop_replicas(0, [TP], True, 5)) == "response STALE_CONTROLLER_EPOCH []"
    assert rt.step(rt.core.stop_replicas(1, [TP], True, 5)) == expect("""
        log DeleteLog
        state Stopped deleted=True
        answer p1 NOT_LEADER_OR_FOLLOWER
        wake fetches
        response NONE [t-0 NONE]""")
    assert TP not in rt.core.partitions and TP not in rt.core.checkpoint_high_watermarks()
    assert rt.core.missing_logs(1, [State(1, 2, (1,))]) == [TP]  # it needs a new log


def test_stop_replica_without_delete_keeps_the_checkpointed_hw():
    rt = leading(isr=(1,))
    rt.produce("p", 2, acks=1)
    assert rt.core.checkpoint_high_watermarks() == {TP: 2}
    rt.produce("p", 1, acks=1)  # HW 3, not checkpointed yet
    rt.step(rt.core.stop_replicas(1, [TP], False, 5))
    assert rt.core.checkpoint_high_watermarks() == {TP: 2}
    assert rt.core.missing_logs(1, [State(1, 2, (1,))]) == []


@pytest.mark.parametrize("protocol", ["leader-epoch", "hw-truncation"])
def test_the_protocol_decides_whether_a_new_follower_asks_or_cuts(protocol):
    rt = Runtime(protocol)
    rt.open(log=MemoryLog(epochs=[(1, 4)]), checkpointed_hw=1)
    rt.leader_and_isr(State(2, 2, (2, 1)))
    rt.poll(2)
    first = describe(rt.requests[-1])
    assert first == ("OffsetForLeaderEpoch to 2: t-0 epoch 1" if protocol == "leader-epoch"
                     else "Fetch to 2: t-0@1:e2 wait 500")  # fmt: skip


def test_list_offsets_shows_a_replica_the_log_end_and_a_consumer_the_hw():
    rt = leading(isr=(1, 2))
    rt.produce("p", 3, acks=1)  # HW 0: the follower has nothing yet
    assert rt.core.list_offset(TP, -1, consumer=False) == (errors.NONE, -1, 3)
    assert rt.core.list_offset(TP, -1, consumer=True) == (errors.NONE, -1, 0)
    assert rt.core.list_offset(TP, -2, consumer=True) == (errors.NONE, -1, 0)
    assert rt.core.list_offset(("t", 7), -1, consumer=True)[0] == errors.UNKNOWN_TOPIC_OR_PARTITION


def test_truncation_rounds_end_when_a_leader_answers_above_the_epoch_asked():
    rt = Runtime()
    rt.open(log=MemoryLog(epochs=[(1, 2), (3, 3)]))
    rt.leader_and_isr(State(2, 5, (2, 1)))
    rt.poll(2)  # asks about epoch 3; the leader has 2 there: cut at 2, ask about 1
    rt.step(rt.core.on_epoch_response(rt.requests[-1], [r.EpochAnswer(TP, errors.NONE, 2, 4)], 0))
    assert rt.poll(2) == "send OffsetForLeaderEpoch to 2: t-0 epoch 1"
    # Asked about 1, it answers 2 again: asking about 1 once more would never end.
    answered = rt.step(
        rt.core.on_epoch_response(rt.requests[-1], [r.EpochAnswer(TP, errors.NONE, 2, 4)], 0)
    )
    assert answered.endswith("state TruncationDone leader=2 log_end_offset=2\npoll [2]")
    assert rt.poll(2) == "send Fetch to 2: t-0@2:e5 wait 500"
