"""Checkpoint files: round trip, atomic replacement, missing = empty, corrupt = named error."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localcluster.storage import (
    CheckpointError,
    read_partition_offsets,
    write_partition_offsets,
)
from localcluster.storage import checkpoint as cp

topics = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789._-", min_size=1, max_size=20)
offset_maps = st.dictionaries(
    st.tuples(topics, st.integers(0, 10_000)), st.integers(-1, 2**63 - 1), max_size=30
)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(offsets=offset_maps)
def test_partition_offsets_round_trip(tmp_path, offsets):
    path = tmp_path / cp.REPLICATION_OFFSET_CHECKPOINT
    write_partition_offsets(path, offsets)
    assert read_partition_offsets(path) == offsets
    assert not path.with_name(path.name + ".tmp").exists()


def test_kafka_text_format(tmp_path):
    path = tmp_path / cp.RECOVERY_POINT_OFFSET_CHECKPOINT
    write_partition_offsets(path, {("b", 1): 7, ("a", 0): 12})
    assert path.read_text() == "0\n2\na 0 12\nb 1 7\n"
    epochs = cp.leader_epoch_file(tmp_path / cp.LEADER_EPOCH_CHECKPOINT)
    epochs.write([(0, 0), (3, 100)])
    assert (tmp_path / cp.LEADER_EPOCH_CHECKPOINT).read_text() == "0\n2\n0 0\n3 100\n"
    assert epochs.read() == [(0, 0), (3, 100)]


def test_missing_file_is_empty(tmp_path):
    assert read_partition_offsets(tmp_path / "nothing-here") == {}
    assert cp.leader_epoch_file(tmp_path / "nope").read() == []


def test_leftover_tmp_never_wins(tmp_path):
    path = tmp_path / cp.REPLICATION_OFFSET_CHECKPOINT
    write_partition_offsets(path, {("t", 0): 5})
    path.with_name(path.name + ".tmp").write_text("0\n1\nt 0 999\n")
    assert read_partition_offsets(path) == {("t", 0): 5}
    write_partition_offsets(path, {("t", 0): 6})  # a later write replaces the stale temp file
    assert read_partition_offsets(path) == {("t", 0): 6}
    assert not path.with_name(path.name + ".tmp").exists()


def test_interrupted_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / cp.REPLICATION_OFFSET_CHECKPOINT
    write_partition_offsets(path, {("t", 0): 5})

    def crash(src, dst):
        raise OSError("killed before the rename")

    monkeypatch.setattr(cp.os, "replace", crash)
    with pytest.raises(OSError):
        write_partition_offsets(path, {("t", 0): 6, ("u", 1): 1})
    monkeypatch.undo()
    assert read_partition_offsets(path) == {("t", 0): 5}


def test_write_fsyncs_file_and_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(cp.os, "fsync", spy)
    path = tmp_path / "cp"
    write_partition_offsets(path, {("t", 0): 1})
    assert synced == [str(path) + ".tmp", str(tmp_path)]


@pytest.mark.parametrize(
    "content, line, what",
    [
        ("1\n1\nt 0 5\n", 1, "version"),
        ("", 1, "empty"),
        ("0\n", 2, "entry count"),
        ("0\nx\nt 0 5\n", 2, "entry count"),
        ("0\n2\nt 0 5\n", 2, "announces 2 entries but 1 follow"),
        ("0\n1\nt 0 5\nu 0 6\n", 2, "announces 1 entries but 2 follow"),
        ("0\n2\nt 0 5\nt 0\n", 4, "topic partition offset"),
        ("0\n2\nt 0 5\nt zero 5\n", 4, "topic partition offset"),
        ("0\n1\nt 0 5 extra\n", 3, "topic partition offset"),
        ("0\n1\n 0 5\n", 3, "topic partition offset"),
        ("0\n1\nt 0 +5\n", 3, "topic partition offset"),
        ("0\n1\nt 0 5x\n", 3, "topic partition offset"),
        ("0\n1\n\n", 3, "topic partition offset"),
    ],
)
def test_corrupt_partition_offsets_name_file_and_line(tmp_path, content, line, what):
    path = tmp_path / cp.REPLICATION_OFFSET_CHECKPOINT
    path.write_text(content)
    with pytest.raises(CheckpointError) as raised:
        read_partition_offsets(path)
    message = str(raised.value)
    assert str(path) in message
    assert f"line {line} " in message
    assert what in message


@pytest.mark.parametrize("garbage", [b"\xff\xfe\x00\x81garbage\x00", bytes(range(256))])
def test_binary_garbage(tmp_path, garbage):
    path = tmp_path / cp.LEADER_EPOCH_CHECKPOINT
    path.write_bytes(garbage)
    with pytest.raises(CheckpointError, match=f"{path} line 1 is not text"):
        cp.leader_epoch_file(path).read()


def test_ascii_garbage(tmp_path):
    path = tmp_path / cp.RECOVERY_POINT_OFFSET_CHECKPOINT
    path.write_bytes(b"hello world\n this is not a checkpoint\n")
    with pytest.raises(CheckpointError, match=f"{path} line 1 has version 'hello world'"):
        read_partition_offsets(path)


@pytest.mark.parametrize(
    "content, line", [("0\n1\n3\n", 3), ("0\n1\n3 x\n", 3), ("0\n2\n1 0\n2 1 1\n", 4)]
)
def test_corrupt_epoch_file(tmp_path, content, line):
    path = tmp_path / cp.LEADER_EPOCH_CHECKPOINT
    path.write_text(content)
    with pytest.raises(CheckpointError, match=f"{path} line {line} should be 'epoch start_offset'"):
        cp.leader_epoch_file(path).read()
