"""LeaderEpochCache: KIP-101/KIP-279 answers, truncation, persistence through the checkpoint."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localcluster.storage import (
    LEADER_EPOCH_CHECKPOINT,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    CheckpointError,
    LeaderEpochCache,
)

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def cache_with(tmp_path, entries):
    cache = LeaderEpochCache(tmp_path / LEADER_EPOCH_CHECKPOINT)
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def test_constants():
    assert UNDEFINED == (-1, -1)


def test_empty_cache_answers_undefined(tmp_path):
    cache = cache_with(tmp_path, [])
    assert cache.latest_epoch == UNDEFINED_EPOCH
    assert cache.end_offset_for(0, 10) == UNDEFINED
    assert cache.end_offset_for(UNDEFINED_EPOCH, 10) == UNDEFINED


def test_end_offset_for_kip_279(tmp_path):
    # epochs 1@0, 3@20, 6@50; log end 80
    cache = cache_with(tmp_path, [(1, 0), (3, 20), (6, 50)])
    assert cache.end_offset_for(1, 80) == (1, 20)
    assert cache.end_offset_for(2, 80) == (1, 20)  # largest epoch <= 2 is 1; it ends where 3 starts
    assert cache.end_offset_for(3, 80) == (3, 50)
    assert cache.end_offset_for(5, 80) == (3, 50)
    assert cache.end_offset_for(6, 80) == (6, 80)  # the latest epoch ends at the log end
    assert cache.end_offset_for(7, 80) == UNDEFINED  # unknown newer epoch
    assert cache.end_offset_for(0, 80) == (0, 0)  # older than all: (requested, first start)
    assert cache.end_offset_for(UNDEFINED_EPOCH, 80) == UNDEFINED


def test_end_offset_for_older_than_all_with_non_zero_start(tmp_path):
    cache = cache_with(tmp_path, [(4, 30), (5, 40)])
    assert cache.end_offset_for(2, 99) == (2, 30)


def test_assign_same_epoch_later_offset_is_ignored(tmp_path):
    cache = cache_with(tmp_path, [(1, 0), (2, 10)])
    assert cache.assign(2, 15) is False
    assert cache.entries() == [(1, 0), (2, 10)]
    assert cache.assign(2, 5) is True  # same epoch, earlier start: replaces
    assert cache.entries() == [(1, 0), (2, 5)]


def test_assign_drops_contradicted_entries(tmp_path):
    cache = cache_with(tmp_path, [(1, 0), (2, 10), (3, 20)])
    cache.assign(4, 15)  # starts below epoch 3's start: epoch 3 is dropped
    assert cache.entries() == [(1, 0), (2, 10), (4, 15)]
    cache.assign(2, 12)  # an older epoch: everything at or above it goes
    assert cache.entries() == [(1, 0), (2, 12)]


def test_truncate_from_end(tmp_path):
    cache = cache_with(tmp_path, [(1, 0), (2, 10), (3, 20)])
    cache.truncate_from_end(21)
    assert cache.entries() == [(1, 0), (2, 10), (3, 20)]
    cache.truncate_from_end(20)  # epoch 3 started at 20: it goes
    assert cache.entries() == [(1, 0), (2, 10)]
    cache.truncate_from_end(0)
    assert cache.entries() == []


def test_truncate_from_start(tmp_path):
    cache = cache_with(tmp_path, [(1, 0), (2, 10), (3, 20)])
    cache.truncate_from_start(0)
    assert cache.entries() == [(1, 0), (2, 10), (3, 20)]
    cache.truncate_from_start(5)  # epoch 1 now covers from 5
    assert cache.entries() == [(1, 5), (2, 10), (3, 20)]
    cache.truncate_from_start(10)
    assert cache.entries() == [(2, 10), (3, 20)]
    cache.truncate_from_start(25)
    assert cache.entries() == [(3, 25)]
    cache.truncate_from_start(1)  # below the first entry: nothing to do
    assert cache.entries() == [(3, 25)]


def test_persisted_and_reloaded(tmp_path):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    cache = cache_with(tmp_path, [(0, 0), (2, 7), (5, 30)])
    assert path.read_text() == "0\n3\n0 0\n2 7\n5 30\n"
    cache.truncate_from_end(30)
    cache.truncate_from_start(3)
    assert LeaderEpochCache(path).entries() == [(0, 0), (2, 7)]  # a start move waits ...
    cache.write_deferred(*cache.unwritten())  # ... for the log's next flush
    assert LeaderEpochCache(path).entries() == [(0, 3), (2, 7)]
    assert cache.unwritten() is None
    cache.clear()
    assert LeaderEpochCache(path).entries() == []
    assert LeaderEpochCache(None).entries() == []


@pytest.mark.parametrize("content", ["0\n2\n3 10\n2 20\n", "0\n2\n3 10\n3 20\n", "0\n2\n1 10\n2 5\n",
                                     "0\n1\n-1 0\n"])  # fmt: skip
def test_checkpoint_out_of_order_is_an_error(tmp_path, content):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    path.write_text(content)
    with pytest.raises(CheckpointError, match=str(path)):
        LeaderEpochCache(path)


def test_garbage_checkpoint_is_an_error(tmp_path):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    path.write_text("0\n1\nnot numbers\n")
    with pytest.raises(CheckpointError, match=f"{path} line 3"):
        LeaderEpochCache(path)


# -- property: against a plain list model ------------------------------------------------------


def model_end_offset_for(entries, requested, log_end_offset):
    if requested == UNDEFINED_EPOCH or not entries:
        return UNDEFINED
    if requested == entries[-1][0]:
        return requested, log_end_offset
    higher = [e for e in entries if e[0] > requested]
    if not higher:
        return UNDEFINED
    lower = [e for e in entries if e[0] <= requested]
    return (lower[-1][0] if lower else requested), higher[0][1]


operations = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.integers(0, 12), st.integers(0, 60)),
        st.tuples(st.just("end"), st.integers(0, 60)),
        st.tuples(st.just("start"), st.integers(0, 60)),
        st.tuples(st.just("clear")),
        st.tuples(st.just("plan")),  # a flush takes what the file is behind on ...
        st.tuples(st.just("land")),  # ... and writes it, maybe after later changes
    ),
    max_size=30,
)


def on_disk_cut_to(path, model) -> list[tuple[int, int]]:
    """The file's entries as opening the log would leave them: cut back to the log start."""
    on_disk = LeaderEpochCache(path)
    if model:
        on_disk.truncate_from_start(model[0][1])
    return on_disk.entries()


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(ops=operations)
def test_against_model(tmp_path, ops):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    path.unlink(missing_ok=True)
    cache = LeaderEpochCache(path)
    model: list[tuple[int, int]] = []
    planned = []
    for op in ops:
        if op[0] == "plan":
            planned.append(cache.unwritten())
            continue
        if op[0] == "land":
            if planned and (plan := planned.pop(0)) is not None:
                cache.write_deferred(*plan)
            assert on_disk_cut_to(path, model) == model  # never an older write over a newer
            continue
        before = model
        if op[0] == "assign":
            _, epoch, start = op
            if not (model and epoch == model[-1][0] and start >= model[-1][1]):
                model = [e for e in model if e[0] < epoch and e[1] < start] + [(epoch, start)]
            cache.assign(epoch, start)
        elif op[0] == "end":
            model = [e for e in model if e[1] < op[1]]
            cache.truncate_from_end(op[1])
        elif op[0] == "start":
            covering = [e for e in model if e[1] <= op[1]]
            if covering:
                model = [(covering[-1][0], op[1])] + [e for e in model if e[1] > op[1]]
            cache.truncate_from_start(op[1])
        else:
            model = []
            cache.clear()
        assert cache.entries() == model
        epochs = [e for e, _ in model]
        starts = [s for _, s in model]
        assert epochs == sorted(set(epochs)) and starts == sorted(starts)
        log_end = max(starts, default=0) + 5
        for requested in range(-1, 14):
            assert cache.end_offset_for(requested, log_end) == model_end_offset_for(
                model, requested, log_end
            )
        # Written through, but a moved start, which the next flush writes: until then the
        # file may still hold the entries below it, which opening the log cuts.
        assert on_disk_cut_to(path, model) == model
        if op[0] != "start" and model != before:  # a change of any other kind: all of it
            assert LeaderEpochCache(path).entries() == model
    for plan in planned:
        if plan is not None:
            cache.write_deferred(*plan)
    if (plan := cache.unwritten()) is not None:  # the next flush
        cache.write_deferred(*plan)
    assert LeaderEpochCache(path).entries() == model


def test_a_deferred_write_never_lands_over_a_newer_one_or_after_the_log_is_deleted(tmp_path):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    cache = cache_with(tmp_path, [(0, 0), (2, 7)])
    cache.truncate_from_start(3)
    late = cache.unwritten()  # a flush took it; its thread is slow
    cache.assign(4, 9)  # written at once, with the moved start
    cache.write_deferred(*late)
    assert LeaderEpochCache(path).entries() == [(0, 3), (2, 7), (4, 9)]
    cache.truncate_from_start(8)
    pending = cache.unwritten()
    cache.close()  # the log was deleted (its directory may come back for a new topic)
    path.unlink()
    cache.write_deferred(*pending)
    assert not path.exists()
