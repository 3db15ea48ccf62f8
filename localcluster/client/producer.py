"""The producer: records into per-partition batches, batches into Produce requests, retries.

`AsyncProducer.send` appends a record to the open batch of its partition (chosen by the
murmur2 hash of the key as Kafka's default partitioner does, or stickily for null keys) and
returns a future of (partition, offset). One sender task drains batches that are ready — full
(`batch.size`), older than `linger.ms`, retried after `retry.backoff.ms`, or flushed — into one
Produce request per leader broker (one batch per partition per request, as Kafka does), with
at most `max.in.flight.requests.per.connection` requests outstanding per broker.

Retriable errors (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, NOT_ENOUGH_REPLICAS, REQUEST_
TIMED_OUT, a lost connection, ...) put the batch back at the head of its partition's queue,
refresh metadata when the leader may have moved, and try again until `retries` or
`delivery.timeout.ms` is exhausted.

Idempotent by default (`enable.idempotence=true`, as Kafka's Java client since 3.0, KIP-679):
before its first batch the producer asks any broker for a producer id (InitProducerId), and
every batch carries that id, its epoch and a per-partition base sequence in its header, so a
retry the broker already holds is answered with its original offsets instead of written twice,
and a retry keeps its place: it goes out before the later batches of its partition, and those
the broker refused for the gap follow it in order (the rules live in client/idempotence.py).
It needs acks=all, retries > 0 and max.in.flight.requests.per.connection <= 5: set explicitly
with any other value it is a configuration error; left at the default it turns itself off with
a log line, as it does when the broker does not offer InitProducerId. With
`enable.idempotence=false` a retried batch may land after a later batch of the same partition
that was in flight at the same time, and a retry after a lost answer may write a batch twice.

`compression.type` (none, gzip, snappy, lz4, zstd; Kafka's names) compresses each batch's
records when it is first drained, through storage/compression.py; `batch.size` counts records
uncompressed. Prebuilt batches (`send_batch` bytes) go out with the compression they carry.

Bounds: `buffer.memory` bytes of unsent records (send waits up to `max.block.ms` for room),
the in-flight limit per broker (and 5 unresolved batches per partition with idempotence), and
`delivery.timeout.ms` per batch. `Producer` is the synchronous facade (an event loop in a
thread; see connection.LoopThread).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import functools
import itertools
import logging
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from localcluster.client.connection import (
    DEFAULT_CLIENT_ID,
    SECURITY_DEFAULTS,
    ClientSecurity,
    KafkaConnectionError,
    KafkaError,
    LoopThread,
    resolve_config,
)
from localcluster.client.idempotence import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    Idempotence,
    failure_hint,
    idempotence_enabled,
    stamp_producer_state,
)
from localcluster.client.metadata import Cluster, TopicPartition
from localcluster.protocol import messages, produce
from localcluster.protocol.api import ApiKey
from localcluster.protocol.wire import Reader
from localcluster.storage import compression
from localcluster.storage.record_batch import (
    HEADER_SIZE,
    BatchSpec,
    Record,
    encode_batch,
    set_create_time,
    validate_batch,
)

log = logging.getLogger(__name__)

DEFAULTS = {
    "client.id": DEFAULT_CLIENT_ID,
    "acks": -1,  # "all"; Kafka's default since 3.0
    "linger.ms": 5,  # Kafka 4.0's default (KIP-1030); 0 before
    "batch.size": 16384,
    "buffer.memory": 32 * 1024 * 1024,
    "max.block.ms": 60_000,
    "request.timeout.ms": 30_000,
    "delivery.timeout.ms": 120_000,
    "retries": 2_147_483_647,
    "retry.backoff.ms": 100,
    "max.in.flight.requests.per.connection": 5,
    "metadata.max.age.ms": 300_000,
    "reconnect.backoff.ms": 50,
    "allow.auto.create.topics": True,
    "enable.idempotence": True,  # Kafka's default since 3.0 (KIP-679)
    "compression.type": "none",
    **SECURITY_DEFAULTS,
}

# Errors after which the partition's leader may have moved: refresh metadata before retrying.
METADATA_ERRORS = {ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition,
                   ErrorCode.leader_not_available, ErrorCode.fenced_leader_epoch,
                   ErrorCode.unknown_leader_epoch}  # fmt: skip
RECORD_OVERHEAD = 12  # attributes and the varints of length, deltas, key and value lengths
DUPLICATE_SEQUENCE_NUMBER = 46  # older brokers' answer to a duplicate: written, offset unknown
# What the Java client sends for an idempotent producer's InitProducerId.
INIT_PRODUCER_ID_REQUEST = {"transactional_id": None, "transaction_timeout": 2_147_483_647,
                            "producer_id": NO_PRODUCER_ID, "producer_epoch": NO_PRODUCER_EPOCH}  # fmt: skip


# -- the default partitioner --------------------------------------------------------------------


def murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 (seed 0x9747b28c), as a signed 32-bit int."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    end = length & ~3
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Kafka's BuiltInPartitioner.partitionForKey: toPositive(murmur2(key)) % n."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


# -- batches ------------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class ProducerBatch:
    tp: TopicPartition
    order: int  # creation order within the producer: retried batches keep their place
    created: float  # loop time
    deadline: float  # delivery.timeout.ms after creation
    records: list[Record] = field(default_factory=list)
    futures: list[asyncio.Future] = field(default_factory=list)
    size: int = HEADER_SIZE  # estimated encoded bytes, for batch.size
    reserved: int = 0  # bytes of buffer.memory held until the batch completes
    raw: bytes | bytearray | None = None  # the encoded batch, fixed at first drain
    count: int = 0
    closed: bool = False  # takes no more records (full, drained, or prebuilt)
    attempts: int = 0
    retry_at: float = 0.0
    done: asyncio.Future | None = None  # (partition, base offset) or the error
    # The header's producer fields (idempotence.py numbers the batch when it is first sent)
    # and those `raw` holds now; encoded() writes the first into raw when they differ.
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    sequence_reset: bool = False  # numbered again after an epoch bump
    # (None: raw's CRC is stale, a prebuilt batch send_batch dated; encoded() makes it anew)
    stamped: tuple[int, int, int] | None = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE)
    attributes: int = 0  # the codec records are compressed with when first encoded

    def encoded(self) -> bytes | bytearray:
        state = (self.producer_id, self.producer_epoch, self.base_sequence)
        if self.raw is None:
            self.raw = encode_batch(self.records, BatchSpec(producer_id=self.producer_id,
                                                            producer_epoch=self.producer_epoch,
                                                            base_sequence=self.base_sequence,
                                                            attributes=self.attributes))  # fmt: skip
            self.records = []
        elif state != self.stamped:  # a prebuilt batch, or numbered again: one CRC pass
            self.raw = stamp_producer_state(self.raw, *state)
        self.stamped = state
        return self.raw


def _as_bytes(value) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    try:
        return bytes(memoryview(value))  # bytearray, memoryview, numpy buffers; never an int
    except TypeError:
        raise TypeError(f"expected bytes, str or None, got {type(value).__name__}") from None


def _headers(headers) -> tuple[tuple[str, bytes | None], ...]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    return tuple((str(k), _as_bytes(v)) for k, v in items)


class AsyncProducer:
    def __init__(self, config: Mapping | None = None, *, bootstrap_servers=None, cluster_dir=None,
                 **settings):  # fmt: skip
        config = dict(config or {})
        bootstrap_servers = config.pop("bootstrap.servers", bootstrap_servers)
        settings = dict(settings)
        acks = settings.pop("acks", (config or {}).get("acks", DEFAULTS["acks"]))
        config = {k: v for k, v in (config or {}).items() if k != "acks"}
        explicit = "enable.idempotence" in config or settings.get("enable_idempotence") is not None
        self.config = resolve_config(DEFAULTS, config, settings)
        self.acks = -1 if str(acks).lower() == "all" else int(acks)
        if self.acks not in (0, 1, -1):
            raise ValueError(f"acks={acks!r}: use 0, 1, -1 or 'all'")
        c = self.config
        self._codec = compression.codec_id(c["compression.type"])
        # None: not idempotent (enable.idempotence=false, turned off, or the broker lacks it).
        self._idempotence_explicit = explicit
        self._idempotence = Idempotence() if idempotence_enabled(c, self.acks, explicit) else None
        self._initializing = False  # an InitProducerId task is running
        self._fatal: KafkaError | None = None  # the producer cannot go on (sends raise it)
        self.cluster = Cluster(bootstrap_servers, cluster_dir, client_id=c["client.id"],
                               security=ClientSecurity.from_config(c),
                               request_timeout_ms=c["request.timeout.ms"],
                               max_in_flight=c["max.in.flight.requests.per.connection"],
                               reconnect_backoff_ms=c["reconnect.backoff.ms"],
                               metadata_max_age_ms=c["metadata.max.age.ms"],
                               allow_auto_create_topics=c["allow.auto.create.topics"])  # fmt: skip
        self._queues: dict[TopicPartition, collections.deque[ProducerBatch]] = {}
        self._incomplete: set[ProducerBatch] = set()
        self._order = itertools.count()
        self._in_flight: dict[int, int] = collections.defaultdict(int)
        self._connecting: set[int] = set()
        self._sticky: dict[str, tuple[int, ProducerBatch | None]] = {}
        self._buffered = 0
        self._room = asyncio.Condition()
        self._intake = asyncio.Lock()  # held by a send that waits; keeps sends in order
        self._waiting_sends = 0  # sends queued on or holding _intake: no overtaking them
        self._wakeup = asyncio.Event()
        self._flushing = 0
        self._closing = False
        self._sender: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._last_refresh = 0.0
        self.requests_sent = 0  # Produce requests written (for tests and benchmarks)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> AsyncProducer:
        await self.cluster.start()
        if self._idempotence is not None:
            try:
                connection = await self.cluster.any_connection()
                if ApiKey.INIT_PRODUCER_ID not in connection.versions:
                    self._idempotence_unsupported(connection)
            except BaseException:
                await self.cluster.close()
                raise
        self._sender = asyncio.get_running_loop().create_task(self._run_sender())
        return self

    @property
    def idempotent(self) -> bool:
        return self._idempotence is not None

    @property
    def producer_id_and_epoch(self) -> tuple[int, int]:
        """(producer id, epoch); (-1, -1) when not idempotent or not known yet."""
        if self._idempotence is None:
            return NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        producer = self._idempotence.producer
        return producer.producer_id, producer.epoch

    def _idempotence_unsupported(self, connection) -> None:
        """A broker without InitProducerId: an error if idempotence was asked for (librdkafka
        makes it fatal), else produce without it."""
        text = (f"the broker at {connection.address} does not offer InitProducerId, which the "
                "idempotent producer needs")  # fmt: skip
        if self._idempotence_explicit:
            raise KafkaError(f"enable.idempotence=true: {text}; set enable.idempotence=false to "
                             "produce without it", ErrorCode.unsupported_version)  # fmt: skip
        log.warning("%s: producing without idempotence (enable.idempotence was left at its "
                    "default)", text)  # fmt: skip
        self._idempotence = None

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def flush(self, timeout_s: float | None = None) -> None:
        """Send everything buffered now, and wait until each batch is acknowledged or failed."""
        pending = [b.done for b in self._incomplete]
        if not pending:
            return
        self._flushing += 1
        self._wakeup.set()
        try:
            await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), timeout_s)
        finally:
            self._flushing -= 1

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush (up to timeout_s), then fail what is left and close the connections."""
        if self._closing:
            return
        try:
            await self.flush(timeout_s)
        except TimeoutError:
            log.warning("producer closed with %d batches unsent", len(self._incomplete))
        finally:
            self._closing = True
            if self._sender is not None:
                self._sender.cancel()
            for task in (self._sender, *self._tasks):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (self._sender, *self._tasks) if t),
                                 return_exceptions=True)  # fmt: skip
            for batch in list(self._incomplete):
                self._fail(batch, KafkaError("the producer was closed before the batch was sent"))
            await self.cluster.close()

    # -- send -------------------------------------------------------------------------------

    async def send(self, topic: str, value, key=None, partition: int | None = None,
                   headers: Iterable | Mapping = (), timestamp_ms: int | None = None) -> asyncio.Future:  # fmt: skip
        """Queue one record; the returned future resolves to (partition, offset).

        Waits (up to max.block.ms) only for the topic's metadata the first time and for
        buffer.memory room. With acks=0 the offset is -1, as in Kafka.
        """
        if self._closing:
            raise KafkaError("send() on a closed producer")
        if self._fatal is not None:
            raise self._fatal
        record = Record(_as_bytes(value), _as_bytes(key), _headers(headers),
                        int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms))  # fmt: skip
        size = RECORD_OVERHEAD + len(record.key or b"") + len(record.value or b"") + sum(
            len(k) + len(v or b"") + 4 for k, v in record.headers)  # fmt: skip
        num_partitions = self._known_partitions(topic)
        if (num_partitions and not self._waiting_sends
                and self._buffered + size <= self.config["buffer.memory"]):  # fmt: skip
            tp = (topic, self._partition(topic, record, partition, num_partitions))
            self._buffered += size  # the fast path: nothing to wait for
            return self._append(tp, record, size)
        # Waiting for metadata or room: later sends queue behind this one (asyncio.Lock is
        # FIFO), so records keep their send order, as a blocked send() in Kafka's client.
        self._waiting_sends += 1
        try:
            async with self._intake:
                num_partitions = await self._partitions_of(topic)
                partition = self._partition(topic, record, partition, num_partitions)
                await self._reserve(size)
                return self._append((topic, partition), record, size)
        finally:
            self._waiting_sends -= 1

    def _partition(
        self, topic: str, record: Record, partition: int | None, num_partitions: int
    ) -> int:
        if partition is None:
            return self._choose_partition(topic, record.key, num_partitions)
        if not 0 <= partition < num_partitions:
            raise KafkaError(f"partition {partition} of {topic!r} does not exist "
                             f"(it has {num_partitions})", ErrorCode.unknown_topic_or_partition)  # fmt: skip
        return partition

    def _known_partitions(self, topic: str) -> int:
        info = self.cluster.metadata.topics.get(topic)
        return len(info.partitions) if info is not None and info.error_code == 0 else 0

    async def send_and_wait(self, topic: str, value, **kwargs) -> tuple[int, int]:
        return await (await self.send(topic, value, **kwargs))

    async def send_batch(self, topic: str, partition: int, records: bytes | Sequence[Record],
                         timestamp_ms: int | None = None) -> asyncio.Future:  # fmt: skip
        """Queue one prebuilt batch (encoded RecordBatch v2 bytes, or Records to encode once).

        The fast path for benchmarks: no per-record futures. Resolves to (partition, base offset).
        With `timestamp_ms` the batch goes out dated then (baseTimestamp, and maxTimestamp
        moved with it), as a producer dates the records it is given: a batch built once and
        sent many times would otherwise keep the date it was built with.
        """
        if self._closing:
            raise KafkaError("send_batch() on a closed producer")
        if self._fatal is not None:
            raise self._fatal
        raw = (
            records
            if isinstance(records, bytes | bytearray | memoryview)
            else encode_batch(records, BatchSpec(attributes=self._codec))
        )
        header = validate_batch(raw, 0, check_crc=False)
        self._waiting_sends += 1
        try:
            async with self._intake:
                self._partition(topic, Record(None), partition, await self._partitions_of(topic))
                await self._reserve(len(raw))
                batch = self._new_batch((topic, partition))
        finally:
            self._waiting_sends -= 1
        # Our own copy: bytes are kept as they are (none made); a batch numbered (idempotence)
        # or dated is a bytearray, patched in place (the one copy), whose CRC encoded() makes
        # anew in one pass when it first goes out. Without idempotence the batch keeps the
        # producer fields it came with.
        fields = (header.producer_id, header.producer_epoch, header.base_sequence)
        batch.stamped = fields
        if self._idempotence is None and timestamp_ms is None:
            batch.raw = bytes(raw)
        else:
            batch.raw = bytearray(raw)
        if timestamp_ms is not None:
            set_create_time(batch.raw, timestamp_ms)
            batch.stamped = None  # its CRC is stale until encoded() makes it anew
        if self._idempotence is None:
            batch.producer_id, batch.producer_epoch, batch.base_sequence = fields
        batch.count, batch.closed = header.records_count, True
        batch.size = batch.reserved = len(raw)
        self._wakeup.set()
        return batch.done

    async def _partitions_of(self, topic: str) -> int:
        if self._known_partitions(topic):
            return self._known_partitions(topic)
        deadline = time.monotonic() + self.config["max.block.ms"] / 1000
        self.cluster.add_topics([topic])
        while True:
            try:
                await self.cluster.refresh_metadata()
            except KafkaError as e:
                if not e.retriable:
                    raise
            info = self.cluster.metadata.topics.get(topic)
            if info is not None and info.partitions and info.error_code == 0:
                return len(info.partitions)
            if (
                info is not None
                and info.error_code
                and not KafkaError.from_code(info.error_code).retriable
            ):
                raise KafkaError.from_code(info.error_code, f"topic {topic!r}")
            if time.monotonic() > deadline:
                raise KafkaError(f"topic {topic!r} not in the metadata after max.block.ms="
                                 f"{self.config['max.block.ms']}", ErrorCode.unknown_topic_or_partition)  # fmt: skip
            await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)

    def _choose_partition(self, topic: str, key: bytes | None, num_partitions: int) -> int:
        if key is not None:
            return partition_for_key(key, num_partitions)
        # Sticky (KIP-480): stay on one partition until its batch closes, then pick another.
        partition, batch = self._sticky.get(topic, (-1, None))
        if partition >= 0 and partition < num_partitions and (batch is None or not batch.closed):
            return partition
        info = self.cluster.metadata.topics[topic]
        available = [
            p.partition
            for p in info.partitions
            if self.cluster.metadata.leader((topic, p.partition)) is not None
        ]
        choices = [p for p in (available or range(num_partitions)) if p != partition] or [
            max(partition, 0)
        ]
        partition = random.choice(choices)
        self._sticky[topic] = (partition, None)
        return partition

    async def _reserve(self, size: int) -> None:
        limit = self.config["buffer.memory"]
        if self._buffered + size <= limit or not self._buffered:
            self._buffered += size
            return
        async with self._room:
            try:
                await asyncio.wait_for(self._room.wait_for(lambda: self._buffered + size <= limit or not self._buffered),
                                       self.config["max.block.ms"] / 1000)  # fmt: skip
            except TimeoutError:
                raise KafkaError(f"no room in buffer.memory={limit} within max.block.ms") from None
            self._buffered += size

    def _release(self, size: int) -> None:
        self._buffered -= size
        if self._room._waiters:  # noqa: SLF001 (skip a task per batch when nobody waits)
            asyncio.get_running_loop().create_task(self._notify_room())

    async def _notify_room(self) -> None:
        async with self._room:
            self._room.notify_all()

    def _new_batch(self, tp: TopicPartition) -> ProducerBatch:
        loop = asyncio.get_running_loop()
        now = loop.time()
        batch = ProducerBatch(
            tp, next(self._order), now, now + self.config["delivery.timeout.ms"] / 1000
        )
        batch.done = loop.create_future()
        batch.attributes = self._codec
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = collections.deque()
        if queue and not queue[-1].closed:
            queue[-1].closed = True
        queue.append(batch)
        self._incomplete.add(batch)
        return batch

    def _append(self, tp: TopicPartition, record: Record, size: int) -> asyncio.Future:
        queue = self._queues.get(tp)
        batch = queue[-1] if queue else None
        if (
            batch is None
            or batch.closed
            or (batch.count and batch.size + size > self.config["batch.size"])
        ):
            batch = self._new_batch(tp)
        sticky = self._sticky.get(tp[0])
        if sticky is not None and sticky[0] == tp[1] and sticky[1] is not batch:
            self._sticky[tp[0]] = (tp[1], batch)
        future = asyncio.get_running_loop().create_future()
        batch.records.append(record)
        batch.futures.append(future)
        batch.count += 1
        batch.size += size
        batch.reserved += size
        if batch.size >= self.config["batch.size"]:
            batch.closed = True
            self._wakeup.set()
        elif batch.count == 1:
            self._wakeup.set()  # the sender arms the linger timer
        return future

    # -- the sender -------------------------------------------------------------------------

    async def _run_sender(self) -> None:
        while True:
            self._wakeup.clear()
            timeout_s = self._drain(asyncio.get_running_loop().time())
            if self._wakeup.is_set():
                continue
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout_s)
            except TimeoutError:
                pass

    def _drain(self, now: float) -> float | None:
        """Send what is ready; return seconds until something may become ready (None: idle)."""
        linger_s = self.config["linger.ms"] / 1000
        wait_s: float | None = None
        metadata = self.cluster.metadata
        idempotence = self._idempotence
        if idempotence is not None:
            self._prepare_idempotence(idempotence)
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp, queue in self._queues.items():
            if not queue:
                continue
            head = queue[0]
            if now >= head.deadline:
                queue.popleft()
                self._expire(head)
                wait_s = 0.0
                continue
            ready_at = head.retry_at if head.attempts else (
                now if head.closed or len(queue) > 1 or self._flushing or self._closing
                else head.created + linger_s)  # fmt: skip
            if ready_at > now:
                wait_s = _earliest(wait_s, ready_at - now)
                continue
            if idempotence is not None and not idempotence.can_send(head):
                continue  # an answer (or the producer id) changes that and wakes the sender
            leader = metadata.leader(tp)
            if leader is None:
                wait_s = _earliest(wait_s, self._maybe_refresh(now))
                continue
            by_leader.setdefault(leader, []).append(tp)
        for leader, tps in by_leader.items():
            connection = self.cluster._connections.get(leader)  # noqa: SLF001
            if connection is None or connection.closed:
                self._spawn_connect(leader)
                continue
            if self._in_flight[leader] >= self.config["max.in.flight.requests.per.connection"]:
                continue  # a response frees a slot and wakes the sender
            batches = []
            for tp in tps:
                batch = self._queues[tp].popleft()
                batch.closed = True
                if idempotence is not None and batch.base_sequence == NO_SEQUENCE:
                    idempotence.number(batch)
                batches.append(batch)
                if self._queues[tp]:
                    wait_s = 0.0  # its next batch may follow at once (up to the in-flight limit)
            self._in_flight[leader] += 1
            self._spawn(self._send_produce(leader, connection, batches))
        if self.cluster.metadata_is_stale():
            self.cluster.request_metadata_refresh()
        return wait_s

    def _expire(self, batch: ProducerBatch) -> None:
        text = (f"{batch.tp[0]}-{batch.tp[1]}: batch expired after delivery.timeout.ms="
                f"{self.config['delivery.timeout.ms']}")  # fmt: skip
        if batch.attempts:
            text += f" ({batch.attempts} attempts unacknowledged: the log may hold it)"
        self._fail(batch, KafkaError(text, ErrorCode.request_timed_out), expired=True)

    # -- idempotence: the producer id --------------------------------------------------------

    def _prepare_idempotence(self, idempotence: Idempotence) -> None:
        """Before a drain: settle partitions with a batch of unknown fate, bump the epoch if
        asked, and ask for a producer id when there is none and batches wait for one."""
        idempotence.maybe_resolve_sequences()
        idempotence.maybe_bump_epoch()
        if (
            not (idempotence.has_producer_id or self._initializing or self._closing)
            and self._incomplete
        ):
            self._initializing = True
            self._spawn(self._init_producer_id())

    async def _init_producer_id(self) -> None:
        """InitProducerId (transactional id null) to any broker, again after retry.backoff.ms
        on a retriable error or a lost connection, while batches wait for it (each has a
        delivery timeout); a non-retriable error stops the producer (Java: fatal)."""
        backoff_s = self.config["retry.backoff.ms"] / 1000
        try:
            while (idempotence := self._idempotence) is not None and self._incomplete:
                if idempotence.has_producer_id or self._closing:
                    return
                try:
                    connection = await self.cluster.any_connection()
                    version = connection.versions.get(ApiKey.INIT_PRODUCER_ID)
                    if version is None:
                        self._idempotence_unsupported(connection)  # raises when asked for
                        return
                    frame, offset = await connection.send(ApiKey.INIT_PRODUCER_ID, lambda v: messages.encode_request(
                        ApiKey.INIT_PRODUCER_ID, v, INIT_PRODUCER_ID_REQUEST), version=version)  # fmt: skip
                    answer = messages.decode_response(
                        ApiKey.INIT_PRODUCER_ID, version, frame, offset
                    )
                except KafkaConnectionError as e:
                    log.info("InitProducerId: %s; trying again", e)
                    await asyncio.sleep(backoff_s)
                    continue
                if answer.error_code == 0:
                    idempotence.set_producer_id_and_epoch(
                        int(answer.producer_id), int(answer.producer_epoch)
                    )
                    return
                error = KafkaError.from_code(
                    answer.error_code, f"InitProducerId from broker at {connection.address}"
                )
                if not error.retriable:
                    raise error
                log.info("%s; trying again", error)
                await asyncio.sleep(backoff_s)
        except Exception as e:  # noqa: BLE001 (a refusal, or an answer that does not parse)
            code = e.code if isinstance(e, KafkaError) else -1
            self._fail_fatally(KafkaError(f"the idempotent producer has no producer id: {e}", code))
        finally:
            self._initializing = False
            self._wakeup.set()

    def _fail_fatally(self, error: KafkaError) -> None:
        """Fail every batch; later sends raise `error`."""
        log.error("producer stopped: %s", error)
        self._fatal = error
        for batch in list(self._incomplete):
            self._fail(batch, error)

    def _maybe_refresh(self, now: float) -> float:
        backoff_s = self.config["retry.backoff.ms"] / 1000
        if now - self._last_refresh >= backoff_s:
            self._last_refresh = now
            self._spawn(self._refresh_and_wake())
        return backoff_s

    async def _refresh_and_wake(self) -> None:
        try:
            await self.cluster.refresh_metadata()
        except KafkaError as e:
            log.info("metadata refresh failed: %s", e)
        self._wakeup.set()

    def _spawn_connect(self, leader: int) -> None:
        if leader in self._connecting:
            return
        self._connecting.add(leader)

        async def connect():
            try:
                await self.cluster.connection(leader)
            except KafkaError as e:
                log.info("cannot reach leader %d: %s", leader, e)
                self.cluster.request_metadata_refresh()
                await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)
            finally:
                self._connecting.discard(leader)
                self._wakeup.set()

        self._spawn(connect())

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_produce(self, leader: int, connection, batches: list[ProducerBatch]) -> None:
        by_topic: dict[str, list[produce.ProducePartition]] = {}
        for b in batches:
            by_topic.setdefault(b.tp[0], []).append(produce.ProducePartition(b.tp[1], b.encoded()))
        request = produce.ProduceRequest(None, self.acks, self.config["request.timeout.ms"],
                                         list(by_topic.items()))  # fmt: skip
        try:
            self.requests_sent += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug("produce to broker %d (%d in flight): %s", leader, self._in_flight[leader],
                          ", ".join(f"{b.tp[0]}-{b.tp[1]} {len(b.futures)} records, attempt {b.attempts + 1}"
                                    for b in batches))  # fmt: skip
            result = await connection.send(
                ApiKey.PRODUCE, lambda v: produce.produce_request_parts(request, v),
                expect_response=self.acks != 0)  # fmt: skip
            if result is None:
                for b in batches:
                    self._complete(b, -1)
                return
            frame, offset = result
            log.debug("produce answered by broker %d", leader)
            responses = produce.read_produce_response(Reader(frame, offset),
                                                      connection.version(ApiKey.PRODUCE))  # fmt: skip
            self._handle_response(batches, responses)
        except KafkaConnectionError as e:
            self.cluster.connection_failed(connection)
            for b in batches:
                self._retry_or_fail(b, e)
        except KafkaError as e:
            for b in batches:
                self._fail(b, e)
        except Exception as e:  # a response that does not parse: fail loudly, keep sending
            log.exception("produce response from broker %d", leader)
            for b in batches:
                self._fail(b, KafkaError(f"produce response from broker {leader}: {e!r}"))
        finally:
            self._in_flight[leader] -= 1
            self._wakeup.set()

    def _handle_response(self, batches: list[ProducerBatch], responses) -> None:
        answers = {(topic, p.partition): p for topic, partitions in responses for p in partitions}
        for b in batches:
            answer = answers.get(b.tp)
            if answer is None:
                self._fail(b, KafkaError(f"{b.tp[0]}-{b.tp[1]}: the broker's response left it out"))
            elif answer.error_code == 0:
                self._complete(b, answer.base_offset)
            elif answer.error_code == DUPLICATE_SEQUENCE_NUMBER and b.base_sequence != NO_SEQUENCE:
                self._complete(b, -1)  # written before, offset unknown: Java completes it too
            else:
                error = KafkaError.from_code(answer.error_code, self._context(b),
                                             answer.error_message or failure_hint(answer.error_code))  # fmt: skip
                if answer.error_code in METADATA_ERRORS:
                    self.cluster.request_metadata_refresh()
                self._retry_or_fail(b, error, answer.log_start_offset)

    def _context(self, batch: ProducerBatch) -> str:
        text = f"produce to {batch.tp[0]}-{batch.tp[1]}"
        if self._idempotence is not None and batch.base_sequence != NO_SEQUENCE:
            text += (f" (producer {batch.producer_id} epoch {batch.producer_epoch} "
                     f"sequence {batch.base_sequence})")  # fmt: skip
        return text

    def _retry_or_fail(self, batch: ProducerBatch, error: KafkaError, log_start_offset: int = -1) -> None:  # fmt: skip
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._closing or batch.attempts >= self.config["retries"] or now >= batch.deadline:
            retriable = False
        elif self._idempotence is not None and batch.base_sequence != NO_SEQUENCE:
            retriable = self._idempotence.can_retry(
                batch, error.code, error.retriable, log_start_offset
            )
        else:
            retriable = error.retriable
        if not retriable:
            self._fail(batch, error)
            return
        batch.attempts += 1
        batch.retry_at = now + self.config["retry.backoff.ms"] / 1000
        log.info("retrying %s-%d (attempt %d): %s", *batch.tp, batch.attempts, error)
        queue = self._queues[batch.tp]
        # Keep creation order among the batches put back: the earliest goes out first (with
        # idempotence that is sequence order, which the broker checks).
        index = bisect.bisect_left([b.order for b in queue], batch.order)
        queue.insert(index, batch)

    def _complete(self, batch: ProducerBatch, base_offset: int) -> None:
        if self._idempotence is not None:
            self._idempotence.completed(batch)
        partition = batch.tp[1]
        for i, future in enumerate(batch.futures):
            if not future.done():
                future.set_result((partition, -1 if base_offset < 0 else base_offset + i))
        self._finish(batch, (partition, base_offset), None)

    def _fail(self, batch: ProducerBatch, error: KafkaError, *, expired: bool = False) -> None:
        if self._idempotence is not None and batch in self._incomplete:
            if expired:
                self._idempotence.expired(batch)
            else:
                self._idempotence.failed(batch, str(error))
        queue = self._queues.get(batch.tp)
        if queue and batch in queue:
            queue.remove(batch)
        for future in batch.futures:
            if not future.done():
                future.set_exception(error)
                future.exception()  # mark retrieved: fire-and-forget senders are not warned
        self._finish(batch, None, error)

    def _finish(self, batch: ProducerBatch, result, error) -> None:
        if batch not in self._incomplete:
            return
        self._incomplete.discard(batch)
        batch.closed = True
        batch.futures = []
        self._release(batch.reserved)
        if not batch.done.done():
            if error is None:
                batch.done.set_result(result)
            else:
                batch.done.set_exception(error)
                batch.done.exception()


def _earliest(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)


def _transfer(future: concurrent.futures.Future, delivery: asyncio.Future) -> None:
    """Copy an asyncio delivery result to the facade's concurrent future."""
    if future.done():  # cancelled by the caller
        return
    if delivery.cancelled():
        future.cancel()
    elif delivery.exception() is not None:
        future.set_exception(delivery.exception())
    else:
        future.set_result(delivery.result())


def _retrieve(wrapper: asyncio.Future) -> None:
    """Mark a wrapper's exception as seen: asyncio would otherwise log it with its traceback
    when the wrapper goes ("Future exception was never retrieved"), once per failed record."""
    if not wrapper.cancelled():
        wrapper.exception()


class Producer:
    """Synchronous facade: an AsyncProducer on an event loop in a background thread.

    `send` returns a concurrent.futures.Future of (partition, offset) at once; `flush` and
    `close` block. Sends go through one FIFO intake that a single task on the loop drains in
    order (so records keep the calling thread's order, and a send that waits for metadata or
    buffer room holds back the later ones, as Kafka's blocking send does). For throughput,
    use AsyncProducer (or send_batch) from asyncio code instead.
    """

    def __init__(self, config: Mapping | None = None, *, bootstrap_servers=None, cluster_dir=None,
                 **settings):  # fmt: skip
        self._thread = LoopThread("localcluster-producer")
        self._lock = threading.Lock()
        self._outstanding: set[concurrent.futures.Future] = set()
        self._intake: collections.deque = collections.deque()  # (kind, args, future)
        self._pumping = False  # a pump task is scheduled or running; guarded by _lock

        async def make():
            producer = AsyncProducer(config, bootstrap_servers=bootstrap_servers,
                                     cluster_dir=cluster_dir, **settings)  # fmt: skip
            return await producer.start()

        try:
            self._producer = self._thread.run(make())
        except BaseException:
            self._thread.stop()
            raise

    @property
    def requests_sent(self) -> int:
        return self._producer.requests_sent

    @property
    def idempotent(self) -> bool:
        return self._producer.idempotent

    @property
    def producer_id_and_epoch(self) -> tuple[int, int]:
        return self._producer.producer_id_and_epoch

    def send(self, topic: str, value, key=None, partition: int | None = None,
             headers: Iterable | Mapping = (), timestamp_ms: int | None = None) -> concurrent.futures.Future:  # fmt: skip
        return self._enqueue("send", (topic, value, key, partition, headers, timestamp_ms))

    def send_batch(self, topic: str, partition: int, records,
                   timestamp_ms: int | None = None) -> concurrent.futures.Future:  # fmt: skip
        return self._enqueue("batch", (topic, partition, records, timestamp_ms))

    def _enqueue(self, kind: str, args: tuple) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if kind != "barrier":
                self._outstanding.add(future)
            self._intake.append((kind, args, future))
            start = not self._pumping
            self._pumping = True
        if kind != "barrier":
            future.add_done_callback(self._untrack)
        if start:
            self._thread.loop.call_soon_threadsafe(self._start_pump)
        return future

    def _untrack(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._outstanding.discard(future)

    def _start_pump(self) -> None:
        self._thread.loop.create_task(self._pump())

    async def _pump(self) -> None:
        while True:
            with self._lock:
                if not self._intake:
                    self._pumping = False
                    return
                items = list(self._intake)
                self._intake.clear()
            for kind, args, future in items:
                if kind == "barrier":
                    future.set_result(None)
                    continue
                try:
                    if kind == "send":
                        delivery = await self._producer.send(*args)
                    else:
                        delivery = await self._producer.send_batch(*args)
                except Exception as e:  # noqa: BLE001 (handed to the caller's future)
                    if not future.done():
                        future.set_exception(e)
                    continue
                delivery.add_done_callback(functools.partial(_transfer, future))

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until every record sent before this call is acknowledged or has failed."""
        barrier = self._enqueue("barrier", ())
        with self._lock:
            outstanding = list(self._outstanding)
        producer = self._producer

        async def flush_all():
            await asyncio.wrap_future(barrier)  # every earlier send is in a batch now
            producer._flushing += 1  # noqa: SLF001 (linger ends now, as AsyncProducer.flush)
            producer._wakeup.set()  # noqa: SLF001
            try:
                # asyncio.wait, not gather: a flush that times out must leave the records in
                # flight alone (gather's cancellation would cancel each record's future)
                if outstanding:
                    waiting = [asyncio.wrap_future(f) for f in outstanding]
                    for wrapper in waiting:  # the caller reads a failure from its own future
                        wrapper.add_done_callback(_retrieve)
                    await asyncio.wait(waiting)
                await asyncio.shield(producer.flush())
            finally:
                producer._flushing -= 1  # noqa: SLF001

        self._thread.run(asyncio.wait_for(flush_all(), timeout_s))

    def close(self, timeout_s: float | None = None) -> None:
        try:
            try:
                self.flush(timeout_s)
            except TimeoutError:
                pass  # close() below fails what is left
            self._thread.run(self._producer.close(timeout_s))
        finally:
            self._thread.stop()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
