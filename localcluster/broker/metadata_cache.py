"""MetadataCache: what the controller last told this broker about brokers and leaders.

Filled by UpdateMetadata (each one a full picture from the controller), read by the Metadata
API. A request from an older controller epoch than the last one applied is refused with
STALE_CONTROLLER_EPOCH and changes nothing. Until the first UpdateMetadata arrives (a broker
just started, or no broker runs a controller), `ready` is False and Metadata falls back to
reading the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from localcluster.protocol.controller_requests import MetadataBroker, UpdateMetadataRequest


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
        self.brokers: dict[int, MetadataBroker] = {}
        self.partitions: dict[tuple[str, int], CachedPartition] = {}

    @property
    def ready(self) -> bool:
        return self.controller_epoch >= 0

    def update(self, request: UpdateMetadataRequest) -> int:
        if request.controller_epoch < self.controller_epoch:
            return ErrorCode.stale_controller_epoch
        self.controller_id = request.controller_id
        self.controller_epoch = request.controller_epoch
        self.brokers = {b.broker_id: b for b in request.brokers}
        self.partitions = {
            (p.topic, p.partition): CachedPartition(p.leader, p.leader_epoch, tuple(p.isr),
                                                    tuple(p.replicas), tuple(offline))
            for p, offline in zip(request.partitions, request.offline_replicas, strict=True)
        }  # fmt: skip
        return ErrorCode.none

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.partitions})

    def partitions_of(self, topic: str) -> dict[int, CachedPartition]:
        return {p: c for (t, p), c in self.partitions.items() if t == topic}
