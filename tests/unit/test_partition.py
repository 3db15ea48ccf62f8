"""Partition: HW, ISR and Kafka's caught-up rule, step by step and under random event sequences."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.replication.partition import IsrUpdate, NotLeaderError, Partition

TOPIC = "t"
LAG_MS = 1_000


def leader(assignment=(0, 1, 2), isr=None, epoch=1, leo=10, hw=5, lso=0, now=1_000, zk=7):
    p = Partition(TOPIC, 0, 0)
    p.make_leader(epoch, assignment if isr is None else isr, assignment, zk, lso, leo, hw, now)
    return p


def follower(leader_id=1, epoch=1, leo=10, hw=5, lso=0):
    p = Partition(TOPIC, 0, 0)
    p.make_follower(leader_id, epoch, (0, 1, 2), (0, 1, 2), 3, lso, leo, hw)
    return p


# -- make_leader / make_follower -------------------------------------------------------------


def test_make_leader_adds_itself_to_isr_and_caps_hw():
    p = Partition(TOPIC, 0, 0)
    moved = p.make_leader(4, (1, 2), (0, 1, 2), 9, 3, 10, 50, now_ms=100, controller_epoch=2)
    assert p.is_leader and p.leader_epoch == 4 and p.zk_version == 9 and p.controller_epoch == 2
    assert p.isr == {0, 1, 2}
    assert p.high_watermark == 10  # capped by the log end
    assert moved is False  # followers have not fetched in this epoch: nothing to advance
    assert p.leader_epoch_start_offset == 10
    assert set(p.replicas) == {1, 2}
    assert all(
        r.log_end_offset == -1 and r.last_caught_up_time_ms == 100 for r in p.replicas.values()
    )


def test_make_leader_hw_floored_by_log_start():
    p = Partition(TOPIC, 0, 0)
    p.make_leader(1, (0, 1), (0, 1), 0, 6, 10, 2, now_ms=0)
    assert p.high_watermark == 6


def test_make_leader_alone_in_isr_commits_its_whole_log():
    p = Partition(TOPIC, 0, 0)
    assert p.make_leader(1, (0,), (0, 1, 2), 0, 0, 10, 3, now_ms=0) is True
    assert p.high_watermark == 10


def test_a_partition_state_is_newer_by_epoch_or_by_znode_version_within_it():
    p = leader(epoch=5, zk=7)
    assert p.is_newer_state(6, 0)  # a new leader epoch, whatever the version
    assert p.is_newer_state(5, 8)  # the same epoch, the ISR changed
    assert not p.is_newer_state(5, 7) and not p.is_newer_state(5, 6) and not p.is_newer_state(4, 99)


def test_make_leader_rejects_an_older_epoch():
    p = leader(epoch=5)
    with pytest.raises(AssertionError):
        p.make_leader(4, (0,), (0, 1, 2), 0, 0, 10, 5, now_ms=0)


def test_make_leader_again_in_the_same_epoch_keeps_follower_state():
    p = leader(epoch=2, leo=10, hw=5)
    p.update_follower_fetch_state(1, 8, now_ms=1_500)
    p.make_leader(2, (0, 1, 2), (0, 1, 2), 8, 0, 12, 0, now_ms=2_000)
    assert p.replicas[1].log_end_offset == 8
    assert p.leader_epoch_start_offset == 10  # the epoch did not restart
    assert p.high_watermark == 5  # never lowered within the epoch
    assert p.zk_version == 8


def test_new_epoch_resets_follower_state():
    p = leader(epoch=2, leo=10, hw=5)
    p.update_follower_fetch_state(1, 10, now_ms=1_500)
    p.update_follower_fetch_state(2, 10, now_ms=1_500)
    assert p.high_watermark == 10
    p.on_local_append(15)
    p.make_leader(3, (0, 1, 2), (0, 1, 2), 8, 0, 15, p.high_watermark, now_ms=2_000)
    assert p.leader_epoch_start_offset == 15
    assert all(r.log_end_offset == -1 for r in p.replicas.values())
    # the HW needs fetches in the new epoch before it moves
    assert p.on_local_append(16) is False and p.high_watermark == 10


def test_make_follower_caps_hw_and_forgets_replicas():
    p = leader()
    p.make_follower(1, 2, (1, 2), (0, 1, 2), 4, 0, 8, 9)
    assert not p.is_leader and p.leader_id == 1 and p.leader_epoch == 2
    assert p.high_watermark == 8 and p.replicas == {} and p.pending_isr is None


def test_leader_only_operations_raise_on_a_follower():
    p = follower()
    with pytest.raises(NotLeaderError):
        p.on_local_append(11)
    with pytest.raises(NotLeaderError):
        p.update_follower_fetch_state(2, 10, now_ms=0)
    assert p.maybe_shrink_isr(10**9, LAG_MS) is None
    assert p.maybe_increment_leader_hw() is False


# -- high watermark ---------------------------------------------------------------------------


def test_hw_is_the_smallest_log_end_in_the_isr():
    p = leader(leo=10, hw=5)
    assert p.update_follower_fetch_state(1, 9, now_ms=1_100) == (False, None)  # 2 never fetched
    assert p.high_watermark == 5
    assert p.update_follower_fetch_state(2, 7, now_ms=1_100) == (True, None)
    assert p.high_watermark == 7
    assert p.on_local_append(20) is False
    assert p.update_follower_fetch_state(2, 10, now_ms=1_200) == (True, None)
    assert p.high_watermark == 9  # now follower 1 is the slowest
    assert p.update_follower_fetch_state(1, 20, now_ms=1_200) == (True, None)
    assert p.update_follower_fetch_state(2, 20, now_ms=1_200) == (True, None)
    assert p.high_watermark == 20


def test_hw_does_not_move_back_when_a_follower_fetches_lower():
    p = leader(isr=(0, 1), leo=10, hw=0)
    p.update_follower_fetch_state(1, 10, now_ms=1_100)
    assert p.high_watermark == 10
    p.update_follower_fetch_state(1, 4, now_ms=1_200)  # e.g. it restarted and truncated
    assert p.high_watermark == 10


def test_fetch_from_an_unassigned_replica_is_ignored():
    p = leader()
    assert p.update_follower_fetch_state(9, 10, now_ms=1_100) == (False, None)
    assert 9 not in p.replicas and p.isr == {0, 1, 2}


# -- Kafka's caught-up rule ---------------------------------------------------------------------


def test_fetch_at_the_leader_end_is_caught_up_now():
    p = leader(leo=10)
    p.update_follower_fetch_state(1, 10, now_ms=5_000)
    assert p.replicas[1].last_caught_up_time_ms == 5_000


def test_fetch_at_the_previous_leader_end_is_caught_up_as_of_the_previous_fetch():
    p = leader(leo=10, now=1_000)
    p.update_follower_fetch_state(1, 5, now_ms=2_000)  # behind: leader's end was 10 then
    assert p.replicas[1].last_caught_up_time_ms == 1_000
    p.on_local_append(20)
    p.update_follower_fetch_state(1, 10, now_ms=3_000)  # reached what the leader had at 2_000
    assert p.replicas[1].last_caught_up_time_ms == 2_000
    p.on_local_append(30)
    p.update_follower_fetch_state(1, 15, now_ms=4_000)  # short of 20, the end at 3_000
    assert p.replicas[1].last_caught_up_time_ms == 2_000
    p.update_follower_fetch_state(1, 30, now_ms=5_000)
    assert p.replicas[1].last_caught_up_time_ms == 5_000


def test_caught_up_time_decides_the_shrink():
    p = leader(leo=10, now=1_000)
    p.update_follower_fetch_state(1, 5, now_ms=2_000)
    p.update_follower_fetch_state(2, 10, now_ms=2_000)
    p.on_local_append(20)
    p.update_follower_fetch_state(1, 10, now_ms=3_000)  # caught up as of 2_000
    p.update_follower_fetch_state(2, 20, now_ms=3_000)  # caught up as of 3_000
    assert p.maybe_shrink_isr(2_000 + LAG_MS, LAG_MS) is None  # exactly the lag: still in
    update = p.maybe_shrink_isr(2_001 + LAG_MS, LAG_MS)
    assert update is not None and update.isr == (0, 2)


# -- ISR shrink and expansion -----------------------------------------------------------------


def test_shrink_proposal_and_success():
    p = leader(leo=10, hw=5, now=1_000, zk=7)
    p.update_follower_fetch_state(1, 10, now_ms=1_500)  # 1 caught up; 2 never fetched
    assert p.maybe_shrink_isr(1_000 + LAG_MS, LAG_MS) is None
    update = p.maybe_shrink_isr(1_001 + LAG_MS, LAG_MS)
    assert update == IsrUpdate(TOPIC, 0, 0, 1, (0, 1), 7, update.reason)
    assert "[2]" in update.reason
    # until ZooKeeper agrees, the HW waits for the old ISR (2 never fetched)
    assert p.isr == {0, 1, 2} and p.high_watermark == 5
    assert p.maybe_shrink_isr(5_000, LAG_MS) is None  # one update at a time
    assert p.on_isr_update_succeeded((0, 1), 8) is True
    assert (
        p.isr == {0, 1} and p.zk_version == 8 and p.high_watermark == 10 and p.pending_isr is None
    )


def test_shrink_never_drops_the_leader():
    p = leader(isr=(0,), leo=10)
    assert p.maybe_shrink_isr(10**9, LAG_MS) is None


def test_expansion_needs_the_hw_and_the_epoch_start():
    p = leader(isr=(0, 1), leo=10, hw=4)  # epoch starts at 10; HW stays 4 until 1 fetches
    assert p.update_follower_fetch_state(2, 6, now_ms=1_100) == (False, None)  # >= HW, < start
    moved, update = p.update_follower_fetch_state(2, 10, now_ms=1_200)
    assert not moved and update is not None and update.isr == (0, 1, 2)
    assert p.pending_isr == (0, 1, 2) and p.isr == {0, 1}


def test_expansion_needs_the_follower_to_reach_the_hw():
    p = leader(isr=(0,), leo=10, hw=0)
    p.on_local_append(20)
    assert p.high_watermark == 20
    assert p.update_follower_fetch_state(1, 15, now_ms=1_100) == (False, None)  # >= start, < HW
    _, update = p.update_follower_fetch_state(1, 20, now_ms=1_200)
    assert update is not None and update.isr == (0, 1)


def test_expansion_never_lowers_the_hw():
    p = leader(isr=(0,), leo=10, hw=0)
    p.on_local_append(20)
    assert p.high_watermark == 20
    _, update = p.update_follower_fetch_state(1, 20, now_ms=1_100)
    assert update is not None and p.high_watermark == 20
    assert p.on_isr_update_succeeded(update.isr, 8) is False
    assert p.isr == {0, 1} and p.high_watermark == 20


def test_a_pending_expansion_holds_the_hw_for_the_member_being_added():
    """Once the write lands the controller may elect the new member: the HW must not pass
    it meanwhile (the simulator's StrongIsr check found this; KIP-497's maximal ISR)."""
    p = leader(isr=(0,), leo=10, hw=0)
    _, update = p.update_follower_fetch_state(1, 10, now_ms=1_100)
    assert update is not None and p.high_watermark == 10
    p.on_local_append(30)
    assert p.high_watermark == 10  # 1 is at 10 and may already be in the ISR in ZooKeeper
    assert p.update_follower_fetch_state(1, 25, now_ms=1_200) == (True, None)
    assert p.high_watermark == 25
    assert p.on_isr_update_succeeded(update.isr, 8) is False
    assert p.isr == {0, 1} and p.high_watermark == 25


def test_a_failed_expansion_releases_the_hw_at_once():
    p = leader(isr=(0,), leo=10, hw=0)
    p.update_follower_fetch_state(1, 10, now_ms=1_100)
    p.on_local_append(30)
    assert p.high_watermark == 10
    assert p.on_isr_update_failed(9) is True  # not held for replica 1 any more
    assert p.pending_isr is None and p.isr == {0} and p.high_watermark == 30


def test_a_failed_expansion_releases_the_hw_with_the_members_idle_at_the_end():
    """Found by the random sequences below: a member idle at the leader's end takes the
    fetch shortcut, which never recomputes the HW."""
    p = leader(isr=(0, 2), leo=3, hw=0)
    p.on_local_append(8)
    p.update_follower_fetch_state(1, 3, now_ms=1_100)  # proposes adding 1, which holds the HW
    p.update_follower_fetch_state(2, 8, now_ms=1_100)
    assert p.pending_isr == (0, 1, 2) and p.high_watermark == 3
    assert p.update_follower_fetch_state(2, 8, now_ms=1_200) == (False, None)  # idle at the end
    assert p.on_isr_update_failed(11) is True
    assert p.high_watermark == 8


def test_no_second_proposal_while_one_is_in_flight():
    p = leader(isr=(0,), leo=10, hw=0)
    _, first = p.update_follower_fetch_state(1, 10, now_ms=1_100)
    _, second = p.update_follower_fetch_state(2, 10, now_ms=1_100)
    assert first is not None and second is None
    assert p.maybe_shrink_isr(10**9, LAG_MS) is None
    p.on_isr_update_succeeded(first.isr, first.zk_version + 1)
    _, third = p.update_follower_fetch_state(2, 10, now_ms=1_200)
    assert third is not None and third.isr == (0, 1, 2) and third.zk_version == first.zk_version + 1


def test_failed_update_changes_only_the_zk_version():
    p = leader(leo=10, hw=5, now=1_000, zk=7)
    p.update_follower_fetch_state(1, 10, now_ms=1_500)
    update = p.maybe_shrink_isr(5_000, LAG_MS)
    assert update is not None
    before = snapshot(p)
    p.on_isr_update_failed(11)
    after = snapshot(p)
    assert after.pop("zk_version") == 11 and after.pop("pending_isr") is None
    before.pop("zk_version"), before.pop("pending_isr")
    assert after == before
    retry = p.maybe_shrink_isr(5_000, LAG_MS)  # retried at the re-read version
    assert retry is not None and retry.zk_version == 11 and retry.isr == update.isr


def test_failed_update_without_a_version_keeps_it():
    p = leader(isr=(0,), leo=10, hw=0, zk=7)
    p.update_follower_fetch_state(1, 10, now_ms=1_100)
    p.on_isr_update_failed()
    assert p.zk_version == 7 and p.pending_isr is None and p.isr == {0}


def test_success_after_losing_leadership_changes_nothing():
    p = leader(isr=(0,), leo=10, hw=0, zk=7)
    _, update = p.update_follower_fetch_state(1, 10, now_ms=1_100)
    p.make_follower(1, 2, (0, 1), (0, 1, 2), 9, 0, 10, 10)
    assert p.on_isr_update_succeeded(update.isr, 8) is False
    assert p.isr == {0, 1} and p.zk_version == 9


# -- follower ---------------------------------------------------------------------------------


def test_follower_hw_follows_the_leader_and_its_own_end():
    p = follower(leo=10, hw=5)
    assert p.on_follower_append(12, 20) is True and p.high_watermark == 12
    assert p.on_follower_append(15, 14) is True and p.high_watermark == 14
    assert p.on_follower_append(15, 14) is False
    assert p.on_follower_append(15, 9) is True and p.high_watermark == 9  # a new leader knows less


def test_follower_truncation_caps_the_hw():
    p = follower(leo=10, hw=8)
    p.on_follower_truncated(0, 6)
    assert (p.log_start_offset, p.high_watermark, p.log_end_offset) == (0, 6, 6)
    p.on_follower_truncated(7, 7)
    assert (p.log_start_offset, p.high_watermark, p.log_end_offset) == (7, 7, 7)


def test_log_start_offset_never_passes_the_hw():
    p = follower(leo=10, hw=5)
    p.on_log_start_offset(5)
    assert p.log_start_offset == 5
    with pytest.raises(AssertionError):
        p.on_log_start_offset(6)


# -- random event sequences against a model ----------------------------------------------------

ASSIGNMENT = (0, 1, 2, 3)
FOLLOWERS = (1, 2, 3)


def snapshot(p: Partition) -> dict:
    return {f.name: copy.deepcopy(getattr(p, f.name)) for f in dataclasses.fields(p)}


class Model:
    """Kafka's rules written out independently of Partition, for one leader."""

    def __init__(self, p: Partition, now: int):
        self.p = p
        self.now = now
        self.real_leo = {r: 0 for r in FOLLOWERS}  # the followers' actual logs (monotone)
        self.pending: tuple[int, ...] | None = None
        self.new_epoch()

    def new_epoch(self):
        p = self.p
        self.epoch = p.leader_epoch
        self.hw = p.high_watermark
        self.known_leo = {r: -1 for r in FOLLOWERS}
        self.caught_up = {r: self.now for r in FOLLOWERS}
        self.last_fetch_leader_leo = {r: -1 for r in FOLLOWERS}
        self.last_fetch_time = {r: 0 for r in FOLLOWERS}
        self.pending = None

    def isr_min(self):
        p = self.p
        maximal = p.isr | set(self.pending or ())  # a member being added counts (KIP-497)
        return min([p.log_end_offset] + [self.known_leo[r] for r in maximal if r != 0])

    def check(self, hw_before: int, recompute: bool = True):
        p = self.p
        assert p.log_start_offset <= p.high_watermark <= p.log_end_offset
        assert 0 in p.isr and p.isr <= set(p.assignment)
        assert p.high_watermark >= hw_before  # one epoch led throughout (epochs keep the HW)
        if recompute:  # only these events recompute the HW (a failed expansion too, at once:
            # until Dec 2026 it waited for the next append or moving fetch)
            self.hw = max(self.hw, self.isr_min())
        assert p.high_watermark == self.hw
        assert p.pending_isr == self.pending


def apply_step(m: Model, data) -> None:
    p = m.p
    hw_before = p.high_watermark
    kind = data.draw(st.sampled_from(["append", "fetch", "fetch", "fetch", "tick", "shrink",
                                      "complete", "new_epoch"]))  # fmt: skip
    recompute = kind in ("append", "fetch", "complete", "new_epoch")
    if kind == "append":
        p.on_local_append(p.log_end_offset + data.draw(st.integers(0, 5)))
    elif kind == "tick":
        # multiples of a quarter lag make "exactly the lag" (still in sync) a common case
        m.now += LAG_MS // 4 * data.draw(st.integers(0, 8)) + data.draw(st.sampled_from([0, 0, 1]))
    elif kind == "fetch":
        r = data.draw(st.sampled_from(FOLLOWERS))
        offset = data.draw(st.integers(min(m.real_leo[r], p.log_end_offset), p.log_end_offset))
        m.real_leo[r] = offset
        leader_leo = p.log_end_offset
        if offset >= leader_leo:
            m.caught_up[r] = max(m.caught_up[r], m.now)
        elif offset >= m.last_fetch_leader_leo[r]:
            m.caught_up[r] = max(m.caught_up[r], m.last_fetch_time[r])
        m.last_fetch_leader_leo[r], m.last_fetch_time[r] = leader_leo, m.now
        m.known_leo[r] = offset
        should_expand = (r not in p.isr and m.pending is None and offset >= p.high_watermark
                         and offset >= p.leader_epoch_start_offset)  # fmt: skip
        _, update = p.update_follower_fetch_state(r, offset, m.now)
        assert p.replicas[r].last_caught_up_time_ms == m.caught_up[r]
        if should_expand:
            assert update is not None and update.isr == tuple(sorted(p.isr | {r}))
            m.pending = update.isr
        else:
            assert update is None
    elif kind == "shrink":
        lagging = {r for r in p.isr if r != 0 and m.now - m.caught_up[r] > LAG_MS}
        update = p.maybe_shrink_isr(m.now, LAG_MS)
        if m.pending is not None or not lagging:
            assert update is None
        else:
            assert update is not None and update.isr == tuple(sorted(p.isr - lagging))
            assert update.zk_version == p.zk_version and update.leader_epoch == p.leader_epoch
            m.pending = update.isr
    elif kind == "complete":
        if m.pending is None:
            return
        if data.draw(st.booleans()):
            p.on_isr_update_succeeded(m.pending, p.zk_version + 1)
            assert p.isr == set(m.pending)
        else:
            before = snapshot(p)
            moved = p.on_isr_update_failed(p.zk_version + 2)
            after = snapshot(p)
            assert after["zk_version"] == before["zk_version"] + 2
            assert moved == (after["high_watermark"] > before["high_watermark"])
            for key in ("zk_version", "pending_isr", "high_watermark"):
                before.pop(key), after.pop(key)
            assert after == before  # nothing else changed (the model checks the HW)
        m.pending = None
    elif kind == "new_epoch":
        p.make_leader(p.leader_epoch + 1, sorted(p.isr), ASSIGNMENT, p.zk_version + 1,
                      p.log_start_offset, p.log_end_offset, p.high_watermark, m.now)  # fmt: skip
        m.new_epoch()
    m.check(hw_before, recompute)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_sequences_keep_the_invariants(data):
    lso = data.draw(st.integers(0, 5))
    leo = data.draw(st.integers(lso, 20))
    hw = data.draw(st.integers(lso, leo))
    isr = {0} | set(data.draw(st.lists(st.sampled_from(FOLLOWERS), unique=True)))
    p = Partition(TOPIC, 0, 0)
    p.make_leader(1, sorted(isr), ASSIGNMENT, 0, lso, leo, hw, 1_000)
    m = Model(p, 1_000)
    m.real_leo = {r: data.draw(st.integers(lso, leo)) for r in FOLLOWERS}
    m.check(hw)
    for _ in range(data.draw(st.integers(1, 60))):
        apply_step(m, data)


def test_an_idle_member_at_the_leader_end_only_moves_its_times():
    # A fetch session names every partition on every fetch: a member that stays at the
    # leader's end keeps being caught up, and nothing else about the partition changes.
    p = leader(leo=10, hw=5, now=1_000)
    p.update_follower_fetch_state(1, 10, now_ms=1_100)
    p.update_follower_fetch_state(2, 10, now_ms=1_100)
    assert p.high_watermark == 10
    before = copy.deepcopy(p)
    assert p.update_follower_fetch_state(1, 10, now_ms=1_900) == (False, None)
    replica = p.replicas[1]
    assert (replica.last_caught_up_time_ms, replica.last_fetch_time_ms) == (1_900, 1_900)
    assert p.maybe_shrink_isr(1_100 + LAG_MS + 1, LAG_MS).isr == (0, 1)  # 2 lagged, 1 did not
    assert (p.high_watermark, p.log_end_offset) == (before.high_watermark, before.log_end_offset)


def test_a_caught_up_replica_outside_the_isr_is_still_added_when_it_fetches_again():
    p = leader(isr=(0, 1), leo=10, hw=10, now=1_000)
    assert p.update_follower_fetch_state(2, 10, now_ms=1_100)[1].isr == (0, 1, 2)
    p.on_isr_update_failed()  # the write lost: the next fetch at the same offset asks again
    assert p.update_follower_fetch_state(2, 10, now_ms=1_200)[1].isr == (0, 1, 2)
