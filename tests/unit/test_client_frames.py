"""FrameProtocol: frames cut from any split of the stream, large ones received whole into
their own buffer, impossible sizes end the connection; and through a real socket."""

from __future__ import annotations

import asyncio
import socket
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.client.frames import SCRATCH_BYTES, FrameError, FrameProtocol


class FakeTransport:
    def __init__(self, protocol: FrameProtocol):
        self.protocol = protocol
        self.aborted = False

    def get_extra_info(self, name: str):
        return None

    def abort(self) -> None:
        if not self.aborted:
            self.aborted = True
            self.protocol.connection_lost(None)


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def feed(protocol: FrameProtocol, data: bytes, chunk_sizes: list[int]) -> None:
    """As the event loop does: ask for a buffer, receive at most its size into it."""
    pos, sizes = 0, iter(chunk_sizes)
    while pos < len(data) and not protocol.transport.aborted:
        buffer = protocol.get_buffer(-1)
        n = min(len(buffer), len(data) - pos, next(sizes, len(data)))
        assert n > 0
        buffer[:n] = data[pos : pos + n]
        protocol.buffer_updated(n)
        pos += n


def new_protocol(max_frame_bytes: int = 1 << 24):
    got, lost = [], []
    protocol = FrameProtocol(max_frame_bytes)
    protocol.on_frame = lambda frame: got.append(bytes(frame))
    protocol.on_lost = lost.append
    protocol.connection_made(FakeTransport(protocol))
    return protocol, got, lost


bodies = st.lists(
    st.one_of(st.binary(min_size=4, max_size=300),
              st.integers(SCRATCH_BYTES - 8, 3 * SCRATCH_BYTES).map(lambda n: bytes([n % 251]) * n)),
    min_size=1, max_size=12)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(bodies, st.lists(st.integers(1, 100_000), max_size=60))
def test_every_split_of_the_stream_gives_the_frames_in_order(frames, chunk_sizes):
    async def main():
        protocol, got, lost = new_protocol()
        feed(protocol, b"".join(framed(f) for f in frames), chunk_sizes)
        assert got == frames
        assert lost == []

    asyncio.run(main())


def test_a_large_frame_is_received_into_its_own_buffer():
    async def main():
        protocol, got, _ = new_protocol()
        body = bytes(range(256)) * 4096  # 1 MiB
        data = framed(b"tiny") + framed(body)
        feed(protocol, data[:100], [])  # the small frame and the large one's first bytes
        buffer = protocol.get_buffer(-1)
        assert len(buffer) == len(body) - (100 - 8 - 4)  # the rest of the large frame, no more
        feed(protocol, data[100:], [])
        assert got == [b"tiny", body]
        assert len(protocol.get_buffer(-1)) == SCRATCH_BYTES  # back to the scratch buffer

    asyncio.run(main())


def test_an_impossible_size_ends_the_connection_with_a_frame_error():
    async def main():
        protocol, got, lost = new_protocol(max_frame_bytes=1000)
        feed(protocol, framed(b"good") + struct.pack(">i", 1001) + b"x" * 10, [])
        assert got == [b"good"]
        assert len(lost) == 1 and isinstance(lost[0], FrameError) and "1001 bytes" in str(lost[0])
        assert protocol.transport.aborted

    asyncio.run(main())


def test_on_frame_raising_ends_the_connection_with_its_error():
    async def main():
        protocol, _, lost = new_protocol()

        def refuse(frame):
            raise ValueError("not asked for")

        protocol.on_frame = refuse
        feed(protocol, framed(b"answer"), [])
        assert [str(e) for e in lost] == ["not asked for"]

    asyncio.run(main())


def test_through_a_socket_with_backpressure_on_the_writer():
    """Pipelined small frames and a 6 MB one arrive whole; a writer whose peer does not read
    waits in drain until it does."""

    async def main():
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        transport, protocol = await loop.connect_accepted_socket(
            lambda: FrameProtocol(1 << 24), ours
        )
        got = []
        protocol.on_frame = got.append
        frames = [b"a" * 10, b"b" * (6 << 20), b"c" * 20]
        await loop.sock_sendall(theirs, b"".join(framed(f) for f in frames))
        await asyncio.wait_for(_until(lambda: len(got) == 3), 10)
        assert [bytes(f) for f in got] == frames

        transport.write(b"x" * (8 << 20))  # the peer reads nothing yet: over the high mark
        drained = asyncio.ensure_future(protocol.drain())
        await asyncio.sleep(0)
        assert not drained.done()
        received = 0
        while received < 8 << 20:
            received += len(await loop.sock_recv(theirs, 1 << 20))
        await asyncio.wait_for(drained, 10)
        transport.close()
        theirs.close()
        await asyncio.wait_for(protocol.closed, 10)

    asyncio.run(main())


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.001)
