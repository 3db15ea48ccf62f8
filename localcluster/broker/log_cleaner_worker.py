"""The log cleaner's worker process: runs `storage.cleaner.clean` on the plans its broker sends.

Why a process: cleaning decodes every record in Python; on a thread of the broker it would hold
the interpreter lock for up to a switch interval (5 ms) each time the event loop wakes, and an
acks=all produce crosses three event loops several times. A process of its own shares nothing
with the event loop but the CPU, and runs at a lower priority (nice 10).

Protocol, on stdin and stdout: frames of a 4-byte big-endian length and a pickle. The broker
sends a detached CleanPlan; the worker answers ("ok", CleanResult) or ("error", text). It exits
on end of input, and dies with its broker (PR_SET_PDEATHSIG): its `.cleaned` files are then
removed when the log next opens. Only its own broker writes to its stdin, so unpickling is
trusted input.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import struct
import sys

from localcluster.storage import cleaner

_LENGTH = struct.Struct(">I")
PR_SET_PDEATHSIG = 1
NICENESS = 10


def read_frame(stream):
    """The next pickled object, or None at end of input."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(head)
    body = stream.read(length)
    if len(body) < length:
        return None
    return pickle.loads(body)


def write_frame(stream, value) -> None:
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(body)) + body)
    stream.flush()


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the worker still exits at end of input
    if os.getppid() == 1:  # the broker died before the line above
        sys.exit(0)


def main() -> int:
    _die_with_parent()
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (plan := read_frame(stdin)) is not None:
        try:
            answer = ("ok", cleaner.clean(plan))
        except Exception as e:  # noqa: BLE001 (the broker logs it and retries later)
            answer = ("error", f"{type(e).__name__}: {e}")
        write_frame(stdout, answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
