"""A partition's log: a list of segments, offsets, truncation, retention, recovery.

Rules:
- Offsets are assigned here and only here: the leader's `append` rewrites each batch's
  baseOffset and partitionLeaderEpoch in place (outside the CRC); a follower's
  `append_as_follower` keeps the leader's offsets and epochs.
- `log_start_offset <= recovery_point <= log_end_offset`; segments are contiguous and sorted.
  The log start is the first segment's base, or past it where DeleteRecords moved it
  (`increment_log_start_offset`: segments wholly below go at once, reads below it are out of
  range); the caller checkpoints it (log-start-offset-checkpoint) and passes it to `open`.
- The log knows nothing of high watermarks: readers pass `max_offset` (a consumer passes the HW).
- Opening after a crash recovers every segment from the one holding the recovery point: each
  batch is validated, a torn or corrupt tail is cut and logged, indexes are rebuilt. A log
  closed cleanly leaves a `clean-shutdown` marker and is trusted after a sanity check.
- The recovery point moves when a flush is done: `flush_plan` (on the caller's thread) names
  the files to fdatasync, `LogFlush.run` syncs them on any thread, `flushed` (back on the
  caller's) advances the point unless the log was truncated meanwhile. The broker runs the
  sync on its checkpoint thread: on a disk, one flush blocked its event loop 0.3-1.6 s.
- An append that finds no space raises `LogDirectoryFullError` and leaves the log as it was:
  segments reserve before they write, and batches of the same append already written are
  removed again. The first failure and the first success after it are logged, once each.
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from localcluster.storage import record_batch as rb
from localcluster.storage import reservation, segment_swap
from localcluster.storage.checkpoint import LEADER_EPOCH_CHECKPOINT
from localcluster.storage.leader_epoch_cache import LeaderEpochCache
from localcluster.storage.reservation import LogDirectoryFullError
from localcluster.storage.segment import (
    SPARE_SUFFIX,
    SUFFIX,
    CutReport,
    FileSlice,
    LogSegment,
    SpareFiles,
)

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN = "clean-shutdown"
INT32_MAX = 2**31 - 1
PAGE_BYTES = 4096  # what a small file (a checkpoint, a new segment's files) needs at least


class OffsetOutOfRangeError(Exception):
    """A fetch or truncation offset outside [log_start_offset, log_end_offset]."""


class RecordBatchTooLargeError(Exception):
    """A batch larger than a whole segment (Kafka: MESSAGE_TOO_LARGE)."""


class UnexpectedAppendOffsetError(Exception):
    """A follower append whose offsets do not continue the log."""


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Kafka's topic-level log settings, in Kafka's units."""

    segment_bytes: int = 1 << 30  # log.segment.bytes
    segment_index_bytes: int = 10 << 20  # log.index.size.max.bytes
    retention_bytes: int = -1  # log.retention.bytes (-1: no limit)
    retention_ms: int = 7 * 24 * 3600 * 1000  # log.retention.ms (-1: no limit)
    segment_ms: int = 7 * 24 * 3600 * 1000  # log.roll.ms: a segment this old rolls
    log_append_time: bool = False  # message.timestamp.type=LogAppendTime (the caller stamps)
    # A segment deleted from the front gives its file to the next one (segment.py, "Reused
    # files"); not for a compacted log, whose cleaner reads segments by name on its thread.
    reuse_segment_files: bool = True

    def __post_init__(self):
        if not 2 * rb.HEADER_SIZE <= self.segment_bytes <= INT32_MAX:
            raise ValueError(
                f"log.segment.bytes={self.segment_bytes} must lie in [{2 * rb.HEADER_SIZE}, "
                f"{INT32_MAX}] (index positions are int32)"
            )
        if self.segment_index_bytes < 8:
            raise ValueError(f"log.index.size.max.bytes={self.segment_index_bytes} is below 8")

    @property
    def max_index_entries(self) -> int:
        return self.segment_index_bytes // 8


@dataclass(slots=True)
class AppendInfo:
    first_offset: int
    last_offset: int
    max_timestamp: int
    records_count: int
    valid_bytes: int
    headers: tuple[rb.BatchHeader, ...] = ()  # the appended batches' headers, in order


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole batches from one segment, starting with the batch that holds `fetch_offset`."""

    fetch_offset: int
    slices: tuple[FileSlice, ...]

    @property
    def size(self) -> int:
        return sum(s.length for s in self.slices)

    def tobytes(self) -> bytes:
        return b"".join(s.tobytes() for s in self.slices)


@dataclass(frozen=True, slots=True)
class LogFlush:
    """What one flush of a log syncs: the files of every segment from the one holding the
    recovery point (data, offset index, time index), and the log end and truncation count when
    it was planned, and the leader epochs the checkpoint file is behind on (a moved log start's,
    written with the flush). `run` may run on any thread: it opens the files by name (a segment
    deleted meanwhile needs no sync), and fdatasync on a file also writes the pages dirtied
    through its shared maps (the indexes), so nothing the event loop remaps is touched."""

    log: Log
    paths: tuple[Path, ...]
    end: int
    truncations: int
    epochs: tuple[list[tuple[int, int]], int] | None = None  # leader-epoch-checkpoint's, if behind

    def run(self) -> None:
        self._sync()
        if self.epochs is not None:
            self.log.leader_epoch_cache.write_deferred(*self.epochs)

    def _sync(self) -> None:
        for path in self.paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # retention or a truncation deleted it meanwhile
            try:
                os.fdatasync(fd)
            except OSError as e:  # EIO: the disk lost writes; the recovery point stays
                raise OSError(e.errno, f"fdatasync of {path}: {e.strerror}") from e
            finally:
                os.close(fd)


class Log:
    def __init__(self, directory: Path, config: LogConfig, segments: list[LogSegment],
                 recovery_point: int):  # fmt: skip
        assert segments
        self.directory = directory
        self.config = config
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._start_offset = segments[0].base_offset  # moved past it by DeleteRecords
        self.leader_epoch_cache = LeaderEpochCache(directory / LEADER_EPOCH_CHECKPOINT)
        self.recovery_point = min(max(recovery_point, self.log_start_offset), self.log_end_offset)
        self.cuts: list[CutReport] = []
        self._full = False  # the last append found no space (logged once until one succeeds)
        self._spares = SpareFiles(directory)  # a retired segment's file for the next one
        self._truncations = 0  # a flush planned before a truncation must not move the point

    # -- opening ------------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path | str, config: LogConfig | None = None,
             recovery_point: int = 0, log_start_offset: int = 0) -> Log:  # fmt: skip
        """Open (creating when new) the log in `directory`, recovering it after a crash.

        `log_start_offset` places the first segment of a new, empty log; of an existing one it
        is the checkpointed start (DeleteRecords'), kept if the log still reaches it.
        """
        directory = Path(directory)
        config = config or LogConfig()
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / CLEAN_SHUTDOWN
        clean = marker.exists()
        segment_swap.recover(directory)  # a cleaning killed midway: old or new segment
        _remove_leftovers(directory)
        bases = sorted(int(p.stem) for p in directory.glob("*" + SUFFIX) if p.stem.isdigit())
        segments: list[LogSegment] = []
        cuts: list[CutReport] = []
        recovered: list[LogSegment] = []
        for k, base in enumerate(bases):
            segment = LogSegment.open_existing(directory, base, config.segment_bytes,
                                               config.max_index_entries)  # fmt: skip
            is_last = k + 1 == len(bases)
            holds_recovery_point = is_last or bases[k + 1] > recovery_point
            cut = None
            if (not clean and holds_recovery_point) or recovered or not segment.load_trusted():
                cut = segment.recover()
                recovered.append(segment)
            segments.append(segment)
            if cut is not None:
                cuts.append(cut)
                log.warning(
                    "log %s: recovery cut %d bytes at position %d of %s (%s); %d later "
                    "segment(s) removed", directory, cut.bytes_cut, cut.position, cut.segment,
                    cut.reason, len(bases) - k - 1,
                )  # fmt: skip
                for later in bases[k + 1 :]:
                    _delete_segment_files(directory, later)
                break
        if not segments:
            segments.append(LogSegment.create(directory, log_start_offset, config.segment_bytes,
                                              config.max_index_entries))  # fmt: skip
        segments[-1].make_appendable()
        opened = cls(directory, config, segments, recovery_point)
        opened.cuts = cuts
        if log_start_offset > opened.log_start_offset:
            opened._move_start(min(log_start_offset, opened.log_end_offset))
        opened._rebuild_epochs_from(recovered)
        # The start first: the file may lag the log start moves made before a crash (they are
        # written with the next flush), and cut in this order it gives what the file written
        # through would have (an entry the start moved to the log end then goes with the end).
        opened.leader_epoch_cache.truncate_from_start(opened.log_start_offset)
        opened.leader_epoch_cache.truncate_from_end(opened.log_end_offset)
        marker.unlink(missing_ok=True)
        if recovered:
            opened.recovery_point = opened.log_end_offset
        return opened

    def _rebuild_epochs_from(self, segments: list[LogSegment]) -> None:
        cache = self.leader_epoch_cache
        for segment in segments:
            for i in range(segment.index.count):
                header = segment.batch_header(i)
                epoch = header.partition_leader_epoch
                if epoch > cache.latest_epoch:
                    cache.assign(epoch, header.base_offset)

    # -- offsets ------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return max(self._start_offset, self._segments[0].base_offset)

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch in the leader epoch cache (-1: none)."""
        return self.leader_epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch's answer: (largest epoch <= `epoch`, its end offset)."""
        return self.leader_epoch_cache.end_offset_for(epoch, self.log_end_offset)

    # -- appending ----------------------------------------------------------------------------

    def append(self, records, leader_epoch: int,
               batches: list[tuple[int, rb.BatchHeader]] | None = None) -> AppendInfo:  # fmt: skip
        """Append a leader's batches (validated first): assign offsets from the log end and
        stamp `leader_epoch`. Nothing is appended when any batch is invalid. `batches`: what
        `validate` returned for these very records, when the caller validated them already."""
        assert leader_epoch >= 0
        data = memoryview(records)
        if batches is None:
            batches = self.validate(data)
        first = offset = self.log_end_offset
        try:
            if leader_epoch > self.leader_epoch_cache.latest_epoch:
                self.leader_epoch_cache.assign(leader_epoch, first)
            self._check_epochs_saved()
            for start, header in batches:
                self._maybe_roll(header, offset)
                self.active_segment.append_batch(data, start, header, offset, leader_epoch)
                offset += header.records_count
        except LogDirectoryFullError as e:
            self._undo_append(first, e)
            raise
        if self._full:
            self._space_returned()
        return self._append_info(first, offset - 1, batches)

    def append_as_follower(self, records) -> AppendInfo:
        """Append batches copied from the leader, keeping their offsets and epochs."""
        data = memoryview(records)
        batches = self.validate(data)
        expected = self.log_end_offset
        for _, header in batches:
            if header.base_offset < expected:
                raise UnexpectedAppendOffsetError(
                    f"log {self.directory}: batch at offset {header.base_offset} does not "
                    f"follow {expected}; truncate the follower first"
                )
            expected = header.next_offset
        cache = self.leader_epoch_cache
        # An epoch above the leader's first batch that starts at our log end holds nothing (we
        # led it and wrote nothing, or its records were truncated): the leader's batches say
        # which epochs really follow. The epoch the leader continues stays, also where it starts
        # at our log end because retention deleted all its records and moved its start there.
        if cache.latest_epoch > batches[0][1].partition_leader_epoch:
            cache.truncate_from_end(self.log_end_offset)
        first = self.log_end_offset
        try:
            for start, header in batches:
                if header.partition_leader_epoch > cache.latest_epoch:
                    cache.assign(header.partition_leader_epoch, header.base_offset)
                self._check_epochs_saved()
                self._maybe_roll(header, header.base_offset)
                self.active_segment.append_batch(data, start, header, header.base_offset,
                                                 header.partition_leader_epoch)  # fmt: skip
        except LogDirectoryFullError as e:
            self._undo_append(first, e)
            raise
        if self._full:
            self._space_returned()
        return self._append_info(batches[0][1].base_offset, batches[-1][1].last_offset, batches)

    def _check_epochs_saved(self) -> None:
        """No batch goes in while leader-epoch-checkpoint misses an epoch (its write failed)."""
        cache = self.leader_epoch_cache
        if cache.saved:
            return
        try:
            cache.save()
        except OSError as e:
            error = reservation.full_error(e, self.directory, 2 * PAGE_BYTES,
                                           "writing leader-epoch-checkpoint")  # fmt: skip
            if error is None:
                raise
            raise error from None

    def _undo_append(self, first: int, error: LogDirectoryFullError) -> None:
        """An append failed for space: remove what of it was written, log the first failure."""
        if self.log_end_offset > first:
            self._truncate_segments(first)
            # Epochs this append assigned past `first`; one starting at `first` holds nothing
            # yet, as after a leader change without writes, and may stay.
            self.leader_epoch_cache.truncate_from_end(first + 1)
            self.recovery_point = min(self.recovery_point, self.log_end_offset)
        if not self._full:
            self._full = True
            log.warning("%s", error)

    def _space_returned(self) -> None:
        self._full = False
        log.info("log %s appends again (%d bytes free on its filesystem)", self.directory,
                 reservation.free_bytes(self.directory))  # fmt: skip

    def validate(self, data) -> list[tuple[int, rb.BatchHeader]]:
        """(position, header) of each batch of an append, every check an append makes (CRC,
        sizes, segment.bytes); raises CorruptRecordError or RecordBatchTooLargeError."""
        if not len(data):
            raise rb.CorruptRecordError("no record batch in the request")
        batches = list(rb.iter_batches(data))
        for _, header in batches:
            if header.size > self.config.segment_bytes:
                raise RecordBatchTooLargeError(
                    f"batch of {header.size} bytes is larger than the segment size, "
                    f"segment.bytes={self.config.segment_bytes} (the topic's, or the broker's "
                    f"log.segment.bytes)"
                )
        return batches

    @staticmethod
    def _append_info(first: int, last: int, batches) -> AppendInfo:
        headers = tuple(h for _, h in batches)
        return AppendInfo(
            first_offset=first,
            last_offset=last,
            max_timestamp=max(h.max_timestamp for h in headers),
            records_count=sum(h.records_count for h in headers),
            valid_bytes=sum(h.size for h in headers),
            headers=headers,
        )

    def _maybe_roll(self, header: rb.BatchHeader, base_offset: int) -> None:
        active = self.active_segment
        # within the segment's file and within segment.bytes now (AlterConfigs may have
        # lowered it since the segment was made)
        fits = (active.can_hold(header.size, 1)
                and active.size + header.size <= self.config.segment_bytes)  # fmt: skip
        relative_ok = base_offset + header.last_offset_delta - active.base_offset <= INT32_MAX
        if active.size == 0 or (fits and relative_ok and not self._aged(header.max_timestamp)):
            return
        self.roll(base_offset)

    def _aged(self, timestamp_ms: int) -> bool:
        """segment.ms, as Kafka's LogSegment.shouldRoll measures it: from the active segment's
        first batch's max timestamp to `timestamp_ms` (an incoming batch's, or now)."""
        active = self.active_segment
        if not active.index.count:
            return False
        first = int(active.index.max_timestamps[0])  # the first batch's, as its header has it
        return first >= 0 and timestamp_ms - first > self.config.segment_ms

    def maybe_roll_by_time(self, now_ms: int) -> bool:
        """The retention check's segment.ms roll: an active segment older than it is sealed,
        so retention can delete it once it expires. No space for the new one: not now."""
        if not self._aged(now_ms):
            return False
        try:
            self.roll()
        except LogDirectoryFullError as e:
            log.warning("log %s: segment.ms roll put off: %s", self.directory, e)
            return False
        return True

    def roll(self, new_base_offset: int | None = None) -> LogSegment:
        """Seal the active segment and start a new one at the log end."""
        base = self.log_end_offset if new_base_offset is None else new_base_offset
        assert base >= self.log_end_offset
        if self.active_segment.size == 0 and base == self.active_segment.base_offset:
            # An empty segment already starts there: a second one would share its file name.
            return self.active_segment
        self.active_segment.seal()
        try:
            segment = LogSegment.create(self.directory, base, self.config.segment_bytes,
                                        self.config.max_index_entries, self._spares.take(base))  # fmt: skip
        except OSError as e:
            # No room for the new segment's files: the old one stays the active one.
            _delete_segment_files(self.directory, base)
            self.active_segment.make_appendable()
            error = reservation.full_error(e, self.directory, 2 * PAGE_BYTES,
                                           f"creating segment {base:020d}")  # fmt: skip
            if error is None:
                raise
            raise error from None
        self._segments.append(segment)
        self._bases.append(base)
        return segment

    # -- reading ------------------------------------------------------------------------------

    def read(self, fetch_offset: int, max_bytes: int, max_offset: int | None = None,
             min_one_batch: bool = True) -> ReadResult:  # fmt: skip
        """Whole batches from the one holding `fetch_offset`, up to `max_bytes` (at least one
        batch when `min_one_batch`, as in KIP-74), ending before the batch that holds
        `max_offset` (a consumer passes the high watermark)."""
        if not self.log_start_offset <= fetch_offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {fetch_offset} is outside the log's range [{self.log_start_offset}, "
                f"{self.log_end_offset}]"
            )
        upper = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        empty = ReadResult(fetch_offset, ())
        k = bisect.bisect_right(self._bases, fetch_offset) - 1
        while k < len(self._segments) and fetch_offset < upper:
            segment = self._segments[k]
            index = segment.index
            first = max(index.batch_at_or_before(fetch_offset), 0)
            if first >= index.count or fetch_offset >= segment.next_offset:
                k += 1  # the offset is this segment's end: the next one starts there
                continue
            if segment.batch_header(first).last_offset < fetch_offset:
                first += 1  # the offset falls in a gap (a compacted leader): start after it
            positions = index.positions
            start = int(positions[first])
            stop = self._end_position(segment, upper)
            if stop <= start:
                return empty
            limit = start + max_bytes
            if stop > limit:
                last = int(positions.searchsorted(positions.dtype.type(min(limit, INT32_MAX)),
                                                  side="right")) - 1  # fmt: skip
                boundary = int(positions[last + 1]) if last + 1 < index.count else segment.size
                stop = boundary if boundary <= limit else int(positions[last])
                if stop <= start:
                    if not min_one_batch:
                        return empty
                    stop = int(positions[first + 1]) if first + 1 < index.count else segment.size
            return ReadResult(fetch_offset, (FileSlice(segment, start, stop - start),))
        return empty

    @staticmethod
    def _end_position(segment: LogSegment, upper: int) -> int:
        """Position of the first batch whose last offset >= `upper` (or the segment end)."""
        index = segment.index
        j = index.batch_at_or_before(upper)
        if j < 0:
            return 0
        if segment.batch_header(j).last_offset >= upper:  # batch j holds `upper`: stop before it
            return int(index.positions[j])
        return int(index.positions[j + 1]) if j + 1 < index.count else segment.size

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record whose timestamp >= `timestamp`, or None.

        In a compressed batch the broker does not decode records: the answer is the batch's
        base offset and max timestamp.
        """
        for segment in self._segments:
            largest = segment.largest_timestamp()
            if largest is None or largest < timestamp:
                continue
            index = segment.index
            # A client's maxTimestamp may overstate its records: then keep looking, as Kafka's
            # searchForTimestamp does, through the later batches of the segment.
            for i in range(index.first_batch_with_timestamp_at_least(timestamp), index.count):
                if int(index.max_timestamps[i]) < timestamp:
                    continue
                header = segment.batch_header(i)
                _, position = index.entry(i)
                with segment.view(position, header.size) as batch:
                    if header.last_offset < self.log_start_offset:
                        continue
                    if header.compression:
                        return max(header.base_offset, self.log_start_offset), header.max_timestamp
                    for record in rb.iter_records(batch):
                        if record.timestamp >= timestamp and record.offset >= self.log_start_offset:
                            return record.offset, record.timestamp
        return None

    # -- truncation and retention -------------------------------------------------------------

    def truncation_offset(self, offset: int) -> int:
        """Where `truncate_to(offset)` would end the log: `offset`, or below it the base of the
        batch that holds it (whole batches go)."""
        if not self.log_start_offset <= offset < self.log_end_offset:
            return offset if offset < self.log_start_offset else self.log_end_offset
        segment = self._segments[bisect.bisect_right(self._bases, offset) - 1]
        return segment.truncation_offset(offset)

    def truncate_to(self, offset: int) -> int:
        """Remove every record at or after `offset` (whole batches). Returns bytes removed."""
        if offset >= self.log_end_offset:
            return 0
        if offset < self.log_start_offset:
            removed = self.size_in_bytes
            self.truncate_fully_and_start_at(offset)
            return removed
        removed = self._truncate_segments(offset)
        self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
        self.recovery_point = min(self.recovery_point, self.log_end_offset)
        log.info("log %s truncated to offset %d (%d bytes removed)", self.directory,
                 self.log_end_offset, removed)  # fmt: skip
        return removed

    def _truncate_segments(self, offset: int) -> int:
        """Remove the batches at or after `offset` (within the log) from the segments."""
        self._truncations += 1
        removed = 0
        while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
            segment = self._segments.pop()
            self._bases.pop()
            removed += segment.size
            segment.delete()
        active = self.active_segment
        active.make_appendable()
        return removed + active.truncate_to(offset)

    def _delete_from_front(self, segment: LogSegment) -> None:
        """A segment below the log start goes; its file may serve the next one."""
        if self.config.reuse_segment_files:
            segment.retire(self._spares)
        else:
            segment.delete()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and start an empty log at `offset`."""
        self._truncations += 1
        self._spares.discard()  # its old batches may lie above `offset`
        for segment in self._segments:
            segment.delete()
        self._segments = [LogSegment.create(self.directory, offset, self.config.segment_bytes,
                                            self.config.max_index_entries)]  # fmt: skip
        self._bases = [offset]
        self._start_offset = offset
        self.leader_epoch_cache.clear()
        self.recovery_point = offset
        log.info("log %s emptied; it now starts at offset %d", self.directory, offset)

    def increment_log_start_offset(self, offset: int) -> bool:
        """DeleteRecords (or a follower following its leader's start): records below `offset`
        are gone; segments wholly below it are deleted now. False when the start is past it."""
        assert offset <= self.log_end_offset, (offset, self.log_end_offset)
        if offset <= self.log_start_offset:
            return False
        self._move_start(offset)
        return True

    def _move_start(self, offset: int) -> None:
        self._start_offset = offset
        deleted = 0
        while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
            segment = self._segments.pop(0)
            self._bases.pop(0)
            self._delete_from_front(segment)
            deleted += 1
        self.leader_epoch_cache.truncate_from_start(offset)
        self.recovery_point = max(self.recovery_point, offset)
        log.info("log %s now starts at offset %d (%d segment(s) below it deleted)",
                 self.directory, offset, deleted)  # fmt: skip

    def delete_old_segments(self, now_ms: int, high_watermark: int | None = None) -> int:
        """Retention: delete whole old segments past `retention.ms` or over `retention.bytes`.

        Never the active segment, and only segments wholly below `high_watermark`.
        Returns how many were deleted.
        """
        config = self.config
        self.maybe_roll_by_time(now_ms)
        limit = self.log_end_offset if high_watermark is None else high_watermark
        excess = self.size_in_bytes - config.retention_bytes
        deleted = 0
        while len(self._segments) > 1 and self._segments[1].base_offset <= limit:
            segment = self._segments[0]
            largest = segment.largest_timestamp()
            expired = (
                config.retention_ms >= 0
                and largest is not None
                and (now_ms - largest > config.retention_ms)
            )
            oversize = config.retention_bytes >= 0 and excess - segment.size >= 0
            if not (expired or oversize):
                break
            excess -= segment.size
            self._segments.pop(0)
            self._bases.pop(0)
            self._delete_from_front(segment)
            deleted += 1
            log.info("log %s: retention deleted segment %s (%s)", self.directory,
                     segment.path.name, "retention.ms" if expired else "retention.bytes")  # fmt: skip
        if deleted:
            self.leader_epoch_cache.truncate_from_start(self.log_start_offset)
            self.recovery_point = max(self.recovery_point, self.log_start_offset)
        return deleted

    def replace_segment(self, old: LogSegment, new: LogSegment | None) -> None:
        """The log cleaner's swap (its files are already in place): `new` (same base offset)
        takes `old`'s place, or `old` goes when None. Readers holding `old` keep its data."""
        k = self._segments.index(old)
        assert old is not self.active_segment and (k > 0 or new is not None)
        if new is None:
            del self._segments[k], self._bases[k]
        else:
            assert new.base_offset == old.base_offset
            self._segments[k] = new

    # -- durability ---------------------------------------------------------------------------

    def flush(self) -> int:
        """fdatasync every segment the recovery point has not passed; returns the new point."""
        plan = self.flush_plan()
        plan.run()
        return self.flushed(plan)

    def flush_plan(self, also: tuple[Path, ...] = ()) -> LogFlush:
        """The files a flush syncs now (`LogFlush.run`, on any thread), then `flushed`;
        `also`: other files beside the log to sync with it (producer state snapshots)."""
        k = max(bisect.bisect_right(self._bases, self.recovery_point) - 1, 0)
        paths = tuple(path for segment in self._segments[k:] if segment.size
                      for path in (segment.path, segment.index.offset_path,
                                   segment.index.time_path))  # fmt: skip
        return LogFlush(self, paths + also, self.log_end_offset, self._truncations,
                        self.leader_epoch_cache.unwritten())  # fmt: skip

    def flushed(self, plan: LogFlush) -> int:
        """After `plan.run()`: everything below its end is on disk, unless the log was cut
        meanwhile (the records past the cut may be new and unsynced). The recovery point."""
        assert plan.log is self
        if plan.truncations == self._truncations:
            self.recovery_point = max(self.recovery_point, min(plan.end, self.log_end_offset))
        return self.recovery_point

    def close(self) -> None:
        """Flush, trim the active segment, and leave the clean-shutdown marker."""
        self.flush()
        self._spares.discard(closing=True)
        for segment in self._segments:
            segment.close()
        (self.directory / CLEAN_SHUTDOWN).touch()

    def delete(self) -> None:
        """Remove the log and its directory (StopReplica with delete)."""
        self.leader_epoch_cache.close()  # before the directory goes: no late write recreates it
        self._spares.discard(closing=True)
        for segment in self._segments:
            segment.delete()
        shutil.rmtree(self.directory, ignore_errors=True)


def _delete_segment_files(directory: Path, base_offset: int) -> None:
    for suffix in (SUFFIX, ".index", ".timeindex"):
        (directory / f"{base_offset:020d}{suffix}").unlink(missing_ok=True)


def _remove_leftovers(directory: Path) -> None:
    """Temp files from an interrupted checkpoint write, indexes without their segment, data
    files kept for reuse (the process that kept them is gone)."""
    for path in directory.iterdir():
        if path.suffix in (".tmp", SPARE_SUFFIX):
            path.unlink(missing_ok=True)
        elif path.suffix in (".index", ".timeindex") and not path.with_suffix(SUFFIX).exists():
            log.info("log %s: removing %s, whose segment is gone", directory, path.name)
            path.unlink(missing_ok=True)
