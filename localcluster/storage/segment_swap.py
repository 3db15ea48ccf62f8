"""Replacing a segment's files atomically: the `.cleaned` and `.swap` names, and their recovery.

The log cleaner (storage/cleaner.py) writes a segment's replacement beside it as
`<base>.log.cleaned` with `<base>.index.cleaned` and `<base>.timeindex.cleaned`, all fsynced.
Then, as Kafka's cleaner does, it renames them to `.swap` (the indexes first, the log last: a
`.log.swap` is the commit point, and its indexes are then complete), and renames each `.swap`
over the live file (the indexes first, the log last). A segment the cleaning empties is deleted
instead: its `.log` first (the commit point), then its indexes.

`recover` runs when a log opens, before its segments are read: a `.log.swap` is completed
(its remaining `.swap` files renamed into place), everything else named `.cleaned` or `.swap`
is deleted (an unfinished cleaning: the old segment is intact). So a kill -9 anywhere leaves
either the old segment or the new one, never a mix of their files. Index files without their
`.log` are removed by the log's own leftover check.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
# The order files are renamed in: the log last, so its `.swap` means the indexes are there.
FILE_SUFFIXES = (".index", ".timeindex", ".log")


def file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def cleaned_paths(directory: Path, base_offset: int) -> dict[str, Path]:
    """suffix -> path of the `.cleaned` file that will replace it."""
    return {s: directory / (file_name(base_offset, s) + CLEANED_SUFFIX) for s in FILE_SUFFIXES}


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def swap_in(directory: Path, base_offset: int) -> None:
    """Replace the segment's live files with its (fsynced) `.cleaned` ones."""
    for suffix in FILE_SUFFIXES:
        name = file_name(base_offset, suffix)
        os.replace(directory / (name + CLEANED_SUFFIX), directory / (name + SWAP_SUFFIX))
    fsync_directory(directory)
    _complete(directory, base_offset)


def delete_segment(directory: Path, base_offset: int) -> None:
    """Remove a segment's files, its log first (index files alone are leftovers)."""
    for suffix in reversed(FILE_SUFFIXES):
        (directory / file_name(base_offset, suffix)).unlink(missing_ok=True)
    fsync_directory(directory)


def discard_cleaned(directory: Path, base_offset: int) -> None:
    for path in cleaned_paths(directory, base_offset).values():
        path.unlink(missing_ok=True)


def _complete(directory: Path, base_offset: int) -> None:
    for suffix in FILE_SUFFIXES:
        name = file_name(base_offset, suffix)
        swap = directory / (name + SWAP_SUFFIX)
        if swap.exists():
            os.replace(swap, directory / name)
    fsync_directory(directory)


def recover(directory: Path) -> list[int]:
    """Finish committed swaps, delete unfinished cleanings; the bases of the swaps finished."""
    finished = []
    log_swap = ".log" + SWAP_SUFFIX
    for path in sorted(directory.glob("*" + log_swap)):
        stem = path.name[: -len(log_swap)]
        if stem.isdigit():
            _complete(directory, int(stem))
            finished.append(int(stem))
            log.info("log %s: completed the swap of cleaned segment %s", directory, stem)
    for path in directory.iterdir():
        if path.name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)):
            log.info("log %s: removing %s of an unfinished cleaning", directory, path.name)
            path.unlink(missing_ok=True)
    return finished
