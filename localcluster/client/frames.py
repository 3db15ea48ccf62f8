"""Size-prefixed frames off a socket, received without a stream buffer in between.

`FrameProtocol` is the asyncio protocol under a client connection. The event loop receives
into buffers it hands out (asyncio.BufferedProtocol), so bytes are copied from the kernel once:
- small frames (most answers) land in one scratch buffer, several per receive, and each is
  cut out as its own `bytes`;
- a frame larger than the scratch buffer gets a buffer of its size (not zeroed first), and the
  loop receives the rest of it straight into that (a follower's fetch answer of a few MB).

An asyncio StreamReader did three copies instead (into its buffer, out of it, and the shift of
what was left) and woke the reading task for every chunk: on the followers of a full-speed
acks=all run at 1 MB batches, 38-41% of their busy samples (bench/README.md, "Receiving
frames").

Each frame goes to `on_frame` as it completes, in order; an impossible size or an `on_frame`
that raises ends the connection through `on_lost`, as does the peer closing it. Writing is the
transport's; `drain()` waits while the transport's buffer is over its high-water mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable

from localcluster.tasks import wake

_SIZE = struct.Struct(">i")
SCRATCH_BYTES = 64 << 10
UNIX_SEND_BUFFER_BYTES = 4 << 20


class FrameError(Exception):
    """A frame with an impossible size: the stream cannot be resynchronised (either end's)."""


class FrameProtocol(asyncio.BufferedProtocol):
    def __init__(self, max_frame_bytes: int):
        self.max_frame_bytes = max_frame_bytes
        # Set by the connection before it sends its first request.
        self.on_frame: Callable[[bytes | memoryview], None] = lambda frame: None
        self.on_lost: Callable[[BaseException | None], None] = lambda error: None
        self.transport: asyncio.Transport | None = None
        self._scratch = bytearray(SCRATCH_BYTES)
        self._view = memoryview(self._scratch)
        self._start = 0  # the scratch holds unread bytes in [_start, _end)
        self._end = 0
        self._frame: memoryview | None = None  # a large frame being received into its own buffer
        self._filled = 0
        self._paused = False
        self._drained: asyncio.Future | None = None
        self._lost: BaseException | None = None
        self.closed = asyncio.get_running_loop().create_future()

    # -- receiving ----------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            widen_send_buffer(sock)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return self._frame[self._filled :]
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._frame is not None:
                self._filled += nbytes
                if self._filled == len(self._frame):
                    frame, self._frame = self._frame, None
                    self.on_frame(frame)
                return
            self._end += nbytes
            self._cut_frames()
        except Exception as e:  # a bad size, or the connection refusing what it got
            self._abort(e)

    def _cut_frames(self) -> None:
        view = self._view
        while self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(view, self._start)
            if size < 4 or size > self.max_frame_bytes:
                raise FrameError(f"a frame of {size} bytes")
            body = self._start + 4
            have = self._end - body
            if have >= size:
                self._start = body + size
                self.on_frame(bytes(view[body : body + size]))
                continue
            if 4 + size > len(view):  # larger than the scratch: a buffer of its own
                self._frame = unzeroed_buffer(size)
                self._frame[:have] = view[body : self._end]
                self._filled = have
                self._start = self._end = 0
                return
            break
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(view) or self._start > len(view) // 2:
            left = self._end - self._start  # a frame's beginning: to the front, to be completed
            view[:left] = view[self._start : self._end]
            self._start, self._end = 0, left

    def _abort(self, error: BaseException) -> None:
        if self._lost is None:
            self._lost = error
        if self.transport is not None:
            self.transport.abort()  # connection_lost follows, and reports self._lost

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: BaseException | None) -> None:
        error = self._lost or exc
        self._lost = error or ConnectionResetError("closed by the peer")
        wake(self._drained)  # the writer finds the connection closed
        wake(self.closed)
        self.on_lost(error)

    # -- writing ------------------------------------------------------------------------------

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        wake(self._drained)

    async def drain(self) -> None:
        """Return once the transport takes more; raises ConnectionError once it is closed."""
        if self._paused and self._lost is None:
            if self._drained is None or self._drained.done():  # one for every task waiting
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drained)
        if self._lost is not None:
            raise ConnectionError(str(self._lost) or type(self._lost).__name__)


def unzeroed_buffer(size: int) -> memoryview:
    """A writable buffer for `size` bytes about to be received, not filled with zeros first:
    `bytearray(size)` writes every byte (and so faults in every page) before the kernel writes
    them again; on a follower at 1 MB batches that was a third of its CPU (bench/README.md,
    "Receiving frames"). numpy's empty array is malloc without the memset."""
    import numpy  # here: the CLI's client does not pay its import for small answers

    return memoryview(numpy.empty(size, numpy.uint8))


def widen_send_buffer(sock: socket.socket) -> None:
    """A Unix socket's send buffer (the one limit on what is in flight: the receiver's is not
    counted) from the usual 208 KiB to UNIX_SEND_BUFFER_BYTES, so a 1 MB batch or a follower's
    fetch answer of a few MB leaves in one or two writes instead of five wake-ups of each side.
    The kernel caps it at net.core.wmem_max, silently; not for TCP, whose buffers tune
    themselves."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER_BYTES)
