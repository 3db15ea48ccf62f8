"""Log: offsets, reads, sendfile slices, rolls, truncation, retention, epochs, reopening."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import traceback

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localcluster.storage import (
    BatchSpec,
    CorruptRecordError,
    Log,
    LogConfig,
    LogDirectoryFullError,
    OffsetOutOfRangeError,
    Record,
    RecordBatchTooLargeError,
    UnexpectedAppendOffsetError,
    encode_batch,
    iter_batches,
    iter_records,
    validate_batch,
)
from localcluster.storage import log as log_module
from localcluster.storage import record_batch as rb
from localcluster.storage.segment import LogSegment
from tests.helpers import check_indexes_agree, scan_log
from tests.unit.test_segment import install_fake_full_disk

SMALL = LogConfig(segment_bytes=1024, segment_index_bytes=80)


def batch(n=1, size=20, ts=1000, tag=b"v", epoch=-1, base_offset=0):
    records = [Record(tag + bytes([48 + i % 10]) * size, key=b"k%d" % i, timestamp=ts + i)
               for i in range(n)]  # fmt: skip
    return encode_batch(records, BatchSpec(base_offset=base_offset, partition_leader_epoch=epoch))


def values(log):
    """[(offset, value)] of every record, by a plain scan."""
    out = []
    for *_, data in scan_log(log):
        out += [(r.offset, r.value) for r in iter_records(data)]
    return out


@pytest.fixture
def log(tmp_path):
    opened = Log.open(tmp_path / "t-0", SMALL)
    yield opened
    opened.close()


# -- appending ----------------------------------------------------------------------------------


def test_append_assigns_offsets_and_stamps_epoch(log):
    info = log.append(batch(3), leader_epoch=2)
    assert (info.first_offset, info.last_offset, info.records_count) == (0, 2, 3)
    info = log.append(batch(1) + batch(2, tag=b"w"), leader_epoch=2)
    assert (info.first_offset, info.last_offset, info.records_count) == (3, 5, 3)
    assert info.max_timestamp == 1001 and info.valid_bytes == len(batch(1)) + len(batch(2))
    assert log.log_end_offset == 6
    headers = [h for *_, h, _ in scan_log(log)]
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [(0, 2), (3, 2), (4, 2)]
    check_indexes_agree(log)


def test_stored_bytes_are_the_clients_except_offset_and_epoch(log):
    sent = batch(4, size=33)
    log.append(batch(1), leader_epoch=0)
    log.append(sent, leader_epoch=7)
    *_, stored = scan_log(log)[-1]
    assert stored[rb.LOG_OVERHEAD : 12] == sent[rb.LOG_OVERHEAD : 12]
    assert stored[16:] == sent[16:]  # magic, the client's CRC and everything it covers
    header = validate_batch(stored)
    assert (header.base_offset, header.partition_leader_epoch) == (1, 7)


def test_invalid_batch_appends_nothing(log):
    log.append(batch(), 0)
    bad = bytearray(batch(2))
    bad[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC"):
        log.append(batch(1) + bytes(bad), 0)
    with pytest.raises(CorruptRecordError):
        log.append(b"", 0)
    with pytest.raises(CorruptRecordError):
        log.append(batch(1)[:-3], 0)
    assert log.log_end_offset == 1 and len(scan_log(log)) == 1


def test_record_batch_too_large(log):
    big = batch(1, size=SMALL.segment_bytes)
    with pytest.raises(RecordBatchTooLargeError, match="segment.bytes=1024"):
        log.append(batch(1) + big, 0)
    assert log.log_end_offset == 0
    size = SMALL.segment_bytes - len(batch(1, size=0))
    while len(batch(1, size=size)) > SMALL.segment_bytes:  # varint lengths grow with the value
        size -= 1
    exact = batch(1, size=size)
    assert len(exact) == SMALL.segment_bytes
    log.append(batch(), 0)
    log.append(exact, 0)  # a batch of exactly segment.bytes fits a segment of its own
    assert [s.base_offset for s in log.segments] == [0, 1]


def test_rolls_at_segment_bytes_and_index_entries(tmp_path):
    config = LogConfig(segment_bytes=4096, segment_index_bytes=24)
    log = Log.open(tmp_path, config)
    for _ in range(7):
        log.append(batch(2, size=10), 0)
    # three index entries per segment: rolls at offsets 6 and 12
    assert [s.base_offset for s in log.segments] == [0, 6, 12]
    assert [os.path.getsize(s.path) for s in log.segments[:-1]] == [
        s.size for s in log.segments[:-1]
    ]
    log.close()
    small = Log.open(tmp_path / "b", SMALL)
    for _ in range(12):
        small.append(batch(1, size=150), 0)
    for segment in small.segments:
        assert segment.size <= SMALL.segment_bytes
        # rolled because the next batch did not fit
    for segment in small.segments[:-1]:
        assert segment.size + len(batch(1, size=150)) > SMALL.segment_bytes
    assert len(small.segments) > 2
    check_indexes_agree(small)
    small.close()


def test_explicit_roll(log):
    log.append(batch(), 0)
    log.roll()
    log.append(batch(), 0)
    assert [s.base_offset for s in log.segments] == [0, 1]
    assert values(log) == [(0, b"v" + b"0" * 20), (1, b"v" + b"0" * 20)]


def test_roll_of_an_empty_active_segment_changes_nothing(tmp_path):
    config = LogConfig(segment_bytes=1024, segment_index_bytes=80, retention_bytes=0)  # fmt: skip
    log = Log.open(tmp_path, config)
    log.append(batch(), 0)
    log.roll()
    assert log.roll() is log.active_segment
    log.append(batch(), 0)
    assert [s.base_offset for s in log.segments] == [0, 1]
    # With a duplicate segment object for 00000000000000000001.log, retention would delete the
    # empty twin and unlink the file the live segment writes to.
    log.append(batch(), 0)
    log.roll()
    log.delete_old_segments(now_ms=0)
    log.close()
    again = Log.open(tmp_path, config)
    assert again.log_end_offset == 3 and again.cuts == []
    again.close()


def test_follower_append_drops_only_stale_epochs_that_start_at_the_log_end(tmp_path):
    """Hypothesis found it (tests/unit/test_log_model.py): retention deletes every record of
    epoch 0 and moves its start to the log end; the leader's next batch continues epoch 0 after a
    gap. Epoch 0 still starts at 1, as in Kafka, whereas an epoch above the leader's, started at
    the log end by a leader that wrote nothing, goes."""
    config = LogConfig(segment_bytes=1024, segment_index_bytes=80, retention_ms=400)
    log = Log.open(tmp_path / "t-0", config)
    try:
        log.append_as_follower(batch(1, epoch=0, base_offset=0))
        log.roll()
        assert log.delete_old_segments(now_ms=1000 + 400 + 1) == 1
        assert (log.log_start_offset, log.leader_epoch_cache.entries()) == (1, [(0, 1)])
        log.append_as_follower(batch(1, epoch=0, base_offset=2))
        assert log.leader_epoch_cache.entries() == [(0, 1)]
        log.leader_epoch_cache.assign(4, log.log_end_offset)  # we led epoch 4, wrote nothing
        log.append_as_follower(batch(1, epoch=3, base_offset=3))
        assert log.leader_epoch_cache.entries() == [(0, 1), (3, 3)]
    finally:
        log.close()


def test_follower_append_keeps_offsets_and_epochs(log):
    info = log.append_as_follower(
        batch(2, epoch=3, base_offset=0) + batch(1, epoch=5, base_offset=2)
    )
    assert (info.first_offset, info.last_offset) == (0, 2)
    assert log.leader_epoch_cache.entries() == [(3, 0), (5, 2)]
    # a gap is allowed (compacted leader); offsets below the log end are not
    log.append_as_follower(batch(1, epoch=5, base_offset=10))
    assert log.log_end_offset == 11
    with pytest.raises(UnexpectedAppendOffsetError, match="does not follow 11"):
        log.append_as_follower(batch(1, epoch=5, base_offset=10))
    with pytest.raises(UnexpectedAppendOffsetError):
        log.append_as_follower(batch(2, base_offset=11) + batch(1, base_offset=12))
    assert [h.base_offset for *_, h, _ in scan_log(log)] == [0, 2, 10]
    # A fetch in the gap starts at the next batch (a follower would reject batch 2 at offset 5);
    # a max_offset in the gap keeps the batches wholly below it.
    assert [h.base_offset for _, h in iter_batches(log.read(5, 10_000).tobytes())] == [10]
    assert [h.base_offset for _, h in iter_batches(log.read(0, 10_000, 5).tobytes())] == [0, 2]
    assert [h.base_offset for _, h in iter_batches(log.read(0, 10_000, 10).tobytes())] == [0, 2]
    assert [h.base_offset for _, h in iter_batches(log.read(0, 10_000, 11).tobytes())] == [0, 2, 10]
    check_indexes_agree(log)


# -- reading ------------------------------------------------------------------------------------


def fill(log, sizes):
    for i, (n, size) in enumerate(sizes):
        log.append(batch(n, size=size, ts=1000 * i, tag=b"%d-" % i), leader_epoch=0)


def test_read_starts_at_the_batch_holding_the_offset(log):
    fill(log, [(3, 10), (3, 10), (3, 10)])
    result = log.read(4, 10_000)
    assert [h.base_offset for _, h in iter_batches(result.tobytes())] == [3, 6]
    assert result.fetch_offset == 4


def test_read_respects_max_offset_and_max_bytes(log):
    fill(log, [(3, 10), (3, 10), (3, 10)])
    one = len(scan_log(log)[0][3])
    assert [
        h.base_offset for _, h in iter_batches(log.read(0, 10_000, max_offset=7).tobytes())
    ] == [0, 3]
    assert [
        h.base_offset for _, h in iter_batches(log.read(0, 10_000, max_offset=6).tobytes())
    ] == [0, 3]
    assert log.read(0, 10_000, max_offset=2).slices == ()  # the first batch holds the HW
    assert log.read(0, 10_000, max_offset=0).slices == ()
    assert log.read(0, 2 * one).size == 2 * one
    assert log.read(0, 2 * one - 1).size == one
    assert log.read(0, 1).size == one  # KIP-74: at least one batch
    assert log.read(0, 1, min_one_batch=False).slices == ()
    assert log.read(9, 100).slices == ()  # at the log end: nothing, not an error


def test_read_out_of_range(log):
    fill(log, [(2, 10)])
    with pytest.raises(
        OffsetOutOfRangeError, match=r"offset 3 is outside the log's range \[0, 2\]"
    ):
        log.read(3, 100)
    log.truncate_fully_and_start_at(50)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(49, 100)


def test_read_result_sendfile_matches_view(log):
    fill(log, [(1 + i % 3, 20 + 7 * i) for i in range(20)])
    assert len(log.segments) > 3
    left, right = socket.socketpair()
    try:
        for offset in range(0, log.log_end_offset, 3):
            result = log.read(offset, 700)
            expected = result.tobytes()
            assert expected
            for piece in result.slices:
                done = 0
                while done < piece.length:
                    done += os.sendfile(left.fileno(), piece.fd, piece.position + done,
                                        piece.length - done)  # fmt: skip
            received = b""
            while len(received) < len(expected):
                received += right.recv(1 << 16)
            assert received == expected
            first = validate_batch(received)
            assert first.base_offset <= offset <= first.last_offset
    finally:
        left.close()
        right.close()


def test_slice_survives_segment_deletion(tmp_path):
    config = LogConfig(segment_bytes=1024, segment_index_bytes=80, retention_bytes=0)  # fmt: skip
    log = Log.open(tmp_path, config)
    fill(log, [(1, 300)] * 6)
    result = log.read(0, 100_000)
    piece = result.slices[0]
    expected = piece.tobytes()
    assert log.delete_old_segments(now_ms=0) >= 1
    assert log.log_start_offset > 0
    assert piece.tobytes() == expected  # the memoryview path too
    left, right = socket.socketpair()
    try:
        sent = os.sendfile(left.fileno(), piece.fd, piece.position, piece.length)
        assert sent == piece.length
        assert right.recv(1 << 16) == expected
    finally:
        left.close()
        right.close()
        log.close()


model_sizes = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 200)), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(sizes=model_sizes, data=st.data())
def test_read_agrees_with_model(tmp_path_factory, sizes, data):
    log = Log.open(tmp_path_factory.mktemp("read"), SMALL)
    try:
        fill(log, sizes)
        batches = [(h.base_offset, h.last_offset, bytes(b), seg) for seg, _, h, b in scan_log(log)]
        end = log.log_end_offset
        for _ in range(8):
            fetch = data.draw(st.integers(0, end), label="fetch_offset")
            max_bytes = data.draw(st.integers(0, 1500), label="max_bytes")
            max_offset = data.draw(st.none() | st.integers(0, end + 2), label="max_offset")
            one = data.draw(st.booleans(), label="min_one_batch")
            got = log.read(fetch, max_bytes, max_offset, min_one_batch=one).tobytes()
            upper = end if max_offset is None else min(max_offset, end)
            # the model: batches from the one holding `fetch`, in its segment, wholly below upper
            start = next((i for i, b in enumerate(batches) if b[1] >= fetch), len(batches))
            expected, total = b"", 0
            for _base, last, raw, seg in batches[start:]:
                if seg != batches[start][3] or last >= upper:
                    break
                if total + len(raw) > max_bytes and not (one and total == 0):
                    break
                expected += raw
                total += len(raw)
            assert got == expected, (fetch, max_bytes, max_offset, one)
    finally:
        log.close()


# -- offset_for_timestamp -----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(stamps=st.lists(st.lists(st.integers(0, 100), min_size=1, max_size=4), min_size=1, max_size=20),
       targets=st.lists(st.integers(-1, 102), min_size=1, max_size=10))  # fmt: skip
def test_offset_for_timestamp_agrees_with_scan(tmp_path_factory, stamps, targets):
    log = Log.open(tmp_path_factory.mktemp("ts"), SMALL)
    try:
        for group in stamps:
            log.append(encode_batch([Record(b"x" * 40, timestamp=t) for t in group]), 0)
        records = []
        for *_, data in scan_log(log):
            records += [(r.offset, r.timestamp) for r in iter_records(data)]
        for target in targets:
            expected = next(((o, t) for o, t in records if t >= target), None)
            assert log.offset_for_timestamp(target) == expected, target
    finally:
        log.close()


def test_offset_for_timestamp_looks_past_a_batch_whose_max_timestamp_overstates(log):
    # A client batch may claim a maxTimestamp above its records' (the CRC still holds). Kafka
    # then keeps scanning the following batches of the segment; so must we.
    body = rb.encode_record(Record(b"a"), 0, 0)
    liar = rb.encode_raw_batch(body, 1, BatchSpec(base_timestamp=10), max_timestamp=100)
    log.append(liar, 0)
    log.append(encode_batch([Record(b"b", timestamp=60)]), 0)
    assert len(log.segments) == 1
    assert log.offset_for_timestamp(50) == (1, 60)


def test_offset_for_timestamp_of_compressed_batch(log):
    log.append(batch(2, ts=10), 0)
    log.append(rb.encode_raw_batch(b"zz", 3, BatchSpec(attributes=1, base_timestamp=20),
                                   max_timestamp=25), 0)  # fmt: skip
    assert log.offset_for_timestamp(21) == (2, 25)
    assert log.offset_for_timestamp(11) == (1, 11)
    assert log.offset_for_timestamp(26) is None


# -- truncation ---------------------------------------------------------------------------------


def test_truncate_to_across_segments(log):
    fill(log, [(2, 200)] * 10)
    assert len(log.segments) > 3
    log.truncate_to(9)  # inside the batch 8..9: the whole batch goes
    assert log.log_end_offset == 8
    assert values(log)[-1][0] == 7
    assert all(s.base_offset <= 8 for s in log.segments)
    check_indexes_agree(log)
    assert log.truncate_to(100) == 0
    log.append(batch(1), 0)
    assert log.log_end_offset == 9
    check_indexes_agree(log)


def test_truncation_offset_says_where_truncate_to_lands(log):
    fill(log, [(2, 200)] * 10)  # batches of two, over several segments
    bases = [s.base_offset for s in log.segments]
    for offset in [*range(0, 21), *bases]:
        assert log.truncation_offset(offset) == min(offset - offset % 2, log.log_end_offset)
    assert log.truncation_offset(99) == log.log_end_offset
    landed = log.truncation_offset(9)
    log.truncate_to(9)
    assert log.log_end_offset == landed == 8


def test_truncate_to_a_segment_base_leaves_an_empty_active_segment(log):
    fill(log, [(2, 200)] * 8)
    base = log.segments[2].base_offset
    log.truncate_to(base)
    assert log.log_end_offset == base
    assert log.active_segment.size == 0 or log.active_segment.base_offset < base
    fill(log, [(1, 10)])
    assert values(log)[-1][0] == base
    check_indexes_agree(log)


def test_truncate_below_log_start_empties_the_log(tmp_path):
    log = Log.open(tmp_path, SMALL, log_start_offset=100)
    assert log.log_start_offset == log.log_end_offset == 100
    fill(log, [(2, 10)])
    log.truncate_to(50)
    assert log.log_start_offset == log.log_end_offset == 50
    assert log.leader_epoch_cache.entries() == []
    log.close()


def test_truncate_fully_and_start_at(log):
    fill(log, [(2, 200)] * 8)
    log.truncate_fully_and_start_at(1000)
    assert (log.log_start_offset, log.log_end_offset) == (1000, 1000)
    assert len(log.segments) == 1 and log.recovery_point == 1000
    assert sorted(p.name for p in log.directory.glob("*.log")) == [f"{1000:020d}.log"]
    assert log.append(batch(), 4).first_offset == 1000
    assert log.leader_epoch_cache.entries() == [(4, 1000)]


# -- retention ----------------------------------------------------------------------------------


def test_retention_by_bytes(tmp_path):
    config = LogConfig(segment_bytes=1024, segment_index_bytes=80, retention_bytes=2500,
                       retention_ms=-1)  # fmt: skip
    log = Log.open(tmp_path, config)
    fill(log, [(1, 300)] * 15)
    sizes = [s.size for s in log.segments]
    deleted = log.delete_old_segments(now_ms=10**12)
    # delete from the oldest while what remains would still be >= retention.bytes
    expected, total = 0, sum(sizes)
    while expected < len(sizes) - 1 and total - sizes[expected] >= 2500:
        total -= sizes[expected]
        expected += 1
    assert deleted == expected > 0
    assert log.size_in_bytes == total
    assert log.log_start_offset == log.segments[0].base_offset
    assert log.log_end_offset == 15
    assert not (tmp_path / f"{0:020d}.log").exists()
    assert not (tmp_path / f"{0:020d}.index").exists()
    check_indexes_agree(log)
    log.close()


def test_retention_by_time_and_high_watermark(tmp_path):
    config = LogConfig(segment_bytes=1024, segment_index_bytes=80, retention_ms=500)  # fmt: skip
    log = Log.open(tmp_path, config)
    fill(log, [(1, 300)] * 12)  # batch i has timestamp 1000 * i
    bases = [s.base_offset for s in log.segments]
    largest = [s.largest_timestamp() for s in log.segments]
    assert log.delete_old_segments(now_ms=largest[0] + 500) == 0  # not yet past retention.ms
    assert log.delete_old_segments(now_ms=largest[1] + 501, high_watermark=bases[1]) == 1
    assert log.log_start_offset == bases[1]
    # the high watermark bounds retention: only segments wholly below it go
    assert log.delete_old_segments(now_ms=10**12, high_watermark=bases[3] - 1) == 1
    assert log.log_start_offset == bases[2]
    # at 10**12 the active segment is older than segment.ms too: the check rolled it (as
    # Kafka's retention does), so it goes with the rest; the new active one stays, empty
    assert log.delete_old_segments(now_ms=10**12) == len(bases) - 2
    assert len(log.segments) == 1 and log.active_segment.size == 0
    assert log.log_end_offset == 12
    log.close()


def test_retention_never_passes_the_high_watermark(tmp_path):
    config = LogConfig(segment_bytes=1024, segment_index_bytes=80, retention_bytes=0)  # fmt: skip
    log = Log.open(tmp_path, config)
    fill(log, [(1, 300)] * 12)
    bases = [s.base_offset for s in log.segments]
    assert log.delete_old_segments(now_ms=0, high_watermark=bases[1] - 1) == 0
    assert log.delete_old_segments(now_ms=0, high_watermark=bases[2] - 1) == 1
    assert log.log_start_offset == bases[1]  # segment 1 ends above the high watermark
    assert log.delete_old_segments(now_ms=0, high_watermark=bases[2]) == 1
    assert log.log_start_offset == bases[2]
    log.close()


# -- epochs follow the log ----------------------------------------------------------------------


def test_epoch_cache_follows_appends_truncation_and_retention(tmp_path):
    config = LogConfig(segment_bytes=1024, segment_index_bytes=80, retention_bytes=0)  # fmt: skip
    log = Log.open(tmp_path, config)
    for epoch in (0, 0, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5):
        log.append(batch(1, size=300), epoch)
    assert log.leader_epoch_cache.entries() == [(0, 0), (1, 2), (3, 5), (5, 9)]
    assert log.end_offset_for_epoch(2) == (1, 5)
    assert log.end_offset_for_epoch(5) == (5, 12)
    assert log.end_offset_for_epoch(6) == (-1, -1)
    log.append(batch(1), 2)  # a lower epoch is stamped but does not rewrite history
    assert log.leader_epoch_cache.latest_epoch == 5
    log.truncate_to(9)
    assert log.leader_epoch_cache.entries() == [(0, 0), (1, 2), (3, 5)]
    log.delete_old_segments(now_ms=0, high_watermark=6)
    start = log.log_start_offset
    assert 0 < start <= 6
    cache = log.leader_epoch_cache.entries()
    history = [(0, 0), (1, 2), (3, 5)]
    covering = [e for e in history if e[1] <= start][-1][0]
    assert cache == [(covering, start)] + [e for e in history if e[1] > start]
    log.close()
    reopened = Log.open(tmp_path, config)
    assert reopened.leader_epoch_cache.entries() == cache
    reopened.close()


# -- reopening ----------------------------------------------------------------------------------


def test_clean_reopen_trusts_indexes(tmp_path, monkeypatch):
    log = Log.open(tmp_path, SMALL)
    fill(log, [(2, 150)] * 10)
    before = values(log)
    log.close()
    assert (tmp_path / log_module.CLEAN_SHUTDOWN).exists()
    recovered = []
    real = LogSegment.recover
    monkeypatch.setattr(LogSegment, "recover", lambda self: recovered.append(self) or real(self))
    again = Log.open(tmp_path, SMALL)
    assert recovered == [] and again.cuts == []
    assert not (tmp_path / log_module.CLEAN_SHUTDOWN).exists()  # a crash from here is unclean
    assert values(again) == before
    check_indexes_agree(again)
    again.append(batch(), 0)
    assert again.log_end_offset == 21
    again.close()


def test_unclean_reopen_recovers_from_the_recovery_point(tmp_path, monkeypatch):
    log = Log.open(tmp_path, SMALL)
    fill(log, [(2, 150)] * 10)
    point = log.flush()
    assert point == 20
    fill(log, [(1, 150)] * 4)
    before = values(log)
    recovered = []
    real = LogSegment.recover
    monkeypatch.setattr(
        LogSegment, "recover", lambda self: recovered.append(self.base_offset) or real(self)
    )
    # no close: the first Log is abandoned, as after kill -9 (its writes are in the page cache)
    again = Log.open(tmp_path, SMALL, recovery_point=point)
    holding = max(s.base_offset for s in again.segments if s.base_offset <= point)
    assert recovered == [s.base_offset for s in again.segments if s.base_offset >= holding]
    assert values(again) == before and again.cuts == []
    assert again.recovery_point == again.log_end_offset == 24
    check_indexes_agree(again)
    again.close()


def test_reopen_with_smaller_segment_bytes_keeps_data(tmp_path):
    log = Log.open(tmp_path, LogConfig(segment_bytes=8192))
    fill(log, [(1, 200)] * 12)
    before = values(log)
    log.close()
    again = Log.open(tmp_path, SMALL)
    assert values(again) == before
    again.append(batch(), 0)
    assert [s.base_offset for s in again.segments] == [0, 12]
    again.close()
    third = Log.open(tmp_path, SMALL)
    assert third.cuts == [] and values(third)[:12] == before
    third.close()


def test_config_bounds():
    with pytest.raises(ValueError, match="log.segment.bytes"):
        LogConfig(segment_bytes=100)
    with pytest.raises(ValueError, match="log.index.size.max.bytes"):
        LogConfig(segment_index_bytes=4)
    assert LogConfig(segment_index_bytes=80).max_index_entries == 10


def test_offsets_beyond_int32_relative_range_roll_a_new_segment(tmp_path):
    log = Log.open(tmp_path, LogConfig(segment_bytes=1 << 16))
    try:
        log.append_as_follower(batch(2, base_offset=0))
        far = 2**31 + 5  # relative to segment 0 this no longer fits the index's int32
        log.append_as_follower(batch(3, base_offset=far))
        assert [s.base_offset for s in log.segments] == [0, far]
        assert log.log_end_offset == far + 3
        assert [h.base_offset for _, h in iter_batches(log.read(far + 1, 10_000).tobytes())] == [
            far
        ]
        assert [h.base_offset for _, h in iter_batches(log.read(1, 10_000).tobytes())] == [0]
        check_indexes_agree(log)
        log.close()
        log = Log.open(tmp_path, LogConfig(segment_bytes=1 << 16))
        assert [s.base_offset for s in log.segments] == [0, far] and log.cuts == []
        check_indexes_agree(log)
        log.truncate_fully_and_start_at(2**40)
        assert log.append(batch(), 0).first_offset == 2**40
        assert log.read(2**40, 1000).tobytes()[:8] == (2**40).to_bytes(8, "big")
        assert log.offset_for_timestamp(0) == (2**40, 1000)
    finally:
        log.close()


# -- a full filesystem --------------------------------------------------------------------------


@pytest.fixture
def disk(monkeypatch):
    """A filesystem that is full on demand (test_segment.FakeFullDisk)."""
    return install_fake_full_disk(monkeypatch)


FULL_TEST_CONFIG = LogConfig(segment_bytes=16384, segment_index_bytes=800)


def fill_until_full(log, size=300, epoch=0, limit=1000):
    """Append one-record batches until the log directory is full; returns how many went in."""
    for appended in range(limit):
        try:
            log.append(batch(1, size=size), epoch)
        except LogDirectoryFullError:
            return appended
    raise AssertionError(f"{limit} appends and still room")


def test_an_append_without_space_raises_logs_once_and_changes_nothing(tmp_path, disk, caplog):
    log = Log.open(tmp_path / "t-0", FULL_TEST_CONFIG)
    log.append(batch(1, size=300), 0)
    disk.full = True
    with caplog.at_level("INFO", logger=log_module.__name__):
        appended = fill_until_full(log)  # none: the filesystem has no room at all
        before = values(log)
        end, sizes = log.log_end_offset, [s.size for s in log.segments]
        for _ in range(3):
            with pytest.raises(LogDirectoryFullError) as failed:
                log.append(batch(3, size=100), 0)
        assert (log.log_end_offset, [s.size for s in log.segments]) == (end, sizes)
        assert values(log) == before and end == 1 + appended
        check_indexes_agree(log)
        message = str(failed.value)
        assert str(tmp_path / "t-0") in message and "bytes free" in message
        warnings = [r for r in caplog.records if "no space left for log" in r.getMessage()]
        assert len(warnings) == 1  # the first failure of the episode, not every one
        disk.full = False
        log.append(batch(3, size=100), 0)
        assert any("appends again" in r.getMessage() for r in caplog.records)
    assert log.log_end_offset == end + 3
    check_indexes_agree(log)
    log.close()


def test_an_append_that_rolls_into_a_segment_without_space_is_undone_whole(tmp_path, disk):
    log = Log.open(tmp_path / "t-0", FULL_TEST_CONFIG)
    while log.active_segment.size < FULL_TEST_CONFIG.segment_bytes - 2000:
        log.append(batch(1, size=300), 0)
    before, end = values(log), log.log_end_offset
    records = b"".join(batch(1, size=300, tag=b"w%d" % i) for i in range(12))  # ~4 KiB: rolls
    # The batches that still fit the active segment go in; the new segment gets no space.
    disk.suffix = ".log"
    disk.spare = log.active_segment.path.name  # it gets space, the next segment none
    disk.full = True
    segments = len(log.segments)
    with pytest.raises(LogDirectoryFullError):
        log.append(records, 0)
    assert values(log) == before and log.log_end_offset == end
    assert len(log.segments) == segments and log.active_segment.size > 0
    assert any(name != disk.spare for name, *_ in disk.writes)  # it did roll
    check_indexes_agree(log)
    disk.full = False
    info = log.append(records, 0)
    assert (info.first_offset, info.last_offset) == (end, end + 11)
    assert values(log)[: len(before)] == before and len(values(log)) == len(before) + 12
    check_indexes_agree(log)
    log.close()
    reopened = Log.open(tmp_path / "t-0", FULL_TEST_CONFIG)
    assert len(values(reopened)) == len(before) + 12
    reopened.close()


def test_a_follower_append_without_space_is_undone_and_its_epochs_too(tmp_path, disk):
    leader = Log.open(tmp_path / "leader", FULL_TEST_CONFIG)
    for epoch in (1, 1, 2, 2, 3, 3):
        leader.append(batch(1, size=2000), epoch)
    fetched = b"".join(s.tobytes() for s in leader.read(0, 1 << 20).slices)
    follower = Log.open(tmp_path / "follower", FULL_TEST_CONFIG)
    disk.full = True
    # The follower's first segment gets no space: the append fails and nothing of it stays.
    with pytest.raises(LogDirectoryFullError):
        follower.append_as_follower(fetched)
    assert follower.log_end_offset == 0 and values(follower) == []
    assert all(start <= 0 for _, start in follower.leader_epoch_cache.entries())
    disk.full = False
    follower.append_as_follower(fetched)
    assert values(follower) == values(leader)
    assert follower.leader_epoch_cache.entries() == leader.leader_epoch_cache.entries()
    leader.close()
    follower.close()


def test_a_failed_epoch_checkpoint_write_holds_appends_until_it_is_written(tmp_path, monkeypatch):
    log = Log.open(tmp_path / "t-0", SMALL)
    log.append(batch(1), 0)
    checkpoint = log.leader_epoch_cache._file
    real_write = checkpoint.write

    def full(entries):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "write", full)
    with pytest.raises(LogDirectoryFullError, match="leader-epoch-checkpoint"):
        log.append(batch(1), 4)
    assert log.log_end_offset == 1
    assert log.leader_epoch_cache.entries() == [(0, 0), (4, 1)]  # kept in memory
    with pytest.raises(LogDirectoryFullError):  # still unwritten: still nothing appended
        log.append(batch(1), 4)
    monkeypatch.setattr(checkpoint, "write", real_write)
    log.append(batch(1), 4)
    assert log.log_end_offset == 2 and log.leader_epoch_cache.saved
    assert checkpoint.read() == [(0, 0), (4, 1)]
    log.close()


def test_a_checkpoint_write_without_space_keeps_the_old_file_and_names_the_new(tmp_path,
                                                                                monkeypatch):  # fmt: skip
    from localcluster.storage import checkpoint as checkpoint_module
    from localcluster.storage import read_partition_offsets, write_partition_offsets

    path = tmp_path / "replication-offset-checkpoint"
    write_partition_offsets(path, {("t", 0): 5})

    class FullOs:
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def write(fd, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module, "os", FullOs())
    with pytest.raises(OSError) as failed:
        write_partition_offsets(path, {("t", 0): 9})
    assert failed.value.errno == errno.ENOSPC and str(path) in str(failed.value)
    monkeypatch.undo()
    assert read_partition_offsets(path) == {("t", 0): 5}
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp file left


# -- a real full tmpfs (root) -------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MiB tmpfs of the test's own, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def in_child(tmp_path, work) -> dict:
    """Run `work()` in a forked child (a SIGBUS kills the child, not pytest); its result."""
    out = tmp_path / f"child-{work.__name__}.json"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            out.write_text(json.dumps(work()))
            code = 0
        except BaseException:
            out.write_text(json.dumps({"error": traceback.format_exc()}))
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert not os.WIFSIGNALED(status), f"{work.__name__} died of signal {os.WTERMSIG(status)}"
    result = json.loads(out.read_text())
    assert os.WEXITSTATUS(status) == 0, result.get("error")
    return result


def test_a_real_full_tmpfs_is_an_error_not_sigbus_and_recovery_reads_no_hole(tmp_path,
                                                                             small_tmpfs):  # fmt: skip
    directory = small_tmpfs / "t-0"
    config = LogConfig(segment_bytes=256 << 10, segment_index_bytes=8000)
    filler = small_tmpfs / "filler"

    def fill():
        filler.write_bytes(b"\1" * (256 << 10))
        log = Log.open(directory, config)
        appended = fill_until_full(log, size=1000, limit=5000)
        error = None
        try:
            log.append(batch(1, size=1000), 0)
        except LogDirectoryFullError as e:
            error = str(e)
        check_indexes_agree(log)
        filler.unlink()  # space returns
        log.append(batch(1, size=1000, tag=b"after"), 0)
        again = fill_until_full(log, size=1000, limit=5000)
        # a crash: the log is not closed; the next process recovers on a full filesystem
        return {"appended": appended, "error": error, "again": again,
                "values": [v.hex() for _, v in values(log)]}  # fmt: skip

    filled = in_child(tmp_path, fill)
    assert filled["appended"] > 500 and filled["again"] > 100  # ~1.7 MiB in 1 KiB batches
    assert "no space left for log" in filled["error"] and str(directory) in filled["error"]

    def recover():
        log = Log.open(directory, config)
        recovered = [v.hex() for _, v in values(log)]
        check_indexes_agree(log)
        log.close()
        return {"values": recovered}

    assert in_child(tmp_path, recover)["values"] == filled["values"]


def test_segment_ms_rolls_at_an_append_or_the_retention_check(tmp_path):
    config = LogConfig(segment_bytes=1 << 16, segment_index_bytes=4096, segment_ms=1500)  # fmt: skip
    log = Log.open(tmp_path, config)
    fill(log, [(1, 10)] * 3)  # timestamps 0, 1000, 2000: the third is 2000 ms after the first
    assert [s.base_offset for s in log.segments] == [0, 2]
    assert not log.maybe_roll_by_time(now_ms=3500)  # 1500 ms after the active one's first
    assert log.maybe_roll_by_time(now_ms=3501)
    assert [s.base_offset for s in log.segments] == [0, 2, 3] and log.active_segment.size == 0
    assert not log.maybe_roll_by_time(now_ms=10**12)  # an empty segment does not age
    log.close()


def test_log_start_offset_moves_inside_a_segment_and_survives_reopening(tmp_path):
    log = Log.open(tmp_path, SMALL)
    fill(log, [(1, 300)] * 12)
    bases = [s.base_offset for s in log.segments]
    inside = bases[2] + 1
    assert log.increment_log_start_offset(inside)
    assert not log.increment_log_start_offset(inside - 1)  # never backwards
    assert log.log_start_offset == inside and log.segments[0].base_offset == bases[2]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(inside - 1, 1 << 20)
    assert log.read(inside, 1 << 20).slices
    log.close()
    again = Log.open(tmp_path, SMALL, log_start_offset=inside)
    assert again.log_start_offset == inside
    assert [s.base_offset for s in again.segments][0] == bases[2]
    again.close()
