"""Follower fetchers: one task per leader broker, fetching every partition it leads for us.

A partition joins its leader's fetcher when this broker becomes its follower. In leader-epoch
mode it first truncates (OffsetForLeaderEpoch, iterated as KIP-279 describes; the decision is
`replication.follower_truncation`'s), then fetches from its log end with Fetch(replica_id),
long-polling `replica.fetch.wait.max.ms`. Errors that mean "the leader is not ready or has
moved on" back off and retry; a new LeaderAndIsr moves the partition to another fetcher.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from localcluster.client.connection import BrokerConnection, KafkaError
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey
from localcluster.protocol.fetch import (
    FetchPartition,
    FetchRequest,
    read_fetch_response,
    write_fetch_request,
)
from localcluster.protocol.wire import Reader
from localcluster.replication.follower_truncation import (
    first_epoch_to_ask,
    hw_truncation,
    leader_epoch_truncation,
)
from localcluster.tasks import cancel_and_wait

log = logging.getLogger(__name__)

FETCH_VERSION = 11
OFFSET_FOR_LEADER_EPOCH_VERSION = 3
LIST_OFFSETS_VERSION = 2
BACKOFF_S = 0.05
BACKOFF_MAX_S = 1.0
MAX_TRUNCATION_ROUNDS = 100  # KIP-279 iterations are bounded by the number of epochs
FETCH_MAX_BYTES = 32 << 20
PARTITION_FETCH_MAX_BYTES = 8 << 20


@dataclass(slots=True)
class FollowedPartition:
    leader_epoch: int
    truncating: bool
    backoff_until: float = 0.0


def long_poll_ms(partitions, now: float, wait_max_ms: int) -> int:
    """How long a Fetch may wait at the leader: replica.fetch.wait.max.ms, but no longer than
    until the first partition backing off (left out of this Fetch) may be fetched again.

    A long poll for the other partitions would otherwise hold it back for the whole wait: after
    a leader change the follower often asks before the new leader has its LeaderAndIsr, backs
    off 50 ms, and then sat behind a 500 ms poll of the partitions the leader already had
    (acks=all failovers that took 540 ms instead of 40)."""
    waits = [p.backoff_until - now for p in partitions if p.backoff_until > now]
    if not waits:
        return wait_max_ms
    return max(0, min(wait_max_ms, math.ceil(min(waits) * 1000)))


class ReplicaFetcher:
    def __init__(self, leader_id: int, manager: ReplicaFetcherManager):
        self.leader_id = leader_id
        self.manager = manager
        self.partitions: dict[tuple[str, int], FollowedPartition] = {}
        self.changed = asyncio.Event()
        self.connection: BrokerConnection | None = None
        self.task: asyncio.Task | None = None
        self._fetching = False
        self._interrupted = False

    def interrupt(self) -> None:
        """A partition needs truncating now: abandon the long-poll in flight (up to
        replica.fetch.wait.max.ms) by hanging up; the leader frees it at once."""
        if self._fetching and self.connection is not None:
            self._interrupted = True
            self.connection.close()

    async def run(self) -> None:
        backoff = BACKOFF_S
        while self.partitions:
            try:
                await self._ensure_connection()
                await self._truncate_pending()
                if not await self._fetch_once():
                    await self._wait_for_work()
                backoff = BACKOFF_S
            except asyncio.CancelledError:
                raise
            except (KafkaError, ConnectionError, OSError, TimeoutError) as e:  # incl. SASL refusals
                self._drop_connection()
                if self._interrupted:  # we hung up on purpose: start over at once
                    self._interrupted = False
                    continue
                log.info("fetcher for leader %d: %s; retrying in %.2f s", self.leader_id,
                         e or type(e).__name__, backoff)  # fmt: skip
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            except Exception:
                log.exception("fetcher for leader %d failed; retrying", self.leader_id)
                self._drop_connection()
                await asyncio.sleep(BACKOFF_MAX_S)
        self._drop_connection()

    async def _wait_for_work(self) -> None:
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), BACKOFF_S)
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

    # -- truncation ---------------------------------------------------------------------------

    async def _truncate_pending(self) -> None:
        now = asyncio.get_running_loop().time()
        for tp, followed in list(self.partitions.items()):
            if followed.truncating and followed.backoff_until <= now:
                await self._truncate(tp, followed)

    async def _truncate(self, tp, followed: FollowedPartition) -> None:
        rm = self.manager.replica_manager
        epoch = first_epoch_to_ask(rm.partitions[tp].log.leader_epoch_cache.latest_epoch) if (
            self._still_following(tp, followed)) else None  # fmt: skip
        for _ in range(MAX_TRUNCATION_ROUNDS):
            if not self._still_following(tp, followed):
                return  # a LeaderAndIsr moved it while we waited for the leader
            hosted = rm.partitions[tp]
            lg = hosted.log
            if epoch is None:
                decision = hw_truncation(hosted.state.high_watermark, lg.log_end_offset)
            else:
                error, leader_epoch, end_offset = await self._ask_epoch_end(
                    tp, followed.leader_epoch, epoch
                )
                if not self._still_following(tp, followed):
                    return
                if error != ErrorCode.none:
                    log.info("%s-%d: leader %d answered OffsetForLeaderEpoch with %s; retrying",
                             *tp, self.leader_id, ErrorCode(error).name)  # fmt: skip
                    followed.backoff_until = asyncio.get_running_loop().time() + BACKOFF_S
                    return
                decision = leader_epoch_truncation(
                    leader_epoch, end_offset, lg.end_offset_for_epoch, lg.log_end_offset,
                    hosted.state.high_watermark)  # fmt: skip
            if decision.offset < lg.log_end_offset:
                rm.truncate_follower(tp, decision.offset)
            if decision.done:
                break
            epoch = decision.next_epoch
        else:
            raise RuntimeError(f"{tp}: truncation did not settle in {MAX_TRUNCATION_ROUNDS} rounds")
        log.info("%s-%d: truncation against leader %d done, fetching from %d", *tp,
                 self.leader_id, rm.partitions[tp].log.log_end_offset)  # fmt: skip
        followed.truncating = False

    def _still_following(self, tp, followed: FollowedPartition) -> bool:
        hosted = self.manager.replica_manager.partitions.get(tp)
        return (self.partitions.get(tp) is followed and hosted is not None
                and not hosted.state.is_leader)  # fmt: skip

    async def _ask_epoch_end(
        self, tp, current_leader_epoch: int, epoch: int
    ) -> tuple[int, int, int]:
        body = messages.encode_request(ApiKey.OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_VERSION, {
            "replica_id": self.manager.broker_id,
            "topics": [{"topic": tp[0], "partitions": [{
                "partition": tp[1], "current_leader_epoch": current_leader_epoch,
                "leader_epoch": epoch}]}],
        })  # fmt: skip
        frame, offset = await self.connection.send(ApiKey.OFFSET_FOR_LEADER_EPOCH, lambda v: body,
                                                   version=OFFSET_FOR_LEADER_EPOCH_VERSION)  # fmt: skip
        response = messages.decode_response(ApiKey.OFFSET_FOR_LEADER_EPOCH,
                                            OFFSET_FOR_LEADER_EPOCH_VERSION, frame, offset)  # fmt: skip
        p = response.topics[0].partitions[0]
        return int(p.error_code), int(p.leader_epoch), int(p.end_offset)

    # -- fetching -----------------------------------------------------------------------------

    async def _fetch_once(self) -> bool:
        """One Fetch for every partition ready to fetch; False when there was none."""
        rm = self.manager.replica_manager
        now = asyncio.get_running_loop().time()
        by_topic: dict[str, list[FetchPartition]] = {}
        for tp, followed in self.partitions.items():
            hosted = rm.partitions.get(tp)
            if followed.truncating or followed.backoff_until > now or hosted is None:
                continue
            by_topic.setdefault(tp[0], []).append(FetchPartition(
                tp[1], hosted.log.log_end_offset, PARTITION_FETCH_MAX_BYTES,
                followed.leader_epoch, hosted.log.log_start_offset))  # fmt: skip
        if not by_topic:
            return False
        wait_ms = long_poll_ms(self.partitions.values(), now, self.manager.fetch_wait_max_ms)
        request = FetchRequest(self.manager.broker_id, wait_ms, 1, FETCH_MAX_BYTES, 0,
                               list(by_topic.items()))  # fmt: skip
        body = write_fetch_request(request, FETCH_VERSION)
        self._fetching = True
        try:
            frame, offset = await self.connection.send(
                ApiKey.FETCH, lambda v: body, version=FETCH_VERSION,
                timeout_ms=self.manager.fetch_wait_max_ms + 30_000)  # fmt: skip
        finally:
            self._fetching = False
        _, responses = read_fetch_response(Reader(frame, offset), FETCH_VERSION)
        for topic, partitions in responses:
            for p in partitions:
                await self._apply((topic, p.partition), p)
        return True

    async def _apply(self, tp, p) -> None:
        followed = self.partitions.get(tp)
        rm = self.manager.replica_manager
        if followed is None or not self._still_following(tp, followed):
            return
        if p.error_code == ErrorCode.none:
            records = p.records[0] if p.records else b""
            rm.append_as_follower(tp, records, p.high_watermark, p.log_start_offset)
            return
        if p.error_code == ErrorCode.offset_out_of_range:
            await self._handle_out_of_range(tp, p)
            return
        log.info("%s-%d: leader %d answered Fetch with %s; backing off", *tp, self.leader_id,
                 ErrorCode(p.error_code).name)  # fmt: skip
        followed.backoff_until = asyncio.get_running_loop().time() + BACKOFF_S

    async def _handle_out_of_range(self, tp, p) -> None:
        """Our fetch offset is outside the leader's log: past its end (cut back to it) or
        before its start (start over at the leader's log start)."""
        rm = self.manager.replica_manager
        leader_end = await self._leader_offset(tp, -1)
        hosted = rm.partitions[tp]
        if hosted.log.log_end_offset > leader_end >= 0:
            log.warning("%s-%d: our log end %d is past leader %d's %d; truncating", *tp,
                        hosted.log.log_end_offset, self.leader_id, leader_end)  # fmt: skip
            rm.truncate_follower(tp, leader_end)
        else:
            leader_start = await self._leader_offset(tp, -2)
            log.warning("%s-%d: leader %d's log starts at %d, past our end %d; starting over",
                        *tp, self.leader_id, leader_start, hosted.log.log_end_offset)  # fmt: skip
            hosted.log.truncate_fully_and_start_at(leader_start)
            hosted.state.on_follower_truncated(
                hosted.log.log_start_offset, hosted.log.log_end_offset
            )

    async def _leader_offset(self, tp, timestamp: int) -> int:
        body = messages.encode_request(ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION, {
            "replica_id": self.manager.broker_id, "isolation_level": 0,
            "topics": [{"name": tp[0], "partitions": [{"partition_index": tp[1],
                                                        "timestamp": timestamp}]}],
        })  # fmt: skip
        frame, offset = await self.connection.send(ApiKey.LIST_OFFSETS, lambda v: body,
                                                   version=LIST_OFFSETS_VERSION)  # fmt: skip
        response = messages.decode_response(
            ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION, frame, offset
        )
        p = response.topics[0].partitions[0]
        if p.error_code != ErrorCode.none:
            raise ConnectionError(f"leader {self.leader_id} answered ListOffsets with "
                                  f"{ErrorCode(p.error_code).name}")  # fmt: skip
        return int(p.offset)


class ReplicaFetcherManager:
    """Which leader each followed partition fetches from; starts and stops fetcher tasks."""

    def __init__(self, replica_manager, broker_id: int, fetch_wait_max_ms: int,
                 connector):  # fmt: skip
        self.replica_manager = replica_manager
        self.broker_id = broker_id
        self.fetch_wait_max_ms = fetch_wait_max_ms
        self.connector = connector  # broker/inter_broker.py: the socket or TCP+SASL to a leader
        self.fetchers: dict[int, ReplicaFetcher] = {}

    def add_partition(self, tp, leader_id: int, leader_epoch: int, truncate: bool) -> None:
        self.remove_partition(tp)
        fetcher = self.fetchers.get(leader_id)
        if fetcher is None or fetcher.task is None or fetcher.task.done():
            fetcher = ReplicaFetcher(leader_id, self)
            self.fetchers[leader_id] = fetcher
        fetcher.partitions[tp] = FollowedPartition(leader_epoch, truncating=truncate)
        if fetcher.task is None or fetcher.task.done():
            fetcher.task = asyncio.get_running_loop().create_task(fetcher.run())
        else:
            fetcher.interrupt()
        fetcher.changed.set()

    def remove_partition(self, tp) -> None:
        for fetcher in self.fetchers.values():
            if fetcher.partitions.pop(tp, None) is not None:
                fetcher.changed.set()

    async def close(self) -> None:
        await cancel_and_wait(*(f.task for f in self.fetchers.values()))
        for fetcher in self.fetchers.values():
            fetcher._drop_connection()
        self.fetchers.clear()
