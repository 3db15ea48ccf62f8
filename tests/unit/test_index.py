"""BatchIndex: lookups agree with a linear scan; trim/open round trip; sanity checks."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localcluster.storage.index import (
    ENTRY_BYTES,
    FIRST_RESERVE_ENTRIES,
    RESERVE_ENTRIES,
    BatchIndex,
    IndexFullError,
)

FAST = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip

# (offset gap before the batch, batch byte size, max timestamp) per entry
entries_st = st.lists(
    st.tuples(st.integers(1, 50), st.integers(61, 500), st.integers(-5, 1000)),
    min_size=0, max_size=40,
)  # fmt: skip


def build(tmp_path, base, entries, max_entries=64):
    index = BatchIndex(tmp_path / f"{base:020d}.log", base, max_entries)
    index.reset()
    index.make_appendable()
    rel, pos, table = 0, 0, []
    for gap, size, ts in entries:
        index.append(rel, pos, ts)
        table.append((base + rel, pos, ts))
        rel += gap
        pos += size
    return index, table


@FAST
@given(
    base=st.integers(0, 2**40),
    entries=entries_st,
    probes=st.lists(st.integers(-60, 2200), max_size=20),
)
def test_lookups_agree_with_linear_scan(tmp_path, base, entries, probes):
    index, table = build(tmp_path, base, entries)
    offsets = [o for o, _, _ in table]
    for delta in probes + [2**31 + 5, -(2**31)]:
        offset = base + delta
        at_or_before = max((i for i, o in enumerate(offsets) if o <= offset), default=-1)
        at_or_after = min((i for i, o in enumerate(offsets) if o >= offset), default=len(offsets))
        assert index.batch_at_or_before(offset) == at_or_before, offset
        assert index.first_batch_at_or_after(offset) == at_or_after, offset
    assert list(index.positions) == [p for _, p, _ in table]


@FAST
@given(entries=entries_st, targets=st.lists(st.integers(-10, 1010), max_size=10))
def test_timestamp_lookup_agrees_with_linear_scan(tmp_path, entries, targets):
    index, table = build(tmp_path, 0, entries)
    for target in targets:
        expected = min(
            (i for i, (_, _, ts) in enumerate(table) if ts >= target), default=len(table)
        )
        assert index.first_batch_with_timestamp_at_least(target) == expected
    assert index.largest_timestamp() == (max(ts for *_, ts in table) if table else None)


def test_trim_and_reopen_round_trip(tmp_path):
    index, table = build(tmp_path, 100, [(3, 100, 5), (1, 70, 9), (4, 80, 7)])
    assert os.path.getsize(index.offset_path) == 64 * ENTRY_BYTES  # preallocated
    index.trim()
    assert os.path.getsize(index.offset_path) == 3 * ENTRY_BYTES
    assert os.path.getsize(index.time_path) == 3 * ENTRY_BYTES
    index.close()
    again = BatchIndex(tmp_path / f"{100:020d}.log", 100, 64)
    assert again.open_trimmed()
    assert again.count == 3
    assert [again.entry(i) for i in range(3)] == [(0, 0), (3, 100), (4, 170)]
    assert list(again.max_timestamps) == [5, 9, 7]
    assert again.is_sane(250) is None


def test_open_trimmed_refuses_missing_or_mismatched_files(tmp_path):
    index, _ = build(tmp_path, 0, [(1, 100, 1), (1, 100, 2)])
    index.trim()
    index.close()
    fresh = lambda: BatchIndex(tmp_path / f"{0:020d}.log", 0, 64)  # noqa: E731
    os.truncate(index.time_path, ENTRY_BYTES)  # sizes disagree
    assert not fresh().open_trimmed()
    os.truncate(index.offset_path, 12)  # not a whole number of entries
    os.truncate(index.time_path, 12)
    assert not fresh().open_trimmed()
    index.time_path.unlink()
    assert not fresh().open_trimmed()
    # more entries than this config allows
    os.truncate(index.offset_path, 8 * ENTRY_BYTES)
    with open(index.time_path, "wb") as f:
        f.truncate(8 * ENTRY_BYTES)
    assert not BatchIndex(tmp_path / f"{0:020d}.log", 0, 4).open_trimmed()


def test_full_index_raises(tmp_path):
    index, _ = build(tmp_path, 0, [(1, 100, 0)] * 4, max_entries=4)
    assert index.is_full and index.room() == 0
    with pytest.raises(IndexFullError):
        index.append(10, 1000, 0)


def test_truncate_entries_zeroes_the_dropped_ones(tmp_path):
    index, _ = build(tmp_path, 0, [(2, 100, 3), (2, 100, 4), (2, 100, 5)])
    index.truncate_entries(1)
    assert index.count == 1
    assert index.batch_at_or_before(10) == 0
    assert index.first_batch_at_or_after(1) == 1
    assert np.all(index._offsets[1:3] == 0) and np.all(index._times[1:3] == 0)
    index.append(1, 100, 8)
    assert index.entry(1) == (1, 100) and index.largest_timestamp() == 8


@pytest.mark.parametrize(
    "entries, log_size, why",
    [
        ([], 0, None),
        ([], 10, "no entries"),
        ([(0, 0), (2, 100)], 200, None),
        ([(0, 8), (2, 100)], 200, "does not start"),
        ([(-1, 0)], 200, "does not start"),
        ([(0, 0), (0, 100)], 200, "not strictly increasing"),
        ([(0, 0), (2, 0)], 200, "not strictly increasing"),
        ([(0, 0), (2, 300)], 200, "past the log"),
    ],
)
def test_is_sane(tmp_path, entries, log_size, why):
    index = BatchIndex(tmp_path / "0.log", 0, 8)
    index.reset()
    index.make_appendable()
    for rel, pos in entries:
        index.append(rel, pos, 0)
    result = index.is_sane(log_size)
    if why is None:
        assert result is None
    else:
        assert why in result


def test_reservations_start_at_one_page_and_double_up_to_reserve_entries(tmp_path):
    index = BatchIndex(tmp_path / "0.log", 0, 40_000)
    index.reset()
    index.make_appendable()
    chunks = []
    for i in range(33_000):
        before = index.reserved_entries
        index.append(i, 100 * i, 0)
        if index.reserved_entries != before:
            chunks.append(index.reserved_entries - before)
    assert FIRST_RESERVE_ENTRIES * ENTRY_BYTES == 4096  # one page of each file
    assert chunks == [512, 1024, 2048, 4096, 8192, 8192, 8192, 7744][: len(chunks)]
    assert max(chunks) == RESERVE_ENTRIES and index.reserved_entries >= 33_000
    for path in (index.offset_path, index.time_path):
        assert os.stat(path).st_blocks * 512 >= index.reserved_entries * ENTRY_BYTES


def test_a_new_index_reserves_one_page(tmp_path):
    index = BatchIndex(tmp_path / "0.log", 0, 1 << 17)
    index.reset()
    index.make_appendable()
    index.append(0, 0, 0)
    assert index.reserved_entries == FIRST_RESERVE_ENTRIES
    for path in (index.offset_path, index.time_path):
        assert os.stat(path).st_blocks * 512 <= 4096
