"""Producer state snapshots (`<offset:020d>.snapshot`) and the ProducerStateManager beside a log.

The file layer around the pure ProducerState (producer_state.py): write, list, read and delete
snapshot files in the partition's directory, and rebuild the state from the latest snapshot plus
a replay of the log after it. The state itself and every check live in producer_state.py.

File format, Kafka's version 1 (ProducerStateManager.writeSnapshot/readSnapshot), big-endian:
    version int16 (1) | crc uint32: CRC-32C of everything after it | entry count int32 |
    entries: producerId int64, epoch int16, lastSequence int32, lastOffset int64,
             offsetDelta int32, timestamp int64, coordinatorEpoch int32,
             currentTxnFirstOffset int64 (-1: no transaction)
A file named N holds the state of the log below offset N. It holds only each producer's LAST
batch, as Kafka's does: after loading one, only that batch (and the batches replayed after it)
can be recognised as a duplicate. Writes are atomic (temp file, fsync, rename, fsync the dir);
the snapshot at a roll is synced later, with the log's next flush (`take_snapshot`).

Rules (Kafka's truncateAndReload, rebuildProducerState, deleteSnapshotsBefore):
- Loading deletes snapshots above the log end and below the log start, tries the newest one
  left, and replays the log from its offset to the log end. A snapshot that cannot be read
  (short, bad CRC, unknown version, garbage) is deleted with a warning naming it and why, and
  the next older one is tried; with none the state is rebuilt from the log start. Never raises.
  The loaded state is then snapshotted at the log end, so the next start replays nothing.
- Truncation reloads the same way; retention (`truncate_head`) deletes snapshots below the new
  log start and keeps every producer (KIP-360); only expiry forgets producers.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from pathlib import Path

from localcluster.storage.checkpoint import write_atomically
from localcluster.storage.log import Log
from localcluster.storage.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    BatchMetadata,
    ProducerState,
    ProducerStateEntry,
)
from localcluster.storage.record_batch import BatchHeader, crc32c

log = logging.getLogger(__name__)

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
NO_TXN_FIRST_OFFSET = -1
_HEAD = struct.Struct(">hIi")  # version, crc, entry count
_CRC_START = 6  # the CRC covers the entry count and the entries
_ENTRY = struct.Struct(">qhiqiqiq")


class CorruptSnapshotError(ValueError):
    """A snapshot file that cannot be trusted; the message says why."""


def snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


# -- encoding ---------------------------------------------------------------------------------


def encode_snapshot(entries: list[ProducerStateEntry]) -> bytes:
    body = bytearray(struct.pack(">i", len(entries)))
    for e in sorted(entries, key=lambda e: e.producer_id):
        body += _ENTRY.pack(e.producer_id, e.producer_epoch, e.last_seq, e.last_data_offset,
                            e.last_offset_delta, e.last_timestamp, e.coordinator_epoch,
                            NO_TXN_FIRST_OFFSET)  # fmt: skip
    return struct.pack(">hI", SNAPSHOT_VERSION, crc32c(body)) + bytes(body)


def decode_snapshot(data: bytes, offset: int) -> list[ProducerStateEntry]:
    """The entries of the snapshot named `offset`; raises CorruptSnapshotError."""
    if len(data) < _HEAD.size:
        raise CorruptSnapshotError(f"{len(data)} bytes, shorter than the {_HEAD.size}-byte header")
    version, crc, count = _HEAD.unpack_from(data)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"unknown version {version} (expected {SNAPSHOT_VERSION})")
    computed = crc32c(data[_CRC_START:])
    if crc != computed:
        raise CorruptSnapshotError(
            f"CRC-32C mismatch: stored {crc:#010x}, computed {computed:#010x}"
        )
    if count < 0 or len(data) != _HEAD.size + count * _ENTRY.size:
        raise CorruptSnapshotError(f"{len(data)} bytes do not hold the {count} entries announced")
    entries: dict[int, ProducerStateEntry] = {}
    for k in range(count):
        (pid, epoch, last_seq, last_offset, offset_delta, timestamp, coordinator_epoch,
         _txn_first_offset) = _ENTRY.unpack_from(data, _HEAD.size + k * _ENTRY.size)  # fmt: skip
        if pid < 0 or pid in entries or last_offset >= offset or offset_delta < 0:
            raise CorruptSnapshotError(
                f"entry {k} (producer {pid}, last offset {last_offset}, offset delta "
                f"{offset_delta}) is impossible in a snapshot at offset {offset}"
            )
        batches = (BatchMetadata(last_seq, last_offset, offset_delta, timestamp),)
        entries[pid] = ProducerStateEntry(pid, epoch, batches if last_offset >= 0 else (),
                                          timestamp, coordinator_epoch)  # fmt: skip
    return list(entries.values())


def list_snapshots(directory: Path) -> list[int]:
    """Offsets of the snapshot files in `directory`, oldest first."""
    offsets = []
    for path in directory.glob("*" + SNAPSHOT_SUFFIX):
        stem = path.name[: -len(SNAPSHOT_SUFFIX)]
        if stem.isdigit() and path.is_file():
            offsets.append(int(stem))
    return sorted(offsets)


def log_batch_headers(lg: Log, start_offset: int, end_offset: int) -> Iterator[list[BatchHeader]]:
    """Headers of the log's batches that end at or after `start_offset` and begin before
    `end_offset`, one list per segment (the log validated them when it recovered)."""
    for segment in lg.segments:
        if segment.next_offset <= start_offset or not segment.index.count:
            continue
        if segment.base_offset >= end_offset:
            break
        headers = []
        for i in range(max(segment.index.batch_at_or_before(start_offset), 0), segment.index.count):
            header = segment.batch_header(i)
            if header.base_offset >= end_offset:
                break
            if header.last_offset >= start_offset:
                headers.append(header)
        yield headers


# -- the manager ------------------------------------------------------------------------------


class ProducerStateManager:
    """A partition's ProducerState with its snapshot files in the log's directory.

    The broker checks and applies appends on `state`; this class owns everything that touches
    files: `load`, `take_snapshot`, `truncate_to`, `truncate_fully_and_start_at`, `truncate_head`.
    """

    def __init__(self, directory: Path | str,
                 producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS):  # fmt: skip
        self.directory = Path(directory)
        self.state = ProducerState(producer_id_expiration_ms)
        self._last_snapshot_offset = 0  # Kafka's lastSnapOffset: no snapshot at or below it
        self._unsynced: list[Path] = []  # snapshots written with sync=False since the last flush

    @classmethod
    def open(cls, lg: Log, now_ms: int,
             producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> ProducerStateManager:  # fmt: skip
        manager = cls(lg.directory, producer_id_expiration_ms)
        manager.load(lg, now_ms)
        return manager

    def snapshot_offsets(self) -> list[int]:
        return list_snapshots(self.directory)

    def snapshot_path(self, offset: int) -> Path:
        return self.directory / snapshot_file_name(offset)

    # -- loading ------------------------------------------------------------------------------

    def load(self, lg: Log, now_ms: int) -> None:
        """Rebuild the state for `lg`: the newest valid snapshot, then the log after it."""
        start, end = lg.log_start_offset, lg.log_end_offset
        for path in self.directory.glob("*" + SNAPSHOT_SUFFIX + ".tmp"):
            path.unlink(missing_ok=True)  # an interrupted write
        for offset in self.snapshot_offsets():
            if offset > end or offset < start:
                self._delete(offset, f"outside the log's offsets [{start}, {end}]")
        loaded = self._load_newest_snapshot(now_ms)
        if loaded is None:
            self.state.truncate_fully_and_start_at(start)
        self._last_snapshot_offset = start if loaded is None else loaded
        replayed = 0
        for headers in log_batch_headers(lg, self.state.map_end_offset, end):
            self.state.replay(headers)
            replayed += len(headers)
        self.state.update_map_end_offset(end)
        # an empty log's (every partition of a new topic) at DEBUG: nothing was loaded
        level = logging.DEBUG if loaded is None and not replayed else logging.INFO
        log.log(level, "producer state of %s loaded from %s and %d batches up to offset %d: %d "
                "producers", self.directory,
                "no snapshot" if loaded is None else snapshot_file_name(loaded), replayed, end,
                len(self.state.producers))  # fmt: skip
        self.take_snapshot()

    def _load_newest_snapshot(self, now_ms: int) -> int | None:
        for offset in reversed(self.snapshot_offsets()):
            try:
                entries = decode_snapshot(self.snapshot_path(offset).read_bytes(), offset)
            except (CorruptSnapshotError, OSError) as e:
                self._delete(offset, f"it cannot be used: {e}", warn=True)
                continue
            self.state.load(entries, offset, now_ms)
            return offset
        return None

    # -- snapshots ----------------------------------------------------------------------------

    def take_snapshot(self, offset: int | None = None, sync: bool = True) -> Path | None:
        """Write the state at `offset` (default: the state's map end), unless a snapshot at or
        past it was written or loaded. At a roll pass the new segment's base (the log end),
        and `sync=False` as Kafka does: the file is written now and synced with the log's next
        flush (`unsynced_files`); its CRC catches what a power loss tore before that."""
        state = self.state
        if offset is not None:
            state.update_map_end_offset(offset)
        if state.map_end_offset <= self._last_snapshot_offset:
            return None
        path = self.snapshot_path(state.map_end_offset)
        write_atomically(path, encode_snapshot(list(state.producers.values())), sync=sync)
        if not sync:
            self._unsynced.append(path)
        self._last_snapshot_offset = state.map_end_offset
        log.info("wrote producer snapshot %s with %d producers", path, len(state.producers))
        return path

    def unsynced_files(self) -> tuple[Path, ...]:
        """The snapshots written unsynced since the last call, and their directory (for the
        renames): what the log's next flush syncs. A file deleted meanwhile is skipped there."""
        if not self._unsynced:
            return ()
        files, self._unsynced = (*self._unsynced, self.directory), []
        return files

    def _delete(self, offset: int, why: str, warn: bool = False) -> None:
        path = self.snapshot_path(offset)
        try:
            path.unlink(missing_ok=True)
        except OSError as e:
            log.warning("could not delete producer snapshot %s (%s): %s", path, why, e)
            return
        (log.warning if warn else log.info)("deleted producer snapshot %s: %s", path, why)

    # -- truncation and retention -------------------------------------------------------------

    def truncate_to(self, offset: int, lg: Log, now_ms: int) -> None:
        """After `lg.truncate_to(offset)`: drop snapshots past the new log end and rebuild."""
        assert lg.log_end_offset <= offset, "truncate the log first"
        if lg.log_end_offset == self.state.map_end_offset:
            return  # nothing was cut (Kafka's truncateAndReload skips the reload too)
        self.load(lg, now_ms)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """After `lg.truncate_fully_and_start_at(offset)`: no producers, no snapshots."""
        for snapshot in self.snapshot_offsets():
            self._delete(snapshot, f"the log was emptied to start at {offset}")
        self.state.truncate_fully_and_start_at(offset)
        self._last_snapshot_offset = offset

    def truncate_head(self, log_start_offset: int) -> None:
        """Retention moved the log start: delete older snapshots; producers stay (KIP-360)."""
        for snapshot in self.snapshot_offsets():
            if snapshot < log_start_offset:
                self._delete(snapshot, f"below the log start offset {log_start_offset}")
        self.state.on_log_start_offset_incremented(log_start_offset)
        self._last_snapshot_offset = max(self._last_snapshot_offset, log_start_offset)
