"""bench.groups' client side: the group members, commit samplers, feed and reader it times.

Everything here runs in the benchmark's own process, each client on its own thread (librdkafka's
and kafka-python's calls wait with the GIL released), and keeps times on CLOCK_MONOTONIC:
- `commit_samples_confluent` / `commit_samples_kafka_python`: one member of a group, then
  synchronous OffsetCommits of one partition alternating with synchronous acks=all Produces of a
  record of the same key and value sizes, on a fixed schedule; the seconds each call blocked.
- `Member`: one confluent-kafka consumer in a group, polled by its thread, keeping every
  assignment it is given (with when); `settled` says when a set of members holds every
  partition exactly once, each member something, each assignment newer than a given time.
- `Feed`: an acks=all producer thread writing sequence-numbered records at a steady rate;
  `Reader`: a group member consuming them and committing synchronously every few tens of ms,
  keeping every record received and every commit tried (when, what, the error).
- `CoordinatorLookup`: FindCoordinator requests over our client's BrokerConnection.
Every loop has a bound (a deadline or a stop event); every client is closed by its owner.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable

from kio.schema.errors import ErrorCode

RECORD = struct.Struct(">qd")  # sequence, sent at (CLOCK_MONOTONIC seconds)
POLL_S = 0.05  # a Member's poll timeout: callbacks are served at most this late
WAIT_S = 30.0  # the longest any client waits for an assignment or an acknowledgement


def earliest(settings: dict) -> dict:
    """Their defaults but auto.offset.reset=earliest, as the consumer-group tests do."""
    return {"auto.offset.reset": "earliest", **settings}


# -- OffsetCommit beside Produce ------------------------------------------------------------


class Schedule:
    """Slots `period_s` apart from the first call; `wait()` sleeps until the next slot and
    returns how many slots were already gone (a call that overran its slot)."""

    def __init__(self, period_s: float):
        self.period_s = period_s
        self.next = time.monotonic()

    def wait(self) -> int:
        now = time.monotonic()
        missed = 0
        while self.next + self.period_s < now:  # bounded: the gap over period_s
            self.next += self.period_s
            missed += 1
        if self.next > now:
            time.sleep(self.next - now)
        self.next += self.period_s
        return missed


def _timed(call: Callable[[], None]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def commit_samples_confluent(bootstrap: str, group: str, topic: str, samples: int, period_s: float,
                             key: bytes, value: bytes) -> dict:  # fmt: skip
    """`samples` synchronous commits of (topic, 0) and as many acks=all produces of key/value to
    (topic, 0), alternating on a schedule of `period_s` per call; seconds per call."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    consumer = Consumer(earliest({"bootstrap.servers": bootstrap, "group.id": group,
                                  "enable.auto.commit": False}))  # fmt: skip
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    out = {"commit_s": [], "produce_s": [], "errors": {}, "missed_slots": 0}
    try:
        consumer.subscribe([topic])
        _until(lambda: consumer.poll(0.05) is not None or consumer.assignment(), "an assignment")
        delivered: list = []

        def produce() -> None:
            delivered.clear()
            producer.produce(topic, value, key, partition=0,
                             on_delivery=lambda error, _: delivered.append(error))  # fmt: skip
            deadline = time.monotonic() + WAIT_S
            while not delivered and time.monotonic() < deadline:
                producer.poll(WAIT_S)
            if not delivered or delivered[0] is not None:
                raise KafkaException(delivered[0] if delivered else "no delivery report")

        schedule = Schedule(period_s)
        for i in range(samples):
            for kind, call in (
                ("commit_s", lambda i=i: consumer.commit(offsets=[TopicPartition(topic, 0, i + 1)],
                                                         asynchronous=False)),
                ("produce_s", produce),
            ):  # fmt: skip
                out["missed_slots"] += schedule.wait()
                try:
                    out[kind].append(_timed(call))
                except KafkaException as e:
                    _count(out["errors"], f"{kind[:-2]}: {e.args[0]}")
            consumer.poll(0)  # serve the consumer's events (the records produced are ignored)
    finally:
        consumer.close()
        producer.flush(5)
    return out


def commit_samples_kafka_python(bootstrap: str, group: str, topic: str, samples: int,
                                period_s: float, key: bytes, value: bytes) -> dict:  # fmt: skip
    """The same with kafka-python 3: KafkaConsumer.commit and KafkaProducer.send().get()."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest")  # fmt: skip
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    out = {"commit_s": [], "produce_s": [], "errors": {}, "missed_slots": 0}
    partition = TopicPartition(topic, 0)
    try:
        # kafka-python 3.0 races its first metadata against its first rebalance: with
        # group.initial.rebalance.delay.ms at 0, a JoinGroup answered first can leave the member
        # with no partitions and no rejoin (tests/integration/test_consumer_groups.py). It
        # subscribes once it has seen the topic, as an application should with this client.
        _until(lambda: consumer.partitions_for_topic(topic), f"topic {topic} in the metadata")
        consumer.subscribe([topic])
        _until(lambda: consumer.poll(REJOIN_POLL_MS) is not None and consumer.assignment(),
               "an assignment")  # fmt: skip
        # Untimed: a first commit that succeeds. kafka-python may rejoin right after its first
        # assignment, and its commits raise RebalanceInProgressError until a poll ends that.
        _until(lambda: _committed_once(consumer, {partition: OffsetAndMetadata(0, "", -1)}),
               "a first commit")  # fmt: skip
        schedule = Schedule(period_s)
        for i in range(samples):
            for kind, call in (
                ("commit_s", lambda i=i: consumer.commit({partition: OffsetAndMetadata(i + 1, "", -1)})),
                ("produce_s", lambda: producer.send(topic, value=value, key=key, partition=0).get(WAIT_S)),
            ):  # fmt: skip
                out["missed_slots"] += schedule.wait()
                try:
                    out[kind].append(_timed(call))
                except KafkaError as e:
                    _count(out["errors"], f"{kind[:-2]}: {type(e).__name__}")
    finally:
        consumer.close(autocommit=False)
        producer.close(5)
    return out


def _committed_once(consumer, offsets) -> bool:
    """kafka-python: commit `offsets`; on an error, poll (which rejoins the group) and say no."""
    from kafka.errors import KafkaError

    try:
        consumer.commit(offsets)
        return True
    except KafkaError:
        consumer.poll(REJOIN_POLL_MS)
        return False


# The polls that may rejoin the group (untimed): long, since kafka-python 3.0 applies a join's
# answer only in a poll that still finds a rejoin needed, and a poll that times out between the
# JoinGroup and SyncGroup answers can leave the member rebalancing for good (traced in
# tests/helpers.py, poll_kafka_python, and docs/groups.md). A poll returns as
# soon as it has records; on the empty topic here it waits the whole time.
REJOIN_POLL_MS = 2000


def _until(predicate: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {timeout_s:g} s")


def _count(errors: dict[str, int], name: str) -> None:
    errors[name] = errors.get(name, 0) + 1


# -- rebalances --------------------------------------------------------------------------------


class Member:
    """One confluent-kafka consumer of a group on its own polling thread; `assigned` is its
    current assignment (a set of partitions; empty after a revoke) and `assigned_at` when it
    came; `assignments` counts the assignments it was given."""

    def __init__(self, bootstrap: str, group: str, settings: dict | None = None):
        from confluent_kafka import Consumer

        self.consumer = Consumer(earliest({"bootstrap.servers": bootstrap, "group.id": group,
                                           **(settings or {})}))  # fmt: skip
        self.lock = threading.Lock()
        self.assigned: frozenset[int] = frozenset()
        self.assigned_at = 0.0
        self.assignments = 0
        self.subscribed_at: float | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._subscribe = threading.Event()
        self._topic = ""
        self._thread = threading.Thread(target=self._poll, name=f"member-{group}", daemon=True)
        self._thread.start()

    def subscribe(self, topic: str) -> None:
        """Ask the polling thread to subscribe (a consumer is used by one thread only: a
        subscribe() from another thread while one polls hung in confluent-kafka 2.16)."""
        self._topic = topic
        self._subscribe.set()

    def _on_assign(self, consumer, partitions) -> None:
        with self.lock:
            self.assigned = frozenset(tp.partition for tp in partitions)
            self.assigned_at = time.monotonic()
            self.assignments += 1

    def _on_revoke(self, consumer, partitions) -> None:
        with self.lock:
            self.assigned = frozenset()
            self.assigned_at = time.monotonic()

    def _poll(self) -> None:
        try:
            while not self._subscribe.wait(POLL_S):  # bounded: until subscribe() or close()
                if self._stop.is_set():
                    return
            self.subscribed_at = time.monotonic()
            self.consumer.subscribe([self._topic], on_assign=self._on_assign,
                                    on_revoke=self._on_revoke, on_lost=self._on_revoke)  # fmt: skip
            while not self._stop.is_set():
                self.consumer.poll(POLL_S)
        except BaseException as e:  # noqa: BLE001 (the benchmark reports it)
            self.error = e

    def state(self) -> tuple[frozenset[int], float]:
        with self.lock:
            return self.assigned, self.assigned_at

    def close(self) -> float:
        """Stop polling, then close() (LeaveGroup); returns when close() was called."""
        self._stop.set()
        self._thread.join(5)
        called = time.monotonic()
        self.consumer.close()
        return called


def settled(members: list[Member], partitions: int, since: float) -> float | None:
    """When the members hold every one of `partitions` exactly once, each something, each from an
    assignment after `since` (with range assignment: the rebalance is over): the latest of those
    assignments' times; None until then."""
    states = [m.state() for m in members]
    held = [p for assigned, _ in states for p in assigned]
    if any(not assigned or at <= since for assigned, at in states):
        return None
    if sorted(held) != list(range(partitions)):
        return None
    return max(at for _, at in states)


# -- the coordinator failover's feed and reader -----------------------------------------------


class Feed:
    """acks=all records (sequence, sent at) round robin over the topic's partitions at
    `rate_per_s`, from a thread; `acked` holds (partition, offset, sequence, sent, acked at)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate_per_s: float):
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1,
                                  "enable.idempotence": True})  # fmt: skip
        self.topic, self.partitions, self.period_s = topic, partitions, 1.0 / rate_per_s
        self.sent = 0
        self.acked: list[tuple[int, int, int, float, float]] = []
        self.errors: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feed", daemon=True)
        self._thread.start()

    def _report(self, error, message) -> None:
        if error is not None:
            _count(self.errors, error.name())
            return
        sequence, sent = RECORD.unpack(message.value())
        self.acked.append((message.partition(), message.offset(), sequence, sent, time.monotonic()))

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            while due <= now and not self._stop.is_set():  # bounded: the records due by now
                self.producer.produce(self.topic, RECORD.pack(self.sent, now),
                                      partition=self.sent % self.partitions, on_delivery=self._report)  # fmt: skip
                self.sent += 1
                due += self.period_s
            self.producer.poll(max(0.0, min(self.period_s, due - time.monotonic())))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.producer.flush(WAIT_S)


class Reader:
    """A confluent-kafka member of `group` consuming the feed and committing what it consumed,
    synchronously, every `commit_interval_s`: `received` holds (partition, offset, sent at,
    received at), `commits` (started, ended, {partition: offset} or None, error name or None)."""

    def __init__(self, bootstrap: str, group: str, topic: str, commit_interval_s: float):
        from confluent_kafka import Consumer

        self.consumer = Consumer(earliest({"bootstrap.servers": bootstrap, "group.id": group,
                                           "enable.auto.commit": False}))  # fmt: skip
        self.topic, self.commit_interval_s = topic, commit_interval_s
        self.lock = threading.Lock()
        self.received: list[tuple[int, int, float, float]] = []
        self.commits: list[tuple[float, float, dict[int, int], str | None]] = []
        self.positions: dict[int, int] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self.consumer.subscribe([topic])
        self._thread = threading.Thread(target=self._run, name=f"reader-{group}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_commit = time.monotonic()
        try:
            while not self._stop.is_set():
                self._consume()
                if time.monotonic() - last_commit >= self.commit_interval_s and self.positions:
                    last_commit = time.monotonic()
                    self._commit()
        except BaseException as e:  # noqa: BLE001 (the benchmark reports it)
            self.error = e

    def _consume(self) -> None:
        messages = self.consumer.consume(1000, 0.01)
        now = time.monotonic()
        with self.lock:
            for message in messages:
                if message.error() is not None:
                    continue
                _, sent = RECORD.unpack(message.value())
                self.received.append((message.partition(), message.offset(), sent, now))
                self.positions[message.partition()] = message.offset() + 1

    def _commit(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        offsets = dict(self.positions)
        started = time.monotonic()
        try:
            self.consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                                 asynchronous=False)  # fmt: skip
            error = None
        except KafkaException as e:
            error = e.args[0].name()
        with self.lock:
            self.commits.append((started, time.monotonic(), offsets, error))

    def snapshot(self, received_from: int = 0, commits_from: int = 0) -> tuple[list, list]:
        """Copies of `received` and `commits` from these indexes on (a poll during a kill
        copies what came since, not the whole run)."""
        with self.lock:
            return self.received[received_from:], self.commits[commits_from:]

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return len(self.received), len(self.commits)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


class CoordinatorLookup:
    """FindCoordinator (v3, a group key) to one broker at a time, over our client's connection
    on a loop thread; a connection that failed is opened again on the next ask."""

    def __init__(self):
        from localcluster.client.connection import LoopThread

        self.loop = LoopThread("bench-groups-find-coordinator")
        self.connections: dict[str, object] = {}

    def ask(self, address: str, group: str, timeout_ms: int = 1000) -> tuple[int, int]:
        """(error code, coordinator node id); a broker that cannot be reached answers
        (COORDINATOR_NOT_AVAILABLE, -1)."""
        from localcluster.client.connection import KafkaError

        try:
            return self.loop.run(self._ask(address, group, timeout_ms), timeout_ms / 1000 + 1)
        except (KafkaError, TimeoutError, OSError):
            return int(ErrorCode.coordinator_not_available), -1

    async def _ask(self, address: str, group: str, timeout_ms: int) -> tuple[int, int]:
        from localcluster.client.connection import Address, BrokerConnection
        from localcluster.protocol import messages
        from localcluster.protocol.api import ApiKey

        connection = self.connections.get(address)
        if connection is None or connection.closed:
            connection = await BrokerConnection.open(Address.parse(address), request_timeout_ms=timeout_ms,
                                                     connect_timeout_ms=timeout_ms)  # fmt: skip
            self.connections[address] = connection
        body = {"key": group, "key_type": 0}
        frame, offset = await connection.send(ApiKey.FIND_COORDINATOR, lambda v: messages.encode_request(
            ApiKey.FIND_COORDINATOR, v, body), version=3)  # fmt: skip
        response = messages.decode_response(ApiKey.FIND_COORDINATOR, 3, frame, offset)
        return int(response.error_code), int(response.node_id)

    def close(self) -> None:
        async def close_all() -> None:
            for connection in self.connections.values():
                connection.close()
                await connection.wait_closed()

        self.loop.run(close_all(), 10)
        self.loop.stop()
