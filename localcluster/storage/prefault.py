"""Reserving and populating a segment's next pages on a background thread, off the event loop.

An active segment populates the pages ahead of its write position with
madvise(MADV_POPULATE_WRITE) (segment.py says why). CPython's `mmap.madvise` holds the GIL for
the whole call, about 0.5 ms per MiB on tmpfs, so done on the broker's event loop it stalled
every request for that long; profiles of a leader at half the acks=all maximum put 28% of the
loop's busy time there. `Prefaulter` makes the same call through ctypes, which releases the
GIL, on one daemon thread: the loop goes on while the kernel allocates the pages.

Before populating a range the thread reserves it (fallocate, reservation.py): a page that is not
reserved is never touched, as a store into it on a full filesystem is SIGBUS. A range that
cannot be reserved is left alone; `reserved` only grows over ranges reserved contiguously from
the start, so the writer, which may only write below it, reserves the rest itself (and gets
ENOSPC there as a clean error). The thread reserves from the watermark when that lags behind its
range (a chunk it could not reserve before), so the ranges join up again once there is space and
the writer is back to reserving nothing. Its lock also orders the thread against a segment that
cuts its file (truncation, seal): the segment takes it, cuts, and lowers `reserved`/`limit`
before the thread can raise `reserved` over blocks that the cut freed.

A new segment (created or rolled) asks for its first chunk at once, so a topic of 600 partitions
queues 600 small requests here rather than having its first appends populate on the loop
(segment.py has the figures). The writer never waits for the thread: what the thread has not
reached yet the writer reserves itself, only what the batch needs, and the copy faults it in;
populating never changes what a page holds, so the two cannot conflict. A `MappedRegion` is
closed before its map is unmapped and its file closed: the lock makes the close wait for a call
in progress, and nothing runs after it.

Kernels before 5.14 have no MADV_POPULATE_WRITE: `AVAILABLE` is then False and segments
prefault on the caller's thread, by touching pages, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import threading

from localcluster.storage import reservation
from localcluster.storage.work_thread import WorkThread

log = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # Linux 5.14


def _load_madvise():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        address = _address_of(probe)
        ok = madvise(address, mmap.PAGESIZE, MADV_POPULATE_WRITE) == 0
    finally:
        probe.close()
    return madvise if ok else None


def _address_of(mm: mmap.mmap) -> int:
    """The map's start address (the buffer export is released at once: `mm` can still close)."""
    view = (ctypes.c_char * 1).from_buffer(mm)
    try:
        return ctypes.addressof(view)
    finally:
        del view


_madvise = _load_madvise()
AVAILABLE = _madvise is not None


class MappedRegion:
    """One mmap the prefault thread may reserve and populate, below `limit`, until `close()`.

    `fd` is the mapped file (None for anonymous memory, which needs no reservation); its blocks
    below `reserved` are allocated. Writers read `reserved` without the lock (one attribute).
    """

    __slots__ = ("address", "length", "lock", "open", "fd", "reserved", "limit", "_watermark_lock")

    def __init__(self, mm: mmap.mmap, fd: int | None = None, reserved: int = 0):
        self.address = _address_of(mm)
        self.length = len(mm)
        self.lock = threading.Lock()
        self.open = True
        self.fd = fd
        self.reserved = reserved if fd is not None else len(mm)
        self.limit = len(mm)
        self._watermark_lock = threading.Lock()  # held for a few bytecodes, by either thread

    def note_reserved(self, start: int, stop: int) -> None:
        """[start, stop) was reserved: the watermark moves when the range continues it."""
        with self._watermark_lock:
            if start <= self.reserved < stop:
                self.reserved = stop

    def cut_reserved(self, position: int) -> None:
        """The file was cut at `position` (hold `lock`): nothing from there on is reserved."""
        with self._watermark_lock:
            self.reserved = min(self.reserved, position)

    def close(self) -> None:
        """Waits for a call in progress on this region; none runs after."""
        with self.lock:
            self.open = False


class Prefaulter(WorkThread):
    """One daemon thread populating requested ranges in order."""

    def __init__(self) -> None:
        super().__init__("prefault")

    def request(self, region: MappedRegion, start: int, stop: int) -> None:
        self.submit(region, start, stop)

    def work(self, region: MappedRegion, start: int, stop: int) -> None:
        with region.lock:
            if not region.open or stop > region.length:
                return
            stop = min(stop, region.limit)  # a sealed segment takes nothing more
            if start >= stop:
                return
            # From the watermark, if it lags (a reservation that failed before): reserved ranges
            # join up, and the writer is back to reserving nothing itself.
            reserve_from = min(start, region.reserved)
            if region.fd is not None and not self._reserve(region, reserve_from, stop):
                return
            if _madvise(region.address + start, stop - start, MADV_POPULATE_WRITE) != 0:
                # ENOMEM/EFAULT: the file was cut under the range; the writer faults in what
                # it needs.
                log.debug("prefault of [%d, %d) failed: errno %d", start, stop, ctypes.get_errno())

    @staticmethod
    def _reserve(region: MappedRegion, start: int, stop: int) -> bool:
        """Reserve before populating; False (populate nothing) when the space is not there."""
        try:
            if reservation.reserve(region.fd, start, stop):
                region.note_reserved(start, stop)
            return True  # reserved, or the filesystem cannot reserve: populate as before
        except OSError as e:
            # ENOSPC: the writer meets it when it gets here and reports it; until then the
            # pages stay untouched.
            log.debug("reserving [%d, %d) failed: %s", start, stop, e)
            return False


PREFAULTER = Prefaulter()
