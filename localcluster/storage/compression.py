"""The record batch codecs: gzip, snappy, lz4 and zstd, compressed and decompressed by cramjam.

A compressed RecordBatch v2 keeps its 61-byte header in the clear and compresses only the
records after it; the codec is the low three bits of the attributes (Kafka's CompressionType
ids: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd). Every reader of records (the consumer, `log
dump`, the chaos checker through the consumer) goes through `decompress` here, so a codec is
added or fixed in one place.

The framings are those Kafka's clients write for v2 batches:
- gzip: a gzip stream (Java's GZIPOutputStream, librdkafka's zlib with the gzip header).
- snappy: the Java client and kafka-python wrap raw snappy blocks in snappy-java's
  SnappyOutputStream framing (the "xerial" framing: a 16-byte header starting
  b"\\x82SNAPPY\\x00", then blocks of [int32 compressed length][raw block]); librdkafka writes
  one raw snappy block. snappy-java's reader takes both, so `decompress` does too (by the magic).
- lz4: the LZ4 frame format (KIP-57 fixed the header checksum for message format v1 and later).
- zstd: a zstd frame.

A payload the codec refuses raises CompressionError naming the codec, never a codec's own
exception, so a corrupt batch is a clear error for the caller (CORRUPT_MESSAGE for a client).
A payload that expands past MAX_DECOMPRESSED_BYTES is refused too (a snappy block before it is
decoded, by the length it declares; the streaming codecs once decoded).
"""

from __future__ import annotations

import struct

import cramjam

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
CODEC_IDS = {name: codec for codec, name in CODEC_NAMES.items()}

# Far above any batch a broker accepts (message.max.bytes is 1 MiB by default) even at
# compression ratios of 100:1, and far below what would hurt a reader.
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")  # magic, version, compatible version (both 1)
_INT32 = struct.Struct(">i")
XERIAL_BLOCK_BYTES = 32 * 1024  # snappy-java's default block size


class CompressionError(ValueError):
    """A payload a codec could not decompress, or a codec id that names none."""


def codec_id(name: str) -> int:
    """The codec id of a `compression.type` value (Kafka's names, any case)."""
    try:
        return CODEC_IDS[str(name).lower()]
    except KeyError:
        raise ValueError(f"compression.type={name!r}: use one of {', '.join(CODEC_IDS)}") from None


def compress(codec: int, data) -> bytes:
    """`data` compressed with `codec` in the framing Kafka's Java client writes."""
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        return _xerial_compress(data)
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise CompressionError(f"no codec {_name(codec)} to compress with")


def decompress(codec: int, data) -> bytes:
    """The records payload `data` of a batch compressed with `codec`, decompressed."""
    name = _name(codec)
    try:
        if codec == GZIP:
            out = cramjam.gzip.decompress(data)
        elif codec == SNAPPY:
            out = _snappy_decompress(data)
        elif codec == LZ4:
            out = cramjam.lz4.decompress(data)
        elif codec == ZSTD:
            out = cramjam.zstd.decompress(data)
        else:
            raise CompressionError(f"compression codec {name} is not one of Kafka's")
    except cramjam.DecompressionError as e:
        raise CompressionError(
            f"{name} payload of {len(data)} bytes does not decompress: {e}"
        ) from None
    out = bytes(out)
    if len(out) > MAX_DECOMPRESSED_BYTES:
        raise CompressionError(
            f"{name} payload expands to {len(out)} bytes, over {MAX_DECOMPRESSED_BYTES}"
        )
    return out


def _name(codec: int) -> str:
    return CODEC_NAMES.get(codec, f"id {codec}")


# -- snappy: raw blocks and snappy-java's framing -----------------------------------------------


def _xerial_compress(data) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1)]
    for start in range(0, len(view), XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_BYTES]))
        parts += (_INT32.pack(len(block)), block)
    return b"".join(parts)


def _snappy_decompress(data) -> bytes:
    view = memoryview(data)
    if bytes(view[: len(XERIAL_MAGIC)]) != XERIAL_MAGIC:
        return _snappy_block(view, 0)  # librdkafka: one raw block
    if len(view) < _XERIAL_HEADER.size:
        raise CompressionError(f"snappy framing header cut at {len(view)} bytes")
    out, pos, total = [], _XERIAL_HEADER.size, 0
    while pos < len(view):  # bounded: every block moves pos forward by at least 4 bytes
        if len(view) - pos < _INT32.size:
            raise CompressionError(f"snappy block length cut at byte {pos} of {len(view)}")
        (length,) = _INT32.unpack_from(view, pos)
        pos += _INT32.size
        if length < 0 or pos + length > len(view):
            raise CompressionError(
                f"snappy block of {length} bytes at byte {pos} runs past the {len(view)} bytes"
            )
        block = _snappy_block(view[pos : pos + length], total)
        total += len(block)
        out.append(block)
        pos += length
    return b"".join(out)


def _snappy_block(block, decoded_before: int) -> bytes:
    """One raw snappy block, refused before decoding when it would pass the bound."""
    if decoded_before + cramjam.snappy.decompress_raw_len(block) > MAX_DECOMPRESSED_BYTES:
        raise CompressionError(f"snappy payload expands past {MAX_DECOMPRESSED_BYTES} bytes")
    return bytes(cramjam.snappy.decompress_raw(block))
