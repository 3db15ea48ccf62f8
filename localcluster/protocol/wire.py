"""Kafka's primitive types for the hand-written hot path (Produce, Fetch) and the headers.

`Reader` walks a memoryview with bounds checks: any read past the end, a negative length where
none is allowed, or an absurd array count raises MalformedRequestError, never IndexError, so a
bad frame is always reported as one. `Writer` appends to a bytearray. Big-endian throughout.
Everything else is encoded by kio from Kafka's JSON schemas (see messages.py).
"""

from __future__ import annotations

import struct

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")

MAX_ARRAY_LENGTH = 1 << 20  # no request of ours carries more elements than this


class MalformedRequestError(ValueError):
    """The bytes do not parse as the request they claim to be; the connection is closed."""


class Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf, pos: int = 0):
        self.buf = memoryview(buf)
        self.pos = pos

    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def _take(self, s: struct.Struct) -> int:
        pos = self.pos
        if pos + s.size > len(self.buf):
            raise MalformedRequestError(
                f"needs {s.size} bytes at {pos}, frame ends at {len(self.buf)}"
            )
        self.pos = pos + s.size
        return s.unpack_from(self.buf, pos)[0]

    def fields(self, s: struct.Struct) -> tuple:
        """Several fixed-size fields at once (one bounds check, one unpack): the hot path's
        per-partition blocks."""
        pos = self.pos
        end = pos + s.size
        if end > len(self.buf):
            raise MalformedRequestError(
                f"needs {s.size} bytes at {pos}, frame ends at {len(self.buf)}"
            )
        self.pos = end
        return s.unpack_from(self.buf, pos)

    def int8(self) -> int:
        return self._take(_I8)

    def int16(self) -> int:
        return self._take(_I16)

    def int32(self) -> int:
        return self._take(_I32)

    def int64(self) -> int:
        return self._take(_I64)

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            if self.pos >= len(self.buf):
                raise MalformedRequestError("varint runs past the end of the frame")
            b = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 35:
                raise MalformedRequestError("unsigned varint longer than 5 bytes")

    def raw(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise MalformedRequestError(f"field of {n} bytes at {self.pos} runs past the frame")
        view = self.buf[self.pos : self.pos + n]
        self.pos += n
        return view

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise MalformedRequestError("null where a string is required")
        return self._decode(self.raw(n))

    def nullable_string(self) -> str | None:
        n = self.int16()
        return None if n < 0 else self._decode(self.raw(n))

    def compact_nullable_string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n < 0 else self._decode(self.raw(n))

    def nullable_bytes(self) -> memoryview | None:
        n = self.int32()
        return None if n < 0 else self.raw(n)

    def array_length(self) -> int:
        n = self.int32()
        if n > MAX_ARRAY_LENGTH or n > self.remaining():
            raise MalformedRequestError(f"array of {n} elements cannot fit the frame")
        return max(n, 0)

    def int32_array(self) -> tuple[int, ...]:
        """An array of int32 (its int32 length, then the elements) in one unpack: a
        LeaderAndIsr or UpdateMetadata of 10,000 partitions holds 20,000 of them."""
        n = self.array_length()
        pos = self.pos
        end = pos + 4 * n
        if end > len(self.buf):
            raise MalformedRequestError(f"array of {n} int32 at {pos} runs past the frame")
        self.pos = end
        return struct.unpack_from(f">{n}i", self.buf, pos)

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.raw(self.uvarint())

    @staticmethod
    def _decode(view: memoryview) -> str:
        try:
            return str(view, "utf-8")
        except UnicodeDecodeError:
            raise MalformedRequestError("string is not valid UTF-8") from None


class Writer:
    __slots__ = ("buf",)

    def __init__(self):
        self.buf = bytearray()

    def fields(self, s: struct.Struct, *values) -> Writer:
        """Several fixed-size fields at once (the counterpart of Reader.fields)."""
        self.buf += s.pack(*values)
        return self

    def int8(self, v: int) -> Writer:
        self.buf += _I8.pack(v)
        return self

    def int16(self, v: int) -> Writer:
        self.buf += _I16.pack(v)
        return self

    def int32(self, v: int) -> Writer:
        self.buf += _I32.pack(v)
        return self

    def uint32(self, v: int) -> Writer:
        self.buf += _U32.pack(v)
        return self

    def int64(self, v: int) -> Writer:
        self.buf += _I64.pack(v)
        return self

    def int32_array(self, values) -> Writer:
        """The counterpart of Reader.int32_array."""
        self.buf += struct.pack(f">i{len(values)}i", len(values), *values)
        return self

    def string(self, s: str) -> Writer:
        data = s.encode()
        self.buf += _I16.pack(len(data))
        self.buf += data
        return self

    def nullable_string(self, s: str | None) -> Writer:
        return self.int16(-1) if s is None else self.string(s)

    def uvarint(self, v: int) -> Writer:
        while v >= 0x80:
            self.buf.append((v & 0x7F) | 0x80)
            v >>= 7
        self.buf.append(v)
        return self

    def bytes(self, data) -> Writer:
        self.buf += data
        return self

    def getvalue(self) -> bytes:
        return bytes(self.buf)
