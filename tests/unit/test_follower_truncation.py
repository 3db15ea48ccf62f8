"""Where a follower cuts its log: HW truncation (0.8) against leader-epoch truncation (KIP-101/279).

Each replica is a list of records (epoch, payload), one per offset, with a LeaderEpochCache as
its epoch history. `settle` runs the decision the way the fetcher does: ask the leader about the
latest local epoch, cut, ask again about `next_epoch` while the decision is not done; then the
follower fetches the rest of the leader's log.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.replication.follower_truncation import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    Truncation,
    first_epoch_to_ask,
    hw_truncation,
    leader_epoch_truncation,
)
from localcluster.storage import LeaderEpochCache


class Replica:
    def __init__(self, records, high_watermark=0):
        self.log: list[tuple[int, str]] = list(records)
        self.cache = LeaderEpochCache(None)
        for offset, (epoch, _) in enumerate(self.log):
            if epoch != self.cache.latest_epoch:
                self.cache.assign(epoch, offset)
        self.high_watermark = high_watermark

    @property
    def log_end_offset(self) -> int:
        return len(self.log)

    def lead(self, epoch: int) -> None:
        """Become leader in `epoch`: the epoch starts at the log end (make_leader)."""
        self.cache.assign(epoch, self.log_end_offset)

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        return self.cache.end_offset_for(epoch, self.log_end_offset)

    def truncate(self, offset: int) -> None:
        del self.log[offset:]
        self.cache.truncate_from_end(offset)
        self.high_watermark = min(self.high_watermark, offset)

    def fetch_from(self, leader: Replica) -> None:
        for offset in range(self.log_end_offset, leader.log_end_offset):
            epoch, payload = leader.log[offset]
            if epoch > self.cache.latest_epoch:  # as Log.append_as_follower
                self.cache.assign(epoch, offset)
            self.log.append((epoch, payload))


def settle(
    follower: Replica, leader: Replica, answer=None, max_rounds: int = 64
) -> list[Truncation]:
    """Truncate `follower` against `leader` as the fetcher does; the decisions, in order.

    `answer(epoch)` is the leader's OffsetForLeaderEpoch answer (default: its epoch cache)."""
    answer = answer or leader.end_offset_for
    epoch = first_epoch_to_ask(follower.cache.latest_epoch)
    decisions = []
    while True:
        if epoch is None:
            decision = hw_truncation(follower.high_watermark, follower.log_end_offset)
        else:
            leader_epoch, leader_end = answer(epoch)
            decision = leader_epoch_truncation(leader_epoch, leader_end, follower.end_offset_for,
                                               follower.log_end_offset, follower.high_watermark)  # fmt: skip
        decisions.append(decision)
        if decision.offset < follower.log_end_offset:
            follower.truncate(decision.offset)
        if decision.done:
            return decisions
        assert len(decisions) < max_rounds, decisions
        epoch = decision.next_epoch


def hw_settle(follower: Replica) -> Truncation:
    decision = hw_truncation(follower.high_watermark, follower.log_end_offset)
    follower.truncate(decision.offset)
    return decision


# -- the pure functions -----------------------------------------------------------------------


def test_hw_truncation_cuts_to_the_hw_within_the_log():
    assert hw_truncation(3, 10) == Truncation(3, done=True)
    assert hw_truncation(12, 10) == Truncation(10, done=True)


def test_first_epoch_to_ask():
    assert first_epoch_to_ask(UNDEFINED_EPOCH) is None
    assert first_epoch_to_ask(0) == 0
    assert first_epoch_to_ask(7) == 7


def _local(answers):
    return lambda epoch: answers[epoch]


@pytest.mark.parametrize(
    "leader_answer, local_answers, leo, hw, expected",
    [
        # the leader knows no epoch <= ours: fall back to the HW
        ((UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET), {}, 10, 4, Truncation(4, True)),
        ((UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET), {}, 3, 4, Truncation(3, True)),
        # an old leader answers an end offset without an epoch (pre KIP-279)
        ((UNDEFINED_EPOCH, 6), {}, 10, 0, Truncation(6, True)),
        ((UNDEFINED_EPOCH, 16), {}, 10, 0, Truncation(10, True)),
        # we hold no epoch <= the leader's: cut at the leader's end
        ((2, 6), {2: (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)}, 10, 0, Truncation(6, True)),
        # a shared epoch: the smaller of the two ends, within the log
        ((3, 8), {3: (3, 9)}, 10, 0, Truncation(8, True)),
        ((3, 9), {3: (3, 7)}, 10, 0, Truncation(7, True)),
        ((3, 12), {3: (3, 12)}, 10, 0, Truncation(10, True)),
        # KIP-279: an epoch we never had; cut to the end of our largest earlier one, ask again
        ((3, 8), {3: (1, 5)}, 10, 0, Truncation(5, False, next_epoch=1)),
        ((3, 8), {3: (1, 12)}, 10, 0, Truncation(10, False, next_epoch=1)),
    ],
)
def test_leader_epoch_truncation_table(leader_answer, local_answers, leo, hw, expected):
    assert leader_epoch_truncation(*leader_answer, _local(local_answers), leo, hw) == expected


# -- KIP-101 scenario 1: HW truncation loses a committed record -----------------------------------


def scenario_1():
    # B leads epoch 0 with m1, m2; A fetched both, and A's next fetch let B's HW reach 2. A
    # restarted before the response carrying HW 2 arrived: its own HW is 1.
    b = Replica([(0, "m1"), (0, "m2")], high_watermark=2)
    a = Replica([(0, "m1"), (0, "m2")], high_watermark=1)
    return a, b


def test_kip101_scenario_1_hw_truncation_loses_a_committed_record():
    a, b = scenario_1()
    committed = b.log[: b.high_watermark]
    assert hw_settle(a) == Truncation(1, done=True)
    # B dies; A leads epoch 1 with what it kept: m2, committed, is gone
    a.lead(1)
    assert a.log == [(0, "m1")]
    assert a.log[: len(committed)] != committed


def test_kip101_scenario_1_leader_epoch_keeps_it():
    a, b = scenario_1()
    committed = b.log[: b.high_watermark]
    assert settle(a, b) == [Truncation(2, done=True)]  # B: epoch 0 ends at 2; nothing cut
    a.lead(1)  # B dies; A leads
    assert a.log[: len(committed)] == committed


# -- KIP-101 scenario 2: replicas diverge after hard failures ----------------------------------------


def scenario_2():
    # A led epoch 0 with m1, m2; B had m2 unflushed and lost it. B came back first, leads
    # epoch 1 and wrote m3 at offset 1. A comes back as a follower.
    a = Replica([(0, "m1"), (0, "m2")], high_watermark=2)
    b = Replica([(0, "m1")], high_watermark=1)
    b.lead(1)
    b.log.append((1, "m3"))
    return a, b


def test_kip101_scenario_2_hw_truncation_diverges():
    a, b = scenario_2()
    assert hw_settle(a) == Truncation(2, done=True)
    a.fetch_from(b)
    assert a.log_end_offset == b.log_end_offset == 2
    assert a.log[1] == (0, "m2") and b.log[1] == (1, "m3")  # two records at one offset


def test_kip101_scenario_2_leader_epoch_converges():
    a, b = scenario_2()
    assert settle(a, b) == [Truncation(1, done=True)]  # B: epoch 0 ends where epoch 1 starts
    a.fetch_from(b)
    assert a.log == b.log == [(0, "m1"), (1, "m3")]
    assert a.cache.entries() == b.cache.entries() == [(0, 0), (1, 1)]


# -- KIP-279: fast leader changes ---------------------------------------------------------------------


def kip_279():
    # A leads epoch 1: a0 reaches B, a1 does not. B leads epoch 2 and writes b1. A leads again
    # in epoch 3 before truncating, still holding a1. B now follows A.
    a = Replica([(1, "a0"), (1, "a1")])
    b = Replica([(1, "a0")])
    b.lead(2)
    b.log.append((2, "b1"))
    a.lead(3)
    return a, b


def test_kip279_leader_answers_its_largest_earlier_epoch():
    a, b = kip_279()
    assert a.end_offset_for(2) == (1, 2)  # A never saw epoch 2: epoch 1 ends at 2 in A's log
    assert settle(b, a) == [Truncation(1, done=True)]  # min(2, B's end of epoch 1, B's LEO)
    b.fetch_from(a)
    assert b.log == a.log == [(1, "a0"), (1, "a1")]


def test_kip279_without_the_epoch_in_the_answer_diverges():
    # Before KIP-279 the leader answered only an end offset for the requested epoch.
    a, b = kip_279()
    decisions = settle(b, a, answer=lambda epoch: (UNDEFINED_EPOCH, a.end_offset_for(epoch)[1]))
    assert decisions == [Truncation(2, done=True)]
    b.fetch_from(a)
    assert b.log[1] == (2, "b1") and a.log[1] == (1, "a1")


def test_kip279_several_rounds():
    # F led epoch 2 (unclean) over an epoch-0 record L never had; L led epochs 1 and 3.
    f = Replica([(0, "c0"), (0, "c1"), (0, "f2"), (2, "f3"), (2, "f4"), (2, "f5")])
    leader = Replica([(0, "c0"), (0, "c1"), (1, "l2"), (1, "l3"), (3, "l4"), (3, "l5"), (3, "l6")])
    leader.lead(4)
    assert settle(f, leader) == [
        Truncation(3, done=False, next_epoch=0),  # L answers (1, 4); F never had epoch 1
        Truncation(2, done=True),  # L answers (0, 2)
    ]
    f.fetch_from(leader)
    assert f.log == leader.log


def test_follower_without_epoch_history_falls_back_to_the_hw():
    f = Replica([], high_watermark=0)
    leader = Replica([(0, "x")])
    assert settle(f, leader) == [Truncation(0, done=True)]
    f.fetch_from(leader)
    assert f.log == leader.log


# -- random divergent histories -----------------------------------------------------------------------


@st.composite
def divergent_histories(draw):
    """(follower, leader, common prefix length): a shared prefix, then different suffixes.

    Epochs rise through the prefix. Past it, every epoch belongs to one side only (one leader
    per epoch); one side may also hold more records of the prefix's last epoch than the other.
    The leader's current epoch is newer than every other and starts at its log end."""
    prefix_epochs = sorted(draw(st.sets(st.integers(0, 9), max_size=4)))
    prefix = []
    for epoch in prefix_epochs:
        prefix += [(epoch, f"c{len(prefix) + i}") for i in range(draw(st.integers(1, 3)))]
    last = prefix_epochs[-1] if prefix_epochs else -1
    suffix_epochs = sorted(draw(st.sets(st.integers(last + 1, last + 12), max_size=5)))
    owners = [draw(st.sampled_from("LF")) for _ in suffix_epochs]
    logs = {"L": list(prefix), "F": list(prefix)}
    extended = draw(st.sampled_from("LF-")) if prefix_epochs else "-"
    if extended != "-":
        log = logs[extended]
        log += [(last, f"{extended}{len(log) + i}") for i in range(draw(st.integers(1, 3)))]
    follower_empty_tail = draw(st.booleans())
    follower = Replica(logs["F"], high_watermark=draw(st.integers(0, len(prefix))))
    leader = Replica(logs["L"])
    follower_last = max(
        [e for e, o in zip(suffix_epochs, owners, strict=True) if o == "F"], default=None
    )
    for epoch, owner in zip(suffix_epochs, owners, strict=True):
        side = leader if owner == "L" else follower
        empty = follower_empty_tail and epoch == follower_last  # led, then demoted before writing
        count = 0 if empty else draw(st.integers(1, 3))
        side.lead(epoch)  # the epoch starts at that side's log end
        side.log += [(epoch, f"{owner}{side.log_end_offset + i}") for i in range(count)]
    leader.lead(max([last, *suffix_epochs]) + 1)
    return follower, leader, len(prefix)


def first_difference(a: list, b: list) -> int:
    for offset, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return offset
    return min(len(a), len(b))


@settings(max_examples=300, deadline=None)
@given(divergent_histories())
def test_leader_epoch_truncation_converges_on_random_histories(history):
    follower, leader, prefix_end = history
    epochs_held = len(follower.cache.entries())
    differ_at = first_difference(follower.log, leader.log)
    assert differ_at >= prefix_end
    decisions = settle(follower, leader)
    assert len(decisions) <= max(1, epochs_held)  # each extra round drops a local epoch
    assert all(not d.done for d in decisions[:-1]) and decisions[-1].done
    assert prefix_end <= follower.log_end_offset <= differ_at
    follower.fetch_from(leader)
    assert follower.log == leader.log
