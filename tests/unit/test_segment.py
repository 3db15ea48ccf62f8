"""LogSegment: append, trim on seal, recovery of zero and torn tails, truncation, slices,
and a full filesystem (an error with nothing left written, never SIGBUS)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import socket

import pytest

from localcluster.storage import (
    FileSlice,
    LogDirectoryFullError,
    Record,
    encode_batch,
    reservation,
    validate_batch,
)
from localcluster.storage import record_batch as rb
from localcluster.storage.segment import LogSegment, segment_file_name
from tests.helpers import scan_segment

CAPACITY = 64 * 1024


def new_segment(tmp_path, base=0, capacity=CAPACITY, entries=128):
    return LogSegment.create(tmp_path, base, capacity, entries)


def reopen(tmp_path, base=0, capacity=CAPACITY, entries=128):
    return LogSegment.open_existing(tmp_path, base, capacity, entries)


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


def test_fills_to_its_capacity(tmp_path):
    segment = LogSegment.create(tmp_path, 0, CAPACITY, 1024)
    offset = 0
    while segment.can_hold(1100, 1):
        put(segment, offset, size=1000)
        offset += 1
    assert offset > 50
    assert [h.base_offset for _, h in scan_segment(segment)] == list(range(offset))


def test_can_hold_counts_bytes_and_index_room(tmp_path):
    segment = LogSegment.create(tmp_path, 0, 1000, 2)
    assert segment.can_hold(1000, 1) and not segment.can_hold(1001, 1)
    put(segment, 0)
    put(segment, 1)
    assert not segment.can_hold(10, 1)


def test_reopen_with_a_smaller_capacity_keeps_the_data(tmp_path):
    # Minimal case of a data-loss bug: make_appendable cut the file to the new, smaller capacity.
    segment = LogSegment.create(tmp_path, 0, 8192, 64)
    offset = 0
    while segment.size < 3000:
        put(segment, offset, size=200)
        offset += 1
    size = segment.size
    segment.close()
    again = LogSegment.open_existing(tmp_path, 0, 1024, 64)  # segment.bytes lowered
    assert again.load_trusted()
    again.make_appendable()
    assert os.path.getsize(again.path) >= size
    assert [h.base_offset for _, h in scan_segment(again)] == list(range(offset))


# -- a full filesystem ------------------------------------------------------------------------


class FakeFullDisk:
    """While `full`, files whose name ends with `suffix` (except the file named `spare`) have no
    room: fallocate(2) (the index files' reservations) fails with ENOSPC, and pwrite(2) (the
    segment's data) writes at most `room` more bytes, short, and then fails with ENOSPC.

    Every fallocate is recorded in `calls` as (file name, start, stop, succeeded), every pwrite
    in `writes` as (file name, position, length). tests/integration/test_disk_full.py and
    test_log.py's tmpfs test meet a really full filesystem.
    """

    def __init__(self, monkeypatch):
        self.full = False
        self.suffix = ""
        self.spare = ""
        self.room = 0
        self.calls: list[tuple[str, int, int, bool]] = []
        self.writes: list[tuple[str, int, int]] = []
        self._real_fallocate = reservation._fallocate
        self._real_pwrite = os.pwrite
        monkeypatch.setattr(reservation, "_fallocate", self.fallocate)
        monkeypatch.setattr(os, "pwrite", self.pwrite)

    def _failing(self, fd) -> tuple[str, bool]:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        return name, self.full and name.endswith(self.suffix) and name != self.spare

    def fallocate(self, fd, mode, offset, length):
        name, failing = self._failing(fd)
        self.calls.append((name, offset, offset + length, not failing))
        if failing:
            ctypes.set_errno(errno.ENOSPC)
            return -1
        return self._real_fallocate(fd, mode, offset, length)

    def pwrite(self, fd, data, position):
        name, failing = self._failing(fd)
        self.writes.append((name, position, len(data)))
        if failing:
            if not self.room:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            with memoryview(data) as view:
                written = self._real_pwrite(fd, view[: self.room], position)
            self.room -= written
            return written
        return self._real_pwrite(fd, data, position)

    def reserved(self, suffix: str) -> list[tuple[int, int]]:
        return [(a, b) for name, a, b, ok in self.calls if ok and name.endswith(suffix)]


def install_fake_full_disk(monkeypatch) -> FakeFullDisk:
    if reservation._fallocate is None:
        pytest.skip("no fallocate in this libc")
    return FakeFullDisk(monkeypatch)


@pytest.fixture
def disk(monkeypatch):
    return install_fake_full_disk(monkeypatch)


def covered(ranges: list[tuple[int, int]], stop: int) -> bool:
    """True when the union of `ranges` covers [0, stop)."""
    reach = 0
    for a, b in sorted(ranges):
        if a > reach:
            break
        reach = max(reach, b)
    return reach >= stop


def test_index_entries_are_reserved_before_they_are_written(tmp_path, disk):
    segment = LogSegment.create(tmp_path, 0, 1 << 20, 4096)
    offset = 0
    while segment.can_hold(1100, 1):
        put(segment, offset, size=1000)
        offset += 1
    assert covered(disk.reserved(".index"), segment.index.count * 8)
    assert covered(disk.reserved(".timeindex"), segment.index.count * 8)
    assert len([c for c in disk.calls if c[0].endswith(".index")]) == 2  # 1 page, then 2
    # The data is written, not stored through the map: nothing reserves it (a full filesystem
    # is pwrite's ENOSPC, never SIGBUS).
    assert disk.reserved(".log") == []
    segment.close()


def test_each_batch_is_written_tail_first_and_its_first_16_bytes_last(tmp_path, disk):
    segment = new_segment(tmp_path)
    put(segment, 0, size=300)
    second = segment.size
    data = put(segment, 1, n=3, epoch=7, size=200)
    name = segment.path.name
    assert [w for w in disk.writes if w[0] == name][-2:] == [
        (name, second + 16, len(data) - 16),
        (name, second, 16),  # baseOffset, batchLength, partitionLeaderEpoch: one write, last
    ]
    _, header = scan_segment(segment)[1]
    assert (header.base_offset, header.partition_leader_epoch) == (1, 7)
    segment.close()


def test_a_segment_allocates_only_the_pages_its_data_fills(tmp_path):
    segment = new_segment(tmp_path, capacity=4 << 20)
    for offset in range(40):
        put(segment, offset, size=1000)
    assert os.path.getsize(segment.path) == 4 << 20  # sparse to its capacity
    allocated = os.stat(segment.path).st_blocks * 512
    assert allocated <= -(-segment.size // mmap.PAGESIZE) * mmap.PAGESIZE + 8192
    segment.close()


@pytest.mark.parametrize("torn_at", [0, 100, 5000, -8],
                         ids=["nothing", "a few tail bytes", "most of the tail", "a torn head"])  # fmt: skip
def test_a_full_filesystem_is_an_error_and_nothing_is_left_written(tmp_path, disk, torn_at):
    segment = new_segment(tmp_path)
    for offset in range(3):
        put(segment, offset, size=500)
    size, count = segment.size, segment.index.count
    batch_bytes = len(encode_batch([Record(bytes([65 + i % 26]) * 600, timestamp=1000 + i)
                                    for i in range(10)]))  # fmt: skip
    # The filesystem takes `torn_at` bytes (negative: all but that many) and then has no room:
    # -8 lets the tail land and tears the 16-byte head that is written last.
    disk.full, disk.room = True, torn_at if torn_at >= 0 else batch_bytes + torn_at
    assert disk.room < batch_bytes
    with pytest.raises(LogDirectoryFullError) as failed:
        put(segment, 3, n=10, size=600)
    assert (segment.size, segment.index.count, segment.next_offset) == (size, count, 3)
    head_tried = (segment.path.name, size, 16) in disk.writes
    assert head_tried == (torn_at < 0)  # the head is written only once the whole tail landed
    assert str(tmp_path) in str(failed.value) and "bytes free" in str(failed.value)
    assert failed.value.directory == tmp_path and failed.value.free_bytes > 0
    with open(segment.path, "rb") as f:  # what went in of the failed batch was cut again
        f.seek(size)
        assert f.read(8192) == b"\0" * 8192
    assert os.path.getsize(segment.path) == CAPACITY
    disk.full = False  # space returns: the same append goes through
    put(segment, 3, n=10, size=600)
    assert [h.base_offset for _, h in scan_segment(segment)] == [0, 1, 2, 3]
    segment.close()
    again = reopen(tmp_path)
    assert again.recover() is None and again.next_offset == 13


def test_a_full_index_file_is_an_error_before_the_batch_is_written(tmp_path, disk):
    segment = LogSegment.create(tmp_path, 0, CAPACITY, 4096)
    disk.suffix = ".timeindex"  # the log file has room, the time index none
    disk.full = True
    with pytest.raises(LogDirectoryFullError, match="index entries"):
        put(segment, 0)
    assert (segment.size, segment.index.count, segment.next_offset) == (0, 0, 0)
    assert not [w for w in disk.writes if w[0] == segment.path.name]
    disk.full = False
    put(segment, 0)
    put(segment, 1)
    assert [h.base_offset for _, h in scan_segment(segment)] == [0, 1]
    assert segment.index.count == 2 and segment.index.reserved_entries >= 2
    segment.close()


def test_a_deleted_or_retired_segment_drops_its_index_maps_unsynced(tmp_path, monkeypatch):
    """Its index files are unlinked next: an msync of them first blocked the event loop on a
    disk (retention deleting a segment), for pages nobody reads again."""
    from localcluster.storage.index import BatchIndex
    from localcluster.storage.segment import SpareFiles

    synced = []
    monkeypatch.setattr(BatchIndex, "flush", lambda index: synced.append(index.base_offset))
    for base, goes in ((0, LogSegment.delete), (100, lambda s: s.retire(SpareFiles(tmp_path)))):
        segment = new_segment(tmp_path, base)
        put(segment, base, n=3)
        goes(segment)
        assert not segment.index.offset_path.exists()
    assert synced == []
