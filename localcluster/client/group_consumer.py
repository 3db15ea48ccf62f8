"""The consumer's side of a consumer group: Kafka's classic protocol as the Java client's
ConsumerCoordinator speaks it, with eager or incremental cooperative rebalancing (KIP-429).

`ConsumerCoordinator` belongs to one AsyncConsumer that called `subscribe`. It finds the
group's coordinator (FindCoordinator, again after COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR or
a lost connection), joins (JoinGroup with protocol type "consumer" and one protocol per
assignor in partition.assignment.strategy; MEMBER_ID_REQUIRED is answered by joining again with
the member id given), and as leader computes every member's partitions (assignors.py) and sends
them in SyncGroup. The assignment's start positions are the committed offsets (OffsetFetch);
a partition without one starts by auto.offset.reset.

When things run:
- A rebalance runs only from `poll` (as in Java: the application must be polling for its
  member to take part), as a task that outlives one poll's timeout, so a rebalance longer
  than the poll goes on in the background and the next poll waits for it again.
- Before rejoining, a member that holds partitions commits its positions (enable.auto.commit).
  Eager protocol (any of range, roundrobin in partition.assignment.strategy): it gives them
  all up, and nothing is consumed during the rebalance. Cooperative protocol
  (cooperative-sticky alone): it keeps them, sends them as its owned partitions, and keeps
  consuming them while the rebalance runs; the assignment then says what it loses (revoked:
  committed, then dropped) and gains (fetched from their committed offsets), and a member
  that revoked some joins again at once, so the second rebalance can hand them on. A member
  that lost its generation (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION) has lost its partitions:
  it drops them without committing, in both protocols.
- Heartbeats run in their own task every heartbeat.interval.ms while the member is stable;
  REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID ask for a rejoin, which the
  next poll does. A member not polled for max.poll.interval.ms leaves the group (Java's rule).
- Auto commit (every auto.commit.interval.ms) is started from poll and commits the positions
  of the records poll already returned; at most one commit is in flight. close() commits,
  then sends LeaveGroup (static members, group.instance.id, do not leave: their session
  timeout does it, KIP-345).

The coordinator gets its own connection (Java's separate coordinator node), so a JoinGroup
parked at the coordinator never holds up fetches to the same broker. Retries back off
exponentially (backoff.py); a rebalance that keeps failing for max.poll.interval.ms gives up
with an error that poll raises. Errors no retry can fix (INCONSISTENT_GROUP_PROTOCOL,
FENCED_INSTANCE_ID, INVALID_SESSION_TIMEOUT, GROUP_AUTHORIZATION_FAILED, ...) are raised by the
next poll.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Iterable, Mapping

from kio.schema.errors import ErrorCode

from localcluster.backoff import ExponentialBackoff
from localcluster.client import group_requests
from localcluster.client.assignors import (
    ASSIGNORS,
    COOPERATIVE,
    MemberSubscription,
    parse_strategy,
    rebalance_protocol,
)
from localcluster.client.connection import BrokerConnection, KafkaConnectionError, KafkaError
from localcluster.client.group_requests import COORDINATOR_ERRORS
from localcluster.client.metadata import TopicPartition
from localcluster.group.consumer_protocol import (
    CONSUMER_PROTOCOL_TYPE,
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from localcluster.protocol.api import ApiKey

log = logging.getLogger(__name__)

GROUP_DEFAULTS = {
    "group.id": "",
    "group.instance.id": "",
    "session.timeout.ms": 45_000,
    "heartbeat.interval.ms": 3_000,
    "max.poll.interval.ms": 300_000,
    "enable.auto.commit": True,
    "auto.commit.interval.ms": 5_000,
    # the Java client's default (3.x): eager with range, and ready to move to cooperative-sticky
    # by a rolling restart without it (librdkafka's default is range,roundrobin)
    "partition.assignment.strategy": "range,cooperative-sticky",
}
JOIN_EXTRA_TIMEOUT_MS = 5_000  # Java: a JoinGroup may wait the rebalance timeout, plus this
QUICK_RETRIES = 5  # immediate rejoins in a row (MEMBER_ID_REQUIRED, ...) before backing off
# Answers to JoinGroup / SyncGroup after which the member joins again at once.
REJOIN_ERRORS = frozenset({ErrorCode.member_id_required, ErrorCode.unknown_member_id,
                           ErrorCode.illegal_generation, ErrorCode.rebalance_in_progress})  # fmt: skip


class CommitFailedError(KafkaError):
    """A commit the group refused because this member's generation is over (the group
    rebalanced, or the member was removed): its partitions may now be someone else's."""


class MemberState(enum.Enum):
    UNJOINED = "unjoined"
    REBALANCING = "rebalancing"
    STABLE = "stable"


def validate_group_config(config: Mapping) -> None:
    c = config
    parse_strategy(c["partition.assignment.strategy"])
    if c["heartbeat.interval.ms"] <= 0 or c["heartbeat.interval.ms"] >= c["session.timeout.ms"]:
        raise ValueError(f"heartbeat.interval.ms={c['heartbeat.interval.ms']} must be positive and "
                         f"below session.timeout.ms={c['session.timeout.ms']}")  # fmt: skip
    if c["auto.commit.interval.ms"] <= 0 or c["max.poll.interval.ms"] <= 0:
        raise ValueError("auto.commit.interval.ms and max.poll.interval.ms must be positive")


def _grouped(partitions: Iterable[TopicPartition]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return tuple((t, tuple(sorted(ps))) for t, ps in sorted(by_topic.items()))


class ConsumerCoordinator:
    """Group membership, assignment and commits for one AsyncConsumer (see the module doc).

    The consumer gives it `cluster` and `config` and two hooks: `set_group_assignment(positions)`
    replaces the assignment at once ({tp: committed offset or None}), `consumed_positions()`
    says what to commit."""

    def __init__(self, consumer, topics: Iterable[str]):
        c = consumer.config
        assert c["group.id"], "a group consumer needs group.id"
        self.consumer = consumer
        self.cluster = consumer.cluster
        self.config = c
        self.group_id: str = c["group.id"]
        self.group_instance_id: str | None = c["group.instance.id"] or None
        self.assignors = parse_strategy(c["partition.assignment.strategy"])
        self.rebalance_protocol = rebalance_protocol(self.assignors)
        self.subscription: tuple[str, ...] = tuple(sorted(set(topics)))
        self.member_id = ""
        self.generation_id = -1
        self.protocol: str | None = None
        self.leader_id = ""
        self.state = MemberState.UNJOINED
        self.rejoin_needed = True
        self.assigned: tuple[TopicPartition, ...] = ()
        self.rebalances = 0  # completed joins: for tests and logs
        self._backoff = ExponentialBackoff(c["retry.backoff.ms"] / 1000,
                                           max(c["retry.backoff.ms"] / 1000, 1.0))  # fmt: skip
        self._connection: BrokerConnection | None = None
        self._coordinator_lock = asyncio.Lock()
        self._rebalance: asyncio.Task | None = None
        self._commit: asyncio.Task | None = None  # the async commit in flight (at most one)
        self._heartbeat: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._fatal: KafkaError | None = None
        self._last_poll = time.monotonic()
        self._next_auto_commit = time.monotonic() + c["auto.commit.interval.ms"] / 1000
        self._committed: dict[TopicPartition, int] = {}  # what this member last committed
        self._closed = False

    def start(self) -> None:
        self.cluster.add_topics(self.subscription)
        self._heartbeat = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    def subscribe(self, topics: Iterable[str]) -> None:
        wanted = tuple(sorted(set(topics)))
        if wanted != self.subscription:
            self.subscription = wanted
            self.cluster.add_topics(wanted)
            self._request_rejoin(f"subscription changed to {list(wanted)}")

    # -- the coordinator connection ---------------------------------------------------------

    async def _coordinator_connection(self) -> BrokerConnection:
        async with self._coordinator_lock:
            if self._connection is not None and not self._connection.closed:
                return self._connection
            found = await group_requests.find_coordinator(
                self.cluster, self.group_id, self.config["request.timeout.ms"],
                self.config["retry.backoff.ms"])  # fmt: skip
            try:
                address = self.cluster.address_of(found.node_id)  # its Unix socket, if known
            except KafkaConnectionError:
                address = found.address
            self._connection = await BrokerConnection.open(
                address, client_id=self.cluster.client_id, max_in_flight=5,
                request_timeout_ms=self.config["request.timeout.ms"],
                security=self.cluster.security)  # fmt: skip
            log.info("group %s: coordinator is broker %d", self.group_id, found.node_id)
            return self._connection

    def _coordinator_unknown(self, why: str) -> None:
        if self._connection is not None:
            log.info("group %s: coordinator lost (%s); finding it again", self.group_id, why)
            self._connection.close()
            self._connection = None

    async def _send(self, api_key: int, body: dict, timeout_ms: int | None = None):
        connection = await self._coordinator_connection()
        try:
            return await group_requests.call(connection, api_key, body, timeout_ms=timeout_ms)
        except KafkaConnectionError as e:
            self._coordinator_unknown(str(e))
            raise

    def _check_coordinator_error(self, code: int, context: str) -> None:
        """Raise a retriable error for the answers that mean 'ask someone else'."""
        if code in COORDINATOR_ERRORS:
            self._coordinator_unknown(ErrorCode(code).name.upper())
            raise KafkaError.from_code(code, context)  # retriable by its code
        if code == ErrorCode.coordinator_load_in_progress:
            raise KafkaError.from_code(code, context)

    # -- poll -------------------------------------------------------------------------------

    async def poll(self, timeout_s: float) -> bool:
        """Called at the start of every consumer poll: rejoin when needed (waiting up to
        timeout_s), start an auto commit when due. True when the member holds its assignment."""
        self._last_poll = time.monotonic()
        self._raise_fatal()
        if self.rejoin_needed or self.state is not MemberState.STABLE:
            if self._rebalance is None or self._rebalance.done():
                self._rebalance = asyncio.get_running_loop().create_task(self._rebalance_loop())
            if self.rebalance_protocol == COOPERATIVE and self.assigned:
                return True  # consume what it holds while the rebalance runs (no auto commit:
                # the coordinator refuses commits between JoinGroup and SyncGroup)
            try:
                await asyncio.wait_for(asyncio.shield(self._rebalance), max(timeout_s, 0))
            except TimeoutError:
                return False
            self._raise_fatal()
            if self.state is not MemberState.STABLE:
                return False
        self._maybe_auto_commit()
        return True

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _request_rejoin(self, why: str) -> None:
        if not self.rejoin_needed:
            log.info("group %s: rejoining (%s)", self.group_id, why)
        self.rejoin_needed = True

    # -- the rebalance ----------------------------------------------------------------------

    async def _rebalance_loop(self) -> None:
        failures = quick = 0
        give_up = time.monotonic() + self.config["max.poll.interval.ms"] / 1000
        while not self._closed:
            try:
                if await self._join_once():
                    return
                quick += 1
                if quick < QUICK_RETRIES:
                    continue  # an answer that says "join again now"
                failures += 1
            except KafkaError as e:
                if not e.retriable:
                    log.info("group %s: cannot join: %s", self.group_id, e)  # poll raises it
                    self._fatal = e
                    return
                failures += 1
                log.info("group %s: join failed (%s); retrying", self.group_id, e)
            if time.monotonic() > give_up:
                self._fatal = KafkaError(
                    f"group {self.group_id}: could not join within max.poll.interval.ms="
                    f"{self.config['max.poll.interval.ms']}", ErrorCode.request_timed_out)  # fmt: skip
                return
            await asyncio.sleep(self._backoff.backoff_s(failures))

    async def _join_once(self) -> bool:
        """One JoinGroup + SyncGroup round. True: stable with an assignment; False: the
        coordinator asked to join again (or, cooperative, this member revoked partitions)."""
        await self._prepare_join()
        self.state = MemberState.REBALANCING
        self.rejoin_needed = False  # a heartbeat's answer from here on asks again
        joined = await self._join_group()
        if joined is None:
            return False
        data = await self._sync_group(joined)
        if data is None:
            return False
        await self._complete_join(data)
        if self.rejoin_needed:  # a rebalance began while the offsets were fetched
            return False
        return True

    async def _prepare_join(self) -> None:
        """Before JoinGroup: commit (auto commit); eager, give up every partition; cooperative,
        only those of topics no longer subscribed."""
        if self._commit is not None:
            await asyncio.gather(self._commit, return_exceptions=True)
        if self.assigned and self.generation_id < 0:
            # the coordinator no longer knows this generation: the partitions may be someone
            # else's already, and a commit would be refused (Java's onPartitionsLost)
            log.info("group %s: partitions lost with the generation: %s", self.group_id,
                     list(self.assigned))  # fmt: skip
            self._drop(self.assigned)
            return
        if self.assigned and self.config["enable.auto.commit"]:
            try:
                await self.commit(None)
            except KafkaError as e:
                log.warning("group %s: commit before the rebalance failed: %s", self.group_id, e)
        if self.rebalance_protocol == COOPERATIVE:
            wanted = set(self.subscription)
            await self._revoke([tp for tp in self.assigned if tp[0] not in wanted], commit=False)
        else:
            await self._revoke(self.assigned, commit=False)

    async def _revoke(self, partitions: Iterable[TopicPartition], commit: bool) -> None:
        """Stop consuming `partitions`, then (commit and auto commit) commit where they got to,
        before the rejoin that lets another member have them."""
        partitions = list(partitions)
        if not partitions:
            return
        log.info("group %s: revoking %s", self.group_id, partitions)
        positions = self.consumer.consumed_positions()
        self._drop(partitions)
        offsets = {tp: positions[tp] for tp in partitions if tp in positions}
        if commit and offsets and self.config["enable.auto.commit"]:
            try:
                await self.commit(offsets)
            except KafkaError as e:
                log.warning("group %s: commit of the revoked partitions failed: %s",
                            self.group_id, e)  # fmt: skip

    def _drop(self, partitions: Iterable[TopicPartition]) -> None:
        gone = set(partitions)
        self.assigned = tuple(tp for tp in self.assigned if tp not in gone)
        positions = self.consumer.consumed_positions()
        self.consumer.set_group_assignment({tp: positions.get(tp) for tp in self.assigned})

    async def _join_group(self):
        owned = _grouped(self.assigned)
        metadata = encode_subscription(Subscription(self.subscription, None, owned,
                                                    self.generation_id))  # fmt: skip
        c = self.config
        body = {"group_id": self.group_id, "session_timeout": c["session.timeout.ms"],
                "rebalance_timeout": c["max.poll.interval.ms"], "member_id": self.member_id,
                "group_instance_id": self.group_instance_id,
                "protocol_type": CONSUMER_PROTOCOL_TYPE,
                "protocols": [{"name": name, "metadata": metadata} for name in self.assignors],
                "reason": "joining the group"}  # fmt: skip
        answer = await self._send(ApiKey.JOIN_GROUP, body,
                                  timeout_ms=c["max.poll.interval.ms"] + JOIN_EXTRA_TIMEOUT_MS)  # fmt: skip
        code = int(answer.error_code)
        if code == ErrorCode.member_id_required:
            self.member_id = answer.member_id  # KIP-394: join again with the id given
            return None
        if code in REJOIN_ERRORS:
            self._reset_generation(code)
            return None
        self._check_coordinator_error(code, f"JoinGroup {self.group_id!r}")
        if code:
            raise KafkaError.from_code(code, f"JoinGroup {self.group_id!r}")
        self.member_id, self.generation_id = answer.member_id, int(answer.generation_id)
        self.protocol, self.leader_id = answer.protocol_name, answer.leader
        return answer

    def _reset_generation(self, code: int) -> None:
        """Java's rules: an unknown member starts over with no id; an old generation keeps its
        member id (the coordinator still knows it)."""
        if code == ErrorCode.unknown_member_id:
            self.member_id = ""
        if code in (ErrorCode.unknown_member_id, ErrorCode.illegal_generation):
            self.generation_id = -1

    async def _sync_group(self, joined) -> bytes | None:
        assignments = []
        if joined.leader == self.member_id and not getattr(joined, "skip_assignment", False):
            assignments = await self._assign(joined.protocol_name, joined.members)
        body = {"group_id": self.group_id, "generation_id": self.generation_id,
                "member_id": self.member_id, "group_instance_id": self.group_instance_id,
                "protocol_type": CONSUMER_PROTOCOL_TYPE, "protocol_name": self.protocol,
                "assignments": assignments}  # fmt: skip
        answer = await self._send(ApiKey.SYNC_GROUP, body)
        code = int(answer.error_code)
        if code in REJOIN_ERRORS:
            self._reset_generation(code)
            return None
        self._check_coordinator_error(code, f"SyncGroup {self.group_id!r}")
        if code:
            raise KafkaError.from_code(code, f"SyncGroup {self.group_id!r}")
        return bytes(answer.assignment)

    async def _assign(self, protocol: str, members) -> list[dict]:
        """The leader's job: every member's partitions by the group's protocol."""
        assignor = ASSIGNORS.get(protocol)
        if assignor is None:
            raise KafkaError(f"group {self.group_id}: the coordinator chose assignor "
                             f"{protocol!r}, which this client does not have")  # fmt: skip
        subscriptions = []
        for member in members:
            try:
                sub = decode_subscription(bytes(member.metadata))
            except ConsumerProtocolError as e:
                log.warning("group %s: member %s sent a subscription that does not parse (%s)",
                            self.group_id, member.member_id, e)  # fmt: skip
                sub = Subscription(())
            owned = tuple((t, p) for t, ps in sub.owned_partitions for p in ps)
            subscriptions.append(MemberSubscription(member.member_id, tuple(sub.topics),
                                                    member.group_instance_id, owned,
                                                    sub.generation_id))  # fmt: skip
        topics = {t for s in subscriptions for t in s.topics}
        self.cluster.add_topics(topics)
        metadata = await self.cluster.refresh_metadata()
        counts = {t: len(info.partitions) for t, info in metadata.topics.items()
                  if t in topics and info.error_code == 0}  # fmt: skip
        result = assignor(counts, subscriptions)
        log.info("group %s: as leader of generation %d, assigned (%s) %s", self.group_id,
                 self.generation_id, protocol, result)  # fmt: skip
        return [{"member_id": member_id,
                 "assignment": encode_assignment(Assignment(_grouped(tps)))}
                for member_id, tps in result.items()]  # fmt: skip

    async def _complete_join(self, data: bytes) -> None:
        try:
            assignment = decode_assignment(data) if data else Assignment(())
        except ConsumerProtocolError as e:
            raise KafkaError(f"group {self.group_id}: the leader's assignment does not parse: {e}",
                             ErrorCode.inconsistent_group_protocol) from None  # fmt: skip
        wanted = set(self.subscription)
        tps = [(t, p) for t, ps in assignment.assigned_partitions if t in wanted for p in ps]
        # eager: nothing is held here, every partition is new
        revoked = [tp for tp in self.assigned if tp not in set(tps)]
        if revoked:  # cooperative: give these up before anyone else may have them
            await self._revoke(revoked, commit=True)
            self._request_rejoin(f"revoked {len(revoked)} partition(s)")
        added = [tp for tp in tps if tp not in set(self.assigned)]
        committed = await self.committed(added) if added else {}
        if self.rejoin_needed and not revoked:
            return
        positions = self.consumer.consumed_positions()  # of the partitions kept
        self.consumer.set_group_assignment(
            {tp: positions.get(tp) for tp in self.assigned}
            | {tp: (committed.get(tp, -1) if committed.get(tp, -1) >= 0 else None) for tp in added}
        )
        self._committed.update({tp: o for tp, o in committed.items() if o >= 0})
        self.assigned = tuple(tps)
        self.state = MemberState.STABLE
        self.rebalances += 1
        log.info("group %s: joined generation %d as %s%s; assigned %s", self.group_id,
                 self.generation_id, self.member_id,
                 " (leader)" if self.leader_id == self.member_id else "", tps)  # fmt: skip

    # -- offsets ----------------------------------------------------------------------------

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed offsets (-1: none), retried until request.timeout.ms."""
        tps = [tuple(tp) for tp in partitions]
        deadline = time.monotonic() + self.config["request.timeout.ms"] / 1000
        failures = 0
        while True:
            try:
                connection = await self._coordinator_connection()
                try:
                    return await group_requests.offset_fetch(connection, self.group_id, tps,
                                                             require_stable=True)  # fmt: skip
                except KafkaConnectionError as e:
                    self._coordinator_unknown(str(e))
                    raise
            except KafkaError as e:
                if e.code in COORDINATOR_ERRORS:
                    self._coordinator_unknown(str(e))
                elif not e.retriable:
                    raise
                failures += 1
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(self._backoff.backoff_s(failures))

    async def commit(self, offsets: Mapping[TopicPartition, int] | None) -> None:
        """Commit `offsets` (default: the positions of what poll returned), retrying
        retriable errors until request.timeout.ms. Raises CommitFailedError when the group
        has moved on without this member."""
        if offsets is None:
            offsets = self.consumer.consumed_positions()
        offsets = {tuple(tp): int(o) for tp, o in offsets.items()}
        if not offsets:
            return
        deadline = time.monotonic() + self.config["request.timeout.ms"] / 1000
        failures = 0
        while True:
            try:
                return await self._commit_once(offsets)
            except KafkaError as e:
                failures += 1
                if not e.retriable or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(self._backoff.backoff_s(failures))

    async def _commit_once(self, offsets: dict[TopicPartition, int]) -> None:
        connection = await self._coordinator_connection()
        try:
            errors = await group_requests.offset_commit(
                connection, self.group_id, offsets, generation_id=self.generation_id,
                member_id=self.member_id, group_instance_id=self.group_instance_id)  # fmt: skip
        except KafkaConnectionError as e:
            self._coordinator_unknown(str(e))
            raise
        failed = {tp: code for tp, code in errors.items() if code}
        for tp, offset in offsets.items():
            if tp not in failed:
                self._committed[tp] = offset
        if not failed:
            return
        tp, code = next(iter(failed.items()))
        context = f"commit of {tp[0]}-{tp[1]} for group {self.group_id!r}"
        if code in (ErrorCode.unknown_member_id, ErrorCode.illegal_generation,
                    ErrorCode.rebalance_in_progress):  # fmt: skip
            self._reset_generation(code)
            self._request_rejoin(ErrorCode(code).name.upper())
            error = KafkaError.from_code(code, context, "the group rebalanced; poll to rejoin")
            raise CommitFailedError(str(error), code)
        self._check_coordinator_error(code, context)
        raise KafkaError.from_code(code, context)

    def commit_async(self, offsets: Mapping[TopicPartition, int] | None = None) -> asyncio.Task:
        """Start a commit (one attempt's retries, as commit); errors are logged, not raised."""
        if offsets is None:
            offsets = self.consumer.consumed_positions()
        task = asyncio.get_running_loop().create_task(self._commit_logged(dict(offsets)))
        self._commit = task
        return task

    async def _commit_logged(self, offsets) -> None:
        try:
            await self.commit(offsets)
        except KafkaError as e:
            log.warning("group %s: commit failed: %s", self.group_id, e)

    def _maybe_auto_commit(self) -> None:
        if not self.config["enable.auto.commit"] or time.monotonic() < self._next_auto_commit:
            return
        self._next_auto_commit = time.monotonic() + self.config["auto.commit.interval.ms"] / 1000
        if self._commit is not None and not self._commit.done():
            return  # the last one is still out; the next interval tries again
        changed = {tp: o for tp, o in self.consumer.consumed_positions().items()
                   if self._committed.get(tp) != o}  # fmt: skip
        if changed:
            self.commit_async(changed)

    # -- heartbeats -------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval_s = self.config["heartbeat.interval.ms"] / 1000
        while not self._closed:
            try:
                await asyncio.wait_for(self._wake.wait(), interval_s)
            except TimeoutError:
                pass
            if self._closed or self.state is not MemberState.STABLE or self.rejoin_needed:
                continue
            idle_s = time.monotonic() - self._last_poll
            if idle_s * 1000 > self.config["max.poll.interval.ms"]:
                log.warning("group %s: poll not called for %.0f s (max.poll.interval.ms=%d); "
                            "leaving the group", self.group_id, idle_s,
                            self.config["max.poll.interval.ms"])  # fmt: skip
                await self._leave("consumer poll timeout has expired")
                continue
            try:
                await self._heartbeat_once()
            except KafkaError as e:
                log.info("group %s: heartbeat failed: %s", self.group_id, e)
            except Exception:  # a bug here must not end the heartbeats silently
                log.exception("group %s: heartbeat failed", self.group_id)

    async def _heartbeat_once(self) -> None:
        body = {"group_id": self.group_id, "generation_id": self.generation_id,
                "member_id": self.member_id, "group_instance_id": self.group_instance_id}  # fmt: skip
        answer = await self._send(ApiKey.HEARTBEAT, body)
        code = int(answer.error_code)
        if code == 0 or self.state is not MemberState.STABLE:
            return
        if code in REJOIN_ERRORS:
            self._reset_generation(code)
            self._request_rejoin(f"heartbeat: {ErrorCode(code).name.upper()}")
        elif code == ErrorCode.fenced_instance_id:
            self._fatal = KafkaError.from_code(code, f"group {self.group_id}: another consumer "
                                               f"has group.instance.id={self.group_instance_id}")  # fmt: skip
        else:
            self._check_coordinator_error(code, f"heartbeat to group {self.group_id!r}")
            log.warning("group %s: heartbeat answered %s", self.group_id, ErrorCode(code).name)

    # -- leaving ----------------------------------------------------------------------------

    async def _leave(self, reason: str) -> None:
        """LeaveGroup (not for a static member), then forget the generation."""
        if self.member_id and self.group_instance_id is None:
            body = {"group_id": self.group_id, "member_id": self.member_id,
                    "members": [{"member_id": self.member_id, "group_instance_id": None,
                                 "reason": reason}]}  # fmt: skip
            try:
                await self._send(ApiKey.LEAVE_GROUP, body)
            except KafkaError as e:
                log.info("group %s: LeaveGroup failed: %s", self.group_id, e)
        self.assigned = ()
        self.consumer.set_group_assignment({})
        self.member_id = "" if self.group_instance_id is None else self.member_id
        self.generation_id = -1
        self.state = MemberState.UNJOINED
        self.rejoin_needed = True

    async def close(self, timeout_s: float) -> None:
        """Commit (auto commit), leave the group, stop the tasks; within about timeout_s."""
        if self._rebalance is not None and not self._rebalance.done():
            # a JoinGroup parked at the coordinator would hold up the LeaveGroup behind it
            self._rebalance.cancel()
            await asyncio.gather(self._rebalance, return_exceptions=True)
            self._coordinator_unknown("closing during a rebalance")
        try:
            # cooperative: a member closed mid-rebalance still holds (and commits) partitions
            if self.assigned and self.generation_id >= 0 and self.config["enable.auto.commit"]:
                try:
                    await asyncio.wait_for(self.commit(None), timeout_s)
                except (KafkaError, TimeoutError) as e:
                    log.warning("group %s: final commit failed: %s", self.group_id, e)
            if self.state is not MemberState.UNJOINED:
                try:
                    await asyncio.wait_for(self._leave("the consumer is being closed"), timeout_s)
                except TimeoutError:
                    pass
        finally:
            self._closed = True
            self._wake.set()
            tasks = [t for t in (self._rebalance, self._heartbeat, self._commit) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._connection is not None:
                self._connection.close()
                await self._connection.wait_closed()
                self._connection = None
