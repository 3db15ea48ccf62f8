"""The leader epoch cache: which leader epoch started at which offset (KIP-101, KIP-279).

Entries are (epoch, start_offset), epochs strictly increasing and start offsets non-decreasing.
A follower asks its leader for `end_offset_for(epoch)` (OffsetForLeaderEpoch) and truncates
exactly where its log diverges, instead of to its high watermark, which can lose committed
records. Every change is written through to `leader-epoch-checkpoint` before it returns, but
one: `truncate_from_start` (a log start moved: retention, DeleteRecords, a follower taking its
leader's start), which the log writes with its next flush (`unwritten`, `write_deferred`, on
the broker's checkpoint thread), as Kafka 3.7+ does (KAFKA-15046): under retention it comes once
per deleted segment per partition, and each write fsyncs twice on the event loop. A file left
with the entries below the start is cut back when the log is opened, and no later write can
bring them back: every write holds all entries, and an older one never lands after a newer.
`truncate_from_end` stays synchronous: its entries above a cut would be wrong, not only old,
once the log grew past them again, and opening could not tell.

A write that fails (ENOSPC on a full log directory) is logged and the change kept in memory,
which stays the truth for OffsetForLeaderEpoch; `saved` is then False and the log appends
nothing until `save()` succeeds, so the file never misses an epoch that records in the log
carry. A file left with epochs past the log end is cut back when the log is opened.
"""

from __future__ import annotations

import bisect
import logging
import threading
from pathlib import Path

from localcluster.storage.checkpoint import CheckpointError, leader_epoch_file

log = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    def __init__(self, checkpoint_path: Path | None):
        self._file = leader_epoch_file(checkpoint_path) if checkpoint_path else None
        self._epochs: list[int] = []
        self._starts: list[int] = []
        self.saved = True  # False after a failed write, until save() succeeds
        # Writes come from the loop (now) and the checkpoint thread (deferred): one at a time,
        # and none of an older version after a newer one. Changes count versions.
        self._lock = threading.Lock()
        self._version = 0
        self._written = 0  # the version in the file
        self._closed = False  # the log was deleted: a deferred write must not recreate it
        if self._file is not None:
            for epoch, start in self._file.read():
                if epoch < 0 or start < 0 or (self._epochs and (
                        epoch <= self._epochs[-1] or start < self._starts[-1])):  # fmt: skip
                    raise CheckpointError(
                        f"checkpoint {self._file.path}: entry ({epoch}, {start}) breaks the "
                        "order (epochs increasing, start offsets non-decreasing). The file is "
                        "corrupt; restore it or delete it to rebuild the history from nothing."
                    )
                self._epochs.append(epoch)
                self._starts.append(start)

    # -- queries ------------------------------------------------------------------------------

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts, strict=True))

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= requested, the offset where it ends), as in KIP-279.

        The end of an epoch is the start of the next one, or the log end for the latest epoch.
        An epoch older than every entry ends at the first entry's start; an unknown newer
        epoch, or UNDEFINED_EPOCH, answers (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET).
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self._epochs[-1]:
            return requested_epoch, log_end_offset
        higher = bisect.bisect_right(self._epochs, requested_epoch)  # first epoch > requested
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested_epoch, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]

    # -- changes ------------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`; drops entries it contradicts."""
        assert epoch >= 0 and start_offset >= 0, (epoch, start_offset)
        if self._epochs and epoch == self._epochs[-1] and start_offset >= self._starts[-1]:
            return False
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        self._flush()
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after `end_offset` (the log was truncated there)."""
        changed = False
        while self._starts and self._starts[-1] >= end_offset:
            self._epochs.pop()
            self._starts.pop()
            changed = True
        if changed:
            self._flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget history below `start_offset`; the epoch covering it now starts there."""
        i = bisect.bisect_right(self._starts, start_offset)  # entries starting <= start_offset
        if i == 0 or (i == 1 and self._starts[0] == start_offset):
            return
        del self._epochs[: i - 1]
        del self._starts[: i - 1]
        self._starts[0] = start_offset
        self._version += 1  # written with the log's next flush (`unwritten`)

    def clear(self) -> None:
        if self._epochs:
            self._epochs.clear()
            self._starts.clear()
            self._flush()

    def save(self) -> None:
        """Write the entries again after a failed write; raises OSError when it fails again."""
        if self._file is not None and not self.saved:
            self._write(self.entries(), self._version)
            self.saved = True

    def unwritten(self) -> tuple[list[tuple[int, int]], int] | None:
        """(the entries, their version) when the file is behind them, for `write_deferred`."""
        if self._file is None or self._written >= self._version:
            return None
        return self.entries(), self._version

    def write_deferred(self, entries: list[tuple[int, int]], version: int) -> None:
        """Write `unwritten`'s entries, on any thread, unless a newer version is in the file
        already or the log was deleted. A failure is logged: the file keeps older entries,
        which opening the log cuts back, and the next flush writes them again."""
        try:
            self._write(entries, version)
        except FileNotFoundError:
            pass  # the log's directory was removed
        except OSError as e:
            log.warning("%s not written (%s); the next flush writes it again", self._file.path, e)

    def close(self) -> None:
        """The log is deleted: no deferred write may land (it would recreate the file)."""
        with self._lock:
            self._closed = True

    def _write(self, entries: list[tuple[int, int]], version: int) -> None:
        assert self._file is not None
        with self._lock:
            if self._closed or version <= self._written:
                return
            self._file.write(entries)
            self._written = version

    def _flush(self) -> None:
        self._version += 1
        if self._file is None:
            return
        try:
            self._write(self.entries(), self._version)
        except OSError as e:
            if self.saved:
                log.warning("%s not written (%s): the epochs are kept in memory and the log "
                            "appends nothing until it is", self._file.path, e)  # fmt: skip
            self.saved = False
            return
        self.saved = True
