"""Incremental fetch sessions (KIP-227), both ends, without I/O.

A fetcher that asks a broker for many partitions over and over (a follower; kafka-python's
consumer) names in each request only the partitions whose position changed, and the broker
answers only the partitions with something new. Idle partitions then cost neither side a
thing per request: without sessions, 50 idle `__consumer_offsets` partitions beside a busy
topic halved a 3-broker cluster's acks=all rate (bench/README.md).

The broker's end is `FetchSessionCache`: `context(request, replica, now_ms)` says what to read
(`FetchContext.read()`) and `FetchContext.respond(responses)` what to send;
`on_partitions_changed(tps)` is told what moved on the broker and says which sessions to wake.
The
fetcher's end is `FetchSessionHandler`: `build(partitions)` gives the session fields and the
partitions to send and to forget, `on_response` / `on_failure` take the outcome.

Kafka's rules (FetchSession.scala, FetchSessionHandler.java):
- epoch -1 (FINAL_EPOCH): a full fetch without a session; a session it names is closed.
- epoch 0 (INITIAL_EPOCH): a full fetch that creates a session (closing one it names); the
  answer carries the new id, or 0 when the cache has no room (the fetcher goes on with full
  fetches and asks again).
- epoch n > 0: an incremental fetch of session `session_id`: FETCH_SESSION_ID_NOT_FOUND when
  the broker has no such session, INVALID_FETCH_SESSION_EPOCH when n is not the epoch it
  expects; the fetcher starts over with a full fetch. The request's partitions are added to
  the session or update it, the forgotten ones leave it, and the answer leaves out a
  partition with no records, no error and the high watermark, last stable offset and log
  start offset it was last sent. Partitions that returned records move to the end, so that
  max_bytes serves all in turn.
- Ours, not Kafka's: Kafka reads every partition of the session on every fetch (and its
  DelayedFetch watches them all). Here an incremental fetch reads only the session's active
  partitions: those named since, those the broker reported moved, and those whose last
  answer said something or left records unread. A partition whose read answered nothing is
  idle until one of those happens, so reading it would answer nothing again. At thousands of
  mostly idle partitions the walk over all of them was most of an idle broker's time.
- Ours, not Kafka's: a follower has one session with each leader (it runs one fetcher per
  leader, as Kafka's num.replica.fetchers=1), so its new session closes any other it has
  here. A full fetch sent before the follower hung up and read after the one that replaced it
  would otherwise open a second session that the follower never uses; the leader counts a
  fetch of an idle partition only from the session that holds it (partition.py,
  FollowerFetchSession), so partitions held by that session would stop being fetched in the
  leader's eyes and fall out of the ISR while their follower fetched on.
- The cache holds at most `max.incremental.fetch.session.cache.slots` sessions (Kafka's 1000;
  a slot is a session of any size, as Kafka's FetchSessionCache counts them: counting
  partitions left a follower of 1,000 partitions without one). A session that does not fit
  evicts the least recently used one idle for `min.incremental.fetch.session.eviction.ms`
  (120 s), or a consumer's for a follower (Kafka's privileged sessions); otherwise it is
  answered without a session.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from localcluster.protocol.fetch import (
    FINAL_EPOCH,
    NO_SESSION_ID,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
)

INITIAL_EPOCH = 0
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
MAX_EPOCH = 2**31 - 1

TopicPartition = tuple[str, int]
Responses = list[tuple[str, list[FetchPartitionResponse]]]


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch`; it wraps to 1, never to the initial or final epoch."""
    return 1 if epoch >= MAX_EPOCH else epoch + 1


# -- the broker's end -------------------------------------------------------------------------


@dataclass(slots=True)
class CachedPartition:
    """A partition of a session: the position last asked, the offsets last sent (-2: never)."""

    fetch: FetchPartition
    high_watermark: int = -2
    last_stable_offset: int = -2
    log_start_offset: int = -2

    def changed_by(self, answer: FetchPartitionResponse) -> bool:
        """Whether `answer` says something new (and remember what it said)."""
        new = (
            answer.error_code != 0
            or bool(answer.records)
            or answer.high_watermark != self.high_watermark
            or answer.last_stable_offset != self.last_stable_offset
            or answer.log_start_offset != self.log_start_offset
        )
        self.high_watermark = answer.high_watermark
        self.last_stable_offset = answer.last_stable_offset
        self.log_start_offset = answer.log_start_offset
        return new


@dataclass(slots=True, eq=False)
class FetchSession:
    session_id: int
    privileged: bool  # a follower's: it may evict consumers' sessions
    partitions: dict[TopicPartition, CachedPartition]
    epoch: int  # the epoch its next request must carry
    last_used_ms: int
    replica_id: int = -1
    # What its next fetch reads: the partitions named since, those that moved
    # (`FetchSessionCache.on_partitions_changed`), and those whose last answer said something
    # or left records unread. The others are idle: read, they would answer nothing.
    active: dict[TopicPartition, None] = field(default_factory=dict)
    moved: set[TopicPartition] = field(default_factory=set)  # since its last first read
    owner: object = None  # the runtime's (the leader's view of a follower's session)


@dataclass(slots=True)
class FetchContext:
    """One request's view of its session: `read()`, the partitions to read as one full
    request (again after each wake-up of a long poll: the session's active partitions may have
    grown), and `respond`, which turns the answers into the response's partitions."""

    error: int  # a top-level error: answer it with no partitions
    session_id: int  # for the response: the session's, or 0 (none)
    request: FetchRequest | None
    session: FetchSession | None = None
    incremental: bool = False

    def read(self) -> FetchRequest | None:
        """An incremental fetch reads the session's active partitions only; a full one all it
        names."""
        session = self.session
        if not self.incremental or session is None:
            return self.request
        return _request_over(self.request, [(tp[0], session.partitions[tp].fetch)
                                            for tp in session.active])  # fmt: skip

    def first_read_done(self) -> None:
        """The first read (the one that records a follower's positions) is over: partitions
        that move from now on are read again by the session's next fetch, whatever this one
        answers of them (a follower's fetch is recorded by a first read: an ISR expansion that
        did not land is proposed again there)."""
        if self.session is not None:
            self.session.moved.clear()

    def respond(self, responses: Responses, unread=frozenset()) -> Responses:
        """The response's partitions from the reads' answers. `unread`: partitions whose
        records max_bytes left to the next fetch."""
        session = self.session
        if session is None:
            return responses
        out: Responses = []
        active = session.active
        for topic, answers in responses:
            kept = []
            for answer in answers:
                tp = (topic, answer.partition)
                cached = session.partitions.get(tp)
                if cached is None:
                    kept.append(answer)
                    continue
                new = cached.changed_by(answer)
                if new or not self.incremental:
                    kept.append(answer)
                if answer.records:  # to the end: the next read starts with the others
                    active.pop(tp, None)
                    active[tp] = None
                elif new or tp in unread or tp in session.moved:
                    active[tp] = None
                else:
                    active.pop(tp, None)
            if kept:
                out.append((topic, kept))
        return out


@dataclass
class FetchSessionCache:
    max_slots: int = 1000  # max.incremental.fetch.session.cache.slots: sessions, not partitions
    eviction_ms: int = 120_000  # min.incremental.fetch.session.eviction.ms
    # ids for new sessions: the runtime passes random ones (Kafka's), the default counts
    new_session_id: Callable[[], int] = field(default_factory=lambda: itertools.count(1).__next__)
    sessions: dict[int, FetchSession] = field(default_factory=dict)  # least recently used first
    # (session, partitions): partitions left a session (forgotten, or it was closed or evicted)
    on_partitions_left: Callable[[FetchSession, list[TopicPartition]], None] = (
        lambda session, tps: None)  # fmt: skip
    # the sessions holding each partition: a change wakes these and no others
    _watchers: dict[TopicPartition, set[int]] = field(default_factory=dict)

    def on_partitions_changed(self, tps) -> list[FetchSession]:
        """`tps` moved (log end, HW, log start, leadership, ISR): the sessions holding them
        read them at their next fetch; returned, to wake a fetch of theirs waiting."""
        touched: dict[int, FetchSession] = {}
        for tp in tps:
            for session_id in self._watchers.get(tp, ()):
                session = self.sessions[session_id]
                session.active[tp] = None
                session.moved.add(tp)
                touched[session_id] = session
        return list(touched.values())

    def context(self, request: FetchRequest, privileged: bool, now_ms: int) -> FetchContext:
        epoch, session_id = request.session_epoch, request.session_id
        if epoch in (FINAL_EPOCH, INITIAL_EPOCH):
            if session_id != NO_SESSION_ID and session_id in self.sessions:
                self._remove(self.sessions[session_id])
            if epoch == FINAL_EPOCH:
                return FetchContext(0, NO_SESSION_ID, request)
            return self._create(request, privileged, now_ms)
        session = self.sessions.get(session_id)
        if session is None:
            return FetchContext(FETCH_SESSION_ID_NOT_FOUND, NO_SESSION_ID, None)
        if session.epoch != epoch:
            return FetchContext(INVALID_FETCH_SESSION_EPOCH, NO_SESSION_ID, None)
        for topic, partitions in request.topics:
            for p in partitions:
                tp = (topic, p.partition)
                cached = session.partitions.get(tp)
                if cached is None:
                    session.partitions[tp] = CachedPartition(p)
                    self._watchers.setdefault(tp, set()).add(session_id)
                else:
                    cached.fetch = p
                session.active[tp] = None
        left = []
        for topic, forgotten in request.forgotten:
            for partition in forgotten:
                tp = (topic, partition)
                if session.partitions.pop(tp, None) is not None:
                    session.active.pop(tp, None)
                    self._unwatch(tp, session_id)
                    left.append(tp)
        if left:
            self.on_partitions_left(session, left)
        session.epoch, session.last_used_ms = next_epoch(epoch), now_ms
        self.sessions[session_id] = self.sessions.pop(session_id)  # most recently used
        return FetchContext(0, session_id, request, session, True)

    def _create(self, request: FetchRequest, privileged: bool, now_ms: int) -> FetchContext:
        if privileged:  # a follower's new session replaces any other it has here
            for other in [s for s in self.sessions.values()
                          if s.privileged and s.replica_id == request.replica_id]:  # fmt: skip
                self._remove(other)
        partitions = {(topic, p.partition): CachedPartition(p)
                      for topic, ps in request.topics for p in ps}  # fmt: skip
        if not partitions or not self._make_room(privileged, now_ms):
            return FetchContext(0, NO_SESSION_ID, request)
        session_id = self.new_session_id()
        while session_id == NO_SESSION_ID or session_id in self.sessions:
            session_id = self.new_session_id()
        session = FetchSession(session_id, privileged, partitions, next_epoch(INITIAL_EPOCH),
                               now_ms, request.replica_id)  # fmt: skip
        self.sessions[session_id] = session
        for tp in partitions:
            self._watchers.setdefault(tp, set()).add(session_id)
        return FetchContext(0, session_id, request, session)

    def _make_room(self, privileged: bool, now_ms: int) -> bool:
        if len(self.sessions) < self.max_slots:
            return True
        victim = next((s for s in self.sessions.values()
                       if now_ms - s.last_used_ms >= self.eviction_ms
                       or (privileged and not s.privileged)), None)  # fmt: skip
        if victim is None:
            return False
        self._remove(victim)
        return True

    def _remove(self, session: FetchSession) -> None:
        del self.sessions[session.session_id]
        for tp in session.partitions:
            self._unwatch(tp, session.session_id)
        self.on_partitions_left(session, list(session.partitions))

    def _unwatch(self, tp: TopicPartition, session_id: int) -> None:
        watching = self._watchers.get(tp)
        if watching is not None:
            watching.discard(session_id)
            if not watching:
                del self._watchers[tp]


def _request_over(request: FetchRequest, partitions) -> FetchRequest:
    """`request`'s fields over `partitions` ((topic, FetchPartition)), grouped by topic."""
    topics: list[tuple[str, list[FetchPartition]]] = []
    index: dict[str, int] = {}
    for topic, fetch in partitions:
        at = index.get(topic)
        if at is None:
            index[topic] = len(topics)
            topics.append((topic, [fetch]))
        else:
            topics[at][1].append(fetch)
    return FetchRequest(request.replica_id, request.max_wait_ms, request.min_bytes,
                        request.max_bytes, request.isolation_level, topics,
                        request.session_id, request.session_epoch, request.rack_id)  # fmt: skip


# -- the fetcher's end ------------------------------------------------------------------------


@dataclass(slots=True)
class SessionRequest:
    """The session fields of the next request, and what it names."""

    session_id: int
    session_epoch: int
    to_send: list[tuple[str, list[FetchPartition]]]
    forgotten: list[tuple[str, list[int]]]
    wanted: dict[TopicPartition, FetchPartition]  # the whole set, for on_response


class FetchSessionHandler:
    """The fetcher's side of one broker's session."""

    def __init__(self) -> None:
        self.session_id = NO_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self.sent: dict[TopicPartition, FetchPartition] = {}  # the session as the broker has it

    def build(self, partitions: list[tuple[str, FetchPartition]]) -> SessionRequest:
        wanted = {(topic, p.partition): p for topic, p in partitions}
        if self.session_id == NO_SESSION_ID or self.epoch == INITIAL_EPOCH:
            return SessionRequest(self.session_id, INITIAL_EPOCH, _by_topic(partitions), [], wanted)
        to_send = [(tp[0], p) for tp, p in wanted.items() if self.sent.get(tp) != p]
        forgotten = [(tp[0], tp[1]) for tp in self.sent if tp not in wanted]
        grouped: dict[str, list[int]] = {}
        for topic, partition in forgotten:
            grouped.setdefault(topic, []).append(partition)
        return SessionRequest(self.session_id, self.epoch, _by_topic(to_send),
                              list(grouped.items()), wanted)  # fmt: skip

    def on_response(self, request: SessionRequest, error: int, session_id: int) -> bool:
        """Take the answer to `request`; False when it carries no partitions to use (the
        session is gone: the next request is a full one)."""
        if error in (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH):
            self.session_id, self.epoch, self.sent = NO_SESSION_ID, INITIAL_EPOCH, {}
            return False
        if error != 0:
            self.on_failure()
            return False
        if request.session_epoch == INITIAL_EPOCH:
            self.session_id = session_id
            self.epoch = next_epoch(INITIAL_EPOCH) if session_id != NO_SESSION_ID else INITIAL_EPOCH
        elif session_id == NO_SESSION_ID:  # the broker closed it
            self.epoch = INITIAL_EPOCH
        else:
            self.epoch = next_epoch(self.epoch)
        self.sent = request.wanted if self.session_id != NO_SESSION_ID else {}
        return True

    def on_failure(self) -> None:
        """No answer (a lost connection, a timeout): whether the broker moved the session on
        is unknown, so the next request is a full one that closes it and opens another."""
        self.epoch, self.sent = INITIAL_EPOCH, {}


def _by_topic(partitions) -> list[tuple[str, list[FetchPartition]]]:
    grouped: dict[str, list[FetchPartition]] = {}
    for topic, p in partitions:
        grouped.setdefault(topic, []).append(p)
    return list(grouped.items())
