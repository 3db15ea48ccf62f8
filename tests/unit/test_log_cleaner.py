"""The log cleaner (storage/cleaner.py) against a model, and its crash recovery (segment_swap).

The model is every record ever appended, in offset order. After each cleaning the log must:
fold to the model's latest value per key; hold only records of the model, offsets growing;
keep its active segment byte for byte; keep every record newer than min.compaction.lag.ms; keep
a tombstone that is latest for its key until delete.retention.ms after its segment was first
cleaned, and drop it at the first cleaning after that.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from localcluster.storage import (
    BatchSpec,
    Log,
    LogConfig,
    Record,
    cleaner,
    compression,
    encode_batch,
    iter_records,
    segment_swap,
)
from localcluster.storage import record_batch as rb
from tests.helpers import check_indexes_agree, scan_log

CONFIG = LogConfig(segment_bytes=1024, segment_index_bytes=80)
RETENTION_MS = 50


def records_of(lg: Log) -> list[Record]:
    return [r for *_, data in scan_log(lg) for r in iter_records(data)]


def fold(records) -> dict[bytes, bytes | None]:
    latest: dict[bytes, bytes | None] = {}
    for r in records:
        latest[r.key] = r.value
    return latest


def live(folded: dict) -> dict:
    return {k: v for k, v in folded.items() if v is not None}


def put(lg: Log, entries, now_ms: int, **spec) -> None:
    lg.append(encode_batch([Record(v, key=k, timestamp=now_ms) for k, v in entries],
                           BatchSpec(**spec)), leader_epoch=0)  # fmt: skip


def active_bytes(lg: Log) -> bytes:
    segment = lg.active_segment
    with segment.view(0, segment.size) as v:
        return bytes(v)


keys = st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"])
values = st.one_of(st.none(), st.binary(min_size=1, max_size=40))
operation = st.one_of(
    st.tuples(st.just("put"), st.lists(st.tuples(keys, values), min_size=1, max_size=3),
              st.integers(0, 20)),
    st.tuples(st.just("roll")),
    st.tuples(st.just("clean"), st.integers(0, 60)),
    st.tuples(st.just("reopen")),
)  # fmt: skip


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(operation, min_size=5, max_size=40), lag_ms=st.sampled_from([0, 30]))
@example(
    ops=[
        ("put", [(b"a", b"1"), (b"b", b"1")], 0),
        ("put", [(b"a", None)], 0),
        ("roll",),
        ("put", [(b"z", b"1")], 0),
        ("roll",),
        ("clean", 0),
        ("put", [(b"z", b"2")], 0),
        ("roll",),
        ("clean", 60),
        ("put", [(b"z", b"3")], 0),
        ("roll",),
        ("clean", 1),
    ],
    lag_ms=0,
)  # a tombstone kept, then dropped past its horizon
def test_cleaning_matches_the_model(tmp_path_factory, ops, lag_ms):
    directory = tmp_path_factory.mktemp("log") / "t-0"
    lg = Log.open(directory, CONFIG)
    settings_ = cleaner.CleanerSettings(lag_ms, RETENTION_MS, 0.0)
    model: list[Record] = []
    first_cleaned: dict[int, int] = {}  # segment base -> when it was first cleaned
    now, checkpoint = 1000, None
    try:
        for op in ops:
            if op[0] == "put":
                now += op[2]
                offset = lg.log_end_offset
                put(lg, op[1], now)
                model += [Record(v, key=k, timestamp=now, offset=offset + i)
                          for i, (k, v) in enumerate(op[1])]  # fmt: skip
            elif op[0] == "roll":
                lg.roll()
            elif op[0] == "reopen":
                lg.close()
                lg = Log.open(directory, CONFIG)
            else:
                now += op[1]
                checkpoint = clean_and_check(lg, model, checkpoint, settings_, now, first_cleaned)
    finally:
        lg.close()


def clean_and_check(lg, model, checkpoint, settings_, now, first_cleaned):
    before = {r.offset: r for r in records_of(lg)}
    active = active_bytes(lg), lg.active_segment.base_offset
    bases_before = {s.base_offset: s.next_offset for s in lg.segments}
    result = cleaner.clean_log(lg, checkpoint, settings_, now)
    after = records_of(lg)
    check_indexes_agree(lg)
    assert (active_bytes(lg), lg.active_segment.base_offset) == active
    # a dropped tombstone took every older record of its key with it (checked below: when)
    assert live(fold(after)) == live(fold(model))
    assert set(fold(model)) - set(fold(after)) <= {k for k, v in fold(model).items() if v is None}
    offsets = [r.offset for r in after]
    assert offsets == sorted(set(offsets))
    for r in after:
        assert before[r.offset] == r  # only records of the log, unchanged
    lag_floor = now - settings_.min_compaction_lag_ms
    kept = {r.offset for r in after}
    if settings_.min_compaction_lag_ms:
        assert all(r.offset in kept for r in before.values() if r.timestamp > lag_floor)
    if result is None:
        return checkpoint
    latest = {r.key: r.offset for r in model}
    for r in before.values():
        if r.offset >= result.end_offset or r.value is not None or latest[r.key] != r.offset:
            continue
        base = max(b for b in bases_before if b <= r.offset)
        cleaned_at = first_cleaned.get(base)
        if cleaned_at is None or now - cleaned_at <= RETENTION_MS:
            assert r.offset in kept, (r, cleaned_at, now)  # before the delete horizon
            event("a tombstone before its horizon was kept")
        else:
            assert r.offset not in kept, (r, cleaned_at, now)
            event("a tombstone past its horizon was dropped")
    for base, next_offset in bases_before.items():
        if base < result.end_offset and next_offset > result.plan.first_dirty_offset:
            first_cleaned.setdefault(base, now)
    return result.end_offset


# -- batches: producers, codecs, timestamps ------------------------------------------------------


@pytest.fixture
def lg(tmp_path):
    opened = Log.open(tmp_path / "t-0", CONFIG)
    yield opened
    opened.close()


def test_a_batch_losing_records_is_rebuilt_per_run_with_its_producer_fields(lg):
    spec = {"producer_id": 7, "producer_epoch": 3, "base_sequence": 10,
            "attributes": compression.LZ4}  # fmt: skip
    put(lg, [(b"a", b"1"), (b"b", b"1"), (b"c", b"1"), (b"d", b"1")], 100, **spec)  # 0..3
    put(lg, [(b"b", b"2"), (b"c", b"2")], 101, **{**spec, "base_sequence": 14})  # 4..5
    put(lg, [(b"x", b"1")], 102, producer_id=9, producer_epoch=0, base_sequence=0)  # 6
    lg.roll()
    put(lg, [(b"z", b"1")], 103)
    # producer 7's last batch is 4..5 (kept whole), producer 9's is 6
    result = cleaner.clean_log(lg, None, cleaner.CleanerSettings(), 200,
                               producer_last_offsets={7: 5, 9: 6})  # fmt: skip
    assert result is not None and result.records_removed == 2
    headers = [h for _, _, h, _ in scan_log(lg)]
    runs = [(h.base_offset, h.last_offset, h.base_sequence, h.compression) for h in headers]
    assert runs[:3] == [(0, 0, 10, compression.LZ4), (3, 3, 13, compression.LZ4),
                        (4, 5, 14, compression.LZ4)]  # fmt: skip
    assert all(h.producer_id == 7 and h.producer_epoch == 3 for h in headers[:3])
    assert [(r.offset, r.key) for r in records_of(lg)] == [
        (0, b"a"), (3, b"d"), (4, b"b"), (5, b"c"), (6, b"x"), (7, b"z")]  # fmt: skip


def test_log_append_time_batches_keep_their_max_timestamp(lg):
    attributes = rb.TIMESTAMP_TYPE_MASK
    put(lg, [(b"a", b"1"), (b"b", b"1")], 100, attributes=attributes)
    data = bytearray(encode_batch([Record(b"2", key=b"a", timestamp=5)], BatchSpec()))
    lg.append(bytes(data), leader_epoch=0)
    lg.roll()
    put(lg, [(b"z", b"1")], 103)
    stamped = scan_log(lg)[0][2].max_timestamp
    assert cleaner.clean_log(lg, None, cleaner.CleanerSettings(), 200) is not None
    header = scan_log(lg)[0][2]
    assert (header.base_offset, header.records_count, header.max_timestamp) == (1, 1, stamped)


def test_a_clean_log_is_not_cleaned_again_and_its_ratio_counts_dirty_bytes(lg):
    for i in range(3):
        put(lg, [(b"k", b"v%d" % i)], 100 + i)
        lg.roll()
    s = cleaner.CleanerSettings()
    planned = cleaner.plan(lg, None, s, 200, lg.log_end_offset)
    assert planned.dirty_ratio == 1.0
    result = cleaner.clean_log(lg, None, s, 200)
    assert cleaner.clean_log(lg, result.end_offset, s, 200) is None
    put(lg, [(b"k", b"new")], 300)
    lg.roll()
    planned = cleaner.plan(lg, result.end_offset, s, 300, lg.log_end_offset)
    assert 0 < planned.dirty_ratio < 1


def test_cleaning_stops_below_the_high_watermark_and_never_empties_the_first_segment(lg):
    for i in range(4):
        put(lg, [(b"k", b"v%d" % i)], 100 + i)
        lg.roll()
    result = cleaner.clean_log(lg, None, cleaner.CleanerSettings(), 200, high_watermark=3)
    assert result.end_offset == 3  # [3, 4) reaches past the HW: it and later stay dirty
    assert [s.base_offset for s in lg.segments][:1] == [0]
    assert [r.offset for r in records_of(lg)] == [2, 3]
    assert lg.log_start_offset == 0 and lg.segments[0].size == 0


def test_a_source_changed_under_the_cleaning_commits_nothing(lg):
    for i in range(3):
        put(lg, [(b"k", b"v%d" % i)], 100 + i)
        lg.roll()
    planned = cleaner.plan(lg, None, cleaner.CleanerSettings(), 200, lg.log_end_offset)
    result = cleaner.clean(planned.detached())
    lg.truncate_to(1)
    before = records_of(lg)
    assert not cleaner.commit(lg, planned, result)
    assert records_of(lg) == before
    assert not [p for p in lg.directory.iterdir() if p.name.endswith(".cleaned")]


def test_the_checkpoint_moves_down_with_a_truncation(tmp_path):
    checkpoints = cleaner.CleanerCheckpoints(tmp_path / cleaner.CLEANER_OFFSET_CHECKPOINT)
    checkpoints.update(("t", 0), 10)
    checkpoints.truncate_to(("t", 0), 12)
    checkpoints.truncate_to(("t", 0), 4)
    again = cleaner.CleanerCheckpoints(tmp_path / cleaner.CLEANER_OFFSET_CHECKPOINT)
    assert again.get(("t", 0)) == 4


# -- recovery: a crash at each step of the swap --------------------------------------------------


def _prepared(tmp_path):
    """A log with overwrites and its cleaning written but not committed; (log, old, new)."""
    lg = Log.open(tmp_path / "t-0", CONFIG)
    for i in range(12):
        put(lg, [(b"k%d" % (i % 3), b"v%d" % i)], 100 + i)
        if i % 4 == 3:
            lg.roll()
    everything = records_of(lg)
    old = [(r.offset, r.value) for r in everything]
    planned = cleaner.plan(lg, None, cleaner.CleanerSettings(), 200, lg.log_end_offset)
    result = cleaner.clean(planned.detached())
    latest = {r.key: r.offset for r in everything if r.offset < result.end_offset}
    new = [(r.offset, r.value) for r in everything
           if r.offset >= result.end_offset or r.offset == latest[r.key]]  # fmt: skip
    return lg, (planned, result), old, new


def _crash_and_reopen(lg: Log):
    # abandon the open log (no close: no clean-shutdown marker), as a kill -9 does
    reopened = Log.open(lg.directory, CONFIG)
    check_indexes_agree(reopened)
    got = [(r.offset, r.value) for r in records_of(reopened)]
    reopened.close()
    return got


@pytest.mark.parametrize("step", ["cleaned", "indexes-swap", "log-swap", "index-replaced"])
def test_a_crash_during_the_swap_leaves_the_old_or_the_new_segment(tmp_path, step):
    lg, (_, result), old, new = _prepared(tmp_path)
    rewritten = [o.source for o in result.outcomes if o.kind == "rewritten"]
    assert rewritten
    directory, source, name = lg.directory, rewritten[0], segment_swap.file_name
    base = source.base_offset
    if step != "cleaned":
        for suffix in (".index", ".timeindex"):
            os.replace(directory / (name(base, suffix) + ".cleaned"),
                       directory / (name(base, suffix) + ".swap"))  # fmt: skip
    if step in ("log-swap", "index-replaced"):
        os.replace(directory / (name(base, ".log") + ".cleaned"),
                   directory / (name(base, ".log") + ".swap"))  # fmt: skip
    if step == "index-replaced":
        os.replace(directory / (name(base, ".index") + ".swap"), directory / name(base, ".index"))
    got = _crash_and_reopen(lg)

    def inside(pairs):
        return [x for x in pairs if base <= x[0] < source.next_offset]

    assert [x for x in got if x not in inside(got)] == [x for x in old if x not in inside(old)]
    expected = old if step in ("cleaned", "indexes-swap") else new
    assert inside(got) == inside(expected)
    assert inside(new) != inside(old)
    assert not [p for p in directory.iterdir() if p.name.endswith((".cleaned", ".swap"))]


def test_a_crash_after_the_commit_reopens_the_new_log(tmp_path):
    lg, (planned, result), old, new = _prepared(tmp_path)
    assert cleaner.commit(lg, planned, result)
    assert [(r.offset, r.value) for r in records_of(lg)] == new
    assert _crash_and_reopen(lg) == new
    assert fold(records_of(lg)) == fold(Record(v, key=b"k%d" % (o % 3)) for o, v in old)


def test_a_tombstone_goes_at_the_first_cleaning_after_its_horizon(lg):
    s = cleaner.CleanerSettings(0, RETENTION_MS, 0.0)
    put(lg, [(b"a", b"1"), (b"b", b"1")], 100)
    put(lg, [(b"a", None)], 101)
    lg.roll()
    put(lg, [(b"z", b"1")], 102)
    lg.roll()
    first = cleaner.clean_log(lg, None, s, 1000)
    assert [(r.key, r.value) for r in records_of(lg)] == [(b"b", b"1"), (b"a", None), (b"z", b"1")]
    put(lg, [(b"z", b"2")], 1001)
    lg.roll()
    second = cleaner.clean_log(lg, first.end_offset, s, 1000 + RETENTION_MS)  # at the horizon
    assert (b"a", None) in [(r.key, r.value) for r in records_of(lg)]
    put(lg, [(b"z", b"3")], 1002)
    lg.roll()
    cleaner.clean_log(lg, second.end_offset, s, 1001 + RETENTION_MS)  # past it
    assert [(r.key, r.value) for r in records_of(lg)] == [(b"b", b"1"), (b"z", b"3")]
