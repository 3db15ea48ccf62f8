"""Kafka framing as the broker's network layer does it (broker/network.py), over real socket
pairs: size bounds, EOF before and inside a frame, frames arriving in pieces, responses that
mix bytes with sendfile'd file slices (including slices larger than the socket buffer), and
the connection's watch (one reader registration for many requests; a client that hangs up
while its request waits), on asyncio's own loop and on uvloop's, which the brokers run."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from dataclasses import dataclass

import pytest
import uvloop

from localcluster.broker import network
from localcluster.broker.network import (
    MIN_FRAME_BYTES,
    SENDFILE_CHUNK_BYTES,
    ConnectionContext,
    ConnectionWatch,
    FrameError,
    FrameReader,
    ListenerInfo,
    PeerGoneError,
    send_parts,
    serve_connection,
)


def run(coroutine_function, *args):
    async def main():
        return await asyncio.wait_for(coroutine_function(*args), 10)

    return asyncio.run(main())


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


_readers: dict[socket.socket, FrameReader] = {}  # one per connection, as the server has


async def read(sock, max_bytes=1 << 20):
    """The connection's next frame; its reader (and what it has buffered) carries over from
    one `run` to the next, each on a loop of its own, which the watch is moved to."""
    loop = asyncio.get_running_loop()
    reader = _readers.get(sock)
    if reader is None or reader.max_bytes != max_bytes:
        reader = _readers[sock] = FrameReader(sock, max_bytes, ConnectionWatch(sock, loop))
    elif reader.watch._loop is not loop:
        reader.watch = ConnectionWatch(sock, loop)
    return await reader.read_frame()


def test_a_frame_is_read_whole(pair):
    server, client = pair
    client.sendall(struct.pack(">i", 10) + b"0123456789" + struct.pack(">i", 8) + b"abcdefgh")
    assert bytes(run(read, server)) == b"0123456789"
    assert bytes(run(read, server)) == b"abcdefgh"


def test_a_frame_arriving_in_pieces_is_reassembled(pair):
    server, client = pair

    async def scenario():
        loop = asyncio.get_running_loop()
        pending = loop.create_task(read(server))
        data = struct.pack(">i", 12) + b"hello, world"
        for i in range(len(data)):
            client.sendall(data[i : i + 1])
            await asyncio.sleep(0)  # let the reader see each byte alone
        return await pending

    assert bytes(run(scenario)) == b"hello, world"


def test_eof_before_a_frame_is_a_clean_end(pair):
    server, client = pair
    client.close()
    assert run(read, server) is None


@pytest.mark.parametrize(
    "sent", [b"\x00\x00", struct.pack(">i", 50), struct.pack(">i", 50) + b"x" * 20]
)
def test_eof_inside_a_frame_is_a_connection_error(pair, sent):
    server, client = pair
    client.sendall(sent)
    client.close()
    with pytest.raises(ConnectionError):
        run(read, server)


@pytest.mark.parametrize("size", [-1, -(2**31), 0, MIN_FRAME_BYTES - 1, 1001, 2**31 - 1])
def test_sizes_outside_the_bounds_are_frame_errors_without_reading_a_body(pair, size):
    server, client = pair
    client.sendall(struct.pack(">i", size))  # and no body: the check must not wait for one
    with pytest.raises(FrameError, match=f"frame size {size} outside"):
        run(read, server, 1000)


def test_the_bounds_are_inclusive(pair):
    server, client = pair
    client.sendall(struct.pack(">i", MIN_FRAME_BYTES) + b"m" * MIN_FRAME_BYTES)
    assert bytes(run(read, server, 1000)) == b"m" * MIN_FRAME_BYTES
    client.sendall(struct.pack(">i", 1000) + b"M" * 1000)
    assert bytes(run(read, server, 1000)) == b"M" * 1000


def test_pipelined_frames_of_every_size_come_out_whole_and_in_order(pair):
    """Small frames several to a receive, large ones (past the scratch buffer) received into
    their own, and sizes split across the scratch buffer's end (the sizes walk every offset)."""
    server, client = pair
    bodies = [bytes([i % 251]) * n for i, n in enumerate(
        [MIN_FRAME_BYTES + k for k in range(40)] + [network.SCRATCH_BYTES - 3, 3 * network.SCRATCH_BYTES + 5, 9]
        * 3 + [MIN_FRAME_BYTES + 7 * k for k in range(300)])]  # fmt: skip
    data = b"".join(struct.pack(">i", len(b)) + b for b in bodies)

    async def scenario():
        loop = asyncio.get_running_loop()
        sending = loop.run_in_executor(None, client.sendall, data)
        got = [bytes(await read(server)) for _ in bodies]
        await sending
        return got

    assert run(scenario) == bodies


@dataclass
class FileBytes:
    """Stands in for storage's FileSlice: what send_parts hands to os.sendfile."""

    fd: int
    position: int
    length: int


def receive_frame(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = sock.recv(1 << 16)
        assert chunk, "peer closed mid-frame"
        data += chunk
    (size,) = struct.unpack(">i", data[:4])
    assert len(data) == 4 + size, "bytes after the frame"
    return data[4:]


@pytest.mark.parametrize("file_bytes", [10, 3 << 20])  # the large one fills the socket buffer
def test_send_parts_mixes_bytes_and_file_slices_in_order(pair, tmp_path, file_bytes):
    server, client = pair
    content = os.urandom(file_bytes + 200)
    path = tmp_path / "segment.log"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = [
            b"head",
            FileBytes(fd, 100, file_bytes),
            bytearray(b"middle"),
            FileBytes(fd, 0, 7),
            b"tail",
        ]
        expected = b"head" + content[100 : 100 + file_bytes] + b"middle" + content[:7] + b"tail"

        async def scenario():
            loop = asyncio.get_running_loop()
            received = loop.run_in_executor(None, receive_frame, client)
            await send_parts(loop, server, parts)
            return await received

        assert run(scenario) == expected
    finally:
        os.close(fd)


def test_a_slice_past_the_end_of_its_file_is_a_connection_error(pair, tmp_path):
    """A segment truncated between read and send must not be sent as a short frame silently."""
    server, client = pair
    path = tmp_path / "segment.log"
    path.write_bytes(b"x" * 50)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ConnectionError, match="ended"):
            run(_send, server, [FileBytes(fd, 0, 100)])
    finally:
        os.close(fd)


async def _send(sock, parts):
    await send_parts(asyncio.get_running_loop(), sock, parts)


def test_a_large_slice_lets_the_loop_run_other_work_between_chunks(pair, tmp_path, monkeypatch):
    """A follower's catch-up answer of many MiB is sent a chunk at a time: a callback due
    meanwhile runs before the last chunk leaves, even when the socket never fills (here a
    sendfile that always takes everything it is given)."""
    server, _ = pair
    size = 4 * SENDFILE_CHUNK_BYTES
    path = tmp_path / "segment.log"
    content = os.urandom(size)
    path.write_bytes(content)
    out, calls = bytearray(), []

    def sendfile_taking_all(out_fd, in_fd, offset, count):
        calls.append(count)
        out.extend(os.pread(in_fd, count, offset))
        return count

    monkeypatch.setattr(network.os, "sendfile", sendfile_taking_all)
    fd = os.open(path, os.O_RDONLY)
    try:

        async def scenario():
            loop = asyncio.get_running_loop()
            ran = []
            sending = loop.create_task(network.sendfile(loop, server, fd, 0, size))
            loop.call_soon(lambda: ran.append(sending.done()))
            await sending
            return ran

        assert run(scenario) == [False]  # the callback ran while the send was still going
        assert calls == [SENDFILE_CHUNK_BYTES] * 4 and bytes(out) == content
    finally:
        os.close(fd)


# -- the connection's watch ---------------------------------------------------------------------

LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}


@pytest.fixture(params=sorted(LOOPS))
def run_on(request):
    """Runs a coroutine function on one loop, with a deadline."""

    def run_with_deadline(coroutine_function, *args):
        async def main():
            return await asyncio.wait_for(coroutine_function(*args), 10)

        return LOOPS[request.param](main())

    return run_with_deadline


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def test_one_reader_registration_serves_a_connection_of_many_requests(pair, run_on):
    """The reader is registered when the connection first waits and kept: 50 requests, each
    answered before the next is sent (as a follower's fetches are), cost one add_reader."""
    server, client = pair
    client.setblocking(False)
    server_fd = server.fileno()  # the connection closes the socket when it ends
    answered = []

    async def handler(frame, context):
        answered.append(bytes(frame))
        return [b"re:" + bytes(frame)]

    async def scenario():
        loop = asyncio.get_running_loop()
        registrations = []
        add_reader = loop.add_reader

        def counting_add_reader(fd, callback, *args):
            registrations.append(fd)
            return add_reader(fd, callback, *args)

        loop.add_reader = counting_add_reader
        context = ConnectionContext(ListenerInfo("UNIX", "PLAINTEXT", is_unix=True), "test")
        serving = loop.create_task(serve_connection(server, context, handler, 1 << 20))
        for i in range(50):
            body = b"request %03d" % i
            await loop.sock_sendall(client, _frame(body))
            response = b""
            while len(response) < 4 + 3 + len(body):
                response += await loop.sock_recv(client, 1024)
            assert response == _frame(b"re:" + body)
        client.close()
        await serving
        return [fd for fd in registrations if fd == server_fd]

    assert run_on(scenario) == [server_fd]
    assert len(answered) == 50


def test_a_client_that_hangs_up_while_its_request_waits_frees_the_connection(pair, run_on):
    """The waiting handler is cancelled and the wait ends in PeerGoneError; the handler's
    synchronous part ran first although the client was already gone when it started."""
    server, client = pair
    steps = []

    async def waits_forever():
        steps.append("synchronous part")
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            steps.append("cancelled")
            raise

    async def scenario():
        client.close()
        with pytest.raises(PeerGoneError, match="closed its connection"):
            await ConnectionWatch(server, asyncio.get_running_loop()).while_peer_stays(
                waits_forever()
            )

    run_on(scenario)
    assert steps == ["synchronous part", "cancelled"]


def test_a_pipelined_request_neither_cancels_the_waiting_one_nor_spins_the_loop(pair, run_on):
    """Bytes of the next request arrive while this one waits: the handler goes on to its
    answer, the reader is dropped until the next read (an unread, level-triggered socket
    would call it on every pass) and the next frame is read whole afterwards."""
    server, client = pair

    async def scenario():
        loop = asyncio.get_running_loop()
        watch = ConnectionWatch(server, loop)
        answer = loop.create_future()
        calls = []
        peek = watch._on_readable

        async def handler():
            return await answer

        waiting = loop.create_task(watch.while_peer_stays(handler()))
        await asyncio.sleep(0)
        loop.remove_reader(server.fileno())  # count the watch's callbacks from here on
        loop.add_reader(server.fileno(), lambda: (calls.append(1), peek()))
        client.sendall(_frame(b"the next request"))
        for _ in range(200):  # loop passes, while the unread bytes stay in the socket
            await asyncio.sleep(0)
        answer.set_result("answered")
        result = await waiting
        frame = await FrameReader(server, 1 << 20, watch).read_frame()
        return result, bytes(frame), len(calls)

    result, frame, callbacks = run_on(scenario)
    assert (result, frame) == ("answered", b"the next request")
    assert callbacks == 1


def test_a_cancellation_from_elsewhere_is_not_taken_for_a_departed_client(pair, run_on):
    """A listener closing cancels its connections: that stays a cancellation."""
    server, _client = pair

    async def scenario():
        loop = asyncio.get_running_loop()
        watch = ConnectionWatch(server, loop)
        waiting = loop.create_task(watch.while_peer_stays(loop.create_future()))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    run_on(scenario)
