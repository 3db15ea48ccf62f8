"""One log segment: `<base_offset:020d>.log`, memory-mapped, plus its BatchIndex.

The active segment's file is preallocated (sparse) to its capacity and mapped whole; the pages
just ahead of the write position are prefaulted in chunks with MADV_POPULATE_WRITE, because an
append that takes one page fault per 4 KiB runs several times slower. Every chunk is reserved
and populated on the prefault thread (prefault.py), which releases the GIL, so the event loop
does not stop while pages are allocated: the first as the segment is created (a new log, a
roll), each next one once the writer is halfway into the last. A segment made appendable again
(a broker's start, a truncation) asks for its next chunk on its first append, so a restart
populates nothing for partitions that stay idle. The first chunk is small (`FIRST_CHUNK_BYTES`,
64 KiB) and each next one twice the last, up to `prefault_bytes` (1 MiB by default): a new
idle or small partition costs 64 KiB of pages, a busy one reaches full chunks after 1 MiB.
Before, the first append populated a whole 1 MiB chunk itself, on the event loop: with 600
partitions (RF 3, 3 brokers) py-spy put 40-47% of the brokers' time in those first appends to
about 1,800 fresh segments, and each broker held 600 MiB of tmpfs pages for partitions that
held a few KiB each; now 59-75 MiB, and those appends are gone from the loop's profile. The
price (bench/README.md, scaling): pages are now allocated while the data comes, and at 600
partitions the measured window did about a quarter fewer records/s on main with the rejoin
fix (its cause is open: see there). On roll and clean close the file is trimmed to its valid
bytes, so a closed segment's size is its data.

No page of the map is touched before its blocks are reserved (fallocate, reservation.py): a
store into an unbacked page of a full filesystem is SIGBUS, a reservation that finds no space
is ENOSPC, raised as `LogDirectoryFullError` before any byte of the batch is copied. Below
`_region.reserved` the file's blocks are allocated; the prefault thread reserves each chunk
before populating it. A writer that gets ahead of the thread (a burst, a long queue of new
segments) reserves what its batch needs itself, page-rounded, and the copy faults those pages
in; it never waits for the thread. Recovery reads only the file's data, never a hole (on tmpfs
even a read of a hole allocates a page).

Crash safety rests on two rules:
- a batch is written tail first and its first 12 bytes (baseOffset, batchLength) last: until
  those land, the preallocated zeros make the batch invalid, so recovery cuts it;
- truncation really removes bytes (the file is cut, then regrown as zeros), so a stale batch
  can never reappear behind a shorter new one.
Populating a page never changes what it holds (zeros, or our own data), so the prefault thread
cannot break either rule: it only allocates pages, below the segment's `limit`, under the lock
that a cut takes.

Nothing here reads past `size`: the file may be shorter than the mapping after a trim.
"""

from __future__ import annotations

import logging
import mmap
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localcluster.storage import file_map, prefault, reclaim, reservation
from localcluster.storage import record_batch as rb
from localcluster.storage.index import BatchIndex

log = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # Linux 5.14+; older kernels fall back to touching the pages
PAGE = mmap.PAGESIZE
FIRST_CHUNK_BYTES = 64 << 10  # a segment's first prefault chunk; each next one doubles
SUFFIX = ".log"
_warned_unreservable: set[int] = set()  # st_dev of filesystems already reported


def _page_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SUFFIX}"


@dataclass(frozen=True, slots=True)
class FileSlice:
    """Bytes of one segment ready to send: `os.sendfile(sock, slice.fd, position, length)`."""

    segment: LogSegment
    position: int
    length: int

    @property
    def fd(self) -> int:
        return self.segment.fileno()

    def view(self) -> memoryview:
        return self.segment.view(self.position, self.length)

    def tobytes(self) -> bytes:
        with self.view() as v:
            return bytes(v)


@dataclass(frozen=True, slots=True)
class CutReport:
    """What recovery removed from a segment and why."""

    segment: str
    position: int
    bytes_cut: int
    reason: str


class LogSegment:
    """Batches from `base_offset` on. `size` valid bytes; `next_offset` follows the last batch."""

    def __init__(self, directory: Path, base_offset: int, capacity: int, max_index_entries: int,
                 prefault_bytes: int):  # fmt: skip
        self.base_offset = base_offset
        self.path = directory / segment_file_name(base_offset)
        self.capacity = capacity
        self.prefault_bytes = prefault_bytes
        self.index = BatchIndex(self.path, base_offset, max_index_entries)
        self.size = 0
        self.next_offset = base_offset
        self.appendable = False
        self._file = None
        self._mm: mmap.mmap | None = None
        self._mapped = 0
        self._prefaulted = 0  # populated, or requested from the prefault thread, up to here
        self._chunk = 0  # the last prefault chunk's size (0: none yet); the next one doubles it
        self._region: prefault.MappedRegion | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, capacity: int, max_index_entries: int,
               prefault_bytes: int) -> LogSegment:  # fmt: skip
        segment = cls(directory, base_offset, capacity, max_index_entries, prefault_bytes)
        segment._file = open(segment.path, "w+b", buffering=0)
        try:
            segment.index.reset()
            segment.make_appendable()
            if prefault.AVAILABLE:  # the first chunk, on the thread (else the first append's)
                segment._prefault_ahead(0)
        except BaseException:
            segment._release_map()
            segment._file.close()
            raise
        return segment

    @classmethod
    def open_existing(cls, directory: Path, base_offset: int, capacity: int,
                      max_index_entries: int, prefault_bytes: int) -> LogSegment:  # fmt: skip
        segment = cls(directory, base_offset, capacity, max_index_entries, prefault_bytes)
        segment._file = open(segment.path, "r+b", buffering=0)
        file_size = os.fstat(segment._file.fileno()).st_size
        segment.size = file_size
        segment._map(file_size)
        return segment

    def load_trusted(self) -> bool:
        """Use the trimmed indexes as they are; False when they look wrong (then recover)."""
        if not self.index.open_trimmed():
            return False
        why = self.index.is_sane(self.size)
        if why is None and self.index.count:
            rel, pos = self.index.entry(self.index.count - 1)
            try:
                last = rb.validate_batch(self._mm, pos, check_crc=False)
            except rb.CorruptRecordError as e:
                why = f"last indexed batch at {pos}: {e}"
            else:
                if last.base_offset != self.base_offset + rel or pos + last.size != self.size:
                    why = "last index entry does not match the last batch"
                elif int(self.index.max_timestamps[-1]) != last.max_timestamp:
                    why = "last time index entry does not match the last batch"
                self.next_offset = last.next_offset
        if why is not None:
            log.warning(
                "index of %s is not usable (%s); rebuilding it from the log", self.path, why
            )
            return False
        return True

    def recover(self) -> CutReport | None:
        """Scan every batch, rebuild the indexes, cut an invalid tail. Returns what was cut."""
        self.index.reset()
        self.index.make_appendable()
        configured_entries = self.index.max_entries
        try:
            position, expected_offset, reason = self._scan(self._data_end())
        except OSError as e:  # no room to rebuild the indexes
            error = reservation.full_error(e, self.path.parent, 2 * PAGE,
                                           f"rebuilding the indexes of {self.path.name}")  # fmt: skip
            if error is None:
                raise
            raise error from None
        self.next_offset = expected_offset
        self.index.max_entries = max(configured_entries, self.index.count)
        cut = None
        if position < self.size:
            tail = self.size - position
            if self._is_zero(position, self.size):
                reason = None  # only preallocated zeros: nothing was lost
            else:
                cut = CutReport(self.path.name, position, tail, reason or "unknown")
            self.truncate_to_position(position)
        self.index.trim()
        return cut

    def _scan(self, data_end: int) -> tuple[int, int, str | None]:
        """Validate and index batches from the start; (stop position, next offset, why it
        stopped or None). Only [0, data_end) is read: a batch running into a hole is cut."""
        stop = 0  # the end of the last good batch
        expected_offset = self.base_offset
        reason = None
        # A walk that ends at data_end short of self.size leaves a hole: zeros, no reason needed.
        with memoryview(self._mm)[:data_end] if self._mm is not None else memoryview(b"") as mm:
            try:
                for position, header in rb.iter_batches(mm):
                    if header.base_offset < expected_offset:
                        reason = (f"batch base offset {header.base_offset} is below the expected "
                                  f"{expected_offset}")  # fmt: skip
                        break
                    if self.index.is_full:
                        # Written under a larger log.index.size.max.bytes: grow the index rather
                        # than cut valid batches (the segment then holds no more and rolls).
                        self.index.max_entries *= 2
                        self.index.make_appendable()
                    self.index.append(header.base_offset - self.base_offset, position,
                                      header.max_timestamp)  # fmt: skip
                    expected_offset = header.next_offset
                    stop = position + header.size
            except rb.CorruptRecordError as e:
                reason = str(e)
        return stop, expected_offset, reason

    def _data_end(self) -> int:
        """Where the file's first hole starts (its size when it has none)."""
        if not self.size:
            return 0
        try:
            return min(os.lseek(self._file.fileno(), 0, os.SEEK_HOLE), self.size)
        except OSError:  # no SEEK_HOLE here: every byte is data
            return self.size

    def make_appendable(self) -> None:
        """Regrow the file and indexes to full size so batches can be appended."""
        if self.appendable:
            return
        # A segment written under a larger log.segment.bytes keeps its data: never cut below it
        # (it simply holds no more and rolls on the next append).
        self.capacity = max(self.capacity, self.size)
        os.ftruncate(self._file.fileno(), self.capacity)
        if self._mapped < self.capacity:
            self._map(self.capacity)
        region = self._region
        with region.lock:
            # Not appendable means the file ended at `size` (sealed, recovered, or new): the
            # data is allocated, nothing beyond it is.
            region.limit = self.capacity
            region.reserved = self.size
        self._prefaulted = self.size
        self.index.make_appendable()
        self.appendable = True

    def seal(self) -> None:
        """Trim the file and indexes to their data: on roll and on clean close."""
        if self.appendable:
            region = self._region
            with region.lock:  # the thread reserves nothing more, and nothing past the cut
                region.limit = 0
                os.ftruncate(self._file.fileno(), self.size)
                region.cut_reserved(self.size)
            self.index.trim()
            self.appendable = False

    def flush(self) -> None:
        if self._mm is not None and self.size:
            self._mm.flush(0, min(self._mapped, -(-self.size // PAGE) * PAGE))
        self.index.flush()

    def close(self) -> None:
        self.flush()
        self.seal()
        self.index.close()
        self._release_map()
        if self._file is not None:
            self._file.close()

    def delete(self) -> None:
        """Unlink the files. Open slices keep the data readable until they are dropped."""
        self.appendable = False
        if self._region is not None:
            self._region.close()  # nothing more is reserved or populated in a deleted file
        self.index.close()
        for path in (self.path, self.index.offset_path, self.index.time_path):
            path.unlink(missing_ok=True)
        # The map and the file object stay referenced by any FileSlice still in flight (for
        # view() as for sendfile); both go when the last reference to this segment does, and
        # then on the reclaim thread: unmapping and closing free the file's pages, which took
        # the event loop 0.4+ ms per MiB (reclaim.py).
        if self._mm is not None or self._file is not None:
            finalizer = weakref.finalize(self, reclaim.RECLAIMER.release, self._mm, self._file)
            finalizer.atexit = False  # at exit the process's pages go with it

    def _map(self, length: int) -> None:
        self._release_map()
        if length:
            self._mm = file_map.map_file(self._file.fileno(), length)  # no fd of its own
            self._region = prefault.MappedRegion(self._mm, self._file.fileno())
        self._mapped = length

    def _release_map(self) -> None:
        if self._region is not None:
            self._region.close()  # no background populate of this map from here on
            self._region = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a reader still holds a view: the map goes when the view does
            self._mm = None
        self._mapped = 0

    # -- appending ----------------------------------------------------------------------------

    def can_hold(self, nbytes: int, nbatches: int) -> bool:
        return self.size + nbytes <= self.capacity and self.index.room() >= nbatches

    def append_batch(self, data, start: int, header: rb.BatchHeader, base_offset: int,
                     leader_epoch: int) -> None:  # fmt: skip
        """Write the batch at data[start:start+size] with the given base offset and epoch."""
        assert self.appendable and self._mm is not None
        size = header.size
        position = self.size
        end = position + size
        assert end <= self.capacity
        # Reserve first (these raise LogDirectoryFullError, with nothing written).
        if end > self._region.reserved:
            self._reserve(end)
        if self.index.count >= self.index.reserved_entries:
            self._reserve_index()
        if end + (self._chunk >> 1) > self._prefaulted:
            self._prefault_ahead(end)
        mm = self._mm
        mm[position + rb.LOG_OVERHEAD : end] = data[start + rb.LOG_OVERHEAD : start + size]
        rb.set_partition_leader_epoch(mm, position, leader_epoch)
        rb._OFFSET_AND_LENGTH.pack_into(mm, position, base_offset, header.batch_length)
        self.index.append(base_offset - self.base_offset, position, header.max_timestamp)
        self.size = end
        self.next_offset = base_offset + header.last_offset_delta + 1

    def _next_chunk(self) -> int:
        """The next prefault chunk's size: FIRST_CHUNK_BYTES, then twice the last one, up to
        `prefault_bytes`."""
        self._chunk = min(self.prefault_bytes, 2 * self._chunk or FIRST_CHUNK_BYTES)
        return self._chunk

    def _prefault_ahead(self, end: int) -> None:
        """New, or past half of the last chunk: have the prefault thread reserve and populate
        the next chunk, from the last page asked for or, when the writer got ahead of it, from
        the writer's own page (the copy faults in what lies below)."""
        if not self.prefault_bytes:
            return  # nothing prefaulted: every page is faulted in by the copy
        if not prefault.AVAILABLE:
            self._prefault(end)
            return
        start = max(self._prefaulted, end)
        stop = min(self._mapped, _page_up(start + self._next_chunk()))
        start &= ~(PAGE - 1)
        if stop > start:
            prefault.PREFAULTER.request(self._region, start, stop)
            self._prefaulted = stop

    def _reserve(self, needed: int, wanted: int = 0) -> None:
        """Reserve from the watermark up to `needed` at least (page-rounded): up to `wanted`
        when that fits, else only what `needed` takes. The writer passes no `wanted`: a chunk
        reserved on the event loop is the cost the prefault thread is there to take."""
        region = self._region
        start = region.reserved
        minimum = min(self.capacity, _page_up(needed))
        for stop in dict.fromkeys((min(self.capacity, _page_up(max(needed, wanted))), minimum)):
            try:
                reserved = reservation.reserve(self._file.fileno(), start, stop)
            except OSError as e:
                if stop > minimum and e.errno in reservation.FULL_ERRNOS:
                    continue  # maybe the batch alone still fits
                error = reservation.full_error(e, self.path.parent, minimum - start,
                                               f"reserving space in {self.path.name}")  # fmt: skip
                if error is None:
                    raise
                raise error from None
            if not reserved:
                self._write_unreserved()
                return
            region.note_reserved(start, stop)
            return

    def _write_unreserved(self) -> None:
        """The filesystem cannot reserve (no fallocate): write as before, unprotected."""
        device = os.fstat(self._file.fileno()).st_dev
        if device not in _warned_unreservable:
            _warned_unreservable.add(device)
            log.warning("the filesystem of %s cannot reserve space (no fallocate): a full "
                        "filesystem there kills the broker with SIGBUS", self.path.parent)  # fmt: skip
        self._region.note_reserved(self._region.reserved, self.capacity)

    def _reserve_index(self) -> None:
        try:
            self.index.reserve(1)
        except OSError as e:
            error = reservation.full_error(e, self.path.parent, 2 * PAGE,
                                           f"reserving index entries of {self.path.name}")  # fmt: skip
            if error is None:
                raise
            raise error from None

    def _prefault(self, needed: int) -> None:
        """Kernels before 5.14 (no MADV_POPULATE_WRITE for the thread): reserve and populate
        the next chunk on the caller's thread, by touching its pages (only what is reserved)."""
        start = self._prefaulted & ~(PAGE - 1)
        stop = min(self._mapped, _page_up(max(needed, start + self._next_chunk())))
        if stop > self._region.reserved:
            self._reserve(needed, stop)
        stop = min(stop, self._region.reserved)
        if stop <= start:
            return
        try:
            self._mm.madvise(MADV_POPULATE_WRITE, start, stop - start)
        except OSError:
            # Fault the pages in by writing to each one (it holds zeros or the tail of our own
            # data, so rewrite what is there).
            for page in range(start, stop, PAGE):
                self._mm[page] = self._mm[page]
        self._prefaulted = max(self._prefaulted, stop)

    # -- reading ------------------------------------------------------------------------------

    def fileno(self) -> int:
        return self._file.fileno()

    def view(self, position: int, length: int) -> memoryview:
        assert 0 <= position and position + length <= self.size
        if self._mm is None:  # an empty file is never mapped (a log's first segment, cleaned)
            return memoryview(b"")
        return memoryview(self._mm)[position : position + length]

    def batch_header(self, i: int) -> rb.BatchHeader:
        _, position = self.index.entry(i)
        return rb.read_header(self._mm, position)

    def truncate_to_position(self, position: int) -> None:
        """Drop the bytes from `position` on (the file is cut, then regrown as zeros)."""
        assert 0 <= position <= self.size
        fd = self._file.fileno()
        region = self._region
        if region is None:  # an empty file, never mapped (so never appendable)
            os.ftruncate(fd, position)
        else:
            with region.lock:  # no reservation in flight may count the blocks freed here
                os.ftruncate(fd, position)
                if self.appendable:
                    os.ftruncate(fd, self.capacity)
                region.cut_reserved(position)
        self.size = position
        self._prefaulted = min(self._prefaulted, position)

    def _first_batch_cut_at(self, offset: int) -> int:
        """The index of the first batch a cut at `offset` removes."""
        i = self.index.first_batch_at_or_after(offset)
        # A batch containing `offset` (base < offset <= last) goes too: Kafka cuts at batches.
        if i > 0 and self.batch_header(i - 1).last_offset >= offset:
            i -= 1
        return i

    def truncation_offset(self, offset: int) -> int:
        """Where `truncate_to(offset)` leaves this segment's end."""
        i = self._first_batch_cut_at(offset)
        if i >= self.index.count:
            return self.next_offset
        return self.batch_header(i - 1).next_offset if i else self.base_offset

    def truncate_to(self, offset: int) -> int:
        """Remove every batch that ends at or after `offset`... i.e. keep batches below it."""
        i = self._first_batch_cut_at(offset)
        if i >= self.index.count:
            return 0
        _, position = self.index.entry(i)
        removed = self.size - position
        self.make_appendable()
        self.index.truncate_entries(i)
        self.truncate_to_position(position)
        self.next_offset = self.batch_header(i - 1).next_offset if i else self.base_offset
        return removed

    def _is_zero(self, start: int, stop: int) -> bool:
        return zeros_only(self._file.fileno(), self._mm, start, stop)

    def largest_timestamp(self) -> int | None:
        return self.index.largest_timestamp()

    def __repr__(self) -> str:
        return (f"LogSegment({self.path.name}, size={self.size}, "
                f"offsets=[{self.base_offset}, {self.next_offset}))")  # fmt: skip


def zeros_only(fd: int, mapping, start: int, stop: int) -> bool:
    """True when bytes [start, stop) of the file `fd` (mapped whole as `mapping`) are all
    zero. Holes of the sparse file are skipped, not read: a fresh segment is mostly hole."""
    position = start
    while position < stop:
        try:
            data = os.lseek(fd, position, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole remains
            return True
        if data >= stop:
            return True
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), stop)
        view = np.frombuffer(mapping, dtype=np.uint8, count=hole - data, offset=data)
        nonzero = view.any()
        del view
        if nonzero:
            return False
        position = hole
    return True
