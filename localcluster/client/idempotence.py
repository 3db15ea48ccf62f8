"""The idempotent producer's bookkeeping (KIP-98, KIP-360): the producer id and epoch, and per
partition the next sequence, the last acknowledged one and the batches not yet resolved.

Pure: no socket, clock or task. AsyncProducer's sender (producer.py) asks it which batch may go
out, has it number the batches it sends, and tells it how each attempt ended. The rules are
those of Kafka's Java client for a producer without transactional.id (TransactionManager,
TxnPartitionEntry, RecordAccumulator.shouldStopDrainBatchesForPartition, Sender.canRetry):

- A batch gets its base sequence when it is first sent, and keeps producer id, epoch and
  sequence across retries: the broker answers a retry of a batch it already has (one of the
  producer's last 5 on that partition) with the offsets it got the first time.
- At most MAX_IN_FLIGHT_PER_PARTITION batches of a partition are unresolved (numbered, neither
  acknowledged nor failed), so every retry is still within the broker's last 5.
- A retried batch goes out only when it is its partition's first unresolved batch: retries go
  out in sequence order, and the later batches that failed behind it with
  OUT_OF_ORDER_SEQUENCE_NUMBER follow it in order.
- A new batch waits while its partition has unresolved batches under an older producer id or
  epoch (sequence 0 of the new epoch must not overtake them), or a batch of unknown fate (it
  expired after it had been sent).
- OUT_OF_ORDER_SEQUENCE_NUMBER of a batch that is not the next after the last acknowledged one
  is explained by an earlier batch that failed: it is retried as it is. Of the next one (a real
  gap), UNKNOWN_PRODUCER_ID, and a batch failed for good after it was sent (the broker may hold
  it or not, and its successors would be out of order): the producer bumps its epoch, as the
  Java client does locally for an idempotent producer (the broker takes a higher epoch starting
  at sequence 0 and refuses the older one, which fences attempts still on the way), and numbers
  that partition's unresolved batches again from 0 under it. Other partitions move to the new
  epoch, at sequence 0, once their unresolved batches are resolved. At epoch 32767 the bump is
  a new producer id from InitProducerId instead.
- Sequences wrap from Int.MaxValue to 0, as the broker's.
Java departs in one place: a final UNKNOWN_PRODUCER_ID resets only the partition's sequences
there; here it bumps the epoch as every other final failure does (the broker takes both).
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field

import crc32c

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1
INT16_MAX = 2**15 - 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
# Kafka's MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION_FOR_IDEMPOTENCE and the broker's
# NUM_BATCHES_TO_RETAIN: the duplicates a broker recognises.
MAX_IN_FLIGHT_PER_PARTITION = 5
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
UNKNOWN_PRODUCER_ID = 59

# RecordBatch v2 (storage/record_batch.py): producerId int64, producerEpoch int16 and
# baseSequence int32 at 43, inside the CRC-32C's range (21..end); the CRC at 17.
_PRODUCER_FIELDS = struct.Struct(">qhi")
_PRODUCER_FIELDS_AT = 43
_CRC = struct.Struct(">I")
_CRC_AT = 17
_CRC_START = 21


INVALID_PRODUCER_EPOCH = 47
_HINTS = {
    OUT_OF_ORDER_SEQUENCE_NUMBER: "the broker's last sequence of this producer on the partition "
                                  "is not the one before this batch; the batch was not written",
    INVALID_PRODUCER_EPOCH: "the broker holds a newer epoch of this producer id on the "
                            "partition; the batch was not written",
    UNKNOWN_PRODUCER_ID: "the broker has no state for this producer id on the partition",
}  # fmt: skip


def failure_hint(error_code: int) -> str | None:
    """What an idempotence error code means for the batch, for its error message."""
    return _HINTS.get(error_code)


def idempotence_enabled(config, acks: int, explicit: bool) -> bool:
    """Kafka's ProducerConfig rules: idempotence needs acks=all, retries > 0 and at most 5
    requests in flight per connection. Asked for explicitly, another value is an error naming
    the setting; left at the default, idempotence turns off with a log line (Kafka 3.x)."""
    if not config["enable.idempotence"]:
        return False
    in_flight = config["max.in.flight.requests.per.connection"]
    conflicts = [text for bad, text in (
        (acks != -1, f"acks={acks} (it needs acks=all)"),
        (config["retries"] == 0, "retries=0 (it needs retries > 0)"),
        (in_flight > MAX_IN_FLIGHT_PER_PARTITION,
         f"max.in.flight.requests.per.connection={in_flight} (it needs at most "
         f"{MAX_IN_FLIGHT_PER_PARTITION})")) if bad]  # fmt: skip
    if conflicts and explicit:
        raise ValueError(f"enable.idempotence=true does not go with {'; '.join(conflicts)}; "
                         "change it, or set enable.idempotence=false")  # fmt: skip
    if conflicts:
        log.info("idempotence is off: %s, and enable.idempotence was left at its default",
                 "; ".join(conflicts))  # fmt: skip
    return not conflicts


def increment_sequence(sequence: int, increment: int) -> int:
    """`sequence + increment`, wrapping past Int.MaxValue to 0 (Kafka's DefaultRecordBatch)."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def sequence_after(a: int, b: int) -> bool:
    """Whether sequence `a` comes after `b`, across the wrap (they are never 2**30 apart)."""
    return 0 < (a - b) % (INT32_MAX + 1) < 2**30


def stamp_producer_state(raw, producer_id: int, epoch: int, base_sequence: int) -> bytearray:
    """`raw` (a v2 batch) with producer id, epoch and base sequence set and its CRC made
    anew: one copy (none for a bytearray, patched in place) and one CRC-32C pass; the
    records are not re-encoded."""
    buf = raw if isinstance(raw, bytearray) else bytearray(raw)
    _PRODUCER_FIELDS.pack_into(buf, _PRODUCER_FIELDS_AT, producer_id, epoch, base_sequence)
    with memoryview(buf) as view, view[_CRC_START:] as covered:
        _CRC.pack_into(buf, _CRC_AT, crc32c.crc32c(covered))
    return buf


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int = NO_PRODUCER_ID
    epoch: int = NO_PRODUCER_EPOCH

    @property
    def is_valid(self) -> bool:
        return self.producer_id >= 0

    def __str__(self) -> str:
        return f"producer {self.producer_id} epoch {self.epoch}"


NONE = ProducerIdAndEpoch()


@dataclass(slots=True)
class PartitionSequences:
    """One partition's numbering (Java's TxnPartitionEntry)."""

    producer: ProducerIdAndEpoch = NONE  # the id and epoch its sequences count under
    next_sequence: int = 0
    last_acked_sequence: int = NO_SEQUENCE
    # Numbered batches neither acknowledged nor failed, in sequence order (numbering order, so
    # the wrap does not reorder them); len <= MAX_IN_FLIGHT_PER_PARTITION.
    unresolved: list = field(default_factory=list)


class Idempotence:
    """Producer id, epoch and every partition's sequences.

    Batches are the producer's ProducerBatch: `tp`, `count`, `producer_id`, `producer_epoch`,
    `base_sequence` (NO_SEQUENCE until first sent) and `sequence_reset` (numbered again after an
    epoch bump) are read and written here.
    """

    def __init__(self) -> None:
        self.producer = NONE
        self.partitions: dict[tuple[str, int], PartitionSequences] = {}
        self.epoch_bump_required = False
        self.partitions_to_renumber: set[tuple[str, int]] = set()
        # A batch expired after it had been sent: the sequence after it, per partition. New
        # batches wait until the partition's unresolved batches tell whether it was written.
        self.unknown_fate: dict[tuple[str, int], int] = {}

    # -- the producer id ------------------------------------------------------------------

    @property
    def has_producer_id(self) -> bool:
        return self.producer.is_valid

    def set_producer_id_and_epoch(self, producer_id: int, epoch: int) -> None:
        """InitProducerId answered; a bump waiting for a new id renumbers now."""
        assert producer_id >= 0 and 0 <= epoch <= INT16_MAX, (producer_id, epoch)
        self.producer = ProducerIdAndEpoch(producer_id, epoch)
        log.info("idempotent producer: %s", self.producer)
        if self.epoch_bump_required:
            self._renumber()

    def maybe_bump_epoch(self) -> None:
        """Bump the epoch if a partition asked for it (Java's bumpIdempotentEpochAndResetIdIfNeeded).
        At the last epoch the id goes: `has_producer_id` turns false until InitProducerId."""
        if not self.epoch_bump_required or not self.producer.is_valid:
            return
        if self.producer.epoch >= INT16_MAX:
            log.info("idempotent producer: %s is the last epoch; asking for a new producer id",
                     self.producer)  # fmt: skip
            self.producer = NONE
            return
        self.producer = ProducerIdAndEpoch(self.producer.producer_id, self.producer.epoch + 1)
        log.info("idempotent producer: epoch bumped, now %s", self.producer)
        self._renumber()

    def request_epoch_bump(self, tp: tuple[str, int], reason: str) -> None:
        if tp not in self.partitions_to_renumber:
            log.info("idempotent producer: %s-%d needs a new epoch: %s", *tp, reason)
        self.epoch_bump_required = True
        self.partitions_to_renumber.add(tp)

    def _renumber(self) -> None:
        for tp in sorted(self.partitions_to_renumber):
            self._start_sequences_at_beginning(tp)
            self.unknown_fate.pop(tp, None)
        self.partitions_to_renumber.clear()
        self.epoch_bump_required = False

    def _start_sequences_at_beginning(self, tp: tuple[str, int]) -> None:
        entry = self.partitions.get(tp)
        if entry is None:
            return
        sequence = 0
        for batch in entry.unresolved:
            self._number(batch, sequence)
            batch.sequence_reset = True
            sequence = increment_sequence(sequence, batch.count)
        entry.producer = self.producer
        entry.next_sequence = sequence
        entry.last_acked_sequence = NO_SEQUENCE

    def _number(self, batch, base_sequence: int) -> None:
        batch.producer_id = self.producer.producer_id
        batch.producer_epoch = self.producer.epoch
        batch.base_sequence = base_sequence

    # -- sending --------------------------------------------------------------------------

    def can_send(self, batch) -> bool:
        """Whether `batch` (its partition's first queued one) may go out now."""
        if not self.producer.is_valid:
            return False
        entry = self.partitions.get(batch.tp)
        if batch.base_sequence != NO_SEQUENCE:  # a retry: only as the first unresolved
            return entry is not None and bool(entry.unresolved) and entry.unresolved[0] is batch
        if entry is None:
            return True
        if entry.unresolved and entry.producer != self.producer:
            return False  # the older epoch's batches first
        if batch.tp in self.unknown_fate:
            return False
        return len(entry.unresolved) < MAX_IN_FLIGHT_PER_PARTITION

    def number(self, batch) -> None:
        """Give a new batch its partition's next sequence (it goes out now)."""
        assert batch.base_sequence == NO_SEQUENCE and self.can_send(batch), batch.tp
        entry = self.partitions.get(batch.tp)
        if entry is None:
            entry = self.partitions[batch.tp] = PartitionSequences()
        if entry.producer != self.producer:  # no unresolved batches left (can_send): restart
            entry.producer = self.producer
            entry.next_sequence = 0
            entry.last_acked_sequence = NO_SEQUENCE
        self._number(batch, entry.next_sequence)
        entry.next_sequence = increment_sequence(entry.next_sequence, batch.count)
        entry.unresolved.append(batch)
        assert len(entry.unresolved) <= MAX_IN_FLIGHT_PER_PARTITION

    # -- outcomes -------------------------------------------------------------------------

    def completed(self, batch) -> None:
        """Acknowledged (a duplicate's answer included: the broker holds it once)."""
        entry = self._resolve(batch)
        if entry is None or entry.producer != ProducerIdAndEpoch(
            batch.producer_id, batch.producer_epoch
        ):
            return
        last = last_sequence(batch)
        if entry.last_acked_sequence == NO_SEQUENCE or sequence_after(
            last, entry.last_acked_sequence
        ):
            entry.last_acked_sequence = last

    def can_retry(self, batch, error_code: int, retriable: bool, log_start_offset: int) -> bool:
        """Whether an error answer for a numbered batch may be retried (Java's
        TransactionManager.canRetry); may ask for an epoch bump. The caller has checked the
        delivery timeout and `retries` first."""
        tp = batch.tp
        if error_code == UNKNOWN_PRODUCER_ID:
            # The broker lost this producer's state (the log's head went, or it never had it).
            if log_start_offset != -1 and not batch.sequence_reset:
                self.request_epoch_bump(tp, "UNKNOWN_PRODUCER_ID")
            return True
        if error_code == OUT_OF_ORDER_SEQUENCE_NUMBER:
            fate = self.unknown_fate.get(tp)
            if fate is None and (
                batch.sequence_reset or not self._is_next(tp, batch.base_sequence)
            ):
                return True  # an earlier batch failed; this one follows it again
            if fate is None or batch.base_sequence == fate:
                self.request_epoch_bump(tp, f"OUT_OF_ORDER_SEQUENCE_NUMBER at sequence "
                                            f"{batch.base_sequence}: the broker lacks what came before")  # fmt: skip
            return True
        return retriable

    def failed(self, batch, reason: str) -> None:
        """Failed for good (the caller tells its records). After it was sent, the broker may
        hold it or not, and the batches numbered after it would be out of order: new epoch."""
        entry = self._resolve(batch)
        if entry is not None and batch.base_sequence != NO_SEQUENCE:
            self.request_epoch_bump(
                batch.tp, f"a batch at sequence {batch.base_sequence} failed ({reason})"
            )

    def expired(self, batch) -> None:
        """Failed for good by delivery.timeout.ms while queued for a retry (Java's
        markSequenceUnresolved): whether the broker holds it shows once the partition's
        other unresolved batches are answered (maybe_resolve_sequences)."""
        entry = self._resolve(batch)
        if entry is None or batch.base_sequence == NO_SEQUENCE:
            return
        after = increment_sequence(last_sequence(batch), 1)
        known = self.unknown_fate.get(batch.tp)
        if known is None or sequence_after(after, known):
            self.unknown_fate[batch.tp] = after

    def maybe_resolve_sequences(self) -> None:
        """For partitions with a batch of unknown fate and nothing unresolved left: if the
        acknowledged sequences reach past it, it was written (a later batch followed it);
        else bump the epoch (Java's maybeResolveSequences)."""
        for tp in [tp for tp in self.unknown_fate if not self.partitions[tp].unresolved]:
            entry = self.partitions[tp]
            if not self._is_next(tp, entry.next_sequence):
                self.request_epoch_bump(tp, "a batch expired after it was sent, and nothing "
                                            "acknowledged after it shows it was written")  # fmt: skip
            del self.unknown_fate[tp]

    def _resolve(self, batch) -> PartitionSequences | None:
        entry = self.partitions.get(batch.tp)
        if entry is not None and any(b is batch for b in entry.unresolved):
            entry.unresolved = [b for b in entry.unresolved if b is not batch]
        return entry

    def _is_next(self, tp: tuple[str, int], sequence: int) -> bool:
        """Whether `sequence` follows the partition's last acknowledged one."""
        last = self.partitions[tp].last_acked_sequence if tp in self.partitions else NO_SEQUENCE
        return sequence == (0 if last == NO_SEQUENCE else increment_sequence(last, 1))

    def unresolved(self, tp: tuple[str, int]) -> int:
        entry = self.partitions.get(tp)
        return len(entry.unresolved) if entry is not None else 0


def last_sequence(batch) -> int:
    return increment_sequence(batch.base_sequence, batch.count - 1)
