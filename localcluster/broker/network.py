"""Sockets: listeners, framing, and sending responses (bytes and sendfile'd segment slices).

Every connection carries a `ConnectionContext`: the listener it arrived on (name and security
protocol), the peer, and its principal (Kafka's KafkaPrincipal as text): `User:ANONYMOUS` on a
PLAINTEXT listener, `User:<name>` once SASL authentication succeeds, and on the Unix socket the
local user the kernel vouches for (SO_PEERCRED). The handler may mark a context to be closed
after its response (a failed SASL authentication is answered, then the connection is dropped).

Each connection is one task that reads a frame, awaits its handler and writes the response
before reading the next frame, so responses leave in request order, as Kafka guarantees (a
client may pipeline; we process one request per connection at a time, like Kafka's muted
channels). A frame larger than `socket.request.max.bytes`, shorter than a header, or one the
handler cannot parse closes that connection with a log line; other connections carry on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from localcluster.client.frames import FrameError, unzeroed_buffer, widen_send_buffer
from localcluster.protocol.wire import MalformedRequestError
from localcluster.tasks import cancel_and_wait, wake

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
MIN_FRAME_BYTES = 8  # api_key, api_version, correlation_id: a request header's fixed part
SENDFILE_CHUNK_BYTES = 1 << 20  # per sendfile call; a steady-state answer (~64 KiB) is one
SCRATCH_BYTES = 16 << 10  # a connection's receive buffer for frame sizes and small frames

ANONYMOUS = "User:ANONYMOUS"
UNIX_LISTENER = "UNIX"


@dataclass(frozen=True, slots=True)
class ListenerInfo:
    """What a connection inherits from the listener that accepted it."""

    name: str  # Kafka's listener name, e.g. PLAINTEXT, BROKER; UNIX for the Unix socket
    security_protocol: str  # PLAINTEXT or SASL_PLAINTEXT (the Unix socket: PLAINTEXT)
    is_unix: bool = False


@dataclass(slots=True)
class ConnectionContext:
    listener: ListenerInfo
    peer: str
    principal: str = ANONYMOUS
    authenticated: bool = False  # SASL done (or not needed: PLAINTEXT, the Unix socket)
    close_after_response: str | bool = False  # why, when the handler wants the connection closed
    close_delay_s: float = 0.0  # wait before closing (after a failed authentication)
    sasl: object | None = field(default=None, repr=False)  # the SASL exchange in progress

    @property
    def needs_authentication(self) -> bool:
        return self.listener.security_protocol == "SASL_PLAINTEXT" and not self.authenticated

    def describe(self) -> str:
        return f"{self.principal} at {self.peer} (listener {self.listener.name})"


Handler = Callable[[memoryview, ConnectionContext], Awaitable[list | None]]


class ConnectionWatch:
    """The event loop's watch on one connection's socket: a reader registered once and kept
    while the connection waits, for its next request's bytes or for its client to hang up.

    A reader registered for each wait (as `loop.sock_recv_into` does, and as the wait for a
    hang-up did) cost each broker of a 3-broker cluster 9 epoll_ctl calls per acks=all batch,
    half of them failing, and a handle each time (bench/README.md, "One watch per
    connection"). The reader is dropped only when bytes arrive that nobody waits for (the next
    request of a client that pipelines, read once the current one is answered) and taken up
    again at the next wait: the loop's readers are level-triggered, and unread bytes would
    call it back on every pass."""

    __slots__ = ("sock", "gone", "_fd", "_loop", "_watching", "_waiter", "_handling")

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop):
        self.sock = sock
        self.gone = False  # the client hung up while a request was being handled
        self._fd = sock.fileno()
        self._loop = loop  # the loop serving the connection
        self._watching = False
        self._waiter: asyncio.Future | None = None  # a wait for bytes
        self._handling: asyncio.Task | None = None  # the task to cancel if the client leaves

    async def readable(self) -> None:
        """Until the socket has bytes to read (or its end)."""
        self._watch()
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def while_peer_stays(self, handling: Awaitable):
        """Await a request's handler, but give up when the client hangs up meanwhile: a parked
        fetch or produce must not hold a departed client's socket for its whole timeout
        (Kafka's selector drops such a channel at once). The handler runs in the caller's task,
        so its synchronous part (an append, a read) is carried out before anything else can
        run: a request already taken is carried out even if its client leaves. Bytes of a
        pipelined next request stay queued (in the socket, or in the FrameReader)."""
        self._watch()
        self._handling = asyncio.current_task(self._loop)
        try:
            return await handling
        except asyncio.CancelledError:
            if self.gone:
                raise PeerGoneError(
                    "the client closed its connection while its request waited"
                ) from None
            raise
        finally:
            self._handling = None

    def close(self) -> None:
        """Before the socket is closed: the loop must not poll a closed descriptor."""
        self._unwatch()

    def _watch(self) -> None:
        if not self._watching:
            self._loop.add_reader(self._fd, self._on_readable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            if not self._loop.is_closed():
                self._loop.remove_reader(self._fd)

    def _on_readable(self) -> None:
        if self._waiter is not None:
            wake(self._waiter)
            return
        if self._handling is not None:
            try:
                data = self.sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.gone = True
                self._handling.cancel()
        self._unwatch()  # unread bytes (or the end) wait for the next read


class FrameReader:
    """Request frames off one connection, with as few trips through the event loop as can be.

    A receive is tried on the socket first; only when it would block does the reader wait on
    the connection's watch. Small requests (a follower's fetch, most client requests) come
    with their size in one receive into a scratch buffer, pipelined ones several at a time; a
    large one (a produce of a 1 MB batch) gets a buffer of its own that the rest of it is
    received into."""

    def __init__(self, sock: socket.socket, max_bytes: int, watch: ConnectionWatch):
        self.sock = sock
        self.max_bytes = max_bytes
        self.watch = watch
        self._scratch = memoryview(bytearray(SCRATCH_BYTES))
        self._start = 0  # unread bytes are [_start, _end)
        self._end = 0

    async def read_frame(self) -> memoryview | None:
        """The next frame's bytes after its size; None on a clean EOF between frames."""
        while self._end - self._start < 4:
            if not await self._fill():
                if self._end == self._start:
                    return None
                raise ConnectionError(
                    f"peer closed after {self._end - self._start} of 4 bytes of a frame"
                )
        (size,) = _SIZE.unpack_from(self._scratch, self._start)
        if size < MIN_FRAME_BYTES or size > self.max_bytes:
            raise FrameError(f"frame size {size} outside [{MIN_FRAME_BYTES}, {self.max_bytes}]")
        body = self._start + 4
        have = min(self._end - body, size)
        view = unzeroed_buffer(size) if size > SCRATCH_BYTES else memoryview(bytearray(size))
        view[:have] = self._scratch[body : body + have]
        self._start = body + have
        if self._start == self._end:
            self._start = self._end = 0
        while have < size:
            n = await self._receive(view[have:])
            if n == 0:
                raise ConnectionError(f"peer closed after {have} of {size} bytes of a frame")
            have += n
        return view

    async def _fill(self) -> bool:
        """Receive more into the scratch buffer; False on EOF."""
        if self._end == len(self._scratch):  # a size split across the end: to the front
            left = self._end - self._start
            self._scratch[:left] = self._scratch[self._start : self._end]
            self._start, self._end = 0, left
        n = await self._receive(self._scratch[self._end :])
        self._end += n
        return n > 0

    async def _receive(self, view: memoryview) -> int:
        while True:
            try:
                return self.sock.recv_into(view)
            except BlockingIOError:
                await self.watch.readable()


async def send_parts(loop, sock: socket.socket, parts: list) -> None:
    """Send a response: a 4-byte size, then bytes parts and FileSlice parts in order."""
    total = sum(p.length if hasattr(p, "length") else len(p) for p in parts)
    pending = bytearray(_SIZE.pack(total))
    for part in parts:
        if hasattr(part, "length"):
            if pending:
                await loop.sock_sendall(sock, pending)
                pending = bytearray()
            await sendfile(loop, sock, part.fd, part.position, part.length)
        else:
            pending += part
    if pending:
        await loop.sock_sendall(sock, pending)


async def sendfile(loop, sock: socket.socket, fd: int, offset: int, count: int) -> None:
    """Send `count` bytes of `fd` from `offset`. At most SENDFILE_CHUNK_BYTES per call, and the
    loop runs other work between chunks: while a reader keeps up, one sendfile of a follower's
    catch-up answer (up to 32 MiB) kept the loop 10-15 ms (bench/README.md, issue 19's stalls)."""
    out = sock.fileno()
    while count:
        try:
            n = os.sendfile(out, fd, offset, min(count, SENDFILE_CHUNK_BYTES))
        except BlockingIOError:
            await _writable(loop, out)
            continue
        if n == 0:
            raise ConnectionError(f"segment file ended {count} bytes early (truncated meanwhile)")
        offset += n
        count -= n
        if count:
            await asyncio.sleep(0)


async def _writable(loop, fd: int) -> None:
    ready = loop.create_future()
    loop.add_writer(fd, wake, ready)
    try:
        await ready
    finally:
        loop.remove_writer(fd)


class PeerGoneError(ConnectionError):
    pass


async def serve_connection(
    sock: socket.socket, context: ConnectionContext, handler: Handler, max_bytes: int
) -> None:
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    watch = ConnectionWatch(sock, loop)
    frames = FrameReader(sock, max_bytes, watch)
    peer = context.peer
    try:
        while True:
            frame = await frames.read_frame()
            if frame is None:
                return
            parts = await watch.while_peer_stays(handler(frame, context))
            if parts is not None:
                await send_parts(loop, sock, parts)
            if context.close_after_response:
                log.info("closing connection from %s: %s", peer, context.close_after_response)
                if context.close_delay_s:
                    # Kafka's connection.failed.authentication.delay.ms: the client reads the
                    # refusal before the close, and a retry loop is slowed down.
                    await asyncio.sleep(context.close_delay_s)
                return
    except (FrameError, MalformedRequestError) as e:
        log.warning("closing connection from %s: %s", peer, e)
    except (ConnectionError, OSError) as e:
        log.info("connection from %s ended: %s", peer, e)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("closing connection from %s after an unexpected error", peer)
    finally:
        watch.close()
        sock.close()


class Listener:
    """Accepts on one listening socket and spawns a task per connection."""

    def __init__(self, sock: socket.socket, handler: Handler, max_bytes: int, info: ListenerInfo):
        self.sock = sock
        self.handler = handler
        self.max_bytes = max_bytes
        self.info = info
        self.name = info.name
        self._connections: set[asyncio.Task] = set()
        self._accept_task: asyncio.Task | None = None

    def start(self) -> None:
        self.sock.setblocking(False)
        self._accept_task = asyncio.get_running_loop().create_task(self._accept_loop())

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(self.sock)
            except OSError as e:
                log.warning("%s listener: accept failed (%s); retrying", self.name, e)
                await asyncio.sleep(0.1)
                continue
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                context = ConnectionContext(self.info, f"{address[0]}:{address[1]}",
                                            authenticated=self.info.security_protocol == "PLAINTEXT")  # fmt: skip
            else:
                widen_send_buffer(conn)
                context = ConnectionContext(self.info, "unix socket", principal=_local_principal(conn),
                                            authenticated=True)  # fmt: skip
            task = loop.create_task(serve_connection(conn, context, self.handler, self.max_bytes))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def close(self) -> None:
        await cancel_and_wait(self._accept_task, *self._connections)
        self.sock.close()


def _local_principal(conn: socket.socket) -> str:
    """The peer's user id as the kernel reports it: whoever could open the socket file."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return f"User:local-uid-{uid}"
    except OSError:
        return "User:local"


class ListenError(RuntimeError):
    """A listener could not be bound; the message names the address and what to do."""


def tcp_listen(host: str, port: int, listener_name: str = "PLAINTEXT") -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host or "0.0.0.0", port))
    except OSError as e:
        sock.close()
        hint = ("another process holds that port (a broker of another cluster, or one still "
                "running?)" if e.errno == 98 else "check the address in listeners")  # fmt: skip
        raise ListenError(f"cannot listen on {listener_name}://{host}:{port}: {e.strerror}; "
                          f"{hint}") from None  # fmt: skip
    sock.listen(512)
    return sock


def unix_listen(path: str) -> socket.socket:
    """The Unix socket is the one-host inter-broker listener: its file mode (owner only) is
    the credential that lets a peer send broker requests."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)  # before listen(): until then nobody can connect
    sock.listen(512)
    return sock
