"""A partition's producer state (idempotent producer, KIP-98): pure, as Kafka's ProducerStateManager.

Per producer id: its epoch and the metadata of its last 5 batches (last sequence, last offset,
offset delta, max timestamp), the last timestamp, and a coordinator epoch (-1: no transactions).
No clock, file or socket here: time is an argument, and snapshots and log replay live in
producer_snapshot.py, so the simulator can drive this part with no files.

Two ways in, as in Kafka (ProducerAppendInfo, UnifiedLog.analyzeAndValidateProducerState):
- a leader's client append: `check_client_append(headers, first_offset)` checks every batch
  against the state as updated by the batches before it and answers a verdict, changing
  nothing. `ProducerAppendInfo` (accepted: append, then `apply` it), `DuplicateBatch` (a batch
  equal to one of the producer's last 5: append nothing, answer its original offsets) or
  `RejectedAppend` (an error code; nothing is appended, also for the other batches).
- followers and log recovery: `replay(headers)` updates the state from batches without checks.
Batches without a producer id (-1, a non-idempotent producer) change nothing.

Rules taken from Kafka 3.8 (ProducerAppendInfo.checkProducerEpoch / checkSequence):
- an epoch below the producer's is INVALID_PRODUCER_EPOCH;
- a new (higher) epoch must start at sequence 0, unless the producer's epoch is unknown (-1);
- in the same epoch the first sequence must follow the last one (Int.MaxValue wraps to 0),
  unless the producer had no entry (new, expired, or loaded without one): then any sequence goes;
- a duplicate is looked up in the committed state only, and only in the producer's epoch; a
  retry of a batch older than the last 5 is OUT_OF_ORDER_SEQUENCE_NUMBER. Kafka 3.x returns
  neither DUPLICATE_SEQUENCE_NUMBER nor UNKNOWN_PRODUCER_ID on this path, so neither is here;
- a negative base sequence with a producer id, or a control batch from a client, is
  INVALID_RECORD (Kafka's LogValidator.validateBatch, which the broker here does not have).
Retention does not remove producers (KIP-360, Kafka >= 2.4): only `remove_expired` does, after
`producer.id.expiration.ms` without a batch (measured from the batch's max timestamp).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from localcluster.storage.record_batch import BatchHeader

NUM_BATCHES_TO_RETAIN = 5
INT32_MAX = 2**31 - 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
NO_COORDINATOR_EPOCH = -1
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms

# Kafka error codes (the cores do not import kio).
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_RECORD = 87

_CONTROL_FLAG = 0x20


def increment_sequence(sequence: int, increment: int) -> int:
    """`sequence + increment`, wrapping past Int.MaxValue to 0 (DefaultRecordBatch)."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def decrement_sequence(sequence: int, decrement: int) -> int:
    if sequence < decrement:
        return INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


def last_sequence(header: BatchHeader) -> int:
    """The batch's last sequence: base sequence + last offset delta, with wrap-around."""
    if header.base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    return increment_sequence(header.base_sequence, header.last_offset_delta)


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


@dataclass(slots=True)  # not frozen (2x cheaper per batch); never changed
class BatchMetadata:
    """One appended batch of a producer, as Kafka keeps it (first values are derived)."""

    last_seq: int
    last_offset: int
    offset_delta: int  # last offset - first offset, which is also last seq - first seq
    timestamp: int

    @property
    def first_seq(self) -> int:
        return decrement_sequence(self.last_seq, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass(slots=True)  # not frozen (2x cheaper per batch); never changed
class ProducerStateEntry:
    """A producer's state in one partition. Never changed: an update makes a new entry."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: tuple[BatchMetadata, ...] = ()  # oldest first, at most NUM_BATCHES_TO_RETAIN
    last_timestamp: int = NO_TIMESTAMP
    coordinator_epoch: int = NO_COORDINATOR_EPOCH

    @property
    def first_seq(self) -> int:
        return self.batches[0].first_seq if self.batches else NO_SEQUENCE

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_data_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    @property
    def last_offset_delta(self) -> int:
        return self.batches[-1].offset_delta if self.batches else 0

    def with_batch(self, producer_epoch: int, batch: BatchMetadata) -> ProducerStateEntry:
        """This entry after `batch`: a new epoch forgets the old epoch's batches."""
        kept = self.batches if producer_epoch == self.producer_epoch else ()
        if len(kept) >= NUM_BATCHES_TO_RETAIN:
            kept = kept[len(kept) - NUM_BATCHES_TO_RETAIN + 1 :]
        return ProducerStateEntry(self.producer_id, producer_epoch, (*kept, batch),
                                  batch.timestamp, self.coordinator_epoch)  # fmt: skip

    def find_duplicate(self, producer_epoch: int, first_seq: int,
                       last_seq: int) -> BatchMetadata | None:  # fmt: skip
        """The retained batch with exactly this sequence range in this epoch, or None."""
        if producer_epoch != self.producer_epoch:
            return None
        for batch in self.batches:
            if batch.last_seq == last_seq and batch.first_seq == first_seq:
                return batch
        return None


@dataclass(slots=True)  # not frozen (2x cheaper per batch); never changed
class ProducerAppendInfo:
    """Accepted: the entries the batches at [start_offset, end_offset) leave; `apply` it once
    they are in the log (Kafka's ProducerAppendInfo, collected for the whole append)."""

    start_offset: int
    end_offset: int
    updates: Mapping[int, ProducerStateEntry]


@dataclass(frozen=True, slots=True)
class DuplicateBatch:
    """A retry of a batch already in the log: append nothing and answer success with the
    original's offsets (Kafka also answers its timestamp as the log append time)."""

    producer_id: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class RejectedAppend:
    """Append nothing; answer `error_code` for the partition."""

    error_code: int
    producer_id: int
    message: str


Verdict = ProducerAppendInfo | DuplicateBatch | RejectedAppend


class ProducerState:
    """Every producer's entry in one partition, covering the log below `map_end_offset`."""

    def __init__(self, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
                 map_end_offset: int = 0):  # fmt: skip
        assert producer_id_expiration_ms >= 0
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.map_end_offset = map_end_offset
        self._producers: dict[int, ProducerStateEntry] = {}

    @property
    def producers(self) -> Mapping[int, ProducerStateEntry]:
        return MappingProxyType(self._producers)

    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    # -- the leader's check -------------------------------------------------------------------

    def check_client_append(self, headers: Sequence[BatchHeader], first_offset: int) -> Verdict:
        """Check a client's batches, which the log would place from `first_offset` (its end).

        Changes nothing: apply the returned ProducerAppendInfo after appending the batches.
        """
        for h in headers:
            rejected = _invalid_record(h)
            if rejected is not None:
                return rejected
        updates: dict[int, ProducerStateEntry] = {}
        offset = first_offset
        for h in headers:
            base, offset = offset, offset + h.last_offset_delta + 1
            producer_id = h.producer_id
            if producer_id <= NO_PRODUCER_ID:
                continue
            committed = self._producers.get(producer_id)
            seq = last_sequence(h)
            if committed is not None:
                dup = committed.find_duplicate(h.producer_epoch, h.base_sequence, seq)
                if dup is not None:
                    return DuplicateBatch(producer_id, dup.first_offset, dup.last_offset,
                                          dup.timestamp)  # fmt: skip
            current = updates.get(producer_id) or committed or ProducerStateEntry(producer_id)
            error = _check_batch(h, base, current, committed)
            if error is not None:
                return error
            updates[producer_id] = current.with_batch(
                h.producer_epoch,
                BatchMetadata(seq, base + h.last_offset_delta, h.last_offset_delta,
                              h.max_timestamp))  # fmt: skip
        return ProducerAppendInfo(first_offset, offset, updates)

    # -- updates ------------------------------------------------------------------------------

    def prepare_replica_append(self, headers: Sequence[BatchHeader]) -> ProducerAppendInfo:
        """The updates of batches that carry their offsets (a follower's, or the log's own)."""
        assert headers
        updates: dict[int, ProducerStateEntry] = {}
        for h in headers:
            # Control batches are transaction markers; nothing here writes them.
            if h.producer_id <= NO_PRODUCER_ID or h.attributes & _CONTROL_FLAG:
                continue
            current = (updates.get(h.producer_id) or self._producers.get(h.producer_id)
                       or ProducerStateEntry(h.producer_id))  # fmt: skip
            # A lower epoch is applied as it comes (Kafka only logs it): the leader checked.
            updates[h.producer_id] = current.with_batch(
                h.producer_epoch,
                BatchMetadata(last_sequence(h), h.last_offset, h.last_offset_delta,
                              h.max_timestamp))  # fmt: skip
        return ProducerAppendInfo(headers[0].base_offset, headers[-1].next_offset, updates)

    def apply(self, info: ProducerAppendInfo) -> None:
        """Commit an append's updates (Kafka: ProducerStateManager.update + updateMapEndOffset)."""
        assert info.start_offset >= self.map_end_offset, (
            f"append info for offsets from {info.start_offset} is stale: the state already "
            f"covers the log up to {self.map_end_offset}"
        )
        self._producers.update(info.updates)
        self.map_end_offset = info.end_offset

    def replay(self, headers: Sequence[BatchHeader]) -> None:
        """Apply batches without checks: a follower's appends, log recovery."""
        if headers:
            self.apply(self.prepare_replica_append(headers))

    def update_map_end_offset(self, offset: int) -> None:
        """The state now covers the log up to `offset` (a roll, or replay up to the log end)."""
        assert offset >= self.map_end_offset
        self.map_end_offset = offset

    # -- expiry, truncation, retention, loading -----------------------------------------------

    def is_expired(self, entry: ProducerStateEntry, now_ms: int) -> bool:
        return now_ms - entry.last_timestamp >= self.producer_id_expiration_ms

    def remove_expired(self, now_ms: int) -> list[int]:
        """Forget producers idle for producer.id.expiration.ms; returns their ids."""
        expired = [pid for pid, e in self._producers.items() if self.is_expired(e, now_ms)]
        for producer_id in expired:
            del self._producers[producer_id]
        return expired

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self._producers.clear()
        self.map_end_offset = offset

    def on_log_start_offset_incremented(self, log_start_offset: int) -> None:
        """Retention moved the log start: producers stay (KIP-360); the map end never lags it."""
        self.map_end_offset = max(self.map_end_offset, log_start_offset)

    def load(self, entries: Iterable[ProducerStateEntry], end_offset: int, now_ms: int) -> None:
        """Replace the state with a snapshot's entries (expired ones are left out)."""
        self._producers = {e.producer_id: e for e in entries if not self.is_expired(e, now_ms)}
        self.map_end_offset = end_offset


def _invalid_record(h: BatchHeader) -> RejectedAppend | None:
    if h.attributes & _CONTROL_FLAG:
        return RejectedAppend(INVALID_RECORD, h.producer_id,
                              "clients are not allowed to write control records")  # fmt: skip
    if h.producer_id > NO_PRODUCER_ID and h.base_sequence < 0:
        return RejectedAppend(INVALID_RECORD, h.producer_id,
                              f"invalid sequence number {h.base_sequence} in a record batch "
                              f"with producer id {h.producer_id}")  # fmt: skip
    return None


def _check_batch(h: BatchHeader, offset: int, current: ProducerStateEntry,
                 committed: ProducerStateEntry | None) -> RejectedAppend | None:  # fmt: skip
    """Kafka's checkProducerEpoch and checkSequence for one client batch.

    `current` is the producer's entry as the earlier batches of this append leave it;
    `committed` is what the state held before the append (None: no entry).
    """
    pid, epoch, seq = h.producer_id, h.producer_epoch, h.base_sequence
    if epoch < current.producer_epoch:
        return RejectedAppend(INVALID_PRODUCER_EPOCH, pid,
                              f"epoch {epoch} of producer {pid} at offset {offset} is below "
                              f"its last seen epoch {current.producer_epoch}")  # fmt: skip
    if epoch != current.producer_epoch:
        if seq != 0 and current.producer_epoch != NO_PRODUCER_EPOCH:
            return RejectedAppend(OUT_OF_ORDER_SEQUENCE_NUMBER, pid,
                                  f"new epoch {epoch} of producer {pid} at offset {offset} "
                                  f"starts at sequence {seq}, not 0 (epoch was "
                                  f"{current.producer_epoch})")  # fmt: skip
        return None
    # No committed epoch (a new producer, or one whose records are all gone): any sequence.
    if committed is None or committed.producer_epoch == NO_PRODUCER_EPOCH:
        return None
    if not in_sequence(current.last_seq, seq):
        return RejectedAppend(OUT_OF_ORDER_SEQUENCE_NUMBER, pid,
                              f"out of order sequence number for producer {pid} at offset "
                              f"{offset}: {seq} (incoming), {current.last_seq} (current end "
                              "sequence number)")  # fmt: skip
    return None
