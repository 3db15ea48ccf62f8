"""One log segment: `<base_offset:020d>.log`, written with pwrite(2), read through a map, plus
its BatchIndex.

The active segment's file is grown (sparse) to its capacity and mapped whole for reading;
batches are written into it with pwrite(2), not stored through the map. On tmpfs a store into
a fresh page of a shared mapping first has the kernel zero the whole page (shmem_fault), then
the copy overwrites it; a write(2) that fills the page skips the zeroing (shmem_write_begin
allocates the page unzeroed and shmem_write_end zeroes only what the write left out). On this
VM a 1 MiB append cost 0.64 ms of CPU per MiB through a map, populated ahead or not, and
0.35 ms with pwrite; and under acks=all at 1 MB batches the prefault thread that populated
the map ahead of the writer (the old design: storage/prefault.py, removed in Dec 2026) used
more CPU than each follower's event loop, 1.45 ms per MiB, because fallocate and populate
cleared every page first. docs/storage.md has the figures before and after.

A full filesystem is an error the writer gets back from pwrite (ENOSPC), raised as
`LogDirectoryFullError`; what a failed append wrote past `size` is cut again, so nothing of it
stays. Stores through a map could not fail cleanly (an unbacked page is SIGBUS), which is why
the index files, still written through their maps, are reserved first (reservation.py).
Recovery reads only the file's data, never a hole (on tmpfs a read of a hole through a map
allocates a page).

Crash safety rests on two rules:
- a batch is written tail first (from byte 16 on) and its first 16 bytes (baseOffset,
  batchLength, partitionLeaderEpoch) last, in one write: until those land, the hole's zeros
  make the batch invalid, so recovery cuts it;
- truncation really removes bytes (the file is cut, then regrown as a hole), so a stale batch
  can never reappear behind a shorter new one.

Reused files. A segment that retention (or a moved log start) deletes can give its data file
to its log's next segment (`retire`, `SpareFile`): writing into pages the file already holds
cost 0.19 ms per MiB here against 0.35 ms into fresh ones, and its pages are neither freed
nor allocated again (bench/README.md, "Segment files reused under retention"). Such a file
holds the old segment's bytes past `size`, so the rules get two more:
- its old batches all lie below the new segment's base offset (a log reuses only its own
  files, taken only for a segment starting at or after their end), so recovery, which stops
  at a batch below the offset it expects, never takes one for a new batch;
- the 16 bytes after the last batch are always zeros: the first 16 bytes are cleared before
  the file is reused, and every append writes 16 zeros after its batch in the same write as
  the batch's tail. So a clean end, and a batch cut before its head was written, both show a
  zero head; recovery of a reused file (marked by the `user.localcluster.reused` attribute
  until sealed) ends the log there, and reports a cut only for bytes that are neither.
A file whose filesystem takes no such attribute is never reused.

Nothing here reads past `size`: the file may be shorter than the mapping after a trim.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localcluster.storage import file_map, reclaim, reservation
from localcluster.storage import record_batch as rb
from localcluster.storage.index import BatchIndex

log = logging.getLogger(__name__)

PAGE = mmap.PAGESIZE
SUFFIX = ".log"
SPARE_SUFFIX = ".spare"  # a retired segment's data file kept for reuse: `<base>.log.spare`
REUSED_ATTRIBUTE = "user.localcluster.reused"  # on a reused file until it is sealed
HEAD_BYTES = 16  # baseOffset, batchLength, partitionLeaderEpoch: what an append writes last
_HEAD = struct.Struct(">qii")
_END_MARK = bytes(HEAD_BYTES)  # what follows the last batch of a reused file


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

    def __init__(self, directory: Path, base_offset: int, capacity: int, max_index_entries: int):
        self.base_offset = base_offset
        self.path = directory / segment_file_name(base_offset)
        self.capacity = capacity
        self.index = BatchIndex(self.path, base_offset, max_index_entries)
        self.size = 0
        self.next_offset = base_offset
        self.appendable = False
        self.reused = False  # the file held another segment: old bytes lie past `size`
        self._file = None
        self._mm: mmap.mmap | None = None
        self._mapped = 0

    # -- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, capacity: int, max_index_entries: int,
               spare: SpareFile | None = None) -> LogSegment:  # fmt: skip
        """A new empty segment; in `spare`'s file when given (which it then owns)."""
        segment = cls(directory, base_offset, capacity, max_index_entries)
        if spare is not None:
            try:
                segment._file = spare.reuse_as(segment.path)
                segment.reused = True
            except OSError as e:
                log.info("%s: a new file instead of a retired segment's (%s)", segment.path, e)
        if segment._file is None:
            segment._file = open(segment.path, "w+b", buffering=0)
        try:
            segment.index.reset()
            segment.make_appendable()
        except BaseException:
            segment._release_map()
            segment._file.close()
            raise
        return segment

    @classmethod
    def open_existing(cls, directory: Path, base_offset: int, capacity: int,
                      max_index_entries: int) -> LogSegment:  # fmt: skip
        segment = cls(directory, base_offset, capacity, max_index_entries)
        segment._file = open(segment.path, "r+b", buffering=0)
        segment.reused = has_reused_mark(segment._file.fileno())
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
            elif self.reused and self._is_zero(position, min(position + HEAD_BYTES, self.size)):
                # A reused file's end: its old bytes, or a batch cut before its head was
                # written (never acknowledged), follow the zero head (the rules above).
                log.info("%s: recovery ends the log at position %d; the %d bytes past it are "
                         "the reused file's old bytes or a batch cut before its head was "
                         "written", self.path, position, tail)  # fmt: skip
            else:
                cut = CutReport(self.path.name, position, tail, reason or "unknown")
            self.truncate_to_position(position)
        if self.reused:
            self._clear_reused_mark()  # nothing old is left past `size`
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
        self.index.make_appendable()
        self.appendable = True

    def seal(self) -> None:
        """Trim the file and indexes to their data: on roll and on clean close."""
        if self.appendable:
            os.ftruncate(self._file.fileno(), self.size)
            if self.reused:
                self._clear_reused_mark()
            self.index.trim()
            self.appendable = False

    def flush(self) -> None:
        if self._file is not None and self.size:
            os.fdatasync(self._file.fileno())
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
        self._unlink_files(self.path)
        # The map and the file object stay referenced by any FileSlice still in flight (for
        # view() as for sendfile); both go when the last reference to this segment does, and
        # then on the reclaim thread: unmapping and closing free the file's pages, which took
        # the event loop 0.4+ ms per MiB (reclaim.py).
        if self._mm is not None or self._file is not None:
            self._when_unreferenced(reclaim.RECLAIMER.release, self._mm, self._file)

    def retire(self, spares: SpareFiles) -> None:
        """Delete the segment as `delete` does, but hand its data file to `spares` for the log's
        next segment, once nothing reads it any more (the finalizer: every FileSlice in flight
        holds its segment). The file is renamed to `<base>.log.spare` at once."""
        if self._file is None or not spares.reusable:
            self.delete()
            return
        spare_path = self.path.with_name(self.path.name + SPARE_SUFFIX)
        try:
            os.rename(self.path, spare_path)
        except OSError as e:
            log.info("%s: not kept for reuse (%s)", self.path, e)
            self.delete()
            return
        self._unlink_files()
        # The new segment maps the file afresh: this map goes to the reclaim thread with the
        # last reader, as on delete.
        spare = SpareFile(spare_path, self._file, self.next_offset)
        self._when_unreferenced(_hand_over, spares, spare, self._mm)

    def _unlink_files(self, *also: Path) -> None:
        """No more appends; the index files, and `also`, unlinked."""
        self.appendable = False
        self.index.discard()
        for path in (*also, self.index.offset_path, self.index.time_path):
            path.unlink(missing_ok=True)

    def _when_unreferenced(self, callback, *args) -> None:
        finalizer = weakref.finalize(self, callback, *args)
        finalizer.atexit = False  # at exit the process's pages go with it

    def _clear_reused_mark(self) -> None:
        self.reused = False
        try:
            os.removexattr(self._file.fileno(), REUSED_ATTRIBUTE)
        except OSError:
            pass  # already gone

    def _map(self, length: int) -> None:
        self._release_map()
        if length:
            self._mm = file_map.map_file(self._file.fileno(), length)  # no fd of its own
        self._mapped = length

    def _release_map(self) -> None:
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
        """Write the batch at data[start:start+size] with the given base offset and epoch.

        Raises LogDirectoryFullError, with nothing of the batch left in the file, when its
        filesystem has no room."""
        assert self.appendable
        size = header.size
        position = self.size
        end = position + size
        assert end <= self.capacity
        if self.index.count >= self.index.reserved_entries:
            self._reserve_index()  # raises LogDirectoryFullError, with nothing written
        fd = self._file.fileno()
        try:
            with memoryview(data) as view:  # a slice of the view: no copy of the bytes
                tail = view[start + HEAD_BYTES : start + size]
                if self.reused:  # the zero head after the batch, in the same write
                    mark = _END_MARK[: min(HEAD_BYTES, self.capacity - end)]
                    _write_vector(fd, tail, mark, position + HEAD_BYTES)
                else:
                    _write_fully(fd, tail, position + HEAD_BYTES)
            _write_fully(fd, _HEAD.pack(base_offset, header.batch_length, leader_epoch),
                         position)  # fmt: skip
        except OSError as e:
            self.truncate_to_position(position)  # a torn tail past `size` must read as zeros
            error = reservation.full_error(e, self.path.parent, size,
                                           f"writing a batch to {self.path.name}")  # fmt: skip
            if error is None:
                raise
            raise error from None
        self.index.append(base_offset - self.base_offset, position, header.max_timestamp)
        self.size = end
        self.next_offset = base_offset + header.last_offset_delta + 1

    def _reserve_index(self) -> None:
        try:
            self.index.reserve(1)
        except OSError as e:
            error = reservation.full_error(e, self.path.parent, 2 * PAGE,
                                           f"reserving index entries of {self.path.name}")  # fmt: skip
            if error is None:
                raise
            raise error from None

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
        os.ftruncate(fd, position)
        if self.appendable:
            os.ftruncate(fd, self.capacity)
        self.size = position

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


def _write_vector(fd: int, data, after: bytes, position: int) -> None:
    """pwrite `data` then `after` at `position` in one call (pwritev); the rest, if it writes
    short, as `_write_fully` does."""
    written = os.pwritev(fd, (data, after), position)
    if written < len(data) + len(after):
        joined = bytes(data) + after
        _write_fully(fd, memoryview(joined)[written:], position + written)


def has_reused_mark(fd: int) -> bool:
    """The file was another segment's: its old bytes may follow the last batch."""
    try:
        os.getxattr(fd, REUSED_ATTRIBUTE)
    except OSError:  # ENODATA, or a filesystem without attributes
        return False
    return True


class SpareFile:
    """A retired segment's data file, renamed `<base>.log.spare`: its old bytes all lie below
    `stale_end` (the old segment's next offset)."""

    def __init__(self, path: Path, file, stale_end: int):
        self.path = path
        self.file = file
        self.stale_end = stale_end

    def reuse_as(self, path: Path):
        """Clear the first 16 bytes, mark the file reused, give it `path`; the file object
        (its owner is now the new segment). Raises OSError with the file released."""
        try:
            fd = self.file.fileno()
            if os.fstat(fd).st_size:
                _write_fully(fd, _END_MARK, 0)
            os.setxattr(fd, REUSED_ATTRIBUTE, b"1")
            os.rename(self.path, path)
        except OSError:
            self.release()
            raise
        return self.file

    def release(self) -> None:
        """Unlink and free it (on the reclaim thread)."""
        self.path.unlink(missing_ok=True)
        reclaim.RECLAIMER.release(None, self.file)


class SpareFiles:
    """The data file one log keeps for its next segment: at most one (the newest offered is
    dropped while one is kept), taken only by a segment starting at or after its old bytes'
    end. Offered from a finalizer, on whichever thread drops a retired segment's last
    reference, hence the lock. `reusable` is False where the log's filesystem keeps no
    extended attributes (the reused mark): retired segments are then deleted as before."""

    def __init__(self, directory: Path):
        self._lock = threading.Lock()
        self._spare: SpareFile | None = None
        self._closed = False
        self.reusable = _takes_attributes(directory)

    def offer(self, spare: SpareFile) -> None:
        with self._lock:
            keep = not self._closed and self._spare is None
            if keep:
                self._spare = spare
        if not keep:
            spare.release()

    def take(self, base_offset: int) -> SpareFile | None:
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare.stale_end > base_offset:
            spare.release()  # its old batches could pass for new ones: never reused
            return None
        return spare

    def discard(self, closing: bool = False) -> None:
        """Free the kept file; when `closing`, free every later offer at once too."""
        with self._lock:
            spare, self._spare = self._spare, None
            self._closed = self._closed or closing
        if spare is not None:
            spare.release()


def _hand_over(spares: SpareFiles, spare: SpareFile, old_map) -> None:
    if old_map is not None:
        reclaim.RECLAIMER.release(old_map, None)
    spares.offer(spare)


def _takes_attributes(directory: Path) -> bool:
    try:
        os.setxattr(directory, REUSED_ATTRIBUTE, b"1")
        os.removexattr(directory, REUSED_ATTRIBUTE)
    except OSError:
        return False
    return True


def _write_fully(fd: int, data, position: int) -> None:
    """pwrite all of `data` at `position` (a regular file writes short only when it runs out
    of space; the next call then says why)."""
    written = os.pwrite(fd, data, position)
    if written < len(data):
        with memoryview(data) as view:
            while written < len(view):
                written += os.pwrite(fd, view[written:], position + written)
