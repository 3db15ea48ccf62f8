"""A segment deleted from the front of its log gives its data file to the log's next segment
(segment.py, "Reused files"): the old bytes past the new segment's last batch never read as
data, after a crash as after a clean close, and real damage is still cut and reported.

A crash is a copy of the log directory taken while the log is open (copytree keeps the
reused mark, an extended attribute): the files as the killed process left them."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from localcluster.storage import Log, LogConfig, Record, encode_batch
from localcluster.storage.segment import (
    HEAD_BYTES,
    REUSED_ATTRIBUTE,
    SPARE_SUFFIX,
    SpareFile,
    SpareFiles,
)
from tests.helpers import check_indexes_agree, scan_log

SEGMENT_BYTES = 8192


@pytest.fixture
def directory(tmp_path) -> Path:
    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, REUSED_ATTRIBUTE, b"1")
    except OSError:
        pytest.skip(f"{tmp_path} keeps no extended attributes: files are never reused there")
    probe.unlink()
    return tmp_path / "t-0"


def config(reuse: bool = True) -> LogConfig:
    return LogConfig(segment_bytes=SEGMENT_BYTES, retention_bytes=2 * SEGMENT_BYTES,
                     retention_ms=-1, reuse_segment_files=reuse)  # fmt: skip


def batch(n: int, value_bytes: int) -> bytes:
    return encode_batch([Record(b"v" * value_bytes, key=b"%d" % i, timestamp=1_000 + i)
                         for i in range(n)])  # fmt: skip


def contents(log: Log) -> list[tuple[int, bytes]]:
    return [(header.base_offset, bytes(data)) for *_, header, data in scan_log(log)]


def marked(path: Path) -> bool:
    try:
        return bool(os.getxattr(path, REUSED_ATTRIBUTE))
    except OSError:
        return False


def fill_until_reused(log: Log) -> set[int]:
    """Big batches, with retention after each, until the active segment is written in a
    retired segment's file; the inodes of the files retention retired."""
    retired: set[int] = set()
    for _ in range(200):
        inodes = {os.stat(s.path).st_ino for s in log.segments}
        log.append(batch(3, 900), leader_epoch=1)
        if log.delete_old_segments(now_ms=0):
            retired |= inodes - {os.stat(s.path).st_ino for s in log.segments}
        if log.active_segment.reused:
            return retired
    raise AssertionError("no segment reused a retired file")


def crash_while_open(directory: Path, where: Path, prepare) -> tuple[Path, list, object]:
    """Open the log, `prepare(log)`, then copy its directory as a killed process would leave
    it: the copy, the batches written (before the copy) and what `prepare` returned."""
    log = Log.open(directory, config())
    try:
        prepared = prepare(log)
        written = contents(log)
        shutil.copytree(log.directory, where)
    finally:
        log.close()
    return where, written, prepared


def retire_until_spare(log: Log) -> None:
    """Big batches and retention until a retired segment's file is kept as the spare."""
    for _ in range(40):
        log.append(batch(3, 900), leader_epoch=1)
        log.delete_old_segments(now_ms=0)
        if list(log.directory.glob("*" + SPARE_SUFFIX)):
            return
    raise AssertionError("retention kept no spare file")


def assert_recovers_as_written(copy: Path, written: list) -> None:
    """Opened after the crash: no cut, and exactly the batches written."""
    recovered = Log.open(copy, config())
    try:
        assert recovered.cuts == [] and contents(recovered) == written
    finally:
        recovered.close()


def test_a_retired_file_serves_the_next_segment_and_a_clean_close_trims_it(directory):
    log = Log.open(directory, config())
    try:
        retired = fill_until_reused(log)
        active = log.active_segment
        assert os.stat(active.path).st_ino in retired
        assert marked(active.path) and os.path.getsize(active.path) == SEGMENT_BYTES
        assert len(list(directory.glob("*" + SPARE_SUFFIX))) <= 1
        log.append(batch(1, 10), leader_epoch=1)  # the file's old bytes stay past it
        written = contents(log)
        assert [offset for offset, _ in written] == sorted({o for o, _ in written})
        check_indexes_agree(log)
    finally:
        log.close()
    # closed: the old bytes are cut off, the mark and the spare are gone
    assert os.path.getsize(active.path) == active.size and not marked(active.path)
    assert not list(directory.glob("*" + SPARE_SUFFIX))
    assert_recovers_as_written(directory, written)


def fill_then_append_small(log: Log, count: int) -> None:
    fill_until_reused(log)
    for _ in range(count):
        log.append(batch(1, 10), leader_epoch=1)


def test_a_crash_in_a_reused_segment_loses_nothing_and_cuts_nothing(directory, tmp_path, caplog):
    copy, written, _ = crash_while_open(directory, tmp_path / "crashed",
                                        lambda log: fill_then_append_small(log, 3))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="localcluster.storage"):
        recovered = Log.open(copy, config())
    try:
        assert recovered.cuts == [] and contents(recovered) == written
        assert "the reused file's old bytes" in caplog.text
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert not marked(recovered.active_segment.path)  # nothing old is left past the end
        recovered.append(batch(2, 10), leader_epoch=2)  # and appending goes on
        assert len(contents(recovered)) == len(written) + 1
        check_indexes_agree(recovered)
    finally:
        recovered.close()


def test_a_batch_cut_before_its_head_was_written_is_dropped_without_a_cut(directory, tmp_path):
    def append_then_tear(log: Log) -> None:
        fill_then_append_small(log, 1)
        active = log.active_segment
        # what a killed append leaves: its tail and the zero head after it, not its own head
        # (past the segment's size, so not among the batches written)
        torn = batch(2, 40)
        os.pwrite(active.fileno(), torn[HEAD_BYTES:] + bytes(HEAD_BYTES), active.size + HEAD_BYTES)

    copy, written, _ = crash_while_open(directory, tmp_path / "crashed", append_then_tear)
    assert_recovers_as_written(copy, written)


def test_damage_inside_a_reused_segment_is_still_cut_and_reported(directory, tmp_path):
    def append_three(log: Log) -> tuple[str, int]:
        fill_then_append_small(log, 3)
        active = log.active_segment
        return active.path.name, active.index.entry(active.index.count - 2)[1]

    copy, written, (name, position) = crash_while_open(
        directory, tmp_path / "crashed", append_three
    )
    path = copy / name
    with open(path, "r+b") as f:  # a flipped byte in the second-to-last batch's records
        f.seek(position + 70)
        byte = f.read(1)
        f.seek(position + 70)
        f.write(bytes([byte[0] ^ 0xFF]))
    recovered = Log.open(copy, config())
    try:
        assert len(recovered.cuts) == 1 and recovered.cuts[0].position == position
        assert "CRC" in recovered.cuts[0].reason or "crc" in recovered.cuts[0].reason
        assert contents(recovered) == written[:-2]
    finally:
        recovered.close()


def test_a_spare_never_serves_a_segment_below_its_old_offsets(directory):
    log = Log.open(directory, config())
    try:
        retire_until_spare(log)
        log.truncate_fully_and_start_at(0)  # below every old offset: the spare goes
        assert not list(directory.glob("*" + SPARE_SUFFIX))
        log.append(batch(3, 900), leader_epoch=2)
        log.roll()
        assert not log.active_segment.reused
    finally:
        log.close()
    spares = SpareFiles(directory)
    path = directory / ("00000000000000000000.log" + SPARE_SUFFIX)
    spares.offer(SpareFile(path, open(path, "w+b", buffering=0), stale_end=500))
    assert spares.take(499) is None and not path.exists()  # released, never handed out


def test_a_compacted_log_deletes_its_old_segments_as_before(directory):
    log = Log.open(directory, config(reuse=False))
    try:
        for _ in range(30):
            log.append(batch(3, 900), leader_epoch=1)
            log.delete_old_segments(now_ms=0)
            assert not log.active_segment.reused
            assert not list(directory.glob("*" + SPARE_SUFFIX))
    finally:
        log.close()


def test_spare_files_of_a_dead_process_are_removed_when_the_log_opens(directory):
    Log.open(directory, config()).close()
    leftover = directory / ("00000000000000000007.log" + SPARE_SUFFIX)
    leftover.write_bytes(b"old bytes")
    Log.open(directory, config()).close()
    assert not leftover.exists()


def test_a_reused_file_killed_before_its_first_batch_holds_nothing(directory, tmp_path):
    def roll_into_spare(log: Log) -> None:
        retire_until_spare(log)
        log.roll()  # empty, in the retired file: its old first batch was cleared away
        assert log.active_segment.reused and log.active_segment.size == 0

    copy, written, _ = crash_while_open(directory, tmp_path / "crashed", roll_into_spare)
    assert_recovers_as_written(copy, written)


def test_the_log_dump_reads_a_live_reused_segment_to_its_last_batch(directory, capsys):
    from localcluster.tools import log_dump

    log = Log.open(directory, config())
    try:
        fill_until_reused(log)
        log.append(batch(1, 10), leader_epoch=1)
        assert log_dump.dump(directory) == 0  # not "recovery would cut": the old bytes
        out = capsys.readouterr().out
        assert "this file was a deleted segment's" in out and "recovery would cut" not in out
    finally:
        log.close()
