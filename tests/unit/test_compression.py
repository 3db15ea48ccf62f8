"""Every codec round-trips through encode_batch and iter_records; both snappy framings decode;
a corrupt compressed payload is a CorruptRecordError naming the codec, for the consumer a
CORRUPT_MESSAGE error, and a row in `log dump`."""

from __future__ import annotations

import gzip
import struct

import cramjam
import pytest

from localcluster.client.consumer import parse_records
from localcluster.client.producer import AsyncProducer
from localcluster.storage import Log, compression
from localcluster.storage import record_batch as rb
from localcluster.storage.record_batch import (
    BatchSpec,
    CorruptRecordError,
    Record,
    encode_batch,
    iter_records,
    validate_batch,
)
from localcluster.tools import log_dump

CODECS = ["gzip", "snappy", "lz4", "zstd"]


def records(n: int = 50) -> list[Record]:
    return [Record(b"value-%d-" % i + b"x" * (i % 20), key=b"k%d" % i, headers=(("h", b"%d" % i),),
                   timestamp=1000 + i) for i in range(n)]  # fmt: skip


def payload(data: bytes) -> bytes:
    return data[rb.HEADER_SIZE :]


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_round_trips(codec):
    original = records()
    data = encode_batch(original, BatchSpec(base_offset=7, attributes=compression.codec_id(codec)))
    header = validate_batch(data)
    assert rb.COMPRESSION_NAMES[header.compression] == codec
    assert len(data) < len(encode_batch(original, BatchSpec(base_offset=7)))  # it did compress
    decoded = list(iter_records(data))
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in decoded] == [
        (7 + i, r.key, r.value, r.headers, r.timestamp) for i, r in enumerate(original)
    ]


def test_payloads_are_in_the_framings_kafkas_java_client_writes():
    body = payload(encode_batch(records()))
    assert gzip.decompress(compression.compress(compression.GZIP, body)) == body
    snappy = compression.compress(compression.SNAPPY, body)
    assert snappy.startswith(b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01")
    assert bytes(cramjam.lz4.decompress(compression.compress(compression.LZ4, body))) == body
    assert compression.compress(compression.LZ4, body)[:4] == b"\x04\x22\x4d\x18"  # frame magic
    assert compression.compress(compression.ZSTD, body)[:4] == b"\x28\xb5\x2f\xfd"


def test_snappy_decodes_a_raw_block_as_librdkafka_writes_and_many_framed_blocks():
    body = b"".join(bytes([i % 251]) * 3 for i in range(100_000))  # over three 32 KiB blocks
    raw_block = bytes(cramjam.snappy.compress_raw(body))
    assert compression.decompress(compression.SNAPPY, raw_block) == body
    framed = compression.compress(compression.SNAPPY, body)
    assert len(framed) > 16 + 3 * 4  # header, then one length-prefixed block per 32 KiB
    assert compression.decompress(compression.SNAPPY, framed) == body


def corrupt_batch(codec: str) -> bytes:
    """A batch with a valid CRC whose compressed payload is garbage past its first bytes."""
    good = encode_batch(records(), BatchSpec(attributes=compression.codec_id(codec)))
    body = bytearray(payload(good))
    keep = 20 if codec == "snappy" else 4  # magic (and block length) stay: the codec refuses
    body[keep:] = bytes((b ^ 0x5A) for b in body[keep:])
    header = validate_batch(good)
    return rb.encode_raw_batch(bytes(body), header.records_count,
                               BatchSpec(attributes=header.attributes,
                                         base_timestamp=header.base_timestamp),
                               max_timestamp=header.max_timestamp)  # fmt: skip


@pytest.mark.parametrize("codec", CODECS)
def test_a_corrupt_compressed_payload_is_a_clear_error(codec):
    data = corrupt_batch(codec)
    validate_batch(data)  # header and CRC are fine: only the payload is bad
    with pytest.raises(CorruptRecordError, match=f"batch at offset 0: {codec} payload"):
        list(iter_records(data))


@pytest.mark.parametrize(
    "framed",
    [b"\x82SNAPPY\x00\x00\x00", b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, 500) + b"ab",
     b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + b"\x00\x00"],
    ids=["header cut", "block past the end", "length cut"],
)  # fmt: skip
def test_a_cut_snappy_framing_is_a_clear_error(framed):
    with pytest.raises(compression.CompressionError, match="snappy"):
        compression.decompress(compression.SNAPPY, framed)


def test_a_decompression_bomb_is_refused(monkeypatch):
    monkeypatch.setattr(compression, "MAX_DECOMPRESSED_BYTES", 1000)
    for codec in (compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD):
        with pytest.raises(compression.CompressionError, match="expands"):
            compression.decompress(codec, compression.compress(codec, b"\0" * 5000))


def test_records_that_do_not_fill_the_decompressed_payload_are_corrupt():
    body = payload(encode_batch(records(3))) + b"extra"
    data = rb.encode_raw_batch(compression.compress(compression.ZSTD, body), 3,
                               BatchSpec(attributes=compression.ZSTD))  # fmt: skip
    with pytest.raises(CorruptRecordError, match="5 bytes follow its 3 records"):
        list(iter_records(data))


def test_an_unknown_codec_id_is_a_clear_error():
    data = rb.encode_raw_batch(b"whatever", 1, BatchSpec(attributes=6))
    with pytest.raises(CorruptRecordError, match="codec id 6 is not one of Kafka's"):
        list(iter_records(data))


def test_the_consumer_reads_every_codec_and_reports_a_corrupt_one():
    data = b"".join(encode_batch(records(5), BatchSpec(base_offset=5 * i, attributes=i))
                    for i in range(5))  # none, gzip, snappy, lz4, zstd  # fmt: skip
    got, next_offset = parse_records(("t", 0), data, 0)
    assert [r.offset for r in got] == list(range(25)) and next_offset == 25
    with pytest.raises(CorruptRecordError, match="lz4 payload"):
        parse_records(("t", 0), corrupt_batch("lz4"), 0)


def test_producer_compression_type_is_checked_by_name():
    with pytest.raises(ValueError, match="compression.type='brotli'"):
        AsyncProducer(bootstrap_servers="127.0.0.1:1", compression_type="brotli")
    assert AsyncProducer(bootstrap_servers="127.0.0.1:1", compression_type="ZSTD")._codec == 4


def test_log_dump_shows_compressed_records_and_a_corrupt_batch(tmp_path, capsys):
    log = Log.open(tmp_path / "t-0")
    try:
        for codec in CODECS:
            log.append(encode_batch([Record(f"in-{codec}".encode(), key=b"k")],
                                    BatchSpec(attributes=compression.codec_id(codec))), 0)  # fmt: skip
        log.append(corrupt_batch("gzip"), 0)
        log.flush()
    finally:
        log.close()
    assert log_dump.dump(tmp_path / "t-0", show_records=True) == 0
    out = capsys.readouterr().out
    for codec in CODECS:
        assert f"k=in-{codec}" in out
    assert "records unreadable" in out and "gzip payload" in out


@pytest.mark.parametrize("codec", CODECS)
def test_the_leader_refuses_a_corrupt_or_miscounted_compressed_batch_and_appends_nothing(
    tmp_path, codec
):
    from localcluster.broker.log_manager import LogManager, check_compressed_batches
    from localcluster.storage import LogConfig

    good = encode_batch(records(), BatchSpec(attributes=compression.codec_id(codec)))
    check_compressed_batches(good, list(rb.iter_batches(good)))  # a good one passes
    header = validate_batch(good)
    miscounted = rb.encode_raw_batch(payload(good), header.records_count + 1,
                                     BatchSpec(attributes=header.attributes,
                                               base_timestamp=header.base_timestamp),
                                     max_timestamp=header.max_timestamp)  # fmt: skip
    manager = LogManager(tmp_path / "data", tmp_path, lambda _: LogConfig(segment_bytes=1 << 20),
                         lambda: 0, 86_400_000)  # fmt: skip
    manager.get_or_create(("t", 0))
    for bad in (corrupt_batch(codec), miscounted):
        with pytest.raises(CorruptRecordError):
            manager.append_as_leader(("t", 0), memoryview(good + bad), 0)
    assert manager.logs[("t", 0)].log_end_offset == 0, "nothing of a refused produce is written"
    manager.close({})
