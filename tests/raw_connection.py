"""A plain blocking TCP connection that speaks Kafka framing, for protocol tests.

Nothing clever, so it cannot hide a broker bug: it writes a frame, reads the next one, checks
the correlation id. The broker closing the connection shows as `recv_frame() is None`.
"""

from __future__ import annotations

import socket
import struct

from localcluster.protocol.api import ApiKey, RequestHeader, is_flexible, write_request_header
from localcluster.protocol.wire import Reader, Writer


class RawConnection:
    def __init__(self, port: int, timeout_s: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.local_port = self.sock.getsockname()[1]
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def frame(self, api_key: int, version: int, body: bytes) -> bytes:
        self.correlation_id += 1
        w = Writer()
        write_request_header(w, RequestHeader(api_key, version, self.correlation_id, "raw-test"))
        w.bytes(body)
        return struct.pack(">i", len(w.buf)) + bytes(w.buf)

    def send(self, api_key: int, version: int, body: bytes) -> int:
        self.sock.sendall(self.frame(api_key, version, body))
        return self.correlation_id

    def recv_frame(self) -> bytes | None:
        """The next response frame, or None when the broker closed the connection."""
        head = self._recv_exactly(4)
        if head is None:
            return None
        body = self._recv_exactly(struct.unpack(">i", head)[0])
        assert body is not None, "the broker closed in the middle of a response"
        return body

    def recv(self, api_key: int, version: int, correlation_id: int) -> tuple[bytes, int]:
        """(response frame, offset of its body) after checking the correlation id."""
        data = self.recv_frame()
        assert data is not None, f"connection closed instead of answering {api_key} v{version}"
        reader = Reader(data)
        assert reader.int32() == correlation_id
        if api_key != ApiKey.API_VERSIONS and is_flexible(api_key, version):
            reader.skip_tagged_fields()
        return data, reader.pos

    def closed_by_broker(self) -> bool:
        return self.recv_frame() is None

    def _recv_exactly(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)
