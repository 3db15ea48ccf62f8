"""Kafka framing as the broker's network layer does it (broker/network.py), over real socket
pairs: size bounds, EOF before and inside a frame, frames arriving in pieces, responses that
mix bytes with sendfile'd file slices (including slices larger than the socket buffer)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from dataclasses import dataclass

import pytest

from localcluster.broker import network
from localcluster.broker.network import (
    MIN_FRAME_BYTES,
    SENDFILE_CHUNK_BYTES,
    FrameError,
    FrameReader,
    send_parts,
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
    reader = _readers.get(sock)
    if reader is None or reader.max_bytes != max_bytes:
        reader = _readers[sock] = FrameReader(sock, max_bytes)
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
