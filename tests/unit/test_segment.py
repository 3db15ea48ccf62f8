"""LogSegment: append, trim on seal, recovery of zero and torn tails, truncation, slices,
and space reserved before it is written (a full filesystem is an error, never SIGBUS)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import socket
import threading

import pytest

from localcluster.storage import (
    FileSlice,
    LogDirectoryFullError,
    Record,
    encode_batch,
    prefault,
    reservation,
    validate_batch,
)
from localcluster.storage import record_batch as rb
from localcluster.storage.segment import FIRST_CHUNK_BYTES, LogSegment, segment_file_name
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


# -- a full filesystem ------------------------------------------------------------------------


class FakeFullDisk:
    """fallocate(2) fails with ENOSPC, while `full`, for files whose name ends with `suffix`
    (except the file named `spare`, which still gets space).

    Every call is recorded as (file name, start, stop, succeeded), and in `on_caller` whether the
    test's own thread made it (not the prefault thread). Stores into unreserved pages
    would not fault here (the real disk has room): the tests check the reservations themselves,
    and tests/integration/test_disk_full.py and test_log.py's tmpfs test meet the real SIGBUS.
    """

    def __init__(self):
        self.full = False
        self.suffix = ""
        self.spare = ""
        self.calls: list[tuple[str, int, int, bool]] = []
        self.on_caller: list[bool] = []
        self._caller = threading.get_ident()
        self._real = reservation._fallocate

    def __call__(self, fd, mode, offset, length):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        failing = self.full and name.endswith(self.suffix) and name != self.spare
        self.calls.append((name, offset, offset + length, not failing))
        self.on_caller.append(threading.get_ident() == self._caller)
        if failing:
            ctypes.set_errno(errno.ENOSPC)
            return -1
        return self._real(fd, mode, offset, length)

    def reserved(self, suffix: str, on_caller: bool | None = None) -> list[tuple[int, int]]:
        return [(a, b) for (name, a, b, ok), caller in zip(self.calls, self.on_caller, strict=True)
                if ok and name.endswith(suffix) and on_caller in (None, caller)]  # fmt: skip


def install_fake_full_disk(monkeypatch) -> FakeFullDisk:
    if reservation._fallocate is None:
        pytest.skip("no fallocate in this libc")
    fake = FakeFullDisk()
    monkeypatch.setattr(reservation, "_fallocate", fake)
    return fake


@pytest.fixture
def disk(monkeypatch):
    prefault.PREFAULTER.idle()  # no first chunk of an earlier test's segment reaches the fake
    yield install_fake_full_disk(monkeypatch)
    prefault.PREFAULTER.idle()  # no background call reaches the fake after the test


def covered(ranges: list[tuple[int, int]], stop: int) -> bool:
    """True when the union of `ranges` covers [0, stop)."""
    reach = 0
    for a, b in sorted(ranges):
        if a > reach:
            break
        reach = max(reach, b)
    return reach >= stop


def test_every_written_byte_and_index_entry_was_reserved_first(tmp_path, disk):
    chunk = 4 * mmap.PAGESIZE
    segment = LogSegment.create(tmp_path, 0, 64 * chunk, 4096, chunk)
    offset = 0
    while segment.can_hold(1100, 1):
        put(segment, offset, size=1000)
        offset += 1
        assert segment._region.reserved >= segment.size  # never a byte past the reservation
    assert prefault.PREFAULTER.idle()
    assert covered(disk.reserved(".log"), segment.size)
    assert covered(disk.reserved(".index"), segment.index.count * 8)
    assert covered(disk.reserved(".timeindex"), segment.index.count * 8)
    # The thread reserves in chunks; the writer, where it got ahead of the thread (which waits
    # for the GIL while this loop holds it), only the pages its batches reach: never per batch.
    assert len(disk.reserved(".log", on_caller=False)) <= 64
    assert len(disk.reserved(".log", on_caller=True)) <= segment.size // mmap.PAGESIZE + 1
    assert len([c for c in disk.calls if c[0].endswith(".index")]) == 2  # 1 page, then 2
    segment.close()


def test_a_full_filesystem_is_an_error_and_nothing_is_written(tmp_path, disk):
    chunk = 2 * mmap.PAGESIZE
    segment = LogSegment.create(tmp_path, 0, 64 * chunk, 4096, chunk)
    batch_bytes = len(put(segment, 0, size=500))
    disk.full = True
    offset = 1
    with pytest.raises(LogDirectoryFullError) as failed:
        for _ in range(100):  # the reserved chunk fills, then the next reservation fails
            put(segment, offset, size=500)
            offset += 1
    size, count = segment.size, segment.index.count
    assert segment.next_offset == offset and count == offset
    assert size <= segment._region.reserved < size + batch_bytes  # the batch did not fit
    assert str(tmp_path) in str(failed.value) and "bytes free" in str(failed.value)
    assert failed.value.directory == tmp_path and failed.value.free_bytes > 0
    with pytest.raises(LogDirectoryFullError):  # still full: still an error, still nothing
        put(segment, offset, size=500)
    assert (segment.size, segment.index.count, segment.next_offset) == (size, count, offset)
    with open(segment.path, "rb") as f:
        f.seek(size)
        assert f.read(chunk) == b"\0" * chunk
    disk.full = False  # space returns: the same append goes through
    put(segment, offset, size=500)
    assert [h.base_offset for _, h in scan_segment(segment)] == list(range(offset + 1))
    segment.close()


def test_a_full_index_file_is_an_error_before_the_batch_is_copied(tmp_path, disk):
    segment = LogSegment.create(tmp_path, 0, CAPACITY, 4096, 8192)
    disk.suffix = ".timeindex"  # the log file has room, the time index none
    disk.full = True
    with pytest.raises(LogDirectoryFullError, match="index entries"):
        put(segment, 0)
    assert (segment.size, segment.index.count, segment.next_offset) == (0, 0, 0)
    with open(segment.path, "rb") as f:
        assert f.read(4096) == b"\0" * 4096
    disk.full = False
    put(segment, 0)
    put(segment, 1)
    assert [h.base_offset for _, h in scan_segment(segment)] == [0, 1]
    assert segment.index.count == 2 and segment.index.reserved_entries >= 2
    segment.close()


@pytest.mark.skipif(not prefault.AVAILABLE, reason="no MADV_POPULATE_WRITE (Linux < 5.14)")
def test_the_prefault_thread_populates_only_what_it_reserved(tmp_path, disk, monkeypatch):
    populated = []
    real = prefault._madvise

    def recording(address, length, advice):
        populated.append((address, address + length))
        return real(address, length, advice)

    monkeypatch.setattr(prefault, "_madvise", recording)
    chunk = 4 * mmap.PAGESIZE
    segment = LogSegment.create(tmp_path, 0, 64 * chunk, 4096, chunk)
    put(segment, 0, size=1000)
    disk.full = True  # from here every reservation fails, the thread's included
    with pytest.raises(LogDirectoryFullError):
        for offset in range(1, 100):
            put(segment, offset, size=1000)
    assert prefault.PREFAULTER.idle()
    base = segment._region.address
    reserved = disk.reserved(".log")
    for start, stop in populated:
        assert covered(reserved, stop - base), (start - base, stop - base, reserved)
    segment.close()


def test_truncation_and_seal_lower_the_reservation(tmp_path, disk):
    segment = new_segment(tmp_path)
    for offset in range(10):
        put(segment, offset, size=300)
    assert prefault.PREFAULTER.idle()
    segment.truncate_to(5)
    assert segment._region.reserved == segment.size  # the cut freed what lay past it
    put(segment, 5, size=300)
    assert segment._region.reserved >= segment.size
    segment.seal()
    assert segment._region.reserved == segment.size and segment._region.limit == 0
    segment.make_appendable()
    assert segment._region.reserved == segment.size
    put(segment, 6, size=300)
    assert [h.base_offset for _, h in scan_segment(segment)] == list(range(7))


# -- prefault chunks ---------------------------------------------------------------------------


@pytest.fixture
def requests(monkeypatch):
    """The prefault thread's requests, recorded as (start, stop) and not carried out: the
    thread never gets ahead of the writer."""
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(prefault, "AVAILABLE", True)
    monkeypatch.setattr(prefault.PREFAULTER, "request",
                        lambda region, start, stop: asked.append((start, stop)))  # fmt: skip
    return asked


def test_a_new_segment_asks_the_prefault_thread_for_its_first_chunk(tmp_path, disk, requests,
                                                                    monkeypatch):  # fmt: skip
    def on_the_caller(*args):
        raise AssertionError("populated on the caller's thread")

    monkeypatch.setattr(LogSegment, "_prefault", on_the_caller)
    segment = LogSegment.create(tmp_path, 0, 4 << 20, 4096, 1 << 20)
    assert requests == [(0, FIRST_CHUNK_BYTES)]
    assert disk.reserved(".log") == []  # not even reserved by the caller: the thread does it
    rolled = LogSegment.create(tmp_path, 100, 4 << 20, 4096, 1 << 20)  # a roll creates one too
    assert requests == [(0, FIRST_CHUNK_BYTES)] * 2
    put(segment, 0)  # the first append asks for nothing more (the chunk is ahead of it)
    assert requests == [(0, FIRST_CHUNK_BYTES)] * 2
    segment.close()
    rolled.close()


def test_the_first_chunk_is_reserved_and_populated_by_the_thread(tmp_path, disk):
    segment = LogSegment.create(tmp_path, 0, 4 << 20, 4096, 1 << 20)
    assert prefault.PREFAULTER.idle()
    if prefault.AVAILABLE:
        assert disk.reserved(".log") == [(0, FIRST_CHUNK_BYTES)]
        assert disk.on_caller == [False]
        assert segment._region.reserved == FIRST_CHUNK_BYTES
        assert os.stat(segment.path).st_blocks * 512 >= FIRST_CHUNK_BYTES
    assert os.stat(segment.path).st_blocks * 512 < 1 << 20  # never a whole 1 MiB chunk
    segment.close()


def test_chunks_start_at_64_kib_and_double_up_to_prefault_bytes(tmp_path, disk, requests):
    segment = LogSegment.create(tmp_path, 0, 8 << 20, 1 << 16, 1 << 20)
    offset = 0
    while segment.size < 5 << 20:
        put(segment, offset, size=10_000)
        offset += 1
        # the next chunk is asked for once the writer is halfway into the last one
        last_start, last_stop = requests[-1]
        assert segment.size <= last_stop - (last_stop - last_start) // 2 or segment.size > 4 << 20
    sizes = [stop - start for start, stop in requests]
    kib = 1 << 10
    assert sizes[:6] == [64 * kib, 128 * kib, 256 * kib, 512 * kib, 1024 * kib, 1024 * kib]
    assert set(sizes[4:]) == {1 << 20}
    assert all(a[1] == b[0] for a, b in zip(requests, requests[1:], strict=False))  # contiguous
    segment.close()


def test_chunks_are_capped_by_a_small_prefault_bytes(tmp_path, requests):
    segment = LogSegment.create(tmp_path, 0, CAPACITY, 1024, 4096)
    for offset in range(10):
        put(segment, offset, size=1000)
    assert {stop - start for start, stop in requests} == {4096}
    segment.close()


def test_a_writer_ahead_of_the_thread_reserves_what_it_writes_itself(tmp_path, disk, requests):
    # The thread never runs here (requests are only recorded): every byte the writer stores it
    # reserved first, on its own thread, only the pages its batches reach (no chunk).
    segment = LogSegment.create(tmp_path, 0, 1 << 20, 4096, 1 << 20)
    offset = 0
    while segment.size < 3 * FIRST_CHUNK_BYTES:
        batch = len(put(segment, offset, size=1000))
        offset += 1
        assert segment._region.reserved >= segment.size
        assert segment._region.reserved - segment.size < mmap.PAGESIZE
        name, start, stop, ok = disk.calls[-1]
        assert ok and disk.on_caller[-1] and stop - start <= batch + mmap.PAGESIZE
    assert covered(disk.reserved(".log", on_caller=True), segment.size)
    assert [h.base_offset for _, h in scan_segment(segment)] == list(range(offset))
    # what the writer asked for ahead of itself is still the thread's to do
    assert requests[-1][1] > segment.size
    segment.close()


def test_without_the_thread_the_writer_reserves_and_populates_chunks(tmp_path, disk, monkeypatch):
    monkeypatch.setattr(prefault, "AVAILABLE", False)  # kernels before 5.14
    segment = LogSegment.create(tmp_path, 0, 1 << 20, 4096, 256 << 10)
    assert disk.reserved(".log") == []  # nothing until the first append
    offset = 0
    while segment.size < 512 << 10:
        put(segment, offset, size=10_000)
        offset += 1
        assert segment._region.reserved >= segment._prefaulted >= segment.size
    # the first append reserves its own pages, then the rest of the first chunk
    stops = [stop for _, stop in disk.reserved(".log")]
    assert stops[1:5] == [64 << 10, 192 << 10, 448 << 10, 704 << 10]
    assert all(disk.on_caller)
    segment.close()
