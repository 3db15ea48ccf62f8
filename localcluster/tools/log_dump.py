"""`localcluster log dump`: print a log's segments and batches without changing anything.

Reads the segment files directly (read-only maps), so it also shows what recovery would cut:
the first invalid batch and whether only preallocated zeros follow it.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from localcluster.group import describe_record
from localcluster.metadata_types import OFFSETS_TOPIC
from localcluster.storage import record_batch as rb
from localcluster.storage.checkpoint import LEADER_EPOCH_CHECKPOINT, CheckpointError
from localcluster.storage.leader_epoch_cache import LeaderEpochCache
from localcluster.storage.segment import HEAD_BYTES, SUFFIX, has_reused_mark, zeros_only


def dump(directory: Path, show_records: bool = False, limit: int = 50) -> int:
    from localcluster.tools.cluster_view import console as shared_console

    console = shared_console()
    segments = sorted(p for p in directory.glob("*" + SUFFIX) if p.stem.isdigit())
    if not segments:
        console.print(f"[red]{directory} holds no segment files (*.log): is it a partition log "
                      "directory?[/red]")  # fmt: skip
        return 1
    try:
        epochs = LeaderEpochCache(directory / LEADER_EPOCH_CHECKPOINT).entries()
        console.print(f"leader epochs (epoch, start offset): {epochs or 'none'}")
    except CheckpointError as e:
        console.print(f"[red]{e}[/red]")
    status = 0
    # __consumer_offsets holds the group coordinator's records: show them as Kafka's tool does
    show = _show_group_record if directory.name.startswith(f"{OFFSETS_TOPIC}-") else _show
    for path in segments:
        status |= _dump_segment(console, path, show_records, limit, show)
    return status


def _producer_columns(header: rb.BatchHeader) -> tuple[str, str, str]:
    """Producer id, epoch and first-last sequence of an idempotent batch; dashes otherwise."""
    if header.producer_id == rb.NO_PRODUCER_ID:
        return "-", "-", "-"
    last = (header.base_sequence + header.last_offset_delta) % (2**31)
    return str(header.producer_id), str(header.producer_epoch), f"{header.base_sequence}-{last}"


def _add_batch(table: Table, mm, position: int, header: rb.BatchHeader, show_records: bool,
               show: Callable[[rb.Record], str]) -> None:  # fmt: skip
    table.add_row(str(header.base_offset), str(header.last_offset), str(header.records_count),
                  str(position), str(header.size), str(header.partition_leader_epoch),
                  str(header.max_timestamp), rb.COMPRESSION_NAMES.get(header.compression, "?"),
                  *_producer_columns(header))  # fmt: skip
    if show_records:
        _add_records(table, mm, position, header, show)


def _dump_segment(console: Console, path: Path, show_records: bool, limit: int,
                  show: Callable[[rb.Record], str]) -> int:  # fmt: skip
    size = path.stat().st_size
    table = Table(title=f"{path.name} ({size} bytes on disk)", title_justify="left")
    for column in ("base offset", "last offset", "count", "position", "size", "epoch",
                   "max timestamp", "compression", "producer id", "producer epoch",
                   "sequences"):  # fmt: skip
        table.add_column(column, justify="right")
    if size == 0:
        console.print(table)
        return 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
        position, shown, problem = 0, 0, None  # position: the end of the last good batch
        try:
            for start, header in rb.iter_batches(mm):
                if not limit or shown < limit:
                    _add_batch(table, mm, start, header, show_records, show)
                shown += 1
                position = start + header.size
        except rb.CorruptRecordError as e:
            problem = e
        console.print(table)
        if limit and shown > limit:
            console.print(f"... {shown - limit} more batches")
        if problem is not None:
            if zeros_only(f.fileno(), mm, position, size):
                console.print(f"{size - position} bytes of preallocated zeros follow position "
                              f"{position}")  # fmt: skip
            elif has_reused_mark(f.fileno()) and zeros_only(
                f.fileno(), mm, position, min(position + HEAD_BYTES, size)
            ):
                console.print(f"the log ends at position {position}: this file was a deleted "
                              f"segment's, and the {size - position} bytes after the zero head "
                              "are its old bytes (docs/storage.md)")  # fmt: skip
            else:
                console.print(f"[red]invalid batch at position {position}: {problem}; recovery "
                              f"would cut the {size - position} bytes from there[/red]")  # fmt: skip
                return 1
    return 0


def _add_records(table: Table, mm, position: int, header: rb.BatchHeader,
                 show: Callable[[rb.Record], str]) -> None:  # fmt: skip
    """One row per record of the batch (decompressed if need be); a batch whose records do not
    decode gets one row saying why, and the dump goes on."""
    with memoryview(mm)[position : position + header.size] as batch:
        try:
            records = list(rb.iter_records(batch))
        except rb.CorruptRecordError as e:
            table.add_row("", "", "", "", "", "", "", f"[red]records unreadable: {e}[/red]")
            return
    for record in records:
        table.add_row("", str(record.offset), "", "", "", "", str(record.timestamp), show(record))


def _show(record: rb.Record) -> str:
    key = record.key.decode(errors="replace") if record.key is not None else "-"
    value = record.value.decode(errors="replace") if record.value is not None else "null"
    return f"{key}={value[:40]}"


def _show_group_record(record: rb.Record) -> str:
    return describe_record(record.key, record.value)
