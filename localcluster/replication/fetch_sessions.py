"""Follower fetch sessions: which partitions this broker fetches from which leader, and what it
asks each leader next. Sans-I/O: the decisions of Kafka's AbstractFetcherThread.

One session per leader and one request in flight per session; the runtime (a fetcher task per
leader, or the simulator) sends what `poll` plans and reports the answer or the failure. A
partition joins the session of its leader when this broker becomes its follower, and is:
- truncating (leader-epoch mode): it asks the leader where its latest epoch ends
  (OffsetForLeaderEpoch), cuts there and asks about an earlier epoch until both logs share one
  (KIP-101/279, `follower_truncation`); with no epoch history it cuts to its HW;
- asking the leader where its log ends, then starts (ListOffsets) after OFFSET_OUT_OF_RANGE;
- fetching: one Fetch carries every fetching partition that is not backing off, from its end.
Truncating and out-of-range partitions ask first. An error answer backs its partition off for
`fetch_backoff_ms` (Kafka's replica.fetch.backoff.ms) and the session goes on with the others;
UNKNOWN_LEADER_EPOCH only for LEADER_BEHIND_BACKOFF_MS: the leader has not yet taken the
LeaderAndIsr the controller sent with ours and will within a few ms (Kafka waits the whole
backoff, which held a failover's acks=all writes 50 ms here when a follower was the quicker);
a long poll waits no longer than the first backoff ends (`long_poll_ms`). A failed request
(timeout, connection) backs off every partition it carried. A partition that joins a session
with a request in flight abandons that request: a long poll for the old state must not hold
the new one back. Answers are matched to the request (by identity) and to each partition's
state when the request left: a partition that left or joined again since ignores them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from localcluster.replication import errors
from localcluster.replication.follower_truncation import (
    first_epoch_to_ask,
    hw_truncation,
    leader_epoch_truncation,
)
from localcluster.replication.ready import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    AppendFailed,
    EpochAnswer,
    EpochAnswered,
    EpochAsk,
    EpochRequestPlan,
    FetchedPartition,
    FetcherRequest,
    FetchPartitionPlan,
    FetchRequestPlan,
    FollowerAppend,
    LeaderError,
    ListOffsetsPlan,
    OutOfRange,
    Ready,
    StartingOver,
    TopicPartition,
    Truncated,
    TruncateFullyAndStartAt,
    TruncateTo,
    TruncationDone,
)
from localcluster.storage import record_batch as rb

LEADER_BEHIND_BACKOFF_MS = 5


@dataclass(slots=True, eq=False)  # identity: answers are matched to the state they left with
class PartitionFetchState:
    """A followed partition, as Kafka's PartitionFetchState."""

    leader_epoch: int
    truncating: bool
    ask_epoch: int | None = None  # KIP-279: the epoch to ask the leader about next
    list_offsets: int | None = None  # LATEST/EARLIEST_TIMESTAMP: asking after out of range
    backoff_until_ms: int = 0


@dataclass(slots=True)
class Inflight:
    request: FetcherRequest
    states: dict[TopicPartition, PartitionFetchState]  # what it carries, as they were


@dataclass(slots=True)
class FetchSession:
    leader_id: int
    partitions: dict[TopicPartition, PartitionFetchState] = field(default_factory=dict)
    inflight: Inflight | None = None


def long_poll_ms(states: Iterable[PartitionFetchState], now_ms: int, wait_max_ms: int) -> int:
    """How long a Fetch may wait at the leader: replica.fetch.wait.max.ms, but no longer than
    until the first partition backing off (left out of this Fetch) may fetch again.

    A long poll for the other partitions would otherwise hold it back for the whole wait: after
    a leader change the follower often asks before the new leader has its LeaderAndIsr, backs
    off, and then sat behind a 500 ms poll of the partitions the leader already had (acks=all
    failovers that took 540 ms instead of 40)."""
    waits = [s.backoff_until_ms - now_ms for s in states if s.backoff_until_ms > now_ms]
    return min(wait_max_ms, min(waits)) if waits else wait_max_ms


def complete_batches(records) -> memoryview:
    """The prefix of `records` made of whole batches (a fetch may end mid-batch)."""
    view = memoryview(records)
    end = 0
    for position, size in rb.batch_spans(view):
        end = position + size
    return view[:end]


def truncate_follower(hosted, offset: int, ready: Ready) -> None:
    """Cut a follower's log to `offset` (nothing when it ends there already), counting the
    result in its Partition now (the log says where the cut lands: it keeps whole batches);
    the runtime runs the log action before anything else."""
    p = hosted.state
    if offset >= p.log_end_offset:
        return
    if offset < p.log_start_offset:
        ready.log_actions.append(TruncateFullyAndStartAt(p.tp, offset))
        p.on_follower_truncated(offset, offset)
        return
    end = hosted.log.truncation_offset(offset)  # whole batches go: maybe below `offset`
    ready.log_actions.append(TruncateTo(p.tp, offset))
    ready.state_changes.append(Truncated(p.tp, offset, p.log_end_offset, end))
    p.on_follower_truncated(p.log_start_offset, end)


class FetchSessions:
    def __init__(self, partitions: dict, fetch_wait_max_ms: int, fetch_backoff_ms: int,
                 append_failure_backoff_ms: int):  # fmt: skip
        self.partitions = partitions  # the core's hosted replicas (shared, read here)
        self.fetch_wait_max_ms = fetch_wait_max_ms
        self.fetch_backoff_ms = fetch_backoff_ms
        self.append_failure_backoff_ms = append_failure_backoff_ms
        self.sessions: dict[int, FetchSession] = {}
        self._leader_of: dict[TopicPartition, int] = {}

    # -- membership ----------------------------------------------------------------------------

    def add_partition(self, tp, leader_id: int, leader_epoch: int, truncating: bool,
                      ready: Ready) -> None:  # fmt: skip
        self.remove_partition(tp, ready)
        session = self.sessions.get(leader_id)
        if session is None:
            session = self.sessions[leader_id] = FetchSession(leader_id)
        session.partitions[tp] = PartitionFetchState(leader_epoch, truncating)
        self._leader_of[tp] = leader_id
        if session.inflight is not None:
            session.inflight = None
            ready.abandoned.add(leader_id)
        ready.fetch_sessions.add(leader_id)

    def remove_partition(self, tp, ready: Ready) -> None:
        leader_id = self._leader_of.pop(tp, None)
        if leader_id is None:
            return
        session = self.sessions[leader_id]
        del session.partitions[tp]
        self._forget_if_idle(session)
        ready.fetch_sessions.add(leader_id)  # a fetcher with nothing left stops

    def has_session(self, leader_id: int) -> bool:
        session = self.sessions.get(leader_id)
        return session is not None and bool(session.partitions)

    def wakeup_ms(self, leader_id: int, now_ms: int) -> int | None:
        """When a session with nothing to send may send again (its first backoff ends)."""
        session = self.sessions.get(leader_id)
        ends = [s.backoff_until_ms for s in session.partitions.values()
                if s.backoff_until_ms > now_ms] if session else []  # fmt: skip
        return min(ends) if ends else None

    def _forget_if_idle(self, session: FetchSession) -> None:
        if not session.partitions and session.inflight is None:
            del self.sessions[session.leader_id]

    # -- planning ------------------------------------------------------------------------------

    def poll(self, leader_id: int, now_ms: int, ready: Ready) -> None:
        """The session's next request into `ready.requests`, unless one is in flight."""
        session = self.sessions.get(leader_id)
        if session is None or session.inflight is not None:
            return
        asks, asking = [], {}
        for tp, state in session.partitions.items():
            if state.truncating and state.backoff_until_ms <= now_ms:
                ask = self._truncation_ask(session, tp, state, ready)
                if ask is not None:
                    asks.append(ask)
                    asking[tp] = state
        if asks:
            self._send(session, EpochRequestPlan(leader_id, tuple(asks)), asking, ready)
            return
        for tp, state in session.partitions.items():
            if (
                not state.truncating
                and state.list_offsets is not None
                and state.backoff_until_ms <= now_ms
            ):
                self._send(session, ListOffsetsPlan(leader_id, tp, state.list_offsets), {tp: state},
                           ready)  # fmt: skip
                return
        fetching = {tp: s for tp, s in session.partitions.items()
                    if not s.truncating and s.list_offsets is None
                    and s.backoff_until_ms <= now_ms}  # fmt: skip
        if not fetching:
            return
        plans = []
        for tp, state in fetching.items():
            p = self.partitions[tp].state
            plans.append(FetchPartitionPlan(tp, p.log_end_offset, state.leader_epoch,
                                            p.log_start_offset))  # fmt: skip
        wait_ms = long_poll_ms(session.partitions.values(), now_ms, self.fetch_wait_max_ms)
        self._send(session, FetchRequestPlan(leader_id, tuple(plans), wait_ms), fetching, ready)

    def _truncation_ask(self, session, tp, state, ready) -> EpochAsk | None:
        hosted = self.partitions[tp]
        if state.ask_epoch is None:
            state.ask_epoch = first_epoch_to_ask(hosted.log.latest_epoch)
            if state.ask_epoch is None:  # no epoch history: nothing to compare; cut to the HW
                p = hosted.state
                truncate_follower(hosted, hw_truncation(p.high_watermark, p.log_end_offset).offset,
                                  ready)  # fmt: skip
                self._truncated(session, tp, state, ready)
                return None
        return EpochAsk(tp, state.leader_epoch, state.ask_epoch)

    def _truncated(self, session, tp, state, ready) -> None:
        state.truncating = False
        state.ask_epoch = None
        ready.state_changes.append(
            TruncationDone(tp, session.leader_id, self.partitions[tp].state.log_end_offset)
        )

    @staticmethod
    def _send(session, request, states, ready: Ready) -> None:
        session.inflight = Inflight(request, states)
        ready.requests.append(request)

    # -- answers -------------------------------------------------------------------------------

    def _take(self, request, ready: Ready) -> Inflight | None:
        """The request's record if it is its session's request in flight (None: abandoned, or
        answered already); the session may send again."""
        session = self.sessions.get(request.leader_id)
        if session is None or session.inflight is None or session.inflight.request is not request:
            return None
        inflight, session.inflight = session.inflight, None
        self._forget_if_idle(session)
        ready.fetch_sessions.add(request.leader_id)
        return inflight

    def _following(self, tp, state: PartitionFetchState) -> bool:
        session = self.sessions.get(self._leader_of.get(tp, -1))
        hosted = self.partitions.get(tp)
        return (session is not None and session.partitions.get(tp) is state
                and hosted is not None and not hosted.state.is_leader)  # fmt: skip

    def _backoff(self, state: PartitionFetchState, now_ms: int, backoff_ms: int) -> None:
        state.backoff_until_ms = now_ms + backoff_ms

    def _error_backoff_ms(self, error: int) -> int:
        return (
            LEADER_BEHIND_BACKOFF_MS
            if error == errors.UNKNOWN_LEADER_EPOCH
            else self.fetch_backoff_ms
        )

    def on_epoch_response(self, request: EpochRequestPlan, answers: Iterable[EpochAnswer],
                          now_ms: int, ready: Ready) -> None:  # fmt: skip
        inflight = self._take(request, ready)
        if inflight is None:
            return
        asked = {ask.tp: ask for ask in request.partitions}
        for answer in answers:
            ask, state = asked.get(answer.tp), inflight.states.get(answer.tp)
            if ask is None or state is None or not self._following(answer.tp, state):
                continue
            self._on_epoch_answer(request.leader_id, ask, answer, state, now_ms, ready)
        # A partition the leader did not answer stays truncating: asked again next poll.

    def _on_epoch_answer(self, leader_id: int, ask: EpochAsk, answer: EpochAnswer,
                         state: PartitionFetchState, now_ms: int, ready: Ready) -> None:  # fmt: skip
        tp = ask.tp
        if answer.error != errors.NONE:
            state.ask_epoch = None  # start over from our latest epoch
            self._backoff(state, now_ms, self._error_backoff_ms(answer.error))
            ready.state_changes.append(
                LeaderError(tp, leader_id, "OffsetForLeaderEpoch", answer.error)
            )
            return
        hosted = self.partitions[tp]
        p = hosted.state
        decision = leader_epoch_truncation(answer.leader_epoch, answer.end_offset,
                                           hosted.log.end_offset_for_epoch, p.log_end_offset,
                                           p.high_watermark)  # fmt: skip
        ready.state_changes.append(EpochAnswered(
            tp, leader_id, ask.leader_epoch, answer.leader_epoch, answer.end_offset,
            decision.offset, None if decision.done else decision.next_epoch))  # fmt: skip
        truncate_follower(hosted, decision.offset, ready)
        # The bound of the KIP-279 rounds: each asks about an older epoch than the last (the
        # leader answers an epoch <= the one asked). One that would not ends them at the cut.
        if decision.done or decision.next_epoch >= ask.leader_epoch:
            self._truncated(self.sessions[leader_id], tp, state, ready)
        else:
            state.ask_epoch = decision.next_epoch

    def on_fetch_response(self, request: FetchRequestPlan, fetched: Iterable[FetchedPartition],
                          now_ms: int, ready: Ready) -> None:  # fmt: skip
        inflight = self._take(request, ready)
        if inflight is None:
            return
        for answer in fetched:
            state = inflight.states.get(answer.tp)
            if state is None or not self._following(answer.tp, state):
                continue
            if answer.error == errors.NONE:
                ready.follower_appends.append(FollowerAppend(
                    answer.tp, complete_batches(answer.records), answer.high_watermark,
                    answer.log_start_offset))  # fmt: skip
            elif answer.error == errors.OFFSET_OUT_OF_RANGE:
                state.list_offsets = LATEST_TIMESTAMP
                ready.state_changes.append(OutOfRange(answer.tp, request.leader_id))
            else:
                self._backoff(state, now_ms, self._error_backoff_ms(answer.error))
                ready.state_changes.append(
                    LeaderError(answer.tp, request.leader_id, "Fetch", answer.error)
                )

    def on_append_failed(self, tp, reason: str, now_ms: int, ready: Ready) -> None:
        """The fetched batches did not fit the log (e.g. not at its end): try again later."""
        leader_id = self._leader_of.get(tp)
        if leader_id is not None:
            self._backoff(self.sessions[leader_id].partitions[tp], now_ms,
                          self.append_failure_backoff_ms)  # fmt: skip
        ready.state_changes.append(AppendFailed(tp, reason))

    def on_list_offsets_response(self, request: ListOffsetsPlan, error: int, offset: int,
                                 now_ms: int, ready: Ready) -> None:  # fmt: skip
        inflight = self._take(request, ready)
        state = inflight.states[request.tp] if inflight else None
        if state is None or not self._following(request.tp, state):
            return
        tp = request.tp
        state.list_offsets = None
        if error != errors.NONE:
            self._backoff(state, now_ms, self._error_backoff_ms(error))
            ready.state_changes.append(LeaderError(tp, request.leader_id, "ListOffsets", error))
            return
        hosted = self.partitions[tp]
        p = hosted.state
        if request.timestamp == LATEST_TIMESTAMP:
            if p.log_end_offset > offset >= 0:  # our end is past the leader's: cut back to it
                truncate_follower(hosted, offset, ready)
            else:  # our end is before the leader's start
                state.list_offsets = EARLIEST_TIMESTAMP
            return
        assert request.timestamp == EARLIEST_TIMESTAMP
        ready.state_changes.append(StartingOver(tp, request.leader_id, offset, p.log_end_offset))
        ready.log_actions.append(TruncateFullyAndStartAt(tp, offset))
        p.on_follower_truncated(offset, offset)

    def on_request_failed(self, request, now_ms: int, ready: Ready) -> None:
        """No answer (a timeout, a broken connection): back off what it carried."""
        inflight = self._take(request, ready)
        if inflight is None:
            return
        for tp, state in inflight.states.items():
            if self._following(tp, state):
                self._backoff(state, now_ms, self.fetch_backoff_ms)
                if isinstance(request, EpochRequestPlan):
                    state.ask_epoch = None
                state.list_offsets = None
