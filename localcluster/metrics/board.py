"""The metrics board: one POSIX shared-memory segment per cluster, one fixed row per broker.

The supervisor creates the segment at `up` and removes it at `down`; brokers write their own row (counters, a produce latency histogram, the log end offset and
high watermark of up to REPLICA_SLOTS replicas they host); `localcluster status --watch` reads
every row without sending a request to anyone. The segment is `/localcluster-<hash>-metrics`
(the hash of the cluster dir, as the /dev/shm data dir), a header then MAX_BROKERS rows of a
numpy structured dtype, so its size never changes.

Rules:
- One writer per row: broker N writes row N (N < MAX_BROKERS; other ids get a no-op writer).
- Readers never block writers: each row has a sequence number (a seqlock), odd while the
  writer is inside an update; a reader copies the row and retries when the number was odd or
  moved, a bounded number of times, then reports the row as `torn` instead of waiting.
- A broker (re)start zeroes its row and stamps `started_ms`; rates are computed by readers
  from two snapshots of the same incarnation.
- Bounded: a latency histogram of LATENCY_BUCKETS power-of-two buckets (no list of samples),
  REPLICA_SLOTS replica slots per broker (further replicas are not shown).
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from dataclasses import dataclass

import numpy as np
import posix_ipc

from localcluster.metrics import segment
from localcluster.metrics.segment import cluster_hash, segment_name  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

MAGIC = 0x4C434D4554524943  # "LCMETRIC"
VERSION = 1
MAX_BROKERS = 128
REPLICA_SLOTS = 64
TOPIC_BYTES = 64  # longer topic names are cut (display only)
LATENCY_BUCKETS = (
    26  # bucket i: latency_us in [2**(i-1), 2**i); bucket 0: < 1 us; last: >= 2**24 us
)
READ_RETRIES = 64

HEADER = np.dtype([("magic", "<u8"), ("version", "<u4"), ("max_brokers", "<u4"),
                   ("row_bytes", "<u4"), ("replica_slots", "<u4"), ("created_ms", "<i8")],
                  align=True)  # fmt: skip
REPLICA = np.dtype([("topic", f"S{TOPIC_BYTES}"), ("partition", "<i4"), ("is_leader", "u1"),
                    ("log_end_offset", "<i8"), ("high_watermark", "<i8")], align=True)  # fmt: skip
# Counters live side by side so a writer adds to them through one flat uint64 view.
COUNTERS = ("messages_in", "bytes_in", "bytes_out", "produce_requests", "fetch_requests",
            "isr_shrinks", "isr_expands", "latency_count", "latency_sum_us")  # fmt: skip
ROW = np.dtype([("seq", "<u8"), ("broker_id", "<i4"), ("pid", "<i4"), ("started_ms", "<i8"),
                ("updated_ms", "<i8"), ("counters", "<u8", (len(COUNTERS),)),
                ("latency_buckets", "<u8", (LATENCY_BUCKETS,)), ("replica_count", "<u4"),
                ("replicas", REPLICA, (REPLICA_SLOTS,))], align=True)  # fmt: skip
HEADER_BYTES = 64
assert HEADER.itemsize <= HEADER_BYTES
SIZE = HEADER_BYTES + MAX_BROKERS * ROW.itemsize
assert SIZE == segment.SIZE, f"update segment.SIZE to {SIZE}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def latency_bucket(latency_us: int) -> int:
    """Index of the power-of-two bucket holding latency_us."""
    return min(max(int(latency_us), 0).bit_length(), LATENCY_BUCKETS - 1)


def bucket_upper_us(index: int) -> float:
    """The exclusive upper bound of a bucket in microseconds (inf for the last one)."""
    return float("inf") if index >= LATENCY_BUCKETS - 1 else float(1 << index)


class _Segment:
    """The mapped segment: a header record and the row array, both numpy views of the map."""

    def __init__(self, name: str, create: bool):
        flags = posix_ipc.O_CREAT if create else 0
        shm = posix_ipc.SharedMemory(name, flags, mode=0o600, size=SIZE if create else 0)
        try:
            if shm.size < SIZE:
                raise ValueError(f"metrics segment {name} holds {shm.size} bytes, expected {SIZE}")
            self.map = mmap.mmap(shm.fd, SIZE)
        finally:
            shm.close_fd()
        self.name = name
        self.header = np.ndarray((), HEADER, buffer=self.map, offset=0)
        self.rows = np.ndarray((MAX_BROKERS,), ROW, buffer=self.map, offset=HEADER_BYTES)
        if int(self.header["magic"]) == 0:
            # Created zero-filled (segment.create_segment): whoever opens it first writes the
            # header; concurrent openers write the same values, the magic number last.
            self.header["version"] = VERSION
            self.header["max_brokers"] = MAX_BROKERS
            self.header["row_bytes"] = ROW.itemsize
            self.header["replica_slots"] = REPLICA_SLOTS
            self.header["created_ms"] = _now_ms()
            self.header["magic"] = MAGIC
        elif int(self.header["magic"]) != MAGIC or int(self.header["row_bytes"]) != ROW.itemsize:
            raise ValueError(f"metrics segment {name} has another layout (another version?)")

    def close(self) -> None:
        self.header = self.rows = None
        try:
            self.map.close()
        except BufferError:
            pass  # a caller still holds a view; the map goes with the process


class MetricsBoard:
    """Entry points: `open_writer` (brokers), `open_reader` (the CLI), `create`, `unlink`."""

    @staticmethod
    def create(cluster_dir: os.PathLike | str) -> None:
        """Create the segment (idempotent); `up` calls it (through segment.create_segment)."""
        segment.create_segment(cluster_dir)

    @staticmethod
    def unlink(cluster_dir: os.PathLike | str) -> bool:
        return segment.unlink_segment(cluster_dir)

    @staticmethod
    def exists(cluster_dir: os.PathLike | str) -> bool:
        return segment.segment_exists(cluster_dir)

    @staticmethod
    def open_writer(cluster_dir: os.PathLike | str, broker_id: int) -> BrokerMetricsWriter:
        """The writer of broker_id's row. Never raises: when there is no board (a broker not
        started by `localcluster up`) or it cannot be used, the writer is a no-op.

        Only `create` makes the segment, so whoever created it (the supervisor, removed by
        `down`) also removes it: brokers started on their own leave nothing in /dev/shm."""
        if not 0 <= broker_id < MAX_BROKERS:
            log.warning("metrics board: broker id %d is beyond its %d rows; not recording",
                        broker_id, MAX_BROKERS)  # fmt: skip
            return NullMetricsWriter()
        try:
            segment = _Segment(segment_name(cluster_dir), create=False)
        except posix_ipc.ExistentialError:
            log.info("no metrics board for %s (not started by `localcluster up`); not recording",
                     cluster_dir)  # fmt: skip
            return NullMetricsWriter()
        except (OSError, ValueError, posix_ipc.Error) as e:
            log.warning("metrics board unavailable (%s); not recording", e)
            return NullMetricsWriter()
        return BrokerMetricsWriter(segment, broker_id)

    @staticmethod
    def open_reader(cluster_dir: os.PathLike | str) -> MetricsReader | None:
        """A reader, or None when no broker created the board yet."""
        try:
            return MetricsReader(_Segment(segment_name(cluster_dir), create=False))
        except (posix_ipc.ExistentialError, ValueError):
            return None


class BrokerMetricsWriter:
    """Writes one broker's row. Call from one thread (the broker's event loop)."""

    def __init__(self, segment: _Segment, broker_id: int):
        self._segment = segment
        self._row = segment.rows[broker_id]
        # The row as 64-bit words: an add through a memoryview costs ~100 ns, a numpy scalar
        # add several times that, and record_produce runs per partition per Produce request.
        start = HEADER_BYTES + broker_id * ROW.itemsize
        self._words = memoryview(segment.map)[start : start + ROW.itemsize].cast("Q")
        self._counter0 = ROW.fields["counters"][1] // 8
        self._bucket0 = ROW.fields["latency_buckets"][1] // 8
        self._updated_word = ROW.fields["updated_ms"][1] // 8
        self._begin()
        seq = self._words[0]
        self._row.fill(0)  # a new incarnation starts from zero
        self._words[0] = seq
        self._row["broker_id"] = broker_id
        self._row["pid"] = os.getpid()
        self._row["started_ms"] = _now_ms()
        self._end()

    def _begin(self) -> None:
        self._words[0] += 1  # odd: readers retry

    def _end(self) -> None:
        self._words[self._updated_word] = _now_ms()
        self._words[0] += 1  # even again

    def record_produce(self, nbytes: int, nrecords: int, latency_us: int) -> None:
        """One partition's append from a Produce request, and how long the request took
        (receipt to response, so acks=all includes the wait for the ISR)."""
        w, c = self._words, self._counter0
        latency_us = max(int(latency_us), 0)
        w[0] += 1
        w[c] += nrecords  # messages_in
        w[c + 1] += nbytes  # bytes_in
        w[c + 3] += 1  # produce_requests
        w[c + 7] += 1  # latency_count
        w[c + 8] += latency_us  # latency_sum_us
        w[self._bucket0 + min(latency_us.bit_length(), LATENCY_BUCKETS - 1)] += 1
        self._end()

    def record_fetch(self, nbytes: int) -> None:
        """Bytes sent in one Fetch response (to consumers and followers)."""
        w, c = self._words, self._counter0
        w[0] += 1
        w[c + 2] += nbytes  # bytes_out
        w[c + 4] += 1  # fetch_requests
        self._end()

    def record_isr_change(self, shrink: bool) -> None:
        self._begin()
        self._words[self._counter0 + (5 if shrink else 6)] += 1
        self._end()

    def update_replicas(self, replicas) -> None:
        """The replicas this broker hosts: an iterable of (topic, partition, is_leader,
        log_end_offset, high_watermark); the first REPLICA_SLOTS are kept."""
        self._begin()
        table = self._row["replicas"]
        count = 0
        for topic, partition, is_leader, log_end_offset, high_watermark in replicas:
            if count == REPLICA_SLOTS:
                break
            table[count] = (topic.encode()[:TOPIC_BYTES], partition, bool(is_leader),
                            log_end_offset, high_watermark)  # fmt: skip
            count += 1
        self._row["replica_count"] = count
        self._end()

    def close(self) -> None:
        self._words.release()
        self._row = None
        self._segment.close()


class NullMetricsWriter:
    """Same calls as BrokerMetricsWriter, records nothing."""

    def record_produce(self, nbytes: int, nrecords: int, latency_us: int) -> None:
        pass

    def record_fetch(self, nbytes: int) -> None:
        pass

    def record_isr_change(self, shrink: bool) -> None:
        pass

    def update_replicas(self, replicas) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class BrokerMetrics:
    """A consistent copy of one row (torn: the writer kept it busy through every retry)."""

    broker_id: int
    pid: int
    started_ms: int
    updated_ms: int
    counters: dict[str, int]
    latency_buckets: tuple[int, ...]
    replicas: tuple[tuple[str, int, bool, int, int], ...]
    torn: bool = False

    def __getattr__(self, name: str) -> int:
        try:
            return self.counters[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class BrokerRates:
    broker_id: int
    messages_in_per_s: float
    bytes_in_per_s: float
    bytes_out_per_s: float
    produce_p50_us: float | None
    produce_p99_us: float | None
    isr_shrinks: int  # since the broker started
    isr_expands: int


class MetricsReader:
    def __init__(self, segment: _Segment):
        self._segment = segment

    def snapshot(self) -> dict[int, BrokerMetrics]:
        """Every row a broker has written, by broker id."""
        out = {}
        rows = self._segment.rows
        for broker_id in np.flatnonzero(rows["started_ms"]):
            metrics = self._read_row(int(broker_id))
            if metrics is not None:
                out[metrics.broker_id] = metrics
        return out

    def _read_row(self, index: int) -> BrokerMetrics | None:
        rows = self._segment.rows
        copy = None
        torn = True
        for _ in range(READ_RETRIES):
            before = int(rows["seq"][index])
            if before % 2:
                continue
            copy = rows[index].copy()
            if int(rows["seq"][index]) == before:
                torn = False
                break
        if copy is None:
            copy = rows[index].copy()
        if int(copy["started_ms"]) == 0:
            return None
        count = min(int(copy["replica_count"]), REPLICA_SLOTS)
        replicas = tuple((r["topic"].decode(errors="replace"), int(r["partition"]),
                          bool(r["is_leader"]), int(r["log_end_offset"]),
                          int(r["high_watermark"])) for r in copy["replicas"][:count])  # fmt: skip
        return BrokerMetrics(int(copy["broker_id"]), int(copy["pid"]), int(copy["started_ms"]),
                             int(copy["updated_ms"]),
                             {n: int(v) for n, v in zip(COUNTERS, copy["counters"], strict=True)},
                             tuple(int(b) for b in copy["latency_buckets"]), replicas, torn)  # fmt: skip

    def close(self) -> None:
        self._segment.close()


def percentile_us(buckets, fraction: float) -> float | None:
    """The upper bound of the bucket holding the given fraction of the counts (None if empty)."""
    counts = np.asarray(buckets, dtype=np.int64)
    total = int(counts.sum())
    if total <= 0:
        return None
    rank = fraction * total
    index = int(np.searchsorted(np.cumsum(counts), rank, side="left"))
    index = min(index, LATENCY_BUCKETS - 1)
    return (
        bucket_upper_us(index) if index < LATENCY_BUCKETS - 1 else float(1 << (LATENCY_BUCKETS - 2))
    )


def rates(before: BrokerMetrics | None, after: BrokerMetrics, seconds: float) -> BrokerRates:
    """Per-second rates between two snapshots of one broker; from its start when `before` is
    missing or from an earlier incarnation."""
    if before is None or before.started_ms != after.started_ms:
        seconds = max((after.updated_ms - after.started_ms) / 1000, 1e-3)
        base = {name: 0 for name in COUNTERS}
        base_buckets = [0] * LATENCY_BUCKETS
    else:
        base, base_buckets = before.counters, before.latency_buckets
    seconds = max(seconds, 1e-3)
    delta = {n: max(after.counters[n] - base[n], 0) for n in COUNTERS}
    buckets = [max(a - b, 0) for a, b in zip(after.latency_buckets, base_buckets, strict=True)]
    return BrokerRates(after.broker_id, delta["messages_in"] / seconds, delta["bytes_in"] / seconds,
                       delta["bytes_out"] / seconds, percentile_us(buckets, 0.5),
                       percentile_us(buckets, 0.99), after.counters["isr_shrinks"],
                       after.counters["isr_expands"])  # fmt: skip
