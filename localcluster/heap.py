"""glibc malloc settings for a process that moves large frames (a broker, a load process):
large buffers reuse freed heap memory.

A broker receives every frame above 64 KiB into a buffer of its own size (client/frames.py,
broker/network.py): a follower's fetch responses and a leader's produce requests, up to several
MiB each, many per second. Our client builds each produce request into fresh buffers too (the
request's bytes, then the frame around them). With glibc's defaults such a buffer is a fresh
mapping, or heap that was handed back to the kernel when the previous one was freed (glibc
trims the top of the heap once more than twice the mmap threshold lies free there), so every
4 KiB page of every frame is faulted in and zeroed by the kernel before the bytes are copied
over it. Under acks=all at 1 MB batches `perf` put 9.5% of the brokers' and the load's samples
in those page faults, under `read` on the brokers; in a load process sending one 1 MB batch
they were 1.6 ms of a 3.9 ms produce (bench/README.md).

`keep_freed_memory` sets a fixed mmap threshold (which also stops glibc from moving it) and a
trim threshold of `TRIM_THRESHOLD_BYTES`: buffers up to 32 MiB come from the heap, and up to
that much freed memory stays there for the next one. The cost is memory: a process keeps what
its largest burst of frames in flight took, plus at most `TRIM_THRESHOLD_BYTES`. On a libc
without mallopt (musl) nothing changes. It is process-wide, so the client library never calls
it: the processes localcluster runs do (broker/__main__.py, tools/load.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest: allocations above it are mapped on their own
TRIM_THRESHOLD_BYTES = 64 << 20


def _load_mallopt():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


_mallopt = _load_mallopt()
AVAILABLE = _mallopt is not None


def keep_freed_memory() -> bool:
    """Apply the settings to this process; False where this libc has no mallopt."""
    if _mallopt is None:
        return False
    ok = _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok = _mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
    if not ok:
        log.debug("mallopt refused the heap settings; large frames use fresh pages")
    return ok
