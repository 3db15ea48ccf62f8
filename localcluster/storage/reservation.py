"""Reserving file space before it is written through a memory map, and the error when there is none.

A store into a page of a shared file mapping that the filesystem cannot back (tmpfs or a disk
that is full) is not an error the writer can catch: the kernel sends SIGBUS and the process dies.
On tmpfs even a read of a hole does, as it allocates a page. So every range of an index file
is reserved with fallocate(2) before anything touches its pages; fallocate fails with ENOSPC,
which becomes `LogDirectoryFullError` with nothing written. Segments are written with pwrite,
whose ENOSPC (segment.py) becomes the same error.

fallocate(2) is called through ctypes, not `os.posix_fallocate`: glibc's posix_fallocate falls
back, on a filesystem without fallocate, to writing a zero byte into each block it reads as zero,
which races with a writer storing batches in the same range. FALLOC_FL_KEEP_SIZE keeps the file
size as it is, so a reservation made late (after the file was trimmed) cannot regrow the file.
Where fallocate is not supported (EOPNOTSUPP) nothing can be reserved: `reserve` says so and
callers write as before, unprotected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
UNSUPPORTED_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.ENOSYS})


class LogDirectoryFullError(Exception):
    """An append found no space in its log directory; nothing of it was written.

    Kafka's KAFKA_STORAGE_ERROR (56) for a produce; a follower retries later. The message names
    the directory, the filesystem's free bytes and what to do.
    """

    def __init__(self, directory: Path, free_bytes: int, needed_bytes: int, reason: str):
        self.directory = Path(directory)
        self.free_bytes = free_bytes
        self.needed_bytes = needed_bytes
        super().__init__(
            f"no space left for log {self.directory} ({reason}): its filesystem has "
            f"{free_bytes} bytes free and this append needs {needed_bytes} more. Nothing of it "
            "was written. Free space there (delete other files, lower retention.bytes or "
            "retention.ms, or move log.dirs to a larger filesystem); appends resume by "
            "themselves once there is room."
        )


def _load_fallocate():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fallocate = libc.fallocate
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fallocate.restype = ctypes.c_int
    return fallocate


_fallocate = _load_fallocate()


def reserve(fd: int, start: int, stop: int) -> bool:
    """Allocate the blocks of [start, stop) of the file behind `fd` (the GIL is released).

    True when reserved, False when the filesystem cannot reserve (no fallocate); raises OSError
    otherwise (ENOSPC or EDQUOT when it is full). Allocated blocks read as zeros.
    """
    if stop <= start:
        return True
    if _fallocate is None:
        return False
    if _fallocate(fd, FALLOC_FL_KEEP_SIZE, start, stop - start) == 0:
        return True
    code = ctypes.get_errno()
    if code in UNSUPPORTED_ERRNOS:
        return False
    raise OSError(code, os.strerror(code))


def release(fd: int, start: int, stop: int) -> None:
    """Give back the blocks of [start, stop), which must hold nothing (it then reads zeros)."""
    if stop > start and _fallocate is not None:
        _fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, start, stop - start)


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still allocate on the filesystem of `directory`."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


def full_error(error: OSError, directory: Path, needed_bytes: int,
               what: str) -> LogDirectoryFullError | None:  # fmt: skip
    """The LogDirectoryFullError for an OSError that means "no space", else None."""
    if error.errno not in FULL_ERRNOS:
        return None
    return LogDirectoryFullError(directory, free_bytes(directory), needed_bytes,
                                 f"{what}: {error.strerror}")  # fmt: skip
