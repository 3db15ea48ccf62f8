"""The log cleaner's work on one log (Kafka's Cleaner and LogToClean): pick what to clean,
build the offset map, rewrite segments keeping the last record per key, swap them in.

A cleaning has three steps, split so the broker can run the middle one on a thread:
1. `plan` (on the caller's thread, cheap: segment metadata only): the dirty section runs from
   the first dirty offset (the `cleaner-offset-checkpoint`, else the log start) to the first
   uncleanable offset: the base of the active segment, of the segment holding the high
   watermark, or of the first segment with a record newer than min.compaction.lag.ms. The dirty
   ratio is dirty bytes / bytes below that offset. Every segment from the log start to the end
   of the dirty section is a source; each keeps a handle on the live segment.
2. `clean` (any thread; reads files with pread, never the live maps, so a concurrent
   truncation cannot fault it): the offset map (key -> last offset) over the dirty section, then
   each source's batches filtered: a record stays if it is the latest of its key (a record
   without a key goes, as in Kafka); a tombstone (null value) also goes once delete.retention.ms
   has passed since its segment was first cleaned (its "cleaned at" time, kept as the segment
   file's mtime). Offsets never change (gaps appear). A batch that loses no record is copied
   verbatim; one that loses some is rewritten as one batch per run of consecutive offsets, with
   the same attributes (codec, timestamp type), producer id and epoch, the base sequence moved
   with its first offset, and the leader epoch (Kafka keeps one batch with gaps inside; our
   batches must count lastOffsetDelta + 1 records). A producer's last batch and control batches
   are kept whole, so producer state rebuilt from the log is unchanged (Kafka keeps an empty
   batch there). A changed segment is written as `.cleaned` files (segment_swap.py).
3. `commit` (the caller's thread, between reads of the log): checks that every source is still
   the segment that was read (no truncation, retention or roll changed it), then swaps each
   changed segment in (`.swap`, rename) or deletes an emptied one (the log's first segment
   stays, empty, so the log start offset never moves), and the caller moves the checkpoint to
   the end of the dirty section. A failed check discards the `.cleaned` files and commits
   nothing; segments already swapped hold the same latest values, and the checkpoint has not
   moved, so the next cleaning repeats the work.

Time is an argument (`now_ms`); nothing here reads a clock. Segments are cleaned one to one
(Kafka also groups small cleaned segments into one; not done here).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from localcluster.storage import compression, segment_swap
from localcluster.storage import record_batch as rb
from localcluster.storage.checkpoint import CheckpointError, partition_offsets_file
from localcluster.storage.log import Log
from localcluster.storage.producer_state import increment_sequence
from localcluster.storage.segment import LogSegment

log = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
READ_CHUNK_BYTES = 4 << 20  # pread this much of a segment at a time
# The offset map's bound (Kafka: log.cleaner.dedupe.buffer.size, 128 MiB over its threads):
# counted as key bytes plus a dict entry's overhead; a full map ends the dirty section early,
# at a segment boundary.
OFFSET_MAP_BYTES = 64 << 20
MAP_ENTRY_OVERHEAD = 100
TopicPartition = tuple[str, int]


class CleaningAborted(Exception):
    """The cleaning was stopped, or a source segment changed under it."""


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """A compacted topic's cleaner settings (Kafka's names and defaults)."""

    min_compaction_lag_ms: int = 0
    delete_retention_ms: int = 86_400_000
    min_cleanable_dirty_ratio: float = 0.5


@dataclass(frozen=True, slots=True)
class Source:
    """A live segment as it was when planned; `cleaned_at_ms` None: in the dirty section."""

    base_offset: int
    path: Path
    size: int
    next_offset: int
    last_crc: int | None
    cleaned_at_ms: int | None


@dataclass(slots=True)
class CleanPlan:
    directory: Path
    sources: list[Source]
    first_dirty_offset: int
    end_offset: int  # the first uncleanable offset
    dirty_bytes: int
    total_bytes: int
    now_ms: int
    delete_retention_ms: int
    producer_last_offsets: Mapping[int, int]  # producer id -> last offset of its last batch
    # the live segments, one per source (not sent with a plan to another process)
    segments: tuple[LogSegment, ...] = field(default=(), compare=False, repr=False)

    def detached(self) -> CleanPlan:
        """The plan without its live segments: all `clean` needs, picklable."""
        return replace(self, segments=())

    @property
    def dirty_ratio(self) -> float:
        return self.dirty_bytes / self.total_bytes if self.total_bytes else 0.0


@dataclass(slots=True)
class Outcome:
    """One source after cleaning: kept as is, rewritten (`.cleaned` files), or emptied."""

    index: int  # of the source in the plan
    source: Source
    kind: str  # "unchanged", "rewritten", "emptied"
    bytes_after: int


@dataclass(slots=True)
class CleanResult:
    plan: CleanPlan
    end_offset: int  # may be below the plan's when the offset map filled
    outcomes: list[Outcome] = field(default_factory=list)
    dirty_bytes_read: int = 0
    records_removed: int = 0

    @property
    def bytes_before(self) -> int:
        return sum(o.source.size for o in self.outcomes)

    @property
    def bytes_after(self) -> int:
        return sum(o.bytes_after for o in self.outcomes)


# -- 1. planning -------------------------------------------------------------------------------


def _cleaned_at_ms(segment: LogSegment) -> int:
    return os.stat(segment.path).st_mtime_ns // 1_000_000


def _last_crc(segment: LogSegment) -> int | None:
    count = segment.index.count
    return segment.batch_header(count - 1).crc if count else None


def first_uncleanable_offset(lg: Log, first_dirty: int, settings: CleanerSettings, now_ms: int,
                             high_watermark: int) -> int:  # fmt: skip
    """The active segment's base, or the base of the first segment from `first_dirty` on that
    reaches the high watermark or holds a record newer than min.compaction.lag.ms."""
    for segment in lg.segments[:-1]:
        if segment.next_offset <= first_dirty:
            continue
        largest = segment.largest_timestamp()
        too_new = (settings.min_compaction_lag_ms > 0 and largest is not None
                   and largest > now_ms - settings.min_compaction_lag_ms)  # fmt: skip
        if segment.next_offset > high_watermark or too_new:
            return segment.base_offset
    return lg.active_segment.base_offset


def plan(lg: Log, checkpoint: int | None, settings: CleanerSettings, now_ms: int,
         high_watermark: int, producer_last_offsets: Mapping[int, int] | None = None
         ) -> CleanPlan | None:  # fmt: skip
    """What a cleaning of `lg` would rewrite, or None when it has no dirty segment."""
    first_dirty = checkpoint
    if first_dirty is None or not lg.log_start_offset <= first_dirty <= lg.log_end_offset:
        first_dirty = lg.log_start_offset  # Kafka resets a checkpoint outside the log too
    end = first_uncleanable_offset(lg, first_dirty, settings, now_ms, high_watermark)
    sources, segments, dirty, total = [], [], 0, 0
    for segment in lg.segments:
        if segment.base_offset >= end:
            break
        is_dirty = segment.next_offset > first_dirty
        cleaned_at = None if is_dirty else _cleaned_at_ms(segment)
        sources.append(Source(segment.base_offset, segment.path, segment.size,
                              segment.next_offset, _last_crc(segment), cleaned_at))  # fmt: skip
        segments.append(segment)
        total += segment.size
        dirty += segment.size if is_dirty else 0
    if not any(s.cleaned_at_ms is None for s in sources):
        return None
    first_dirty = next(s.base_offset for s in sources if s.cleaned_at_ms is None)
    return CleanPlan(lg.directory, sources, first_dirty, end, dirty, total, now_ms,
                     settings.delete_retention_ms, dict(producer_last_offsets or {}),
                     tuple(segments))  # fmt: skip


# -- 2. cleaning (any thread) ------------------------------------------------------------------


def _batches(path: Path, size: int, stopped: Callable[[], bool]) -> Iterator[memoryview]:
    """Each batch of the first `size` bytes of the file, read with pread in chunks."""
    fd = os.open(path, os.O_RDONLY)  # this inode even if the log renames or deletes the path
    try:
        position = 0
        while position < size:
            if stopped():
                raise CleaningAborted("stopped")
            data = os.pread(fd, min(READ_CHUNK_BYTES, size - position), position)
            consumed = 0
            for start, length in rb.batch_spans(data):
                yield memoryview(data)[start : start + length]
                consumed = start + length
            if consumed == 0:  # one batch larger than the chunk
                need = rb.read_header(data).size if len(data) >= rb.HEADER_SIZE else 0
                whole = os.pread(fd, need, position) if need > len(data) else b""
                if len(whole) < max(need, 1):
                    raise CleaningAborted(f"{path.name} changed at position {position}")
                yield memoryview(whole)
                consumed = need
            position += consumed
    finally:
        os.close(fd)


def build_offset_map(plan: CleanPlan, stopped: Callable[[], bool],
                     pause: Callable[[], None] = lambda: None,
                     map_bytes: int = OFFSET_MAP_BYTES) -> tuple[dict[bytes, int], int, int]:  # fmt: skip
    """key -> last offset over the dirty sources, whole segments only; (map, end offset,
    dirty bytes read). A full map ends the dirty section at the segment it filled in."""
    offsets: dict[bytes, int] = {}
    used, read = 0, 0
    end = plan.end_offset
    for source in plan.sources:
        if source.cleaned_at_ms is not None:
            continue
        if used > map_bytes and offsets:
            end = source.base_offset
            break
        for batch in _batches(source.path, source.size, stopped):
            pause()
            header = rb.read_header(batch)
            if header.is_control:
                continue
            for record in rb.iter_records(batch):
                if record.key is not None:
                    if record.key not in offsets:
                        used += len(record.key) + MAP_ENTRY_OVERHEAD
                    offsets[record.key] = record.offset
        read += source.size
    return offsets, end, read


@dataclass(slots=True)
class _Filter:
    offsets: dict[bytes, int]
    producer_last_offsets: Mapping[int, int]
    drop_tombstones: bool
    removed: int = 0

    def retain(self, record: rb.Record) -> bool:
        if record.key is None:
            return False
        latest = self.offsets.get(record.key)
        if latest is not None and record.offset < latest:
            return False
        return not (record.value is None and self.drop_tombstones)

    def batch(self, batch: memoryview) -> list[bytes] | memoryview:
        """The batch itself when it keeps every record, else its rewritten batches."""
        header = rb.read_header(batch)
        if header.is_control:
            return batch
        if header.producer_id >= 0 and self.producer_last_offsets.get(header.producer_id) == \
                header.last_offset:  # fmt: skip
            return batch
        records = list(rb.iter_records(batch))
        kept = [r for r in records if self.retain(r)]
        self.removed += len(records) - len(kept)
        if len(kept) == len(records):
            return batch
        return [rebuild_batch(header, run) for run in _runs(kept)]


def _runs(records: list[rb.Record]) -> Iterator[list[rb.Record]]:
    """Consecutive offsets together."""
    run: list[rb.Record] = []
    for record in records:
        if run and record.offset != run[-1].offset + 1:
            yield run
            run = []
        run.append(record)
    if run:
        yield run


def rebuild_batch(header: rb.BatchHeader, run: list[rb.Record]) -> bytes:
    """A batch of `run` (consecutive offsets) carrying `header`'s batch-level fields."""
    base = run[0].offset
    sequence = header.base_sequence
    if sequence >= 0:
        sequence = increment_sequence(sequence, base - header.base_offset)
    spec = rb.BatchSpec(base_offset=base, partition_leader_epoch=header.partition_leader_epoch,
                        base_timestamp=header.base_timestamp, producer_id=header.producer_id,
                        producer_epoch=header.producer_epoch, base_sequence=sequence,
                        attributes=header.attributes)  # fmt: skip
    payload = b"".join(rb.encode_record(r, r.offset - base, r.timestamp - header.base_timestamp)
                       for r in run)  # fmt: skip
    if header.compression:
        payload = compression.compress(header.compression, payload)
    log_append_time = header.attributes & rb.TIMESTAMP_TYPE_MASK
    max_timestamp = header.max_timestamp if log_append_time else max(r.timestamp for r in run)
    return rb.encode_raw_batch(payload, len(run), spec, max_timestamp)


class _CleanedWriter:
    """A segment's `.cleaned` files: the log written batch by batch, its trimmed indexes."""

    def __init__(self, directory: Path, base_offset: int):
        self.paths = segment_swap.cleaned_paths(directory, base_offset)
        self.base_offset = base_offset
        self.file = open(self.paths[".log"], "wb")
        self.size = 0
        self.entries: list[tuple[int, int]] = []
        self.timestamps: list[int] = []
        self.changed = False

    def append(self, batch) -> None:
        header = rb.read_header(batch)
        self.entries.append((header.base_offset - self.base_offset, self.size))
        self.timestamps.append(header.max_timestamp)
        self.file.write(batch)
        self.size += header.size

    def finish(self, cleaned_at_ms: int) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        offsets = np.array(self.entries, dtype=np.int32).reshape(-1, 2)
        for path, array in ((self.paths[".index"], offsets),
                            (self.paths[".timeindex"], np.array(self.timestamps, np.int64))):  # fmt: skip
            with open(path, "wb") as f:
                f.write(array.tobytes())
                f.flush()
                os.fsync(f.fileno())
        ns = cleaned_at_ms * 1_000_000
        os.utime(self.paths[".log"], ns=(ns, ns))

    def discard(self) -> None:
        if not self.file.closed:
            self.file.close()
        for path in self.paths.values():
            path.unlink(missing_ok=True)


def clean(plan: CleanPlan, stopped: Callable[[], bool] = lambda: False,
          pause: Callable[[], None] = lambda: None, map_bytes: int = OFFSET_MAP_BYTES) -> CleanResult:  # fmt: skip
    """Step 2: the offset map, then each source filtered into `.cleaned` files when it changes.
    `stopped` aborts (CleaningAborted, nothing left behind); `pause` runs between batches (a
    thread yields the interpreter there)."""
    offsets, end, read = build_offset_map(plan, stopped, pause, map_bytes)
    result = CleanResult(plan, end, dirty_bytes_read=read)
    try:
        for k, source in enumerate(plan.sources):
            if source.base_offset >= end:
                break
            result.outcomes.append(_clean_source(plan, k, source, offsets, result, stopped, pause))
    except BaseException:
        discard(result)
        raise
    return result


def _clean_source(plan: CleanPlan, k: int, source: Source, offsets: dict[bytes, int],
                  result: CleanResult, stopped, pause) -> Outcome:  # fmt: skip
    horizon_passed = (source.cleaned_at_ms is not None
                      and plan.now_ms - source.cleaned_at_ms > plan.delete_retention_ms)  # fmt: skip
    keep = _Filter(offsets, plan.producer_last_offsets, drop_tombstones=horizon_passed)
    writer = _CleanedWriter(plan.directory, source.base_offset)
    try:
        for batch in _batches(source.path, source.size, stopped):
            kept = keep.batch(batch)
            if kept is batch:
                writer.append(batch)
            else:
                writer.changed = True
                for rebuilt in kept:
                    writer.append(rebuilt)
            pause()
    except BaseException:
        writer.discard()
        raise
    result.records_removed += keep.removed
    if not writer.changed:
        writer.discard()
        return Outcome(k, source, "unchanged", source.size)
    if writer.size == 0 and k > 0:
        writer.discard()
        return Outcome(k, source, "emptied", 0)
    cleaned_at = plan.now_ms if source.cleaned_at_ms is None else source.cleaned_at_ms
    writer.finish(cleaned_at)
    return Outcome(k, source, "rewritten", writer.size)


def discard(result: CleanResult) -> None:
    """Remove the `.cleaned` files of a cleaning that will not be committed."""
    for outcome in result.outcomes:
        if outcome.kind == "rewritten":
            segment_swap.discard_cleaned(result.plan.directory, outcome.source.base_offset)


# -- 3. committing (the log's thread) ----------------------------------------------------------


def _still_there(lg: Log, segment: LogSegment, source: Source) -> bool:
    return (segment in lg.segments and segment is not lg.active_segment
            and segment.size == source.size and segment.next_offset == source.next_offset
            and _last_crc(segment) == source.last_crc)  # fmt: skip


def commit(lg: Log, planned: CleanPlan, result: CleanResult) -> bool:
    """Step 3: swap the cleaned segments into `lg` (`planned` is the plan with its segments);
    False (nothing swapped, the `.cleaned` files gone) when a source changed since it was read.
    The caller then checkpoints `end_offset`."""
    if not all(_still_there(lg, planned.segments[o.index], o.source) for o in result.outcomes):
        discard(result)
        log.info("log %s: a segment changed while it was cleaned; cleaning it again later",
                 lg.directory)  # fmt: skip
        return False
    config = lg.config
    for outcome in result.outcomes:
        old = planned.segments[outcome.index]
        if outcome.kind == "unchanged":
            if outcome.source.cleaned_at_ms is None:  # first cleaned now: its tombstones' clock
                ns = result.plan.now_ms * 1_000_000
                os.utime(old.path, ns=(ns, ns))
            continue
        if outcome.kind == "emptied":
            segment_swap.delete_segment(lg.directory, old.base_offset)
            lg.replace_segment(old, None)
            continue
        segment_swap.swap_in(lg.directory, old.base_offset)
        new = LogSegment.open_existing(lg.directory, old.base_offset, config.segment_bytes,
                                       config.max_index_entries)  # fmt: skip
        if not new.load_trusted():
            new.recover()
        lg.replace_segment(old, new)
    return True


def clean_log(lg: Log, checkpoint: int | None, settings: CleanerSettings, now_ms: int,
              high_watermark: int | None = None,
              producer_last_offsets: Mapping[int, int] | None = None) -> CleanResult | None:  # fmt: skip
    """All three steps on the caller's thread (tests, tools); None when nothing is dirty.
    Cleans whatever the dirty ratio; the caller checkpoints `result.end_offset`."""
    hw = lg.log_end_offset if high_watermark is None else high_watermark
    planned = plan(lg, checkpoint, settings, now_ms, hw, producer_last_offsets)
    if planned is None:
        return None
    result = clean(planned.detached())
    return result if commit(lg, planned, result) else None


# -- the checkpoint ----------------------------------------------------------------------------


class CleanerCheckpoints:
    """`cleaner-offset-checkpoint` of one log dir: partition -> first dirty offset."""

    def __init__(self, path: Path):
        self.file = partition_offsets_file(path)
        try:
            self.offsets = dict(self.file.read())
        except CheckpointError as e:
            # Losing it only means cleaning again from each log's start.
            log.warning("%s; cleaning every compacted log from its start", e)
            self.offsets = {}

    def get(self, tp: TopicPartition) -> int | None:
        return self.offsets.get(tp)

    def update(self, tp: TopicPartition, offset: int) -> None:
        self.offsets[tp] = offset
        self.save()

    def truncate_to(self, tp: TopicPartition, offset: int) -> None:
        """A log truncated below its checkpoint is dirty from there (Kafka's
        maybeTruncateCheckpoint): written at once, or appends after it would pass as clean."""
        if self.offsets.get(tp, -1) > offset:
            self.update(tp, offset)

    def remove(self, tp: TopicPartition) -> None:
        if self.offsets.pop(tp, None) is not None:
            self.save()

    def save(self) -> None:
        self.file.write(sorted(self.offsets.items()))
