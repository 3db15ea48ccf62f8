"""The consumer: assignment, positions, and Fetch requests to partition leaders.

Either `assign` a list of (topic, partition), then `seek`/`seek_to_beginning`/`seek_to_end` or
let `auto.offset.reset` (earliest | latest | none; Kafka's default latest) pick the first
position; or, with `group.id`, `subscribe` to topics and let the group assign partitions
(group_consumer.py: joining, heartbeats, commits; positions start at the committed offsets).
`commit` and `committed` work in both modes when group.id is set (a manually assigned
consumer commits as Kafka's "simple" consumer, with no generation). `poll` keeps at
most one Fetch in flight per leader broker, across calls as Kafka's Fetcher does, and returns
the records of whichever answers first, up to `max.poll.records`.

A fetch response may end in a partial batch (the broker cuts at max bytes): complete batches
are used and the rest is fetched again from the next offset. A batch that starts before the
fetch position contributes only the records at or after it. Control batches (transaction
markers) and offset gaps advance the position without records. Compressed batches (gzip,
snappy, lz4, zstd) are decoded by storage/compression.py; one that does not decode is a
CORRUPT_MESSAGE error from `poll`, naming the codec and the batch.

Positions move when `poll` returns records. A seek discards buffered records and the answers
of in-flight fetches for the old position. OFFSET_OUT_OF_RANGE resets the position by policy,
or raises OffsetOutOfRangeError from `poll` when the policy is none.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from localcluster.client.connection import (
    DEFAULT_CLIENT_ID,
    SECURITY_DEFAULTS,
    ClientSecurity,
    KafkaConnectionError,
    KafkaError,
    LoopThread,
    OffsetOutOfRangeError,
    resolve_config,
)
from localcluster.client.group_consumer import (
    GROUP_DEFAULTS,
    ConsumerCoordinator,
    validate_group_config,
)
from localcluster.client.metadata import Cluster, TopicPartition
from localcluster.protocol import fetch, messages
from localcluster.protocol.api import ApiKey
from localcluster.protocol.wire import Reader
from localcluster.storage.record_batch import (
    TIMESTAMP_TYPE_MASK,
    iter_batches,
    iter_records,
)

log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1

DEFAULTS = {
    "client.id": DEFAULT_CLIENT_ID,
    "auto.offset.reset": "latest",
    "fetch.min.bytes": 1,
    "fetch.max.bytes": 52_428_800,
    "fetch.max.wait.ms": 500,
    "max.partition.fetch.bytes": 1_048_576,
    "max.poll.records": 500,
    "check.crcs": True,
    "request.timeout.ms": 30_000,
    "retry.backoff.ms": 100,
    "metadata.max.age.ms": 300_000,
    "reconnect.backoff.ms": 50,
    "allow.auto.create.topics": True,
    **GROUP_DEFAULTS,
    **SECURITY_DEFAULTS,
}
CLOSE_TIMEOUT_S = 30.0  # Java's KafkaConsumer.close() default
RESET_POLICIES = ("earliest", "latest", "none")
METADATA_ERRORS = {ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition,
                   ErrorCode.leader_not_available, ErrorCode.fenced_leader_epoch,
                   ErrorCode.unknown_leader_epoch}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int
    timestamp_type: int = 0  # 0 CreateTime, 1 LogAppendTime


@dataclass(slots=True)
class FetchedPartition:
    """Records of one partition from one fetch, not yet returned by poll."""

    tp: TopicPartition
    fetch_offset: int  # the position the fetch was sent for; stale once the position moved
    records: collections.deque[ConsumerRecord]
    next_offset: int  # after the last complete batch


@dataclass(slots=True)
class PartitionState:
    position: int | None = None
    high_watermark: int = -1
    log_start_offset: int = -1
    error: KafkaError | None = None  # raised by the next poll
    buffered: FetchedPartition | None = None
    backoff_until: float = 0.0
    pending_reset: str | None = None


def parse_records(tp: TopicPartition, data, fetch_offset: int, check_crcs: bool = True):
    """(records at or after fetch_offset, offset after the last complete batch or None)."""
    topic, partition = tp
    view = memoryview(data)
    records: list[ConsumerRecord] = []
    next_offset = None
    # complete_only: a partial batch at the end of the response is fetched again next time.
    for position, header in iter_batches(view, check_crc=check_crcs, complete_only=True):
        end = position + header.size
        next_offset = header.next_offset
        if header.is_control or header.next_offset <= fetch_offset:
            continue
        timestamp_type = 1 if header.attributes & TIMESTAMP_TYPE_MASK else 0
        for r in iter_records(view[position:end]):
            if r.offset < fetch_offset:
                continue
            timestamp = header.max_timestamp if timestamp_type else r.timestamp
            records.append(ConsumerRecord(topic, partition, r.offset, r.key, r.value, r.headers,
                                          timestamp, timestamp_type))  # fmt: skip
    return records, next_offset


class AsyncConsumer:
    def __init__(self, config: Mapping | None = None, *, bootstrap_servers=None, cluster_dir=None,
                 **settings):  # fmt: skip
        config = dict(config or {})
        bootstrap_servers = config.pop("bootstrap.servers", bootstrap_servers)
        self.config = resolve_config(DEFAULTS, config, settings)
        if self.config["auto.offset.reset"] not in RESET_POLICIES:
            raise ValueError(f"auto.offset.reset={self.config['auto.offset.reset']!r}: use "
                             f"{', '.join(RESET_POLICIES)}")  # fmt: skip
        validate_group_config(self.config)
        c = self.config
        self.cluster = Cluster(bootstrap_servers, cluster_dir, client_id=c["client.id"],
                               security=ClientSecurity.from_config(c),
                               request_timeout_ms=c["request.timeout.ms"],
                               reconnect_backoff_ms=c["reconnect.backoff.ms"],
                               metadata_max_age_ms=c["metadata.max.age.ms"],
                               allow_auto_create_topics=c["allow.auto.create.topics"])  # fmt: skip
        self._assignment: dict[TopicPartition, PartitionState] = {}
        self._fetches: dict[int, asyncio.Task] = {}
        self._ready: asyncio.Event = asyncio.Event()
        self._started = False
        self.coordinator: ConsumerCoordinator | None = None  # once subscribed
        self._simple_group: ConsumerCoordinator | None = None  # commits of an assigned consumer

    async def start(self) -> AsyncConsumer:
        await self.cluster.start()
        self._started = True
        return self

    async def __aenter__(self) -> AsyncConsumer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Commit and leave the group (when subscribed), then close every connection."""
        for group in (self.coordinator, self._simple_group):
            if group is not None:
                await group.close(timeout_s)
        for task in self._fetches.values():
            task.cancel()
        await asyncio.gather(*self._fetches.values(), return_exceptions=True)
        self._fetches.clear()
        await self.cluster.close()

    # -- assignment and positions -----------------------------------------------------------

    async def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Replace the assignment; partitions kept keep their positions."""
        if self.coordinator is not None:
            raise KafkaError("this consumer is subscribed: assign and subscribe are exclusive "
                             "(unsubscribe first)")  # fmt: skip
        wanted = [(str(t), int(p)) for t, p in partitions]
        self._assignment = {tp: self._assignment.get(tp) or PartitionState() for tp in wanted}
        if self.cluster.add_topics(t for t, _ in wanted):
            await self._refresh_metadata()

    def assignment(self) -> list[TopicPartition]:
        return list(self._assignment)

    # -- groups -----------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> None:
        """Join group.id's group for these topics; the next polls join and get partitions."""
        topics = [str(t) for t in ([topics] if isinstance(topics, str) else topics)]
        if not self.config["group.id"]:
            raise KafkaError("subscribe needs group.id (a consumer group to join)")
        if not topics:
            raise ValueError("subscribe to at least one topic (unsubscribe to stop)")
        if self._assignment and self.coordinator is None:
            raise KafkaError("this consumer has assigned partitions: assign and subscribe are "
                             "exclusive (assign([]) first)")  # fmt: skip
        if self.coordinator is None:
            self.coordinator = ConsumerCoordinator(self, topics)
            self.coordinator.start()
        else:
            self.coordinator.subscribe(topics)

    async def unsubscribe(self) -> None:
        """Commit (auto commit) and leave the group; the assignment becomes empty."""
        if self.coordinator is not None:
            coordinator, self.coordinator = self.coordinator, None
            await coordinator.close(CLOSE_TIMEOUT_S)
        self._assignment = {}

    def subscription(self) -> list[str]:
        return list(self.coordinator.subscription) if self.coordinator else []

    def _group(self) -> ConsumerCoordinator:
        if self.coordinator is not None:
            return self.coordinator
        if not self.config["group.id"]:
            raise KafkaError("committed offsets need group.id")
        if self._simple_group is None:  # never joins: commits with generation -1
            self._simple_group = ConsumerCoordinator(self, ())
        return self._simple_group

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None, *,
                     asynchronous: bool = False) -> None:  # fmt: skip
        """Commit offsets (default: the position of every assigned partition, i.e. after the
        records poll returned). Raises CommitFailedError if the group rebalanced meanwhile."""
        group = self._group()
        if asynchronous:
            group.commit_async(offsets)
        else:
            await group.commit(offsets)

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed offset of each partition (-1: none)."""
        return await self._group().committed(partitions)

    def set_group_assignment(self, positions: Mapping[TopicPartition, int | None]) -> None:
        """The group coordinator's hook: replace the assignment at once, each new partition at
        its committed offset (None: by auto.offset.reset); a partition already assigned keeps
        its state (cooperative rebalancing goes on consuming what it keeps)."""
        self._assignment = {tp: self._assignment.get(tp) or PartitionState(position=p)
                            for tp, p in positions.items()}  # fmt: skip
        self._ready.set()  # a waiting poll looks at the new assignment

    def consumed_positions(self) -> dict[TopicPartition, int]:
        """What a commit records: the position of each assigned partition that has one."""
        return {tp: s.position for tp, s in self._assignment.items() if s.position is not None}

    def _state(self, tp: TopicPartition) -> PartitionState:
        state = self._assignment.get(tuple(tp))
        if state is None:
            raise KafkaError(f"{tp[0]}-{tp[1]} is not assigned to this consumer")
        return state

    def seek(self, tp: TopicPartition, offset: int) -> None:
        state = self._state(tp)
        assert offset >= 0, offset
        state.position, state.buffered, state.error, state.pending_reset = offset, None, None, None

    async def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        await self._seek_to(partitions, EARLIEST_TIMESTAMP)

    async def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        await self._seek_to(partitions, LATEST_TIMESTAMP)

    async def _seek_to(self, partitions, timestamp: int) -> None:
        tps = list(self._assignment) if partitions is None else [tuple(tp) for tp in partitions]
        for tp in tps:
            self._state(tp)
        offsets = await self.list_offsets({tp: timestamp for tp in tps})
        for tp, (offset, _) in offsets.items():
            self.seek(tp, offset)

    async def position(self, tp: TopicPartition) -> int:
        """The offset of the next record poll returns (resolved by policy when unset)."""
        state = self._state(tp)
        if state.position is None:
            await self._reset_positions([tuple(tp)])
        if state.error is not None:
            raise state.error
        return state.position

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        found = await self.list_offsets({tuple(tp): EARLIEST_TIMESTAMP for tp in partitions})
        return {tp: offset for tp, (offset, _) in found.items()}

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermarks: the offset the next committed record will get."""
        found = await self.list_offsets({tuple(tp): LATEST_TIMESTAMP for tp in partitions})
        return {tp: offset for tp, (offset, _) in found.items()}

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict:
        """{tp: (offset, timestamp)} of the first record at or after each timestamp
        ((-1, -1) when there is none)."""
        return await self.list_offsets(timestamps)

    async def list_offsets(self, timestamps: Mapping[TopicPartition, int],
                           timeout_ms: int | None = None) -> dict[TopicPartition, tuple[int, int]]:  # fmt: skip
        """ListOffsets to each partition's leader, retried on retriable errors until
        timeout_ms (default request.timeout.ms), then the last error is raised."""
        self.cluster.add_topics(tp[0] for tp in timestamps)
        remaining = dict(timestamps)
        out: dict[TopicPartition, tuple[int, int]] = {}
        deadline = time.monotonic() + (self.config["request.timeout.ms"] if timeout_ms is None
                                       else timeout_ms) / 1000  # fmt: skip
        while remaining:
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in remaining:
                leader = self.cluster.metadata.leader(tp)
                by_leader.setdefault(-1 if leader is None else leader, []).append(tp)
            last_error: KafkaError | None = None
            for leader, tps in by_leader.items():
                if leader < 0:
                    last_error = KafkaError(
                        f"no leader known for {tps}", ErrorCode.leader_not_available, True
                    )
                    continue
                try:
                    answers = await self._list_offsets_from(
                        leader, {tp: remaining[tp] for tp in tps}
                    )
                except KafkaConnectionError as e:
                    last_error = e
                    continue
                for tp, (code, offset, timestamp) in answers.items():
                    if code == 0:
                        out[tp] = (offset, timestamp)
                        remaining.pop(tp, None)
                        continue
                    error = KafkaError.from_code(code, f"ListOffsets {tp[0]}-{tp[1]}")
                    if not error.retriable:
                        raise error
                    last_error = error
            if not remaining:
                break
            if time.monotonic() > deadline:
                raise last_error or KafkaError("ListOffsets timed out", ErrorCode.request_timed_out)
            await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)
            await self._refresh_metadata()
        return out

    async def _list_offsets_from(self, leader: int, timestamps: Mapping[TopicPartition, int]):
        connection = await self.cluster.connection(leader)
        topics: dict[str, list] = {}
        for (topic, partition), ts in timestamps.items():
            topics.setdefault(topic, []).append({"partition_index": partition, "timestamp": ts,
                                                 "current_leader_epoch": -1})  # fmt: skip
        request = {"replica_id": -1, "isolation_level": 0,
                   "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}  # fmt: skip
        try:
            frame, offset = await connection.send(
                ApiKey.LIST_OFFSETS,
                lambda v: messages.encode_request(ApiKey.LIST_OFFSETS, v, request),
            )
        except KafkaConnectionError:
            self.cluster.connection_failed(connection)
            raise
        response = messages.decode_response(ApiKey.LIST_OFFSETS, connection.version(ApiKey.LIST_OFFSETS),
                                            frame, offset)  # fmt: skip
        out = {}
        for t in response.topics:
            for p in t.partitions:
                out[(t.name, p.partition_index)] = (int(p.error_code), p.offset, p.timestamp)
                if p.error_code in METADATA_ERRORS:
                    self.cluster.request_metadata_refresh()
        return out

    async def _reset_positions(
        self, tps: list[TopicPartition], timeout_ms: int | None = None
    ) -> None:
        policy = self.config["auto.offset.reset"]
        if policy == "none":
            for tp in tps:
                self._assignment[tp].error = KafkaError(
                    f"{tp[0]}-{tp[1]} has no position and auto.offset.reset=none; seek first",
                    ErrorCode.offset_out_of_range)  # fmt: skip
            return
        timestamp = EARLIEST_TIMESTAMP if policy == "earliest" else LATEST_TIMESTAMP
        offsets = await self.list_offsets({tp: timestamp for tp in tps}, timeout_ms)
        for tp, (offset, _) in offsets.items():
            state = self._assignment.get(tp)
            if state is not None and (state.position is None or state.pending_reset):
                state.position, state.buffered, state.pending_reset = offset, None, None

    async def _refresh_metadata(self) -> None:
        try:
            await self.cluster.refresh_metadata()
        except KafkaError as e:
            if not e.retriable:
                raise
            log.info("metadata refresh failed: %s", e)

    # -- poll -------------------------------------------------------------------------------

    async def poll(self, timeout_ms: int = 0) -> list[ConsumerRecord]:
        """Records from the assigned partitions; waits up to timeout_ms for some to arrive."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 0) / 1000
        if self.coordinator is not None and not await self.coordinator.poll(
            max(timeout_ms, 0) / 1000
        ):
            return []  # still joining; the rebalance goes on until the next poll
        while True:
            self._raise_errors()
            records = self._take(self.config["max.poll.records"])
            if records:
                return records
            unset = [tp for tp, s in self._assignment.items()
                     if (s.position is None or s.pending_reset) and s.error is None]  # fmt: skip
            if unset:
                remaining_ms = int((deadline - loop.time()) * 1000)
                try:
                    await self._reset_positions(unset, max(remaining_ms, 0))
                except KafkaError as e:
                    if not e.retriable:
                        raise
                    if loop.time() >= deadline:
                        return []  # no leader to ask yet; the next poll tries again
                continue
            remaining = deadline - loop.time()
            sent = self._send_fetches(
                max(0, min(self.config["fetch.max.wait.ms"], int(remaining * 1000)))
            )
            if not self._fetches:
                if remaining <= 0:
                    return []
                await self.cluster.wait_for_metadata_change(
                    min(remaining, self.config["retry.backoff.ms"] / 1000)
                )
                continue
            self._ready.clear()
            if remaining <= 0:
                # timeout 0: one round trip for the fetches just sent (with max_wait 0), not
                # for long polls still out from earlier calls
                if sent:
                    await asyncio.wait(sent, timeout=self.config["request.timeout.ms"] / 1000)
                self._raise_errors()
                return self._take(self.config["max.poll.records"])
            try:
                await asyncio.wait_for(self._ready.wait(), remaining)
            except TimeoutError:
                self._raise_errors()
                return self._take(self.config["max.poll.records"])

    def _raise_errors(self) -> None:
        for state in self._assignment.values():
            if state.error is not None:
                error, state.error = state.error, None
                raise error

    def _take(self, max_records: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        for state in self._assignment.values():
            fetched = state.buffered
            if fetched is None:
                continue
            while fetched.records and len(out) < max_records:
                out.append(fetched.records.popleft())
            if fetched.records:
                state.position = fetched.records[0].offset
                break
            state.position = max(state.position, fetched.next_offset)
            state.buffered = None
            if len(out) >= max_records:
                break
        return out

    def _send_fetches(self, max_wait_ms: int) -> list[asyncio.Task]:
        """Start a fetch to each leader that has none in flight; returns the new ones."""
        metadata = self.cluster.metadata
        by_leader: dict[int, list[TopicPartition]] = {}
        now = time.monotonic()
        missing_leader = False
        sent: list[asyncio.Task] = []
        for tp, state in self._assignment.items():
            if state.position is None or state.buffered is not None or state.error is not None:
                continue
            if state.backoff_until > now:
                continue
            leader = metadata.leader(tp)
            if leader is None:
                missing_leader = True
                continue
            by_leader.setdefault(leader, []).append(tp)
        if missing_leader or self.cluster.metadata_is_stale():
            self.cluster.request_metadata_refresh()
        for leader, tps in by_leader.items():
            if leader in self._fetches:
                continue
            positions = {tp: self._assignment[tp].position for tp in tps}
            task = asyncio.get_running_loop().create_task(
                self._fetch(leader, positions, max_wait_ms)
            )
            self._fetches[leader] = task
            sent.append(task)
        return sent

    async def _fetch(
        self, leader: int, positions: dict[TopicPartition, int], max_wait_ms: int
    ) -> None:
        c = self.config
        try:
            connection = await self.cluster.connection(leader)
            topics: dict[str, list[fetch.FetchPartition]] = {}
            for (topic, partition), offset in positions.items():
                topics.setdefault(topic, []).append(
                    fetch.FetchPartition(partition, offset, c["max.partition.fetch.bytes"])
                )
            request = fetch.FetchRequest(fetch.CONSUMER_REPLICA_ID, max_wait_ms, c["fetch.min.bytes"],
                                         c["fetch.max.bytes"], 0, list(topics.items()))  # fmt: skip
            try:
                frame, offset = await connection.send(
                    ApiKey.FETCH, lambda v: fetch.write_fetch_request(request, v),
                    timeout_ms=c["request.timeout.ms"] + max_wait_ms)  # fmt: skip
            except KafkaConnectionError:
                self.cluster.connection_failed(connection)
                raise
            error_code, responses = fetch.read_fetch_response(Reader(frame, offset),
                                                              connection.version(ApiKey.FETCH))  # fmt: skip
            if error_code:
                raise KafkaError.from_code(error_code, f"fetch from broker {leader}")
            for topic, partitions in responses:
                for p in partitions:
                    self._handle_partition(
                        (topic, p.partition), positions.get((topic, p.partition)), p
                    )
        except KafkaError as e:
            log.info("fetch from broker %d failed: %s", leader, e)
            backoff = time.monotonic() + c["retry.backoff.ms"] / 1000
            for tp in positions:
                state = self._assignment.get(tp)
                if state is not None:
                    state.backoff_until = backoff
            if not e.retriable:
                for tp in positions:
                    if tp in self._assignment:
                        self._assignment[tp].error = e
        finally:
            self._fetches.pop(leader, None)
            self._ready.set()

    def _handle_partition(self, tp: TopicPartition, fetch_offset: int | None, p) -> None:
        state = self._assignment.get(tp)
        if (
            state is None
            or fetch_offset is None
            or state.position != fetch_offset
            or state.buffered
        ):
            return  # unassigned or sought meanwhile: this answer is for an old position
        if p.error_code == ErrorCode.offset_out_of_range:
            policy = self.config["auto.offset.reset"]
            if policy == "none":
                state.error = OffsetOutOfRangeError(
                    f"{tp[0]}-{tp[1]}: offset {fetch_offset} is out of range (auto.offset.reset=none)",
                    ErrorCode.offset_out_of_range)  # fmt: skip
            else:
                log.info(
                    "%s-%d: offset %d out of range; resetting to %s", *tp, fetch_offset, policy
                )
                state.pending_reset = policy
            return
        if p.error_code:
            error = KafkaError.from_code(p.error_code, f"fetch {tp[0]}-{tp[1]}")
            if p.error_code in METADATA_ERRORS:
                self.cluster.request_metadata_refresh()
            state.backoff_until = time.monotonic() + self.config["retry.backoff.ms"] / 1000
            if not error.retriable:
                state.error = error
            return
        state.high_watermark, state.log_start_offset = p.high_watermark, p.log_start_offset
        data = p.records[0] if p.records else b""
        try:
            records, next_offset = parse_records(tp, data, fetch_offset, self.config["check.crcs"])
        except KafkaError as e:
            state.error = e
            return
        except ValueError as e:  # CorruptRecordError
            state.error = KafkaError(
                f"fetch {tp[0]}-{tp[1]} at {fetch_offset}: {e}", ErrorCode.corrupt_message
            )
            return
        if records or (next_offset is not None and next_offset > fetch_offset):
            state.buffered = FetchedPartition(tp, fetch_offset, collections.deque(records),
                                              next_offset if next_offset is not None else fetch_offset)  # fmt: skip


class Consumer:
    """Synchronous facade: an AsyncConsumer on an event loop in a background thread."""

    def __init__(self, config: Mapping | None = None, *, bootstrap_servers=None, cluster_dir=None,
                 **settings):  # fmt: skip
        self._thread = LoopThread("localcluster-consumer")

        async def make():
            consumer = AsyncConsumer(config, bootstrap_servers=bootstrap_servers,
                                     cluster_dir=cluster_dir, **settings)  # fmt: skip
            return await consumer.start()

        try:
            self._consumer = self._thread.run(make())
        except BaseException:
            self._thread.stop()
            raise

    def _run(self, coro):
        future = self._thread.submit(coro)
        try:
            return future.result()
        except BaseException:
            # Ctrl-C (or SIGTERM made KeyboardInterrupt) in the caller: cancel the call on the
            # loop too, so close() does not find a poll still pending
            future.cancel()
            raise

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._run(self._consumer.assign(partitions))

    def assignment(self) -> list[TopicPartition]:
        return self._consumer.assignment()

    def subscribe(self, topics: Iterable[str]) -> None:
        async def go():
            self._consumer.subscribe(topics)

        self._run(go())

    def unsubscribe(self) -> None:
        self._run(self._consumer.unsubscribe())

    def subscription(self) -> list[str]:
        return self._consumer.subscription()

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None, *,
               asynchronous: bool = False) -> None:  # fmt: skip
        self._run(self._consumer.commit(offsets, asynchronous=asynchronous))

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._run(self._consumer.committed(partitions))

    @property
    def coordinator(self):
        """The group membership (member_id, generation_id, assigned, ...) once subscribed."""
        return self._consumer.coordinator

    def seek(self, tp: TopicPartition, offset: int) -> None:
        async def go():
            self._consumer.seek(tp, offset)

        self._run(go())

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._run(self._consumer.seek_to_beginning(partitions))

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._run(self._consumer.seek_to_end(partitions))

    def position(self, tp: TopicPartition) -> int:
        return self._run(self._consumer.position(tp))

    def poll(self, timeout_ms: int = 0) -> list[ConsumerRecord]:
        return self._run(self._consumer.poll(timeout_ms))

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._run(self._consumer.beginning_offsets(partitions))

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._run(self._consumer.end_offsets(partitions))

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict:
        return self._run(self._consumer.offsets_for_times(timestamps))

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        try:
            self._run(self._consumer.close(timeout_s))
        finally:
            self._thread.stop()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
