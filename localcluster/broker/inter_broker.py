"""A broker's connection to another broker's Unix socket: requests out, responses back in order.

Used by follower fetchers (Fetch, OffsetForLeaderEpoch) and, later, the controller's channel
(LeaderAndIsr, StopReplica). One request at a time per connection, which is how the receiving
broker processes them anyway; a fetcher that wants parallelism opens a connection per leader.
"""

from __future__ import annotations

import asyncio
import socket
import struct

from localcluster.protocol.api import RequestHeader, is_flexible, write_request_header
from localcluster.protocol.wire import Reader, Writer

_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES = 256 * 1024 * 1024


class BrokerConnection:
    def __init__(self, path: str, client_id: str):
        self.path = path
        self.client_id = client_id
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation_id = 0
        self._lock = asyncio.Lock()

    async def connect(self, timeout_s: float = 5.0) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_unix_connection(self.path, limit=1 << 20), timeout_s)  # fmt: skip
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def request(self, api_key: int, version: int, body: bytes,
                      timeout_s: float = 30.0) -> Reader:  # fmt: skip
        """Send one request; return a Reader positioned at the response body."""
        async with self._lock:
            if not self.connected:
                await self.connect()
            self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
            header = Writer()
            write_request_header(header, RequestHeader(api_key, version, self._correlation_id,
                                                       self.client_id))  # fmt: skip
            payload = bytes(header.buf) + body
            self._writer.write(_SIZE.pack(len(payload)) + payload)
            try:
                size_bytes = await asyncio.wait_for(self._reader.readexactly(4), timeout_s)
                (size,) = _SIZE.unpack(size_bytes)
                if not 4 <= size <= MAX_RESPONSE_BYTES:
                    raise ConnectionError(f"response size {size} from {self.path} is impossible")
                frame = await asyncio.wait_for(self._reader.readexactly(size), timeout_s)
            except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError):
                self.close()
                raise
            reader = Reader(frame)
            correlation_id = reader.int32()
            if correlation_id != self._correlation_id:
                self.close()
                raise ConnectionError(f"{self.path} answered correlation id {correlation_id}, "
                                      f"expected {self._correlation_id}")  # fmt: skip
            if is_flexible(api_key, version):
                reader.skip_tagged_fields()
            return reader

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None
        self._reader = None
