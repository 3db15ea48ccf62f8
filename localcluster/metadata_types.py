"""The cluster's metadata values: plain, frozen, with Kafka's names. No I/O, no encoding.

The controller core, the replication core, the runtimes and the store's encoding
(coord/znode_data.py, which turns these into Kafka's znode JSON and back) all speak them, so
they live below every one of those layers and import nothing of the project.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TopicPartition = tuple[str, int]

NO_LEADER = -1  # the leader of a partition no replica may lead


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """/brokers/ids/<id>: how to reach a live broker. A new registration of the same id (a
    new session: the broker restarted or its session expired) is a different value."""

    broker_id: int
    host: str
    port: int
    unix_socket: str
    rack: str | None = None
    pid: int | None = None
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """/brokers/topics/<t>: each partition's replicas (AR, preferred leader first), and the
    replicas a reassignment is adding and removing."""

    partitions: dict[int, tuple[int, ...]]
    adding_replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)
    removing_replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    """The partition state znode: who leads, in which epoch, with which ISR."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
