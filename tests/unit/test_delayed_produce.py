"""ProducePurgatory: acks=all produces wait for the HW; each is answered exactly once."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from localcluster.replication import delayed_produce
from localcluster.replication.delayed_produce import ProducePurgatory, ProducePurgatoryFullError

A = ("a", 0)
B = ("b", 1)
NONE = ErrorCode.none
NOT_ENOUGH_AFTER = ErrorCode.not_enough_replicas_after_append
NOT_LEADER = ErrorCode.not_leader_or_follower
TIMED_OUT = ErrorCode.request_timed_out


def test_error_codes_are_kafkas():
    assert (NONE, NOT_ENOUGH_AFTER, NOT_LEADER, TIMED_OUT) == (0, 20, 6, 7)


def test_completes_when_the_hw_reaches_the_offset():
    p = ProducePurgatory()
    p.park("k1", A, 5, deadline_ms=1_000)
    p.park("k2", A, 8, deadline_ms=1_000)
    assert len(p) == 2
    assert p.on_high_watermark(A, 4, isr_size=3, min_insync_replicas=2) == []
    assert p.on_high_watermark(A, 5, isr_size=3, min_insync_replicas=2) == [("k1", NONE)]
    assert len(p) == 1
    assert p.on_high_watermark(A, 10, isr_size=2, min_insync_replicas=2) == [("k2", NONE)]
    assert len(p) == 0
    assert p.on_high_watermark(A, 20, isr_size=2, min_insync_replicas=2) == []


def test_isr_smaller_than_min_insync_fails_after_append():
    p = ProducePurgatory()
    p.park("k", A, 5, deadline_ms=1_000)
    assert p.on_high_watermark(A, 5, isr_size=1, min_insync_replicas=2) == [("k", NOT_ENOUGH_AFTER)]
    assert len(p) == 0


def test_only_the_named_partition_completes():
    p = ProducePurgatory()
    p.park("a", A, 1, deadline_ms=1_000)
    p.park("b", B, 1, deadline_ms=1_000)
    assert p.on_high_watermark(A, 9, 3, 1) == [("a", NONE)]
    assert p.on_high_watermark(("other", 0), 9, 3, 1) == []
    assert len(p) == 1


def test_leadership_loss_answers_not_leader():
    p = ProducePurgatory()
    p.park("a1", A, 1, deadline_ms=1_000)
    p.park("a2", A, 2, deadline_ms=1_000)
    p.park("b", B, 1, deadline_ms=1_000)
    assert sorted(p.on_leadership_lost(A)) == [("a1", NOT_LEADER), ("a2", NOT_LEADER)]
    assert p.on_leadership_lost(A) == []
    assert len(p) == 1
    assert p.on_high_watermark(A, 9, 3, 1) == []


def test_expires_at_the_deadline():
    p = ProducePurgatory()
    p.park("late", A, 5, deadline_ms=2_000)
    p.park("early", A, 5, deadline_ms=1_000)
    assert p.next_deadline_ms() == 1_000
    assert p.expire(999) == []
    assert p.expire(1_000) == [("early", TIMED_OUT)]
    assert p.next_deadline_ms() == 2_000
    assert p.expire(5_000) == [("late", TIMED_OUT)]
    assert len(p) == 0 and p.next_deadline_ms() is None
    assert p.on_high_watermark(A, 9, 3, 1) == []


def test_never_answered_twice():
    p = ProducePurgatory()
    p.park("hw", A, 1, deadline_ms=1_000)
    p.park("lost", B, 1, deadline_ms=1_000)
    p.park("timeout", A, 9, deadline_ms=500)
    assert p.on_high_watermark(A, 1, 3, 1) == [("hw", NONE)]
    assert p.on_leadership_lost(B) == [("lost", NOT_LEADER)]
    assert p.expire(10_000) == [("timeout", TIMED_OUT)]  # the other two are not expired again
    assert p.on_high_watermark(A, 20, 3, 1) == [] and p.on_leadership_lost(A) == []
    assert len(p) == 0


def test_equal_produces_are_distinct():
    p = ProducePurgatory()
    p.park("same", A, 1, deadline_ms=1_000)
    p.park("same", A, 1, deadline_ms=1_000)
    assert p.on_high_watermark(A, 1, 3, 1) == [("same", NONE), ("same", NONE)]
    assert p.expire(1_000) == []


def test_size_is_bounded(monkeypatch):
    monkeypatch.setattr(delayed_produce, "MAX_PARKED", 3)
    p = ProducePurgatory()
    for i in range(3):
        p.park(i, A, 1, deadline_ms=1_000)
    with pytest.raises(ProducePurgatoryFullError, match="3 produces"):
        p.park(3, A, 1, deadline_ms=1_000)
    assert len(p) == 3
    p.on_high_watermark(A, 1, 3, 1)
    p.park(4, A, 1, deadline_ms=1_000)  # answered ones make room
    assert len(p) == 1


def test_answered_produces_do_not_pile_up_until_their_deadlines():
    # Answered produces must not be held until their (far) deadlines: the bookkeeping of a
    # busy partition with a 30 s timeout would grow with throughput x timeout, unbounded.
    p = ProducePurgatory()
    p.park("waits", B, 10**6, deadline_ms=40_000)
    for i in range(10_000):
        p.park(i, A, i, deadline_ms=30_000)
        assert p.on_high_watermark(A, i, 3, 1) == [(i, NONE)]
        held = len(p._deadlines) + len(p._done)  # heap entries and their answered marks
        assert held <= 2 * (len(p) + delayed_produce.COMPACT_AFTER) + 2, (i, held)
    assert len(p) == 1
    assert p.expire(30_000) == []
    assert p.expire(40_000) == [("waits", TIMED_OUT)]


# -- random operations: every produce is answered exactly once, with the right code ---------------

TPS = (A, B)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from([2, delayed_produce.COMPACT_AFTER]))
def test_random_operations_answer_each_produce_once(data, compact_after):
    with mock.patch.object(delayed_produce, "COMPACT_AFTER", compact_after):  # 2: rebuilt often
        check_random_operations(data)


def check_random_operations(data):
    p = ProducePurgatory()
    now = 0
    parked = {}  # key -> (tp, required offset, deadline)
    answered = {}
    hw = dict.fromkeys(TPS, 0)

    def record(answers, check):
        for key, code in answers:
            assert key in parked and key not in answered, key
            check(key, code)
            answered[key] = code

    for step in range(data.draw(st.integers(1, 50))):
        op = data.draw(st.sampled_from(["park", "park", "hw", "lost", "tick"]))
        if op == "park":
            tp = data.draw(st.sampled_from(TPS))
            required = hw[tp] + data.draw(st.integers(1, 5))
            deadline = now + data.draw(st.integers(0, 50))
            p.park(step, tp, required, deadline)
            parked[step] = (tp, required, deadline)
        elif op == "hw":
            tp = data.draw(st.sampled_from(TPS))
            hw[tp] += data.draw(st.integers(0, 4))
            isr, min_isr = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))

            def check_hw(key, code, tp=tp, isr=isr, min_isr=min_isr):
                assert parked[key][0] == tp and parked[key][1] <= hw[tp]
                assert code == (NONE if isr >= min_isr else NOT_ENOUGH_AFTER)

            record(p.on_high_watermark(tp, hw[tp], isr, min_isr), check_hw)
            # nothing this partition's HW covers is left waiting
            assert not [k for k, (t, r, _) in parked.items()
                        if k not in answered and t == tp and r <= hw[tp]]  # fmt: skip
        elif op == "lost":
            tp = data.draw(st.sampled_from(TPS))

            def check_lost(key, code, tp=tp):
                assert parked[key][0] == tp and code == NOT_LEADER

            record(p.on_leadership_lost(tp), check_lost)
            assert not [k for k, (t, _, _) in parked.items() if k not in answered and t == tp]
        elif op == "tick":
            now += data.draw(st.integers(0, 20))

            def check_expired(key, code, now=now):
                assert parked[key][2] <= now and code == TIMED_OUT

            record(p.expire(now), check_expired)
            assert not [k for k, (_, _, d) in parked.items() if k not in answered and d <= now]
        assert len(p) == len(parked) - len(answered)
    record(p.expire(10**9), lambda key, code: code == TIMED_OUT or pytest.fail(code))
    assert set(answered) == set(parked) and len(p) == 0
