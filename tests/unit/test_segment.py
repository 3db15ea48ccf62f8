"""LogSegment: append, trim on seal, recovery of zero and torn tails, truncation, slices."""

from __future__ import annotations

import os
import socket

from localcluster.storage import FileSlice, Record, encode_batch, validate_batch
from localcluster.storage import record_batch as rb
from localcluster.storage.segment import LogSegment, segment_file_name
from tests.helpers import scan_segment

CAPACITY = 64 * 1024


def new_segment(tmp_path, base=0, capacity=CAPACITY, entries=128):
    return LogSegment.create(tmp_path, base, capacity, entries, 8192)


def reopen(tmp_path, base=0, capacity=CAPACITY, entries=128):
    return LogSegment.open_existing(tmp_path, base, capacity, entries, 8192)


def put(segment, offset, n=1, epoch=0, size=20, ts=1000):
    data = encode_batch([Record(bytes([65 + i % 26]) * size, timestamp=ts + i) for i in range(n)])
    header = validate_batch(data)
    segment.append_batch(memoryview(data), 0, header, offset, epoch)
    return data


def test_file_name():
    assert segment_file_name(42) == "00000000000000000042.log"


def test_append_rewrites_offset_and_epoch_and_indexes(tmp_path):
    segment = new_segment(tmp_path, base=10)
    put(segment, 10, n=3, epoch=4)
    put(segment, 13, n=2, epoch=5)
    assert segment.next_offset == 15
    scanned = scan_segment(segment)
    assert [(p, h.base_offset, h.partition_leader_epoch, h.records_count) for p, h in scanned] == [
        (0, 10, 4, 3),
        (scanned[1][0], 13, 5, 2),
    ]
    assert segment.index.entry(1) == (3, scanned[1][0])
    assert os.path.getsize(segment.path) == CAPACITY  # preallocated while active


def test_seal_trims_file_and_indexes(tmp_path):
    segment = new_segment(tmp_path)
    put(segment, 0)
    put(segment, 1)
    segment.seal()
    assert os.path.getsize(segment.path) == segment.size
    assert os.path.getsize(segment.index.offset_path) == 16
    assert os.path.getsize(segment.index.time_path) == 16
    segment.close()
    again = reopen(tmp_path)
    assert again.load_trusted()
    assert again.next_offset == 2 and again.index.count == 2


def test_recovery_cuts_preallocated_zeros_silently(tmp_path):
    segment = new_segment(tmp_path)
    put(segment, 0, n=2)
    put(segment, 2)
    size = segment.size
    segment.flush()  # no seal: the file keeps its preallocated zero tail (a kill -9)
    again = reopen(tmp_path)
    assert again.size == CAPACITY
    assert again.recover() is None
    assert again.size == size and again.next_offset == 3 and again.index.count == 2
    assert os.path.getsize(again.path) == size


def test_recovery_cuts_a_torn_batch_and_reports_it(tmp_path):
    segment = new_segment(tmp_path)
    put(segment, 0)
    good = segment.size
    torn = encode_batch([Record(b"t" * 300)])
    # A torn write: the body landed but not the first 12 bytes (they are written last).
    segment._mm[good + 12 : good + len(torn)] = torn[12:]
    segment.flush()
    again = reopen(tmp_path)
    cut = again.recover()
    assert cut is not None
    assert (cut.segment, cut.position, cut.bytes_cut) == (segment.path.name, good, CAPACITY - good)
    assert "batchLength 0" in cut.reason
    assert again.size == good and again.next_offset == 1


def test_recovery_stops_at_offsets_that_go_backwards(tmp_path):
    segment = new_segment(tmp_path, base=5)
    put(segment, 5, n=2)
    first_end = segment.size
    put(segment, 6)  # overlaps: offset 6 is below the expected 7
    segment.flush()
    again = reopen(tmp_path, base=5)
    cut = again.recover()
    assert cut is not None and cut.position == first_end
    assert "below the expected 7" in cut.reason
    assert again.next_offset == 7


def test_truncate_to_cuts_whole_batches_and_zeroes(tmp_path):
    segment = new_segment(tmp_path)
    put(segment, 0, n=3)
    second = segment.size
    put(segment, 3, n=3)
    put(segment, 6, n=1)
    # offset 4 lies inside the batch 3..5: the whole batch goes
    removed = segment.truncate_to(4)
    assert segment.next_offset == 3 and segment.size == second and segment.index.count == 1
    assert removed > 0
    with open(segment.path, "rb") as f:
        f.seek(second)
        assert f.read(4096) == b"\0" * 4096  # the file was cut and regrown, not left stale
    assert segment.truncate_to(100) == 0
    put(segment, 3, n=1)
    assert [h.base_offset for _, h in scan_segment(segment)] == [0, 3]


def test_truncate_to_base_empties_the_segment(tmp_path):
    segment = new_segment(tmp_path, base=7)
    put(segment, 7, n=2)
    segment.truncate_to(7)
    assert segment.size == 0 and segment.next_offset == 7 and segment.index.count == 0


def test_file_slice_sendfile_matches_view(tmp_path):
    segment = new_segment(tmp_path)
    for offset in range(5):
        put(segment, offset, size=100 + 37 * offset)
    positions = [p for p, _ in scan_segment(segment)]
    piece = FileSlice(segment, positions[1], positions[4] - positions[1])
    left, right = socket.socketpair()
    try:
        sent = 0
        while sent < piece.length:
            sent += os.sendfile(left.fileno(), piece.fd, piece.position + sent, piece.length - sent)
        received = b""
        while len(received) < piece.length:
            received += right.recv(65536)
    finally:
        left.close()
        right.close()
    assert received == piece.tobytes()
    assert [h.base_offset for _, h in rb.iter_batches(received)] == [1, 2, 3]


def test_grows_past_prefault_window(tmp_path):
    segment = LogSegment.create(tmp_path, 0, CAPACITY, 1024, 4096)  # prefault one page at a time
    offset = 0
    while segment.can_hold(1100, 1):
        put(segment, offset, size=1000)
        offset += 1
    assert offset > 50
    assert [h.base_offset for _, h in scan_segment(segment)] == list(range(offset))


def test_can_hold_counts_bytes_and_index_room(tmp_path):
    segment = LogSegment.create(tmp_path, 0, 1000, 2, 4096)
    assert segment.can_hold(1000, 1) and not segment.can_hold(1001, 1)
    put(segment, 0)
    put(segment, 1)
    assert not segment.can_hold(10, 1)


def test_reopen_with_a_smaller_capacity_keeps_the_data(tmp_path):
    # Minimal case of a data-loss bug: make_appendable cut the file to the new, smaller capacity.
    segment = LogSegment.create(tmp_path, 0, 8192, 64, 4096)
    offset = 0
    while segment.size < 3000:
        put(segment, offset, size=200)
        offset += 1
    size = segment.size
    segment.close()
    again = LogSegment.open_existing(tmp_path, 0, 1024, 64, 4096)  # segment.bytes lowered
    assert again.load_trusted()
    again.make_appendable()
    assert os.path.getsize(again.path) >= size
    assert [h.base_offset for _, h in scan_segment(again)] == list(range(offset))
