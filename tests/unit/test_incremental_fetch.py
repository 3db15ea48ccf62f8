"""KIP-227 fetch sessions, both ends (protocol/incremental_fetch.py), without a broker.

The broker's cache and the fetcher's handler are driven against each other: after every round
the fetcher must know every partition's high watermark and log start offset as the broker has
them, although incremental answers leave out what did not change."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.protocol.fetch import (
    FINAL_EPOCH,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
)
from localcluster.protocol.incremental_fetch import (
    FETCH_SESSION_ID_NOT_FOUND,
    INITIAL_EPOCH,
    INVALID_FETCH_SESSION_EPOCH,
    FetchSessionCache,
    FetchSessionHandler,
)


def request(topics, session_id=0, epoch=INITIAL_EPOCH, forgotten=(), replica_id=1):
    return FetchRequest(replica_id, 500, 1, 1 << 20, 0, topics, session_id, epoch,
                        forgotten=list(forgotten))  # fmt: skip


def positions(*offsets, topic="t"):
    return [(topic, [FetchPartition(i, offset, 1 << 20) for i, offset in enumerate(offsets)])]


def answer(p: FetchPartition, high_watermark: int, records: bytes = b"", error: int = 0):
    return FetchPartitionResponse(p.partition, error, high_watermark, high_watermark, 0,
                                  [records] if records else [])  # fmt: skip


def answers_for(read: FetchRequest, high_watermarks: dict) -> list:
    return [(topic, [answer(p, high_watermarks[(topic, p.partition)]) for p in ps])
            for topic, ps in read.topics]  # fmt: skip


def names(responses) -> list[tuple[str, int]]:
    return [(topic, p.partition) for topic, ps in responses for p in ps]


def read_names(context) -> list[tuple[str, int]]:
    return [(t, p.partition) for t, ps in context.read().topics for p in ps]


def test_a_full_fetch_opens_a_session_whose_incremental_fetches_read_only_what_moved():
    cache = FetchSessionCache(new_session_id=lambda: 7)
    full = cache.context(request(positions(10, 20, 30)), True, now_ms=0)
    assert full.session_id == 7 and full.error == 0
    hws = {("t", 0): 10, ("t", 1): 20, ("t", 2): 30}
    assert names(full.respond(answers_for(full.read(), hws))) == [("t", 0), ("t", 1), ("t", 2)]

    # epoch 1 names nothing: what the full answer told is read once more, and answers nothing
    quiet = cache.context(request([], 7, 1), True, now_ms=1)
    assert read_names(quiet) == [("t", 0), ("t", 1), ("t", 2)]
    assert quiet.respond(answers_for(quiet.read(), hws)) == []
    # then the session is idle: nothing is read until something moves or is named
    idle = cache.context(request([], 7, 2), True, now_ms=2)
    assert read_names(idle) == [] and idle.respond([]) == []

    # epoch 3 names partition 1, which moved on, and the leader's HW of partition 2 moved: only
    # those two are read; the answer names only the partition whose HW moved (partition 1's
    # position alone is no news)
    hws[("t", 2)] = 31
    assert cache.on_partitions_changed([("t", 2)]) == [cache.sessions[7]]
    moved = cache.context(request([("t", [FetchPartition(1, 25, 1 << 20)])], 7, 3), True, 3)
    assert [(p.partition, p.fetch_offset) for _, ps in moved.read().topics for p in ps] == [
        (2, 30), (1, 25)]  # fmt: skip
    assert names(moved.respond(answers_for(moved.read(), hws))) == [("t", 2)]
    # partition 2 answered news: read once more; partition 1 answered none: idle again
    assert read_names(cache.context(request([], 7, 4), True, 4)) == [("t", 2)]


def test_records_or_an_error_are_always_answered_and_partitions_with_records_go_last():
    cache = FetchSessionCache(new_session_id=lambda: 3)
    full = cache.context(request(positions(0, 0, 0)), False, now_ms=0)
    hws = {("t", i): 0 for i in range(3)}
    full.respond(answers_for(full.read(), hws))
    inc = cache.context(request([], 3, 1), False, now_ms=0)
    (t, (p0, p1, p2)) = inc.read().topics[0]
    out = inc.respond([(t, [answer(p0, 0, b"batch"), answer(p1, 0, error=6), answer(p2, 0)])])
    assert names(out) == [("t", 0), ("t", 1)]
    cache.on_partitions_changed([("t", 2)])
    again = cache.context(request([], 3, 2), False, now_ms=0)
    assert [p.partition for p in again.read().topics[0][1]] == [1, 0, 2]


def test_records_left_unread_by_max_bytes_are_read_again_though_they_answered_nothing():
    cache = FetchSessionCache(new_session_id=lambda: 4)
    full = cache.context(request(positions(0, 0)), True, now_ms=0)
    full.respond(answers_for(full.read(), {("t", 0): 5, ("t", 1): 5}))
    inc = cache.context(request([], 4, 1), True, now_ms=0)
    assert inc.respond(answers_for(inc.read(), {("t", 0): 5, ("t", 1): 5}), {("t", 1)}) == []
    assert read_names(cache.context(request([], 4, 2), True, 0)) == [("t", 1)]


def test_a_move_after_the_first_read_is_read_again_by_the_next_fetch_whatever_it_answers():
    # A follower's fetch is recorded by its first read: an ISR expansion whose write clashed
    # while the fetch waited must reach the next fetch's first read to be proposed again.
    cache = FetchSessionCache(new_session_id=lambda: 6)
    full = cache.context(request(positions(0, 0)), True, now_ms=0)
    full.respond(answers_for(full.read(), {("t", 0): 0, ("t", 1): 0}))
    inc = cache.context(request([], 6, 1), True, now_ms=0)
    inc.first_read_done()
    cache.on_partitions_changed([("t", 0)])  # while it waits
    assert inc.respond(answers_for(inc.read(), {("t", 0): 0, ("t", 1): 0})) == []
    following = cache.context(request([], 6, 2), True, now_ms=0)
    assert read_names(following) == [("t", 0)]
    following.first_read_done()
    assert following.respond(answers_for(following.read(), {("t", 0): 0})) == []
    assert read_names(cache.context(request([], 6, 3), True, now_ms=0)) == []


def test_a_change_touches_only_the_sessions_holding_the_partition():
    ids = iter(range(1, 100))
    cache = FetchSessionCache(new_session_id=lambda: next(ids))
    a = cache.context(request(positions(0, 0)), True, now_ms=0).session_id
    b = cache.context(request(positions(0, topic="u"), replica_id=2), True, 0).session_id
    assert [s.session_id for s in cache.on_partitions_changed([("u", 0)])] == [b]
    assert [s.session_id for s in cache.on_partitions_changed([("t", 1), ("x", 0)])] == [a]
    cache.context(request([], a, FINAL_EPOCH), True, now_ms=0)
    assert cache.on_partitions_changed([("t", 1)]) == []


def test_partitions_leaving_a_session_are_reported_forgotten_closed_or_evicted():
    ids = iter(range(1, 100))
    left = []
    cache = FetchSessionCache(max_slots=1, new_session_id=lambda: next(ids),
                              on_partitions_left=lambda s, tps: left.append((s.session_id, tps)))  # fmt: skip
    first = cache.context(request(positions(0, 0)), False, now_ms=0).session_id
    cache.context(request([], first, 1, forgotten=[("t", [0])]), False, now_ms=0)
    assert left == [(first, [("t", 0)])]
    second = cache.context(request(positions(0)), True, now_ms=0).session_id  # evicts it
    assert left[-1] == (first, [("t", 1)])
    cache.context(request(positions(0), second, INITIAL_EPOCH), True, now_ms=0)  # closes it
    assert left[-1] == (second, [("t", 0)])


def test_a_followers_new_session_closes_its_other_one_and_no_one_elses():
    # A follower hangs up on a full fetch (a partition joined its session) and sends another;
    # the leader may read the first after the second. Its session would hold the follower's
    # partitions though the follower never fetches on it.
    ids = iter(range(1, 100))
    left = []
    cache = FetchSessionCache(new_session_id=lambda: next(ids),
                              on_partitions_left=lambda s, tps: left.append((s.session_id, tps)))  # fmt: skip
    other_follower = cache.context(request(positions(0), replica_id=2), True, 0).session_id
    consumer = cache.context(request(positions(0), replica_id=-1), False, 0).session_id
    consumer_too = cache.context(request(positions(0), replica_id=-1), False, 0).session_id
    newer = cache.context(request(positions(0, 0)), True, now_ms=0).session_id
    stale = cache.context(request(positions(0, 0)), True, now_ms=1).session_id  # read late
    assert set(cache.sessions) == {other_follower, consumer, consumer_too, stale}
    assert left == [(newer, [("t", 0), ("t", 1)])]  # its partitions' fetches count no more
    # the follower's next incremental fetch on the session it knows starts it over
    assert cache.context(request([], newer, 1), True, 2).error == FETCH_SESSION_ID_NOT_FOUND
    again = cache.context(request(positions(0, 0), newer, INITIAL_EPOCH), True, 3).session_id
    assert set(cache.sessions) == {other_follower, consumer, consumer_too, again}


def test_unknown_sessions_and_wrong_epochs_are_refused_and_the_final_epoch_closes():
    cache = FetchSessionCache(new_session_id=lambda: 5)
    cache.context(request(positions(0)), True, now_ms=0)
    assert cache.context(request([], 99, 1), True, 0).error == FETCH_SESSION_ID_NOT_FOUND
    assert cache.context(request([], 5, 4), True, 0).error == INVALID_FETCH_SESSION_EPOCH
    assert cache.context(request([], 5, 1), True, 0).error == 0
    assert cache.context(request([], 5, 1), True, 0).error == INVALID_FETCH_SESSION_EPOCH
    closed = cache.context(request(positions(0), 5, FINAL_EPOCH), True, 0)
    assert closed.session_id == 0 and not cache.sessions
    assert cache.context(request([], 5, 3), True, 0).error == FETCH_SESSION_ID_NOT_FOUND


def test_forgotten_partitions_leave_the_session_and_new_ones_join_it():
    cache = FetchSessionCache(new_session_id=lambda: 2)
    cache.context(request(positions(0, 0)), True, now_ms=0)
    inc = cache.context(request(positions(5, topic="u"), 2, 1, forgotten=[("t", [0])]), True, 0)
    assert names(inc.read().topics) == [("u", 0)]  # named: read; ("t", 1) idle, not read
    assert list(inc.session.partitions) == [("t", 1), ("u", 0)]


def test_a_full_cache_evicts_an_idle_or_a_consumer_session_but_never_a_busy_follower():
    ids = iter(range(1, 100))
    cache = FetchSessionCache(max_slots=2, eviction_ms=1000, new_session_id=lambda: next(ids))
    follower = cache.context(request(positions(0, 0)), True, now_ms=0).session_id
    consumer = cache.context(request(positions(0, 0), replica_id=-1), False, now_ms=0).session_id
    # a consumer cannot push out a busy follower: it is answered without a session
    late = cache.context(request(positions(0, 0), replica_id=-1), False, now_ms=10)
    assert late.session_id == 0 and set(cache.sessions) == {follower, consumer}
    # a follower pushes out the consumer's
    other = cache.context(request(positions(0, 0), replica_id=2), True, now_ms=20).session_id
    assert set(cache.sessions) == {follower, other}
    # a session idle for the eviction time gives way to anyone
    cache.context(request([], other, 1), True, now_ms=1500)
    newcomer = cache.context(request(positions(0), replica_id=-1), False, now_ms=1500).session_id
    assert set(cache.sessions) == {other, newcomer}


def test_a_slot_is_a_session_of_any_size_as_kafka_counts_them():
    # A follower of 3,000 partitions on 3 brokers fetches 1,000+ from each leader: counting
    # partitions, no follower got a session and every fetch named them all.
    ids = iter(range(1, 100))
    cache = FetchSessionCache(max_slots=2, new_session_id=lambda: next(ids))
    big = cache.context(request(positions(*[0] * 1500)), True, now_ms=0).session_id
    other = cache.context(request(positions(*[0] * 1500), replica_id=2), True, now_ms=0).session_id
    assert big and other and set(cache.sessions) == {big, other}
    assert cache.context(request(positions(0), replica_id=3), True, now_ms=0).session_id == 0


def test_the_handler_sends_only_changes_and_starts_over_after_an_error_or_a_lost_answer():
    handler = FetchSessionHandler()
    parts = [("t", FetchPartition(i, 0, 100)) for i in range(3)]
    first = handler.build(parts)
    assert (first.session_id, first.session_epoch) == (0, INITIAL_EPOCH)
    assert handler.on_response(first, 0, 9)
    moved = [parts[0], ("t", FetchPartition(1, 4, 100))]
    second = handler.build(moved)
    assert (second.session_id, second.session_epoch) == (9, 1)
    assert names(
        [(t, [FetchPartitionResponse(p.partition, 0)]) for t, ps in second.to_send for p in ps]
    ) == [("t", 1)]
    assert second.forgotten == [("t", [2])]
    assert handler.on_response(second, 0, 9)
    assert handler.build(moved).session_epoch == 2
    handler.on_failure()
    closing = handler.build(moved)
    assert (closing.session_id, closing.session_epoch) == (9, INITIAL_EPOCH)
    assert len(closing.to_send[0][1]) == 2
    assert not handler.on_response(closing, INVALID_FETCH_SESSION_EPOCH, 0)
    assert (handler.build(moved).session_id, handler.build(moved).session_epoch) == (
        0,
        INITIAL_EPOCH,
    )


round_steps = st.lists(st.tuples(
    st.dictionaries(st.integers(0, 5), st.integers(0, 3), max_size=6),  # HW moves per partition
    st.sets(st.integers(0, 5), max_size=6),  # the partitions the fetcher wants this round
    st.booleans(),  # the answer is lost
), min_size=1, max_size=25)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(round_steps)
def test_the_fetcher_always_knows_what_the_broker_has_although_answers_leave_things_out(rounds):
    ids = itertools.count(11)
    cache = FetchSessionCache(new_session_id=lambda: next(ids))
    handler = FetchSessionHandler()
    broker_hw = {("t", i): 0 for i in range(6)}
    fetcher_view: dict = {}
    for moves, wanted, lost in rounds:
        for partition, by in moves.items():
            broker_hw[("t", partition)] += by
        cache.on_partitions_changed([("t", p) for p, by in moves.items() if by])
        planned = [("t", FetchPartition(i, 0, 100)) for i in sorted(wanted)]
        sent = handler.build(planned)
        context = cache.context(request(sent.to_send, sent.session_id, sent.session_epoch,
                                        sent.forgotten), True, now_ms=0)  # fmt: skip
        if lost:
            if context.error == 0:
                context.respond(answers_for(context.read(), broker_hw))
            handler.on_failure()
            fetcher_view = {}  # a lost answer: the next full answer tells all
            continue
        if context.error:
            assert not handler.on_response(sent, context.error, 0)
            fetcher_view = {}
            continue
        out = context.respond(answers_for(context.read(), broker_hw))
        assert handler.on_response(sent, 0, context.session_id)
        if sent.session_epoch == INITIAL_EPOCH:
            fetcher_view = {}
        for topic, ps in out:
            for p in ps:
                fetcher_view[(topic, p.partition)] = p.high_watermark
        for tp in [("t", i) for i in wanted]:
            assert fetcher_view.get(tp) == broker_hw[tp], (tp, sent, out)
