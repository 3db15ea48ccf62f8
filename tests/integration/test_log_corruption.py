"""Corruption: flipped bytes in segments, broken index files, garbage checkpoints.

A log that was not closed cleanly is recovered from its recovery point: at the first invalid
batch the rest of that segment is cut and later segments are removed, and the cut is logged.
A cleanly closed log (`clean-shutdown` marker) is trusted after a sanity check of each
segment's indexes; indexes that fail it are rebuilt from the data.
"""

from __future__ import annotations

import logging
import os
import random

import pytest

from localcluster.storage import (
    LEADER_EPOCH_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CheckpointError,
    Log,
    LogConfig,
    Record,
    encode_batch,
    iter_records,
    read_partition_offsets,
    write_partition_offsets,
)
from localcluster.storage import record_batch as rb
from localcluster.storage.log import CLEAN_SHUTDOWN
from tests.helpers import check_indexes_agree, scan_log

CONFIG = LogConfig(segment_bytes=2048, segment_index_bytes=800)


def build(directory, batches=60, clean=True):
    log = Log.open(directory, CONFIG)
    for i in range(batches):
        records = [Record(b"value %d.%d " % (i, j) * (1 + i % 7), key=b"k%d" % i,
                          timestamp=10_000 + 10 * i + j) for j in range(1 + i % 3)]  # fmt: skip
        log.append(encode_batch(records), leader_epoch=i // 10)
    layout = [(seg, pos, header, data) for seg, pos, header, data in scan_log(log)]
    if clean:
        log.close()
    else:
        log.flush()
    return log, layout


def contents(log):
    return [(seg, data) for seg, _, _, data in scan_log(log)]


def flip(path, position):
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0x5A]))


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- flipped bytes in the data --------------------------------------------------------------------


@pytest.mark.parametrize("where", ["crc range", "crc field", "magic"])
def test_flip_mid_segment_keeps_the_valid_prefix(tmp_path, caplog, where):
    log, layout = build(tmp_path)
    bases = sorted({seg for seg, *_ in layout})
    assert len(bases) >= 4
    victim_segment = bases[1]
    in_segment = [i for i, (seg, *_) in enumerate(layout) if seg == victim_segment]
    victim = in_segment[len(in_segment) // 2]
    seg, position, header, _ = layout[victim]
    offset_in_batch = {"crc range": rb.CRC_START + 30, "crc field": 18, "magic": 16}[where]
    path = tmp_path / f"{seg:020d}.log"
    flip(path, position + offset_in_batch)
    (tmp_path / CLEAN_SHUTDOWN).unlink()  # as after kill -9: recover from the recovery point 0
    with caplog.at_level(logging.WARNING, logger="localcluster.storage"):
        again = Log.open(tmp_path, CONFIG)
    try:
        assert contents(again) == [(s, d) for s, _, _, d in layout[:victim]]
        assert again.log_end_offset == header.base_offset
        assert [s.base_offset for s in again.segments] == bases[:2]
        for later in bases[2:]:
            for suffix in (".log", ".index", ".timeindex"):
                assert not (tmp_path / f"{later:020d}{suffix}").exists()
        assert len(again.cuts) == 1
        cut = again.cuts[0]
        assert (cut.segment, cut.position) == (path.name, position)
        assert cut.bytes_cut == sum(len(d) for s, _, _, d in layout[victim:] if s == seg)
        messages = warnings(caplog)
        assert len(messages) == 1
        assert (
            f"recovery cut {cut.bytes_cut} bytes at position {position} of {path.name}"
            in messages[0]
        )
        assert f"{len(bases) - 2} later segment(s) removed" in messages[0]
        assert {"crc range": "CRC-32C mismatch", "crc field": "CRC-32C mismatch",
                "magic": "magic"}[where] in cut.reason  # fmt: skip
        check_indexes_agree(again)
        # the epoch history follows the cut log
        cached = again.leader_epoch_cache.entries()
        assert all(start < again.log_end_offset for _, start in cached)
        info = again.append(encode_batch([Record(b"after")]), leader_epoch=9)
        assert info.first_offset == header.base_offset
    finally:
        again.close()
    reopened = Log.open(tmp_path, CONFIG)
    try:
        assert reopened.cuts == [] and reopened.log_end_offset == header.base_offset + 1
    finally:
        reopened.close()


def test_flip_in_the_last_batch_cuts_only_it(tmp_path, caplog):
    log, layout = build(tmp_path, clean=False)  # abandoned open: preallocated tail, no marker
    seg, position, header, data = layout[-1]
    flip(tmp_path / f"{seg:020d}.log", position + len(data) - 1)
    with caplog.at_level(logging.WARNING, logger="localcluster.storage"):
        again = Log.open(tmp_path, CONFIG)
    try:
        assert contents(again) == [(s, d) for s, _, _, d in layout[:-1]]
        assert [(c.position, c.bytes_cut) for c in again.cuts] == [
            (position, CONFIG.segment_bytes - position)
        ]
        assert "CRC-32C mismatch" in again.cuts[0].reason
        assert len(warnings(caplog)) == 1 and "0 later segment(s) removed" in warnings(caplog)[0]
        check_indexes_agree(again)
    finally:
        again.close()


def test_clean_log_with_a_damaged_last_batch_header_is_rebuilt(tmp_path, caplog):
    log, layout = build(tmp_path)
    seg, position, header, _ = layout[-1]
    path = tmp_path / f"{seg:020d}.log"
    flip(path, position + 10)  # batchLength of the last batch: the sanity check must notice
    with caplog.at_level(logging.WARNING, logger="localcluster.storage"):
        again = Log.open(tmp_path, CONFIG)
    try:
        assert contents(again) == [(s, d) for s, _, _, d in layout[:-1]]
        assert any("is not usable" in m for m in warnings(caplog))
        assert any("recovery cut" in m for m in warnings(caplog))
        check_indexes_agree(again)
    finally:
        again.close()


# -- broken index files on a cleanly closed log ---------------------------------------------------


def damage_truncate(path):
    os.truncate(path, max(os.path.getsize(path) - 8, 0))


def damage_truncate_odd(path):
    os.truncate(path, os.path.getsize(path) - 3)


def damage_garbage(path):
    path.write_bytes(random.Random(path.name).randbytes(os.path.getsize(path)))


def damage_zeros(path):
    path.write_bytes(b"\0" * os.path.getsize(path))


def damage_delete(path):
    path.unlink()


def damage_grow(path):
    with open(path, "ab") as f:
        f.write(random.Random(1).randbytes(64))


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("damage", [damage_truncate, damage_truncate_odd, damage_garbage,
                                    damage_zeros, damage_delete, damage_grow])  # fmt: skip
def test_broken_index_files_are_rebuilt(tmp_path, suffix, damage):
    log, layout = build(tmp_path)
    before = Log.open(tmp_path, CONFIG)
    reads = [before.read(o, 700).tobytes() for o in range(0, before.log_end_offset, 3)]
    stamps = [before.offset_for_timestamp(t) for t in range(9_990, 10_320, 7)]
    before.close()
    bases = sorted({seg for seg, *_ in layout})
    for base in (bases[0], bases[len(bases) // 2], bases[-1]):
        damage(tmp_path / f"{base:020d}{suffix}")
    again = Log.open(tmp_path, CONFIG)
    try:
        assert again.cuts == []
        assert contents(again) == [(s, d) for s, _, _, d in layout]
        check_indexes_agree(again)
        assert [again.read(o, 700).tobytes() for o in range(0, again.log_end_offset, 3)] == reads
        assert [again.offset_for_timestamp(t) for t in range(9_990, 10_320, 7)] == stamps
        records = [r for _, _, _, d in layout for r in iter_records(d)]
        assert stamps[3] == next((r.offset, r.timestamp) for r in records if r.timestamp >= 10_011)
    finally:
        again.close()
    # the rebuilt indexes were trimmed on close and are trusted next time
    third = Log.open(tmp_path, CONFIG)
    try:
        check_indexes_agree(third)
    finally:
        third.close()


def test_index_files_without_their_segment_are_removed(tmp_path):
    log, layout = build(tmp_path, batches=5)
    orphan = tmp_path / f"{999:020d}.index"
    orphan.write_bytes(b"\0" * 16)
    (tmp_path / f"{999:020d}.timeindex").write_bytes(b"\0" * 16)
    (tmp_path / (LEADER_EPOCH_CHECKPOINT + ".tmp")).write_text("0\n1\n7 0\n")
    again = Log.open(tmp_path, CONFIG)
    try:
        assert not orphan.exists() and not (tmp_path / f"{999:020d}.timeindex").exists()
        assert not (tmp_path / (LEADER_EPOCH_CHECKPOINT + ".tmp")).exists()
        assert again.leader_epoch_cache.entries() == [(0, 0)]
        assert contents(again) == [(s, d) for s, _, _, d in layout]
    finally:
        again.close()


# -- garbage checkpoints --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, line",
    [
        (b"\x00\xff\xfe garbage \x81", 1),
        (b"7\n1\n0 0\n", 1),
        (b"0\n3\n0 0\n", 2),
        (b"0\n1\nzero 0\n", 3),
    ],
)
def test_garbage_leader_epoch_checkpoint_fails_the_open(tmp_path, content, line):
    build(tmp_path, batches=5)
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as raised:
        Log.open(tmp_path, CONFIG)
    assert f"checkpoint {path} line {line} " in str(raised.value)
    assert path.read_bytes() == content  # never silently reset


@pytest.mark.parametrize("name", [REPLICATION_OFFSET_CHECKPOINT, RECOVERY_POINT_OFFSET_CHECKPOINT])
def test_garbage_offset_checkpoints(tmp_path, name):
    path = tmp_path / name
    write_partition_offsets(path, {("t", 0): 10, ("t", 1): 20})
    text = path.read_text()
    assert read_partition_offsets(path) == {("t", 0): 10, ("t", 1): 20}
    path.write_text(text.replace("t 1 20", "t 1 2O"))  # a letter O for a zero
    with pytest.raises(CheckpointError, match=f"checkpoint {path} line 4 should be"):
        read_partition_offsets(path)
    path.write_bytes(random.Random(3).randbytes(200) + b"\xff")
    with pytest.raises(CheckpointError, match=f"checkpoint {path} line 1"):
        read_partition_offsets(path)
    path.write_text(text[:-8])  # cut short mid-entry: the count no longer matches
    with pytest.raises(CheckpointError, match=f"checkpoint {path} line"):
        read_partition_offsets(path)
