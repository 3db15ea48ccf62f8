"""The simulated producing client: unique values in batches, acks=all or acks=1, and, when it
is idempotent, the real client's bookkeeping (client/idempotence.py, sans-I/O) deciding which
batch goes out with which producer id, epoch and sequence.

Two ways to send an acks=all batch:
- once (scripted scenarios unless they say `producer ...`): given up after its timeout, never
  acknowledged;
- with retries (random runs): a batch answered with a retriable error, or not answered within
  `request_timeout_ms`, goes again to the partition's leader of the moment, until
  `delivery_timeout_ms`; up to 5 batches of a partition in flight. Idempotent, a retry keeps its
  producer id, epoch and sequence, so the broker answers one it already holds with the offsets it
  got the first time; plain, a retry is a new append (the duplicate the invariant checker
  catches, KIP-98's motivation).
acks=1 batches are plain and sent once (idempotence needs acks=all). The producer id is given
(there is no InitProducerId in the simulator); epoch bumps are the client's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from localcluster.client.idempotence import (
    MAX_IN_FLIGHT_PER_PARTITION,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    Idempotence,
)
from localcluster.storage import Record, encode_batch
from localcluster.storage.record_batch import BatchSpec
from tests.sim import network as m

PRODUCER_ID = 1000
RETRIABLE = {ErrorCode.not_leader_or_follower, ErrorCode.not_enough_replicas,
             ErrorCode.not_enough_replicas_after_append, ErrorCode.request_timed_out,
             ErrorCode.unknown_topic_or_partition, ErrorCode.kafka_storage_error,
             ErrorCode.corrupt_message}  # fmt: skip


@dataclass(eq=False, slots=True)
class Batch:
    """A producer batch; `producer_id`, `producer_epoch`, `base_sequence` and `sequence_reset`
    are Idempotence's to set."""

    tp: tuple[str, int]
    values: tuple[bytes, ...]
    acks: int
    timeout_ms: int
    deadline_ms: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    sequence_reset: bool = False
    corr: int | None = None  # the attempt in flight
    broker: int = -1  # where it went
    retry_at_ms: int = 0

    @property
    def count(self) -> int:
        return len(self.values)

    @property
    def names(self) -> str:
        return ",".join(v.decode() for v in self.values)


class Client:
    """Records what acks=all answered NONE for (the checker's acknowledged records)."""

    def __init__(self, sim, retries: bool = False, idempotent: bool = False,
                 request_timeout_ms: int = 500, delivery_timeout_ms: int = 1500,
                 retry_backoff_ms: int = 20):  # fmt: skip
        self.sim = sim
        self.corr = 0
        self.inflight: dict[int, Batch] = {}
        self.queues: dict[tuple[str, int], list[Batch]] = {}  # unresolved, in send order
        self.produced = 0
        self._pumps: set[tuple[str, int]] = set()  # partitions with a pump scheduled
        self.configure(retries, idempotent)
        self.request_timeout_ms = request_timeout_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms

    def configure(self, retries: bool, idempotent: bool) -> None:
        assert retries or not idempotent, "an idempotent producer retries"
        self.retries = retries
        self.idempotence = Idempotence() if idempotent else None
        if idempotent:
            self.idempotence.set_producer_id_and_epoch(PRODUCER_ID, 0)

    @property
    def busy(self) -> bool:
        return bool(self.inflight) or any(self.queues.values())

    def _now(self) -> int:
        return self.sim.clock.now_ms()

    def _leader(self, tp) -> int:
        state = self.sim.zk.states.get(tp)
        return -1 if state is None else state[0].leader

    def produce(self, tp, values: tuple[bytes, ...], acks: int, timeout_ms: int = 400) -> bool:
        batch = Batch(tp, values, acks, timeout_ms, self._now() + self.delivery_timeout_ms)
        if not (self.retries and acks == -1):
            if self._leader(tp) < 0:
                return False
            self.produced += len(values)
            self._send(batch)
            return True
        self.produced += len(values)
        self.queues.setdefault(tp, []).append(batch)
        self._pump(tp)
        return True

    # -- sending ----------------------------------------------------------------------------

    def _send(self, batch: Batch) -> None:
        self.corr += 1
        batch.corr = self.corr
        spec = BatchSpec(producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
                         base_sequence=batch.base_sequence)  # fmt: skip
        records = encode_batch([Record(v) for v in batch.values], spec)
        self.inflight[self.corr] = batch
        batch.broker = self._leader(batch.tp)
        msg = m.Produce(self.corr, batch.tp, records, batch.acks, batch.timeout_ms)
        self.sim.network.send("client", batch.broker, msg)
        retrying = self.retries and batch.acks == -1
        wait_ms = self.request_timeout_ms if retrying else batch.timeout_ms + 100
        self.sim.scheduler.after(wait_ms, self._timed_out, self.corr)

    def _pump(self, tp) -> None:
        """Send what may go now, in order: Idempotence says which (retries first, 5 at most)."""
        idempotence, now = self.idempotence, self._now()
        if idempotence is not None:
            idempotence.maybe_resolve_sequences()
            idempotence.maybe_bump_epoch()
        queue = self.queues.get(tp, [])
        for batch in list(queue):
            if batch.corr is not None:
                continue
            if now >= batch.deadline_ms:
                self._give_up(batch, "delivery timeout", expired=True)
                continue
            if batch.retry_at_ms > now or self._leader(tp) < 0:
                self._pump_later(tp)
                break
            if idempotence is not None:
                if not idempotence.can_send(batch):
                    self._pump_later(tp)  # what it waits for may expire
                    break
                if batch.base_sequence == NO_SEQUENCE:
                    idempotence.number(batch)
            elif sum(b.corr is not None for b in queue) >= MAX_IN_FLIGHT_PER_PARTITION:
                break
            self._send(batch)

    # -- outcomes ---------------------------------------------------------------------------

    def _timed_out(self, corr: int) -> None:
        batch = self.inflight.get(corr)
        if batch is None:
            return
        if self.retries and batch.acks == -1:  # a lost request or answer: send it again
            self._disconnect(batch.broker, "no answer")
        else:  # given up (the producer's delivery.timeout.ms); it was never acknowledged
            del self.inflight[corr]
            batch.corr = None

    def _disconnect(self, broker: int, reason: str) -> None:
        """The connection to `broker` is gone (a request timed out, or an answer overtook an
        earlier one's, which one TCP connection never does): every retried batch in flight on
        it fails and goes again; answers still on their way are dropped with it."""
        for corr, batch in sorted(self.inflight.items()):
            if batch.broker == broker and batch.acks == -1 and self.retries:
                del self.inflight[corr]
                batch.corr = None
                self._retry(batch, reason)

    def _overtaken(self, src, corr: int) -> bool:
        return any(c < corr and b.broker == src and b.acks == -1 for c, b in self.inflight.items())

    def _retry(self, batch: Batch, reason: str) -> None:
        self.sim.trace(f"client: {batch.names} to {batch.tp[0]}-{batch.tp[1]}: {reason}; retrying")
        batch.retry_at_ms = self._now() + self.retry_backoff_ms
        self._pump_later(batch.tp)

    def _pump_later(self, tp) -> None:
        if tp not in self._pumps:
            self._pumps.add(tp)
            self.sim.scheduler.after(self.retry_backoff_ms, self._scheduled_pump, tp)

    def _scheduled_pump(self, tp) -> None:
        self._pumps.discard(tp)
        self._pump(tp)

    def _give_up(self, batch: Batch, reason: str, expired: bool = False) -> None:
        self.sim.trace(f"client: {batch.names} failed for good: {reason}")
        self.queues[batch.tp].remove(batch)
        if self.idempotence is not None and expired:
            self.idempotence.expired(batch)
        elif self.idempotence is not None:
            self.idempotence.failed(batch, reason)

    def receive(self, src, msg) -> bool:
        batch = self.inflight.get(msg.corr)
        if batch is None:
            return True
        if self.retries and batch.acks == -1 and self._overtaken(src, msg.corr):
            self._disconnect(src, "connection lost")
            return True
        del self.inflight[msg.corr]
        batch.corr = None
        tp, names = msg.tp, batch.names
        if msg.error == ErrorCode.none:
            if batch in self.queues.get(tp, ()):
                self.queues[tp].remove(batch)
                if self.idempotence is not None:
                    self.idempotence.completed(batch)
            if batch.acks == -1:
                for i, value in enumerate(batch.values):
                    self.sim.checker.on_ack(tp, msg.base_offset + i, value)
            self.sim.trace(f"client: {'acked' if batch.acks == -1 else 'acks=1'} {names} at "
                           f"{tp[0]}-{tp[1]}@{msg.base_offset} by b{src}")  # fmt: skip
        elif batch in self.queues.get(tp, ()):
            name = ErrorCode(msg.error).name
            retriable = msg.error in RETRIABLE
            if self.idempotence is not None:
                retriable = self.idempotence.can_retry(batch, msg.error, retriable, -1)
            if retriable and self._now() < batch.deadline_ms:
                self._retry(batch, f"{name} from b{src}")
            else:
                self._give_up(batch, f"{name} from b{src}")
        else:
            self.sim.trace(f"client: {names} failed: {ErrorCode(msg.error).name} from b{src}")
        self._pump(tp)
        return True
