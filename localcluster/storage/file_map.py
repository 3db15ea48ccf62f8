"""Memory maps of files that hold no file descriptor of their own.

CPython's `mmap.mmap(fd, length)` keeps a dup() of `fd` for as long as the map lives (for
`size()` and `resize()`, which the storage engine never calls). A replica's active segment
then held four descriptors: the segment file, the map's copy of it, and the copies that its
two numpy index memmaps kept. With RLIMIT_NOFILE at 20,000 that capped a broker near 5,000
replicas (10,000 partitions RF 3 on 5 brokers need 6,000 each). A mapping needs no open
descriptor once it exists, so the maps made here keep none: a segment holds one descriptor
(its file, for sendfile, fallocate and ftruncate) and an index none.

Python 3.13 has `mmap.mmap(..., trackfd=False)` for this. Before it, the map's copy is closed
and its `fd` field set to -1, the value an anonymous map has, so `close()` and the
deallocator close nothing. That field's place in the object is CPython's private layout, so
it is checked once at import on a map of a scratch file (the field must name a descriptor of
that same file, other than the one mapped); where the check fails, maps keep their copy, as
before, and `FDS_PER_MAP` says so.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys
import tempfile

log = logging.getLogger(__name__)


def _find_fd_field() -> int | None:
    """The byte offset of mmap_object.fd in CPython 3.11/3.12 on Unix, if this build has it
    there (after PyObject_HEAD, data, size, pos, offset, exports), else None."""
    if sys.implementation.name != "cpython" or os.name != "posix":
        return None
    offset = object.__basicsize__ + 5 * ctypes.sizeof(ctypes.c_ssize_t)
    if mmap.mmap.__basicsize__ < offset + ctypes.sizeof(ctypes.c_int):
        return None
    with tempfile.TemporaryFile() as scratch:
        scratch.truncate(mmap.PAGESIZE)
        probe = mmap.mmap(scratch.fileno(), mmap.PAGESIZE)
        try:
            field = ctypes.c_int.from_address(id(probe) + offset)
            copy = field.value
            if copy < 0 or copy == scratch.fileno():
                return None
            try:
                if not os.path.sameopenfile(copy, scratch.fileno()):
                    return None
            except OSError:
                return None
            field.value = -1
            os.close(copy)
        finally:
            probe.close()
    return offset


if sys.version_info >= (3, 13):
    _FD_FIELD = None
    FDS_PER_MAP = 0
else:
    _FD_FIELD = _find_fd_field()
    FDS_PER_MAP = 0 if _FD_FIELD is not None else 1
    if _FD_FIELD is None:
        log.warning("memory maps keep a descriptor each here (unknown mmap layout): a broker "
                    "holds 4 open files per replica")  # fmt: skip


def map_file(fd: int, length: int) -> mmap.mmap:
    """`mmap.mmap(fd, length)` (shared, read-write) that keeps no descriptor open: closing
    `fd` afterwards leaves the map valid."""
    if sys.version_info >= (3, 13):
        return mmap.mmap(fd, length, trackfd=False)
    mm = mmap.mmap(fd, length)
    if _FD_FIELD is not None:
        field = ctypes.c_int.from_address(id(mm) + _FD_FIELD)
        copy = field.value
        field.value = -1
        os.close(copy)
    return mm
