"""What the controller core is told: Kafka's controller events, and the results of store I/O.

Two kinds, both plain frozen values:
- Controller events (Kafka's ControllerEvent names) say that something happened: a watch fired
  (BrokerChange, TopicChange, ...), a timer went off, a broker asked to shut down. They carry
  no store data: the core asks for what it needs to read.
- Store results answer the one store operation the core is waiting for (actions.py names the
  operation each answers). A conditional write answers with the versions it wrote and the
  partitions whose version clashed (ZooKeeper's BadVersion); a write fenced by the controller
  epoch answers ControllerMoved instead, which is also what the /controller watch says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from localcluster.controller.context import Leadership
from localcluster.metadata_types import BrokerRegistration, TopicAssignment, TopicPartition

# -- controller events ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Startup:
    """This broker just won the seat (onControllerFailover): load everything, take over."""


@dataclass(frozen=True, slots=True)
class BrokerChange:
    """/brokers/ids changed: a broker registered, died, or registered again (a new session)."""


@dataclass(frozen=True, slots=True)
class TopicChange:
    """/brokers/topics changed: a topic was created or its znodes were deleted."""


@dataclass(frozen=True, slots=True)
class PartitionModifications:
    """/brokers/topics/<topic> changed: partitions were added to it."""

    topic: str


@dataclass(frozen=True, slots=True)
class IsrChangeNotification:
    """A leader changed an ISR and left a notification under /isr_change_notification."""


@dataclass(frozen=True, slots=True)
class TopicDeletion:
    """/admin/delete_topics changed."""


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """/admin/reassign_partitions changed."""


@dataclass(frozen=True, slots=True)
class PreferredReplicaLeaderElection:
    """/admin/preferred_replica_election changed."""


@dataclass(frozen=True, slots=True)
class UncleanLeaderElection:
    """/admin/unclean_leader_election changed (Kafka's ElectLeaders with UNCLEAN)."""


@dataclass(frozen=True, slots=True)
class TopicUncleanLeaderElectionEnable:
    """A topic's unclean.leader.election.enable became true (Kafka's event of that name: the
    controller's broker saw the config change): its offline partitions may elect now."""

    topic: str


@dataclass(frozen=True, slots=True)
class AutoPreferredReplicaLeaderElection:
    """The leader imbalance check is due (auto.leader.rebalance.enable)."""


@dataclass(frozen=True, slots=True)
class ControlledShutdown:
    """`broker_id` asks to shut down; answer with ReplyControlledShutdown(correlation_id)."""

    broker_id: int
    correlation_id: int


@dataclass(frozen=True, slots=True)
class StopReplicaResponseReceived:
    """A broker answered StopReplica: (topic, partition, error code) per partition."""

    broker_id: int
    partition_errors: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class ControllerMoved:
    """Another broker holds the seat: a write was fenced by /controller_epoch, or the
    /controller watch names someone else. Also a valid answer to any store operation."""

    reason: str


# -- store results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BrokersRead:
    live: dict[int, BrokerRegistration]


@dataclass(frozen=True, slots=True)
class TopicNamesRead:
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TopicsRead:
    """Each asked topic's assignment (missing: the topic is gone) and config overrides, and
    apart the topics whose znodes do not decode, with why: the config when the topic is in
    `assignments`, else the assignment."""

    assignments: dict[str, TopicAssignment]
    configs: dict[str, dict[str, str]]
    unreadable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartitionStatesRead:
    """Each asked partition's state znode with its version; None where there is none."""

    states: dict[TopicPartition, Leadership | None]


@dataclass(frozen=True, slots=True)
class PartitionStatesWritten:
    """`versions`: the new zkVersion of each partition written. `conflicts`: the partitions
    whose znode was not at the version the write named (BadVersion, or NodeExists for a
    create): someone else wrote it meanwhile, and the core re-reads them."""

    versions: dict[TopicPartition, int]
    conflicts: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class IsrChangesRead:
    """The partitions named by the ISR change notifications, which the read consumed."""

    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class TopicDeletionsRead:
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReassignmentsRead:
    """The requested replica lists; None when there is no request."""

    requested: dict[TopicPartition, tuple[int, ...]] | None


@dataclass(frozen=True, slots=True)
class ElectionRequestRead:
    """The partitions of an election request; None when there is no request."""

    partitions: tuple[TopicPartition, ...] | None


@dataclass(frozen=True, slots=True)
class StoreWritten:
    """A write that answers nothing but that it was done."""


ControllerEvent = (
    Startup | BrokerChange | TopicChange | PartitionModifications | IsrChangeNotification
    | TopicDeletion | PartitionReassignment | PreferredReplicaLeaderElection
    | UncleanLeaderElection | AutoPreferredReplicaLeaderElection | ControlledShutdown
    | StopReplicaResponseReceived | ControllerMoved
)  # fmt: skip
StoreResult = (
    BrokersRead | TopicNamesRead | TopicsRead | PartitionStatesRead | PartitionStatesWritten
    | IsrChangesRead | TopicDeletionsRead | ReassignmentsRead | ElectionRequestRead | StoreWritten
)  # fmt: skip
