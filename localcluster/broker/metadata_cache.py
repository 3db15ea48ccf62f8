"""MetadataCache: what the controller last told this broker about brokers and leaders.

Filled by UpdateMetadata, read by the Metadata API. A FULL request replaces every partition;
an INCREMENTAL one replaces the partitions it names and removes those it names with the leader
LEADER_DURING_DELETE (as Kafka's ZooKeeper-mode brokers apply them; protocol/
controller_requests.py). Each carries the whole broker list. A request from an older
controller epoch than the last one applied is refused with STALE_CONTROLLER_EPOCH and changes
nothing. Until the first FULL request arrives (a broker just started, or no broker runs a
controller), `ready` is False and Metadata falls back to reading the store: an INCREMENTAL one
alone is a part of a picture (the controller sends a broker that registers FULL first).

A broker the controller no longer lists (it died) stays in Metadata's broker list for
DEPARTED_BROKER_LINGER_MS, never as a leader (its partitions show their new leader, or
LEADER_NOT_AVAILABLE, and list it among the offline replicas). Why: librdkafka (2.x) destroys
a broker handle as soon as a Metadata response leaves the broker out, and when that same
response names the partition's new leader, the dying handle, which still holds the partition,
hands it back to "no leader" after the migration; nothing asks for the leader again until
librdkafka's 1 s topic scan, so acks stalled 0.7-1.0 s after a leader's kill -9 (bench.failover,
bench/README.md). Listed a little longer, the partition moves to its new leader first and the
dead broker's handle goes later, holding nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kio.schema.errors import ErrorCode

from localcluster.protocol.controller_requests import (
    FULL,
    LEADER_DURING_DELETE,
    MetadataBroker,
    UpdateMetadataRequest,
)

DEPARTED_BROKER_LINGER_MS = 2000


@dataclass(frozen=True, slots=True)
class CachedPartition:
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    offline_replicas: tuple[int, ...]


class MetadataCache:
    def __init__(self):
        self.controller_id = -1
        self.controller_epoch = -1
        self.brokers: dict[int, MetadataBroker] = {}  # the live brokers
        self.departed: dict[int, tuple[MetadataBroker, float]] = {}  # left the list at (ms)
        self._topics: dict[str, dict[int, CachedPartition]] = {}
        self._full_applied = False

    @property
    def ready(self) -> bool:
        return self._full_applied

    def update(self, request: UpdateMetadataRequest, now_ms: float | None = None) -> int:
        if request.controller_epoch < self.controller_epoch:
            return ErrorCode.stale_controller_epoch
        now_ms = _monotonic_ms() if now_ms is None else now_ms
        self.controller_id = request.controller_id
        self.controller_epoch = request.controller_epoch
        brokers = {b.broker_id: b for b in request.brokers}
        for broker_id, broker in self.brokers.items():
            if broker_id not in brokers:
                self.departed[broker_id] = (broker, now_ms)
        for broker_id in brokers:
            self.departed.pop(broker_id, None)
        self.brokers = brokers
        if request.type == FULL:
            self._topics = {}
            self._full_applied = True
        topics = self._topics
        for p, offline in zip(request.partitions, request.offline_replicas, strict=True):
            if p.leader == LEADER_DURING_DELETE:
                partitions = topics.get(p.topic)
                if partitions is not None:
                    partitions.pop(p.partition, None)
                    if not partitions:
                        del topics[p.topic]
                continue
            topics.setdefault(p.topic, {})[p.partition] = CachedPartition(
                p.leader, p.leader_epoch, tuple(p.isr), tuple(p.replicas), tuple(offline)
            )
        return ErrorCode.none

    def listed_brokers(self, now_ms: float | None = None) -> dict[int, MetadataBroker]:
        """The brokers Metadata lists: the live ones and those that left less than
        DEPARTED_BROKER_LINGER_MS ago (forgotten once that has passed)."""
        now_ms = _monotonic_ms() if now_ms is None else now_ms
        for broker_id, (_, since_ms) in list(self.departed.items()):
            if now_ms - since_ms >= DEPARTED_BROKER_LINGER_MS:
                del self.departed[broker_id]
        return {**{b: broker for b, (broker, _) in self.departed.items()}, **self.brokers}

    def topics(self) -> list[str]:
        return sorted(self._topics)

    def partitions_of(self, topic: str) -> Mapping[int, CachedPartition]:
        """The topic's partitions (none when the controller has not named it), read-only."""
        return MappingProxyType(self._topics.get(topic, {}))


def _monotonic_ms() -> float:
    return time.monotonic() * 1000
