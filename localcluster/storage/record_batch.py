"""Kafka's RecordBatch v2 (magic 2): encode, validate, iterate, patch in place.

The broker stores client batches verbatim. The only bytes it ever rewrites are baseOffset and
partitionLeaderEpoch, which sit before the CRC's range (attributes .. end), so a rewritten batch
keeps its client's CRC. Compressed batches are validated by header and CRC only; their records
are never decoded by the broker. Readers (`iter_records`) decode every codec through
storage/compression.py, and `encode_batch` compresses when the spec's attributes name a codec.

Batch layout (big-endian):
    0  baseOffset int64         8  batchLength int32 (bytes after this field)
    12 partitionLeaderEpoch int32   16 magic int8   17 crc uint32 (CRC-32C of 21..end)
    21 attributes int16         23 lastOffsetDelta int32    27 baseTimestamp int64
    35 maxTimestamp int64       43 producerId int64         51 producerEpoch int16
    53 baseSequence int32       57 recordsCount int32       61 records...
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import crc32c as _crc32c

from localcluster.storage import compression

MAGIC = 2
HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes batchLength does not count
CRC_START = 21
NO_PARTITION_LEADER_EPOCH = -1
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
COMPRESSION_NAMES = compression.CODEC_NAMES

_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_TIMESTAMPS = struct.Struct(">qq")  # baseTimestamp, maxTimestamp (at byte 27)
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")


class CorruptRecordError(ValueError):
    """A batch failed validation; Kafka answers such a produce with CORRUPT_MESSAGE."""


@dataclass(slots=True)  # not frozen: building a frozen one costs 6x more, per batch
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies in a log."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)


@dataclass(frozen=True, slots=True)
class Record:
    """One record. `offset` and `timestamp` are absolute once read from a batch."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp: int | None = None
    offset: int | None = None


@dataclass(slots=True)
class BatchSpec:
    """What `encode_batch` needs beyond the records; defaults are a plain producer's."""

    base_offset: int = 0
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH
    base_timestamp: int = 0
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    base_sequence: int = NO_SEQUENCE
    attributes: int = 0


def crc32c(data) -> int:
    return _crc32c.crc32c(data)


# -- varints (zig-zag, as in Kafka's ByteUtils) --------------------------------------------------


def _write_varint(out: bytearray, value: int) -> None:
    v = (value << 1) ^ (value >> 63)
    v &= 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _read_varint(buf, pos: int) -> tuple[int, int]:
    shift = 0
    raw = 0
    while True:
        if pos >= len(buf):
            raise CorruptRecordError("record varint runs past the end of the batch")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptRecordError("record varint longer than 10 bytes")
    return (raw >> 1) ^ -(raw & 1), pos


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(data))
        out += data


def _read_bytes(buf, pos: int) -> tuple[bytes | None, int]:
    length, pos = _read_varint(buf, pos)
    if length < 0:
        return None, pos
    end = pos + length
    if end > len(buf):
        raise CorruptRecordError("record field runs past the end of the batch")
    return bytes(buf[pos:end]), end


# -- encoding ---------------------------------------------------------------------------------


def encode_record(record: Record, offset_delta: int, timestamp_delta: int) -> bytes:
    body = bytearray()
    body.append(0)  # record attributes: unused in v2
    _write_varint(body, timestamp_delta)
    _write_varint(body, offset_delta)
    _write_bytes(body, record.key)
    _write_bytes(body, record.value)
    _write_varint(body, len(record.headers))
    for name, value in record.headers:
        _write_bytes(body, name.encode())
        _write_bytes(body, value)
    out = bytearray()
    _write_varint(out, len(body))
    out += body
    return bytes(out)


def encode_batch(records: Sequence[Record], spec: BatchSpec | None = None) -> bytes:
    """A v2 batch holding `records`, offsets relative to `spec.base_offset`; its records are
    compressed with the codec `spec.attributes` names (none by default)."""
    assert records, "a record batch holds at least one record"
    spec = spec or BatchSpec()
    base_ts = spec.base_timestamp
    if records[0].timestamp is not None and spec.base_timestamp == 0:
        base_ts = records[0].timestamp
    body = bytearray()
    max_ts = None  # the largest record timestamp; the base may lie above every record's
    for delta, record in enumerate(records):
        ts = base_ts if record.timestamp is None else record.timestamp
        max_ts = ts if max_ts is None else max(max_ts, ts)
        body += encode_record(record, delta, ts - base_ts)
    codec = spec.attributes & COMPRESSION_MASK
    payload = compression.compress(codec, body) if codec else bytes(body)
    return _assemble(spec, len(records) - 1, base_ts, max_ts, len(records), payload)


def encode_raw_batch(
    payload: bytes, records_count: int, spec: BatchSpec, max_timestamp: int | None = None
) -> bytes:
    """A batch around an already encoded (e.g. compressed) records payload."""
    max_ts = spec.base_timestamp if max_timestamp is None else max_timestamp
    return _assemble(spec, records_count - 1, spec.base_timestamp, max_ts, records_count, payload)


def _assemble(spec: BatchSpec, last_delta: int, base_ts: int, max_ts: int, count: int, body: bytes):
    after_crc = bytearray(HEADER_SIZE - CRC_START)
    struct.pack_into(
        ">hiqqqhii", after_crc, 0, spec.attributes, last_delta, base_ts, max_ts,
        spec.producer_id, spec.producer_epoch, spec.base_sequence, count,
    )  # fmt: skip
    after_crc += body
    crc = crc32c(after_crc)
    head = struct.pack(
        ">qiibI", spec.base_offset, len(after_crc) + 9, spec.partition_leader_epoch, MAGIC, crc
    )
    return head + bytes(after_crc)


# -- reading and validation -------------------------------------------------------------------


def read_header(buf, position: int = 0) -> BatchHeader:
    """The header at `position`; checks nothing but that 61 bytes are there."""
    if len(buf) - position < HEADER_SIZE:
        raise CorruptRecordError(
            f"batch header needs {HEADER_SIZE} bytes, {len(buf) - position} remain"
        )
    return BatchHeader(*_HEADER.unpack_from(buf, position))


def validate_batch(buf, position: int = 0, *, check_crc: bool = True) -> BatchHeader:
    """Validate the batch that starts at `position` and return its header.

    Raises CorruptRecordError naming the first thing wrong: magic, a batchLength that does not
    fit the bytes, recordsCount != lastOffsetDelta + 1, or a CRC-32C mismatch.
    """
    available = len(buf) - position
    if available < LOG_OVERHEAD:
        raise CorruptRecordError(f"batch needs at least {LOG_OVERHEAD} bytes, {available} remain")
    _, batch_length = _OFFSET_AND_LENGTH.unpack_from(buf, position)
    if batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(
            f"batchLength {batch_length} is below the v2 header's "
            f"{HEADER_SIZE - LOG_OVERHEAD} bytes"
        )
    if batch_length + LOG_OVERHEAD > available:
        raise CorruptRecordError(
            f"batchLength {batch_length} runs past the {available - LOG_OVERHEAD} bytes present"
        )
    header = BatchHeader(*_HEADER.unpack_from(buf, position))
    if header.magic != MAGIC:
        raise CorruptRecordError(f"magic {header.magic} is not supported (only v2 batches)")
    if header.records_count != header.last_offset_delta + 1 or header.records_count < 1:
        raise CorruptRecordError(
            f"recordsCount {header.records_count} != lastOffsetDelta {header.last_offset_delta} + 1"
        )
    if check_crc:
        end = position + header.size
        view = buf[position + CRC_START : end]
        actual = crc32c(view)
        if isinstance(view, memoryview):
            view.release()
        if actual != header.crc:
            raise CorruptRecordError(
                f"CRC-32C mismatch: stored {header.crc:#010x}, computed {actual:#010x}"
            )
    return header


# The one walk over concatenated batches: everything that steps from batch to batch (the log's
# appends and recovery, fetch responses in the follower and the consumer, message.max.bytes,
# log dump, the tests' scans) goes through batch_spans, or iter_batches on top of it.


def batch_spans(buf, position: int = 0) -> Iterator[tuple[int, int]]:
    """(position, size) of each whole batch from `position`, by its batchLength alone.

    Validates nothing else (for code that must not raise on what a peer sent: the log
    validates at append). Ends at the first batch cut short by the end of `buf` (a fetch
    response ends where its byte limit fell) or with a batchLength below a header's."""
    end = len(buf)
    while end - position >= LOG_OVERHEAD:
        size = _OFFSET_AND_LENGTH.unpack_from(buf, position)[1] + LOG_OVERHEAD
        if size < HEADER_SIZE or position + size > end:
            return
        yield position, size
        position += size


def iter_batches(
    buf, position: int = 0, *, check_crc: bool = True, complete_only: bool = False
) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each valid batch from `position`; raises CorruptRecordError at
    the first bad one, a torn tail included. complete_only: a last batch cut short by the end
    of `buf` (a fetch response) ends the walk instead; a bad whole batch still raises."""
    stop = position
    for start, size in batch_spans(buf, position):
        yield start, validate_batch(buf, start, check_crc=check_crc)
        stop = start + size
    if stop < len(buf) and not (complete_only and _cut_short(buf, stop)):
        validate_batch(buf, stop, check_crc=check_crc)  # raises, saying what is wrong there
        raise AssertionError("batch_spans stopped before a valid batch")  # pragma: no cover


def _cut_short(buf, position: int) -> bool:
    """The bytes from `position` are the start of a batch that runs past the end of buf."""
    available = len(buf) - position
    return (available < LOG_OVERHEAD
            or _OFFSET_AND_LENGTH.unpack_from(buf, position)[1] + LOG_OVERHEAD > available)  # fmt: skip


def iter_records(batch) -> Iterator[Record]:
    """The records of one batch, decompressed if need be, with absolute offsets and timestamps.

    Raises CorruptRecordError for a batch that fails validation, a payload its codec refuses,
    or records that do not parse or do not number recordsCount.
    """
    header = validate_batch(batch, 0)
    buf = memoryview(batch)[HEADER_SIZE : header.size]
    if header.compression:
        try:
            buf = memoryview(compression.decompress(header.compression, buf))
        except compression.CompressionError as e:
            raise CorruptRecordError(f"batch at offset {header.base_offset}: {e}") from None
    pos = 0
    for _ in range(header.records_count):
        record, pos = _read_record(buf, pos, header)
        yield record
    if pos != len(buf):
        raise CorruptRecordError(
            f"batch at offset {header.base_offset}: {len(buf) - pos} bytes follow its "
            f"{header.records_count} records"
        )


def _read_record(buf, pos: int, header: BatchHeader) -> tuple[Record, int]:
    length, pos = _read_varint(buf, pos)
    end = pos + length
    if length < 0 or end > len(buf):
        raise CorruptRecordError("record length runs past the end of the batch")
    pos += 1  # attributes
    ts_delta, pos = _read_varint(buf, pos)
    offset_delta, pos = _read_varint(buf, pos)
    key, pos = _read_bytes(buf, pos)
    value, pos = _read_bytes(buf, pos)
    count, pos = _read_varint(buf, pos)
    headers = []
    for _ in range(count):
        name, pos = _read_bytes(buf, pos)
        hvalue, pos = _read_bytes(buf, pos)
        headers.append(((name or b"").decode(errors="replace"), hvalue))
    if pos != end:
        raise CorruptRecordError("record length does not match its fields")
    record = Record(value=value, key=key, headers=tuple(headers),
                    timestamp=header.base_timestamp + ts_delta,
                    offset=header.base_offset + offset_delta)  # fmt: skip
    return record, end


# -- in-place rewrites (outside the CRC's range) ----------------------------------------------


def set_base_offset(buf, position: int, base_offset: int) -> None:
    _INT64.pack_into(buf, position, base_offset)


def set_partition_leader_epoch(buf, position: int, epoch: int) -> None:
    _INT32.pack_into(buf, position + 12, epoch)


def set_create_time(buf: bytearray, timestamp_ms: int, position: int = 0) -> None:
    """Date the records of the batch at `position` at `timestamp_ms`: baseTimestamp set to it,
    maxTimestamp moved with it (the records' deltas stay). Both lie inside the CRC's range,
    which the caller computes anew."""
    base_timestamp, max_timestamp = _TIMESTAMPS.unpack_from(buf, position + 27)
    _TIMESTAMPS.pack_into(buf, position + 27, timestamp_ms,
                          timestamp_ms + max_timestamp - base_timestamp)  # fmt: skip


def with_log_append_time(records, now_ms: int) -> bytearray:
    """A copy of `records` whose every batch says LogAppendTime at `now_ms`, as Kafka's leader
    stamps them (message.timestamp.type=LogAppendTime): the timestamp-type attribute bit and
    maxTimestamp are inside the CRC's range, so each batch's CRC-32C is computed again. The
    records' own deltas stay; a reader takes maxTimestamp for every record of such a batch."""
    out = bytearray(records)
    for position, header in iter_batches(out, check_crc=False):
        _INT16.pack_into(out, position + CRC_START, header.attributes | TIMESTAMP_TYPE_MASK)
        _INT64.pack_into(out, position + 35, now_ms)  # maxTimestamp
        end = position + header.size
        _UINT32.pack_into(out, position + 17, crc32c(memoryview(out)[position + CRC_START : end]))
    return out
