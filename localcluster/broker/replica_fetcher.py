"""Follower fetchers: one task and one connection per leader broker, sending what the replica
core's fetch session for that leader plans (replication/fetch_sessions.py decides which
partitions, truncation, backoffs and the long poll) and reporting each answer back.

The task polls its session, sends the request (OffsetForLeaderEpoch, ListOffsets or a Fetch of
many partitions), decodes the answer into the core's terms and carries out the Ready it gets
(through the ReplicaManager). A request that fails (connection lost, timeout, a refused SASL
handshake) is reported as failed; only reconnecting backs off here (exponentially, as a
client's reconnect.backoff.ms). When the core abandons the request in flight (a partition
joined the session), the fetcher hangs up so the leader frees the long poll at once.

A fetcher that stops on an error nobody expected (a bug, or storage failing under a follower
append) is not left dead: with no fetcher, its partitions would fall out of every ISR and stay
out until the next LeaderAndIsr for that leader. The manager logs the error with its traceback,
reports the request it was carrying as failed (so the core's session may plan again) and starts
a new fetcher a second later. Kafka's fetcher thread likewise survives such an
error: it marks the partition failed and goes on with the others.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from localcluster.backoff import ExponentialBackoff
from localcluster.client.connection import BrokerConnection, KafkaError
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey
from localcluster.protocol.fetch import (
    FetchPartition,
    FetchRequest,
    read_session_fetch_response,
    write_fetch_request,
)
from localcluster.protocol.incremental_fetch import FetchSessionHandler
from localcluster.protocol.wire import Reader
from localcluster.replication.ready import (
    EpochAnswer,
    EpochRequestPlan,
    FetchedPartition,
    FetchRequestPlan,
    ListOffsetsPlan,
)
from localcluster.tasks import cancel_and_wait

log = logging.getLogger(__name__)

FETCH_VERSION = 11
OFFSET_FOR_LEADER_EPOCH_VERSION = 3
LIST_OFFSETS_VERSION = 2
BACKOFF_MAX_S = 1.0  # the longest the loop sleeps: a reconnect, or a wait for work
RECONNECT_BACKOFF = ExponentialBackoff(initial_s=0.05, max_s=BACKOFF_MAX_S)
FETCH_MAX_BYTES = 32 << 20
PARTITION_FETCH_MAX_BYTES = 8 << 20
RESTART_AFTER_S = 1.0  # a fetcher that died on a bug: once a second at most, not in a spin
CONNECTION_ERRORS = (KafkaError, ConnectionError, OSError, TimeoutError)  # incl. SASL refusals


class ReplicaFetcher:
    def __init__(self, leader_id: int, manager: ReplicaFetcherManager):
        self.leader_id = leader_id
        self.manager = manager
        self.changed = asyncio.Event()
        self.connection: BrokerConnection | None = None
        self.task: asyncio.Task | None = None
        self._sending = False
        self._interrupted = False
        self.request = None  # the core's request this fetcher carries, until it is answered
        self.session = FetchSessionHandler()  # KIP-227: only what changed goes each time

    def interrupt(self) -> None:
        """The core gave up on the request in flight: hang up; the leader frees it at once."""
        if self._sending and self.connection is not None:
            self._interrupted = True
            # Only the connection: if the answer is already in, it is taken as usual and the
            # session goes on (the leader keeps sessions across connections); if not, the
            # failed send starts the session over.
            self.connection.close()

    async def run(self) -> None:
        rm = self.manager.replica_manager
        core = rm.core
        failures = 0  # connection attempts that failed in a row
        while core.has_fetch_session(self.leader_id):
            self.changed.clear()
            try:
                await self._ensure_connection()
            except asyncio.CancelledError:
                raise
            except CONNECTION_ERRORS as e:
                self._drop_connection()
                failures += 1
                backoff_s = RECONNECT_BACKOFF.backoff_s(failures)
                log.info("fetcher for leader %d: %s; connecting again in %.2f s", self.leader_id,
                         e or type(e).__name__, backoff_s)  # fmt: skip
                await asyncio.sleep(backoff_s)
                continue
            failures = 0
            ready = core.poll_fetch_session(self.leader_id, rm.now_ms())
            if ready.requests:
                self.request = ready.requests[0]
            rm.execute(ready)
            if not ready.requests:
                await self._wait_for_work(core.fetch_session_wakeup_ms(self.leader_id, rm.now_ms()))
                continue
            await self._exchange(ready.requests[0])
        self._drop_connection()

    async def _exchange(self, request) -> None:
        rm = self.manager.replica_manager
        self._sending = True
        try:
            answer = await self._send(request)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._drop_connection()
            if self._interrupted:
                pass  # we hung up on purpose: the core has moved on
            elif isinstance(e, CONNECTION_ERRORS):
                log.info("fetcher for leader %d: %s; backing off", self.leader_id,
                         e or type(e).__name__)  # fmt: skip
            else:
                log.exception("fetcher for leader %d failed; backing off", self.leader_id)
            rm.execute(rm.core.on_fetch_request_failed(request, rm.now_ms()))
            return
        finally:
            # An answer that came before a hang-up is taken below; the core drops it.
            self._sending = self._interrupted = False
            self.request = None
        rm.execute(answer())

    async def _wait_for_work(self, wakeup_ms: int | None) -> None:
        """Until the session changes or its first backoff ends."""
        now_ms = self.manager.replica_manager.now_ms()
        timeout_s = BACKOFF_MAX_S if wakeup_ms is None else max(wakeup_ms - now_ms, 1) / 1000
        try:
            await asyncio.wait_for(self.changed.wait(), min(timeout_s, BACKOFF_MAX_S))
        except TimeoutError:
            pass

    async def _ensure_connection(self) -> None:
        if self.connection is not None and not self.connection.closed:
            return
        self.connection = await self.manager.connector.open(
            self.leader_id, f"replica-fetcher-{self.manager.broker_id}", 1
        )

    def _drop_connection(self) -> None:
        if self.connection is not None:
            self.connection.close()
        self.connection = None
        self.session.on_failure()  # an answer may be lost with it: start the session over

    # -- the wire: one request, and its answer as a core step ---------------------------------

    async def _send(self, request):
        """Send `request`; return the core step that takes its answer."""
        core, now_ms = self.manager.replica_manager.core, self.manager.replica_manager.now_ms
        if isinstance(request, FetchRequestPlan):
            fetched = await self._fetch(request)
            return lambda: core.on_fetch_response(request, fetched, now_ms())
        if isinstance(request, EpochRequestPlan):
            answers = await self._ask_epoch_ends(request)
            return lambda: core.on_epoch_response(request, answers, now_ms())
        assert isinstance(request, ListOffsetsPlan)
        error, offset = await self._leader_offset(request)
        return lambda: core.on_list_offsets_response(request, error, offset, now_ms())

    async def _fetch(self, request: FetchRequestPlan) -> list[FetchedPartition]:
        """The planned partitions through the fetch session: the request names those whose
        position changed, the answer those with something new; the others are as they were."""
        planned = [(p.tp[0], FetchPartition(p.tp[1], p.fetch_offset, PARTITION_FETCH_MAX_BYTES,
                                            p.current_leader_epoch, p.log_start_offset))
                   for p in request.partitions]  # fmt: skip
        session = self.session.build(planned)
        body = write_fetch_request(FetchRequest(self.manager.broker_id, request.max_wait_ms, 1,
                                                FETCH_MAX_BYTES, 0, session.to_send,
                                                session.session_id, session.session_epoch,
                                                forgotten=session.forgotten),
                                   FETCH_VERSION)  # fmt: skip
        try:
            frame, offset = await self.connection.send(
                ApiKey.FETCH, lambda v: body, version=FETCH_VERSION,
                timeout_ms=self.manager.fetch_wait_max_ms + 30_000)  # fmt: skip
        except BaseException:
            self.session.on_failure()
            raise
        error, session_id, responses = read_session_fetch_response(Reader(frame, offset),
                                                                   FETCH_VERSION)  # fmt: skip
        if not self.session.on_response(session, error, session_id):
            log.info("fetcher for leader %d: fetch session %d ended (error %d); starting a "
                     "new one", self.leader_id, session.session_id, error)  # fmt: skip
            return []
        return [FetchedPartition((topic, p.partition), p.error_code, p.high_watermark,
                                 p.log_start_offset, p.records[0] if p.records else b"")
                for topic, partitions in responses for p in partitions]  # fmt: skip

    async def _ask_epoch_ends(self, request: EpochRequestPlan) -> list[EpochAnswer]:
        """One OffsetForLeaderEpoch for every partition asked, grouped by topic."""
        topics: dict[str, list[dict]] = {}
        for ask in request.partitions:
            topics.setdefault(ask.tp[0], []).append({
                "partition": ask.tp[1], "current_leader_epoch": ask.current_leader_epoch,
                "leader_epoch": ask.leader_epoch})  # fmt: skip
        body = messages.encode_request(ApiKey.OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_VERSION, {
            "replica_id": self.manager.broker_id,
            "topics": [{"topic": topic, "partitions": partitions} for topic, partitions in topics.items()],
        })  # fmt: skip
        frame, offset = await self.connection.send(ApiKey.OFFSET_FOR_LEADER_EPOCH, lambda v: body,
                                                   version=OFFSET_FOR_LEADER_EPOCH_VERSION)  # fmt: skip
        response = messages.decode_response(ApiKey.OFFSET_FOR_LEADER_EPOCH,
                                            OFFSET_FOR_LEADER_EPOCH_VERSION, frame, offset)  # fmt: skip
        return [EpochAnswer((topic.topic, int(p.partition)), int(p.error_code), int(p.leader_epoch),
                            int(p.end_offset))
                for topic in response.topics for p in topic.partitions]  # fmt: skip

    async def _leader_offset(self, request: ListOffsetsPlan) -> tuple[int, int]:
        tp = request.tp
        body = messages.encode_request(ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION, {
            "replica_id": self.manager.broker_id, "isolation_level": 0,
            "topics": [{"name": tp[0], "partitions": [{"partition_index": tp[1],
                                                        "timestamp": request.timestamp}]}],
        })  # fmt: skip
        frame, offset = await self.connection.send(ApiKey.LIST_OFFSETS, lambda v: body,
                                                   version=LIST_OFFSETS_VERSION)  # fmt: skip
        response = messages.decode_response(
            ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION, frame, offset
        )
        p = response.topics[0].partitions[0]
        return int(p.error_code), int(p.offset)


class ReplicaFetcherManager:
    """A fetcher task for every leader the core has a fetch session with."""

    def __init__(self, replica_manager, broker_id: int, fetch_wait_max_ms: int,
                 connector):  # fmt: skip
        # The fetchers' kio requests, which both ends first use in a leader change: loaded at
        # start, not in the middle of a failover (this broker answers them as a leader too).
        messages.preload([(ApiKey.OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_VERSION),
                          (ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION)])  # fmt: skip
        self.replica_manager = replica_manager
        self.broker_id = broker_id
        self.fetch_wait_max_ms = fetch_wait_max_ms
        self.connector = connector  # broker/inter_broker.py: the socket or TCP+SASL to a leader
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._closed = False

    def on_sessions(self, leaders, abandoned) -> None:
        """A Ready's `fetch_sessions` (poll, start or stop) and `abandoned` (hang up)."""
        for leader_id in abandoned:
            fetcher = self.fetchers.get(leader_id)
            if fetcher is not None:
                fetcher.interrupt()
        for leader_id in leaders:
            fetcher = self.fetchers.get(leader_id)
            if fetcher is not None and fetcher.task is not None and not fetcher.task.done():
                fetcher.changed.set()
            elif self.replica_manager.core.has_fetch_session(leader_id):
                self._start(leader_id)

    def _start(self, leader_id: int) -> None:
        fetcher = self.fetchers[leader_id] = ReplicaFetcher(leader_id, self)
        fetcher.task = asyncio.get_running_loop().create_task(fetcher.run())
        fetcher.task.add_done_callback(functools.partial(self._on_fetcher_done, fetcher))

    def _on_fetcher_done(self, fetcher: ReplicaFetcher, task: asyncio.Task) -> None:
        """A fetcher that raised: say so, free its request in the core and start another."""
        if task.cancelled() or task.exception() is None:
            return  # closed, or its session ended
        rm = self.replica_manager
        log.error("fetcher for leader %d stopped on an unexpected error; its partitions are not "
                  "replicated until it starts again in %.1f s. This is a bug: please report it "
                  "with this traceback", fetcher.leader_id, RESTART_AFTER_S,
                  exc_info=task.exception())  # fmt: skip
        fetcher._drop_connection()
        request, fetcher.request = fetcher.request, None
        if request is not None:
            rm.execute(rm.core.on_fetch_request_failed(request, rm.now_ms()))
        asyncio.get_running_loop().call_later(RESTART_AFTER_S, self._restart, fetcher)

    def _restart(self, fetcher: ReplicaFetcher) -> None:
        leader_id = fetcher.leader_id
        if self.fetchers.get(leader_id) is fetcher and not self._closed:
            if self.replica_manager.core.has_fetch_session(leader_id):
                self._start(leader_id)

    async def close(self) -> None:
        self._closed = True
        await cancel_and_wait(*(f.task for f in self.fetchers.values()))
        for fetcher in self.fetchers.values():
            fetcher._drop_connection()
        self.fetchers.clear()
