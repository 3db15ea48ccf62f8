"""Checkpoint files in Kafka's text format, written atomically.

    <version>            0
    <count>              N
    <entry>              N lines, fields separated by one space

`replication-offset-checkpoint`, `recovery-point-offset-checkpoint` and
`log-start-offset-checkpoint` hold
"topic partition offset" lines; `leader-epoch-checkpoint` holds "epoch start_offset" lines.
A write goes to a temp file, is fsynced, renamed over the old file, and the directory is fsynced,
so a reader sees the old file or the new one, never a mix. A missing file means "start from
nothing"; a corrupt file raises CheckpointError naming the file and line: silently resetting a
high watermark or an epoch history could lose acknowledged records.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

VERSION = 0

REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_OFFSET_CHECKPOINT = "recovery-point-offset-checkpoint"
# Kafka's name: where DeleteRecords (or a follower learning the leader's) moved a log's start
# inside its first segment; the segments alone would put it back at their base after a restart.
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"


class CheckpointError(Exception):
    """A checkpoint file cannot be read; the message names the file, the line and what to do."""


def write_atomically(path: Path, data: str | bytes, mode: int = 0o644, sync: bool = True) -> None:
    """Temp file, fsync, rename over `path`, fsync the directory: a reader sees the old file
    or the new one. Checkpoints, producer state snapshots and credential files all use it.
    `sync=False` leaves out both fsyncs, for a file whose reader checks it (a CRC) and can do
    without it: a process crash still leaves the old file or the new one, a power loss may
    leave an empty or torn one until the caller has it synced."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # a temp file left by a crash keeps its old mode otherwise
        view = memoryview(data.encode() if isinstance(data, str) else data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    except OSError as e:
        # ENOSPC lands here, not as a signal: the old file stays, the temp file goes.
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, f"writing {path}: {e.strerror}") from e
    os.close(fd)
    os.replace(tmp, path)
    if not sync:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class CheckpointFile(Generic[T]):
    """A checkpoint of entries of type T, each `format`ted to and `parse`d from one line."""

    def __init__(self, path: Path, format: Callable[[T], str], parse: Callable[[list[str]], T],
                 fields: str):  # fmt: skip
        self.path = Path(path)
        self._format = format
        self._parse = parse
        self._fields = fields

    def write(self, entries: Iterable[T]) -> None:
        lines = [self._format(e) for e in entries]
        write_atomically(self.path, f"{VERSION}\n{len(lines)}\n" + "".join(f"{x}\n" for x in lines))

    def read(self) -> list[T]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        except UnicodeDecodeError:
            raise self._error(1, "is not text") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if not lines:
            raise self._error(1, "is empty (expected the version line)")
        if lines[0].strip() != str(VERSION):
            raise self._error(1, f"has version {lines[0]!r}, expected {VERSION}")
        if len(lines) < 2 or not lines[1].strip().isdigit():
            raise self._error(2, f"should hold the entry count, found {_show(lines, 1)}")
        count = int(lines[1])
        if len(lines) - 2 != count:
            raise self._error(2, f"announces {count} entries but {len(lines) - 2} follow")
        entries = []
        for number, line in enumerate(lines[2:], start=3):
            try:
                entries.append(self._parse(line.split(" ")))
            except (ValueError, IndexError):
                raise self._error(number, f"should be '{self._fields}', found {line!r}") from None
        return entries

    def _error(self, line: int, what: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {self.path} line {line} {what}. The file is corrupt; restore it from a "
            "copy, or delete it to start this checkpoint from nothing (for a high watermark or "
            "epoch history that may expose or truncate records)."
        )


def _show(lines: list[str], i: int) -> str:
    return repr(lines[i]) if i < len(lines) else "nothing"


def _int(text: str) -> int:
    if not text.lstrip("-").isdigit():
        raise ValueError(text)
    return int(text)


def _parse_partition_offset(fields: list[str]) -> tuple[tuple[str, int], int]:
    topic, partition, offset = fields  # ValueError when the count is wrong
    if not topic:
        raise ValueError("empty topic")
    return (topic, _int(partition)), _int(offset)


def partition_offsets_file(path: Path) -> CheckpointFile[tuple[tuple[str, int], int]]:
    """topic-partition -> offset (high watermarks, recovery points)."""
    return CheckpointFile(path, lambda e: f"{e[0][0]} {e[0][1]} {e[1]}",
                          _parse_partition_offset, "topic partition offset")  # fmt: skip


def _parse_epoch_entry(fields: list[str]) -> tuple[int, int]:
    epoch, offset = fields
    return _int(epoch), _int(offset)


def leader_epoch_file(path: Path) -> CheckpointFile[tuple[int, int]]:
    """epoch -> start offset, oldest first."""
    return CheckpointFile(path, lambda e: f"{e[0]} {e[1]}", _parse_epoch_entry,
                          "epoch start_offset")  # fmt: skip


def read_partition_offsets(path: Path) -> dict[tuple[str, int], int]:
    return dict(partition_offsets_file(path).read())


def write_partition_offsets(path: Path, offsets: dict[tuple[str, int], int]) -> None:
    partition_offsets_file(path).write(sorted(offsets.items()))
