"""The Log against a plain in-memory model, over random operation sequences (hypothesis).

The model is a list of segments, each a list of batches (offsets, epoch, the exact bytes the log
must hold), plus the leader epoch history. Every rule applies an operation to both; after every
step the log's offsets, segment bases, bytes, indexes and epoch cache must equal the model's.
The config is tiny so that rolls, index-full rolls and retention happen every few steps, and
closing/reopening (clean, and "crashed": abandoned without close) are operations too.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from localcluster.storage import (
    CorruptRecordError,
    Log,
    LogConfig,
    OffsetOutOfRangeError,
    Record,
    RecordBatchTooLargeError,
    UnexpectedAppendOffsetError,
    encode_batch,
    iter_records,
)
from localcluster.storage import record_batch as rb
from tests.helpers import check_indexes_agree, scan_log

CONFIG = LogConfig(segment_bytes=700, segment_index_bytes=32, retention_bytes=1600,
                   retention_ms=400)  # fmt: skip
MAX_ENTRIES = CONFIG.max_index_entries  # 4


@dataclass
class MBatch:
    base: int
    last: int
    epoch: int
    data: bytes  # exactly what the log must hold
    max_ts: int

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass
class MSegment:
    base: int
    batches: list[MBatch] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(b.size for b in self.batches)

    @property
    def next_offset(self) -> int:
        return self.batches[-1].last + 1 if self.batches else self.base


def stamp(data: bytes, base: int, epoch: int) -> bytes:
    buf = bytearray(data)
    rb.set_base_offset(buf, 0, base)
    rb.set_partition_leader_epoch(buf, 0, epoch)
    return bytes(buf)


class LogMachine(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.directory = tempfile.mkdtemp(prefix="log-model-", dir="/dev/shm")
        self.log = Log.open(self.directory, CONFIG)
        self.segments = [MSegment(0)]
        self.epochs: list[tuple[int, int]] = []
        self.epoch = 0
        self.clock = 1000
        self.flushed = 0  # recovery point of the last flush (what a checkpoint would hold)

    def teardown(self):
        if hasattr(self, "log"):
            try:
                self.log.close()
            finally:
                shutil.rmtree(self.directory, ignore_errors=True)

    # -- model helpers ----------------------------------------------------------------------

    @property
    def leo(self) -> int:
        return self.segments[-1].next_offset

    @property
    def lso(self) -> int:
        return self.segments[0].base

    def all_batches(self) -> list[MBatch]:
        return [b for s in self.segments for b in s.batches]

    def model_place(self, batch: MBatch) -> None:
        active = self.segments[-1]
        fits = (
            active.size + batch.size <= CONFIG.segment_bytes and len(active.batches) < MAX_ENTRIES
        )
        if not fits and active.batches:
            self.segments.append(MSegment(batch.base))
        self.segments[-1].batches.append(batch)

    def model_assign(self, epoch: int, start: int) -> None:
        if self.epochs and epoch == self.epochs[-1][0] and start >= self.epochs[-1][1]:
            return
        self.epochs = [e for e in self.epochs if e[0] < epoch and e[1] < start] + [(epoch, start)]

    def model_truncate_epochs_from_end(self, end: int) -> None:
        self.epochs = [e for e in self.epochs if e[1] < end]

    def model_truncate_epochs_from_start(self, start: int) -> None:
        covering = [e for e in self.epochs if e[1] <= start]
        if covering:
            self.epochs = [(covering[-1][0], start)] + [e for e in self.epochs if e[1] > start]

    def make(self, n: int, size: int, seed: int) -> tuple[bytes, int]:
        records = [Record(bytes([97 + (seed + i) % 26]) * size, key=b"%d" % seed,
                          timestamp=self.clock + i) for i in range(n)]  # fmt: skip
        self.clock += n
        return encode_batch(records), self.clock - 1

    # -- appends ------------------------------------------------------------------------------

    @rule(n=st.integers(1, 5), size=st.integers(0, 100), seed=st.integers(0, 99),
          bump=st.sampled_from([0, 0, 0, 1, 2]), batches=st.integers(1, 2))  # fmt: skip
    def append(self, n, size, seed, bump, batches):
        self.epoch += bump
        parts = [self.make(n, size, seed + k) for k in range(batches)]
        info = self.log.append(b"".join(p for p, _ in parts), leader_epoch=self.epoch)
        first = self.leo
        if not self.epochs or self.epoch > self.epochs[-1][0]:
            self.model_assign(self.epoch, first)
        offset = first
        for data, max_ts in parts:
            self.model_place(MBatch(offset, offset + n - 1, self.epoch,
                                    stamp(data, offset, self.epoch), max_ts))  # fmt: skip
            offset += n
        assert (info.first_offset, info.last_offset) == (first, offset - 1)
        assert info.records_count == n * batches

    @rule(k=st.integers(2, 8), size=st.integers(20, 100))
    def append_several(self, k, size):
        # Uniform rule choice would otherwise keep logs short: this one fills segments.
        for i in range(k):
            self.append(n=1 + i % 3, size=size, seed=i, bump=0, batches=1)

    @rule(n=st.integers(1, 3), gap=st.sampled_from([0, 0, 0, 1, 7]), bump=st.integers(0, 1))
    def append_as_follower(self, n, gap, bump):
        self.epoch += bump
        base = self.leo + gap
        data, max_ts = self.make(n, 30, base)
        data = stamp(data, base, self.epoch)
        info = self.log.append_as_follower(data)
        assert (info.first_offset, info.last_offset) == (base, base + n - 1)
        if self.epoch > (self.epochs[-1][0] if self.epochs else -1):
            self.model_assign(self.epoch, base)
        self.model_place(MBatch(base, base + n - 1, self.epoch, data, max_ts))

    @precondition(lambda self: self.leo > self.lso)
    @rule()
    def follower_append_behind_the_log_end(self):
        data, _ = self.make(1, 5, 0)
        with pytest.raises(UnexpectedAppendOffsetError):
            self.log.append_as_follower(stamp(data, self.leo - 1, self.epoch))

    @rule(flip=st.integers(rb.CRC_START, 80))
    def append_corrupt(self, flip):
        good, _ = self.make(1, 60, 1)
        bad = bytearray(self.make(2, 60, 2)[0])
        bad[flip] ^= 0x40
        with pytest.raises(CorruptRecordError):
            self.log.append(good + bytes(bad), leader_epoch=self.epoch)

    @rule()
    def append_too_large(self):
        data, _ = self.make(1, CONFIG.segment_bytes, 3)
        with pytest.raises(RecordBatchTooLargeError):
            self.log.append(data, leader_epoch=self.epoch)

    @rule()
    def roll(self):
        self.log.roll()
        if self.segments[-1].batches:
            self.segments.append(MSegment(self.leo))

    # -- truncation and retention -------------------------------------------------------------

    @rule(back=st.integers(-2, 25))
    def truncate_to(self, back):
        offset = max(self.leo - back, 0)
        self.log.truncate_to(offset)
        event(
            "truncate_to inside the log" if self.lso <= offset < self.leo else "truncate_to outside"
        )
        if offset >= self.leo:
            return
        if offset < self.lso:
            self.segments = [MSegment(offset)]
            self.epochs = []
            return
        while len(self.segments) > 1 and self.segments[-1].base >= offset:
            self.segments.pop()
        active = self.segments[-1]
        active.batches = [b for b in active.batches if b.last < offset]
        self.model_truncate_epochs_from_end(self.leo)

    @rule(ahead=st.integers(0, 30))
    def truncate_fully_and_start_at(self, ahead):
        offset = self.leo + ahead
        self.log.truncate_fully_and_start_at(offset)
        self.segments = [MSegment(offset)]
        self.epochs = []

    @rule(age=st.integers(0, 600), hw_back=st.none() | st.integers(0, 20))
    def delete_old_segments(self, age, hw_back):
        now = self.clock + age
        hw = None if hw_back is None else max(self.leo - hw_back, self.lso)
        deleted = self.log.delete_old_segments(now, hw)
        limit = self.leo if hw is None else hw
        expected = 0
        total = sum(s.size for s in self.segments)
        while len(self.segments) > 1 and self.segments[1].base <= limit:
            first = self.segments[0]
            largest = max((b.max_ts for b in first.batches), default=None)
            expired = largest is not None and now - largest > CONFIG.retention_ms
            oversize = total - first.size >= CONFIG.retention_bytes
            if not (expired or oversize):
                break
            total -= first.size
            self.segments.pop(0)
            expected += 1
        assert deleted == expected
        event(f"retention deleted {min(expected, 2)}+ segments")
        if expected:
            self.model_truncate_epochs_from_start(self.lso)

    # -- durability ---------------------------------------------------------------------------

    @rule()
    def flush(self):
        self.flushed = self.log.flush()
        assert self.flushed == self.leo

    @rule()
    def close_and_reopen(self):
        self.log.close()
        self.log = Log.open(self.directory, CONFIG)
        assert self.log.cuts == []
        self.after_reopen()

    @rule(from_zero=st.booleans())
    def crash_and_reopen(self, from_zero):
        # The old Log is abandoned without close, as after kill -9: its writes are in the page
        # cache, its files untrimmed, and no clean-shutdown marker.
        self.log = Log.open(self.directory, CONFIG, recovery_point=0 if from_zero else self.flushed)
        assert self.log.cuts == []
        assert self.log.recovery_point == self.leo
        self.after_reopen()

    def after_reopen(self):
        self.model_truncate_epochs_from_end(self.leo)
        self.model_truncate_epochs_from_start(self.lso)
        self.flushed = min(self.flushed, self.leo)

    # -- reads --------------------------------------------------------------------------------

    @rule(data=st.data())
    def read(self, data):
        fetch = data.draw(st.integers(self.lso, self.leo), label="fetch_offset")
        max_bytes = data.draw(st.integers(0, 900), label="max_bytes")
        max_offset = data.draw(st.none() | st.integers(self.lso, self.leo + 2), label="max_offset")
        one = data.draw(st.booleans(), label="min_one_batch")
        got = self.log.read(fetch, max_bytes, max_offset, min_one_batch=one).tobytes()
        upper = self.leo if max_offset is None else min(max_offset, self.leo)
        expected, total = b"", 0
        for segment in self.segments:
            if segment.next_offset <= fetch:
                continue
            for batch in segment.batches:
                if batch.last < fetch:
                    continue
                if batch.last >= upper:
                    break
                if total + batch.size > max_bytes and not (one and not expected):
                    break
                expected += batch.data
                total += batch.size
            if segment.batches:
                break  # a read never crosses a segment
        assert got == expected

    @rule(offset=st.integers(1, 40))
    def read_out_of_range(self, offset):
        with pytest.raises(OffsetOutOfRangeError):
            self.log.read(self.leo + offset, 100)
        if self.lso >= offset:
            with pytest.raises(OffsetOutOfRangeError):
                self.log.read(self.lso - offset, 100)

    @rule(back=st.integers(-5, 60))
    def offset_for_timestamp(self, back):
        target = self.clock - back
        expected = None
        for batch in self.all_batches():
            found = next(((r.offset, r.timestamp) for r in iter_records(batch.data)
                          if r.timestamp >= target), None)  # fmt: skip
            if found:
                expected = found
                break
        assert self.log.offset_for_timestamp(target) == expected

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self):
        log = self.log
        event(f"segments: {min(len(self.segments), 4)}+")
        assert (log.log_start_offset, log.log_end_offset) == (self.lso, self.leo)
        assert [s.base_offset for s in log.segments] == [s.base for s in self.segments]
        assert log.log_start_offset <= log.recovery_point <= log.log_end_offset
        scanned = scan_log(log)
        expected = [(s.base, b.data) for s in self.segments for b in s.batches]
        assert [(base, data) for base, _, _, data in scanned] == expected
        check_indexes_agree(log)
        assert log.leader_epoch_cache.entries() == self.epochs
        for epoch in range(-1, self.epoch + 2):
            higher = [e for e in self.epochs if e[0] > epoch]
            lower = [e for e in self.epochs if e[0] <= epoch]
            if epoch == -1 or not self.epochs or (not higher and epoch != self.epochs[-1][0]):
                want = (-1, -1)
            elif epoch == self.epochs[-1][0]:
                want = (epoch, self.leo)
            else:
                want = (lower[-1][0] if lower else epoch, higher[0][1])
            assert log.end_offset_for_epoch(epoch) == want


LogMachine.TestCase.settings = settings(
    max_examples=250,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLogModel = LogMachine.TestCase
