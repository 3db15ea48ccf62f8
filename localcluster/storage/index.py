"""A segment's two indexes, one entry per batch, as numpy arrays over shared maps that hold no
open file (file_map.py).

`.index` holds (relative offset int32, position int32) per batch; `.timeindex` holds the batch's
max timestamp (int64). Both files are preallocated (sparse) to `max_entries` while their segment
is active and trimmed to the live entries on roll and clean close, so a trimmed file's size tells
its entry count. After an unclean shutdown the active segment's indexes are rebuilt from the log
by recovery, never trusted. Lookups are `np.searchsorted` on the relative-offset column; keys
are passed as int32 so numpy never widens (copies) the whole column.

The preallocated files are sparse: an entry is stored into a page of a memmap, which on a full
filesystem is SIGBUS, so entries are reserved (fallocate, reservation.py) in chunks before they
are written; `append` reserves itself when it must, and raises OSError (ENOSPC) with nothing
written. Below `reserved_entries` both files are allocated. The first chunk is one page (512
entries) and each next one twice the last, up to `RESERVE_ENTRIES` (8192, 64 KiB per file):
with 64 KiB on a segment's first append, a broker with 600 replicas that hold a few batches
each had 75 MiB of tmpfs pages in index files; now 4.7 MiB, and a busy segment is back at
64 KiB per call after 8,000 batches.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from localcluster.storage import file_map, reservation

ENTRY_BYTES = 8  # both files: 2 x int32, or 1 x int64
INT32_MAX = 2**31 - 1
PAGE_BYTES = mmap.PAGESIZE
RESERVE_ENTRIES = 8192  # at most 64 KiB of each file per fallocate: one call per 8192 batches
FIRST_RESERVE_ENTRIES = PAGE_BYTES // ENTRY_BYTES  # the first chunk: one page of each file


class IndexFullError(Exception):
    """No room for another entry: the segment must roll."""


def _map(path: Path, dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The file as an array over a shared map that holds no descriptor (file_map.py): an
    index costs its broker no open file. The map goes when the last array over it does."""
    if shape[0] == 0:
        return np.zeros(shape, dtype=dtype)
    fd = os.open(path, os.O_RDWR)
    try:
        mapping = file_map.map_file(fd, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    finally:
        os.close(fd)
    return np.ndarray(shape, dtype=dtype, buffer=mapping)


class BatchIndex:
    """Offset and time index of one segment; `count` entries are live."""

    def __init__(self, log_path: Path, base_offset: int, max_entries: int):
        assert max_entries > 0
        self.base_offset = base_offset
        self.max_entries = max_entries
        self.offset_path = log_path.with_suffix(".index")
        self.time_path = log_path.with_suffix(".timeindex")
        self.count = 0
        self._offsets = np.zeros((0, 2), dtype=np.int32)
        self._times = np.zeros((0,), dtype=np.int64)
        self._capacity = 0
        self.reserved_entries = 0  # both files are allocated for this many entries
        self._chunk_entries = 0  # the last reserved chunk (0: none yet); the next one doubles it

    # -- opening ------------------------------------------------------------------------------

    def open_trimmed(self) -> bool:
        """Load trimmed index files; False when missing or their sizes disagree (rebuild)."""
        try:
            offset_bytes = self.offset_path.stat().st_size
            time_bytes = self.time_path.stat().st_size
        except FileNotFoundError:
            return False
        if offset_bytes % ENTRY_BYTES or offset_bytes != time_bytes:
            return False
        count = offset_bytes // ENTRY_BYTES
        if count > self.max_entries:
            return False
        self._remap(count)
        self.count = count
        self.reserved_entries = count  # written entries are allocated
        return True

    def reset(self) -> None:
        """Empty files, ready to be filled (rebuild or a new segment)."""
        for path in (self.offset_path, self.time_path):
            with open(path, "wb"):
                pass
        self._remap(0)
        self.count = 0
        self.reserved_entries = 0

    def make_appendable(self) -> None:
        """Grow both files (sparse) to `max_entries` so entries can be appended."""
        if self._capacity < self.max_entries:
            for path in (self.offset_path, self.time_path):
                os.truncate(path, self.max_entries * ENTRY_BYTES)
            self._remap(self.max_entries)

    def _remap(self, capacity: int) -> None:
        # No msync first: what the old map wrote is in the file's pages, which the new map and
        # the log's next flush (an fdatasync of the file, off the event loop) see. At a roll on
        # a disk, the msync here blocked the broker's event loop up to 0.7 s.
        self._offsets = _map(self.offset_path, np.int32, (capacity, 2))
        self._times = _map(self.time_path, np.int64, (capacity,))
        self._capacity = capacity

    # -- writing ------------------------------------------------------------------------------

    @property
    def is_full(self) -> bool:
        return self.count >= self.max_entries

    def room(self) -> int:
        return self.max_entries - self.count

    def reserve(self, entries: int) -> None:
        """Reserve room for `entries` more entries in both files (a chunk at a time).

        Raises OSError (ENOSPC when the filesystem is full); nothing is reserved then. Room
        past the mapped capacity is not reserved: `append` raises IndexFullError there.
        """
        needed = min(self.count + entries, self._capacity)
        if needed <= self.reserved_entries:
            return
        step = min(RESERVE_ENTRIES, 2 * self._chunk_entries or FIRST_RESERVE_ENTRIES)
        chunk = min(self._capacity, max(needed, self.reserved_entries + step))
        try:
            self._reserve_to(chunk)
        except OSError as e:
            if chunk == needed or e.errno not in reservation.FULL_ERRNOS:
                raise
            # Space is short: only the page the next entries need (it is allocated whole).
            page_entries = PAGE_BYTES // ENTRY_BYTES
            self._reserve_to(min(self._capacity, -(-needed // page_entries) * page_entries))
            return
        self._chunk_entries = step

    def _reserve_to(self, stop: int) -> None:
        """Both files or neither: when the time index gets no space, the offset index gives
        back what it just got (past the reserved entries nothing is stored)."""
        start_byte, stop_byte = self.reserved_entries * ENTRY_BYTES, stop * ENTRY_BYTES
        offsets = os.open(self.offset_path, os.O_RDWR)
        try:
            # False: the filesystem cannot reserve; entries are written unprotected.
            reservation.reserve(offsets, start_byte, stop_byte)
            times = os.open(self.time_path, os.O_RDWR)
            try:
                reservation.reserve(times, start_byte, stop_byte)
            except OSError:
                # Up to the page end: a partial page is only zeroed, not freed.
                reservation.release(offsets, start_byte, -(-stop_byte // PAGE_BYTES) * PAGE_BYTES)
                raise
            finally:
                os.close(times)
        finally:
            os.close(offsets)
        self.reserved_entries = stop

    def append(self, relative_offset: int, position: int, max_timestamp: int) -> None:
        n = self.count
        if n >= self._capacity:
            raise IndexFullError(f"index {self.offset_path.name} is full ({self.max_entries})")
        if n >= self.reserved_entries:
            self.reserve(1)
        self._offsets[n, 0] = relative_offset
        self._offsets[n, 1] = position
        self._times[n] = max_timestamp
        self.count = n + 1

    def truncate_entries(self, count: int) -> None:
        """Keep the first `count` entries; the dropped ones are zeroed."""
        assert 0 <= count <= self.count
        if count < self.count:
            self._offsets[count : self.count] = 0
            self._times[count : self.count] = 0
            self.count = count

    def trim(self) -> None:
        """Cut both files to the live entries (roll, clean close)."""
        live = self.count
        # Keep the arrays mapped: nothing reads past `count`, so the shrunken files are safe.
        for path in (self.offset_path, self.time_path):
            os.truncate(path, live * ENTRY_BYTES)
        self.reserved_entries = min(self.reserved_entries, live)
        self._remap(live)

    def flush(self) -> None:
        for array in (self._offsets, self._times):
            if isinstance(array.base, mmap.mmap):
                array.base.flush()

    def close(self) -> None:
        self.flush()
        self.discard()

    def discard(self) -> None:
        """Drop the maps unsynced: the files are being deleted (an msync of them there blocked
        the event loop on a disk, for pages nobody would read again)."""
        self._offsets = np.zeros((0, 2), dtype=np.int32)
        self._times = np.zeros((0,), dtype=np.int64)
        self._capacity = 0

    # -- reading ------------------------------------------------------------------------------

    @property
    def relative_offsets(self) -> np.ndarray:
        return self._offsets[: self.count, 0]

    @property
    def positions(self) -> np.ndarray:
        return self._offsets[: self.count, 1]

    @property
    def max_timestamps(self) -> np.ndarray:
        return self._times[: self.count]

    def entry(self, i: int) -> tuple[int, int]:
        return int(self._offsets[i, 0]), int(self._offsets[i, 1])

    def batch_at_or_before(self, offset: int) -> int:
        """Index of the last batch whose base offset <= `offset`, or -1."""
        relative = offset - self.base_offset
        if relative < 0:
            return -1
        last = self.count - 1
        if last >= 0 and relative >= self._offsets[last, 0]:
            return last  # a follower or tailing consumer reads the newest batch: no search
        key = np.int32(min(relative, INT32_MAX))
        return int(self.relative_offsets.searchsorted(key, side="right")) - 1

    def first_batch_at_or_after(self, offset: int) -> int:
        """Index of the first batch whose base offset >= `offset` (== count when none)."""
        relative = offset - self.base_offset
        if relative <= 0:
            return 0
        return int(
            self.relative_offsets.searchsorted(np.int32(min(relative, INT32_MAX)), side="left")
        )

    def first_batch_with_timestamp_at_least(self, timestamp: int) -> int:
        """Index of the first batch whose records may reach `timestamp` (count when none)."""
        if not self.count:
            return 0
        running_max = np.maximum.accumulate(self.max_timestamps)
        return int(np.searchsorted(running_max, np.int64(timestamp), side="left"))

    def largest_timestamp(self) -> int | None:
        return int(self.max_timestamps.max()) if self.count else None

    def is_sane(self, log_size: int) -> str | None:
        """None when the entries are plausible for a log of `log_size` bytes, else why not."""
        if not self.count:
            return None if log_size == 0 else "no entries for a non-empty log"
        rel, pos = self.relative_offsets, self.positions
        if rel[0] < 0 or pos[0] != 0:
            return f"first entry ({rel[0]}, {pos[0]}) does not start the log"
        if self.count > 1 and (np.any(np.diff(rel) <= 0) or np.any(np.diff(pos) <= 0)):
            return "entries are not strictly increasing"
        if pos[-1] >= log_size:
            return f"last entry points at {pos[-1]}, past the log's {log_size} bytes"
        return None
