"""The cluster's metadata values: plain, frozen, with Kafka's names. No I/O, no encoding.

The controller core, the replication core, the runtimes and the store's encoding
(coord/znode_data.py, which turns these into Kafka's znode JSON and back) all speak them, so
they live below every one of those layers and import nothing of the project.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The group coordinator's internal topic (Kafka's name); every layer may need to name it.
OFFSETS_TOPIC = "__consumer_offsets"

TopicPartition = tuple[str, int]

NO_LEADER = -1  # the leader of a partition no replica may lead


@dataclass(frozen=True, slots=True)
class EndPoint:
    """One advertised listener: Kafka's EndPoint (listener name, host, port, protocol)."""

    listener_name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.listener_name}://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """/brokers/ids/<id>. `endpoints` are the advertised listeners in their configured order;
    `unix_socket` and `host_id` (boot id and network namespace) are ours: a broker with the same
    host id can reach the socket, any other goes over the inter-broker listener."""

    broker_id: int
    endpoints: tuple[EndPoint, ...]
    unix_socket: str = ""
    rack: str | None = None
    pid: int | None = None
    timestamp_ms: int = 0
    host_id: str = ""

    @property
    def host(self) -> str:
        """The first advertised endpoint's host: what a Unix-socket client is told."""
        return self.endpoints[0].host if self.endpoints else ""

    @property
    def port(self) -> int:
        return self.endpoints[0].port if self.endpoints else -1

    def endpoint(self, listener_name: str) -> EndPoint | None:
        return next((e for e in self.endpoints if e.listener_name == listener_name), None)


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
