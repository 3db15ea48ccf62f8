"""What the controller core hands back: one Ready per step, with everything for the runtime to do.

`Ready.actions` are done in order and answer nothing (requests to send, channels to open or
close, watches, event-log lines, answers to controlled shutdown, resigning). `Ready.store` is
at most one store operation the core waits for: the runtime does it after the actions and
steps the core with its result (events.py; `RESULT_OF` names which). Conditional writes of
partition state and every write that needs fencing name the /controller_epoch version they
are fenced by; the runtime answers ControllerMoved when the fence held them back.

Error codes are Kafka's numbers, written here so the core needs no protocol library.
"""

from __future__ import annotations

import enum
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TypeVar

from localcluster.controller import events as ev
from localcluster.metadata_types import (
    BrokerRegistration,
    LeaderAndIsr,
    TopicAssignment,
    TopicPartition,
)
from localcluster.protocol import controller_requests as cr

NONE = 0
BROKER_NOT_AVAILABLE = 8


class ElectionRequest(enum.Enum):
    """The admin znodes that ask for elections."""

    PREFERRED = "preferred replica election"
    UNCLEAN = "unclean leader election"


# -- store operations (the core waits for their results) -----------------------------------------


@dataclass(frozen=True, slots=True)
class ReadBrokers:
    pass


@dataclass(frozen=True, slots=True)
class ReadTopicNames:
    pass


@dataclass(frozen=True, slots=True)
class ReadTopics:
    """Each topic's assignment and config overrides."""

    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReadPartitionStates:
    """Every partition state an event needs, in one operation (Kafka's getTopicPartitionStates)."""

    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class PartitionStateWrite:
    tp: TopicPartition
    state: LeaderAndIsr
    zk_version: int | None  # the version to update; None: create the znode


@dataclass(frozen=True, slots=True)
class WritePartitionStates:
    """Conditional writes, each on its own (one clash does not hold back the others)."""

    writes: tuple[PartitionStateWrite, ...]
    controller_epoch_zk_version: int


@dataclass(frozen=True, slots=True)
class WriteAssignment:
    topic: str
    assignment: TopicAssignment
    controller_epoch_zk_version: int


@dataclass(frozen=True, slots=True)
class DeleteTopicZnodes:
    """The topic's assignment, config and deletion request."""

    topic: str


@dataclass(frozen=True, slots=True)
class ConsumeIsrChangeNotifications:
    """Read and delete every ISR change notification."""


@dataclass(frozen=True, slots=True)
class ReadTopicDeletions:
    pass


@dataclass(frozen=True, slots=True)
class ReadReassignments:
    pass


@dataclass(frozen=True, slots=True)
class RemoveReassignments:
    """Drop these partitions from /admin/reassign_partitions (the znode goes when empty)."""

    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class ReadElectionRequest:
    kind: ElectionRequest


@dataclass(frozen=True, slots=True)
class DeleteElectionRequest:
    kind: ElectionRequest


StoreOperation = (
    ReadBrokers | ReadTopicNames | ReadTopics | ReadPartitionStates | WritePartitionStates
    | WriteAssignment | DeleteTopicZnodes | ConsumeIsrChangeNotifications | ReadTopicDeletions
    | ReadReassignments | RemoveReassignments | ReadElectionRequest | DeleteElectionRequest
)  # fmt: skip

RESULT_OF: dict[type, type] = {
    ReadBrokers: ev.BrokersRead,
    ReadTopicNames: ev.TopicNamesRead,
    ReadTopics: ev.TopicsRead,
    ReadPartitionStates: ev.PartitionStatesRead,
    WritePartitionStates: ev.PartitionStatesWritten,
    WriteAssignment: ev.StoreWritten,
    DeleteTopicZnodes: ev.StoreWritten,
    ConsumeIsrChangeNotifications: ev.IsrChangesRead,
    ReadTopicDeletions: ev.TopicDeletionsRead,
    ReadReassignments: ev.ReassignmentsRead,
    RemoveReassignments: ev.StoreWritten,
    ReadElectionRequest: ev.ElectionRequestRead,
    DeleteElectionRequest: ev.StoreWritten,
}

# -- actions (done in order, answering nothing) --------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddBroker:
    """Open a request channel to a broker that registered."""

    registration: BrokerRegistration


@dataclass(frozen=True, slots=True)
class RemoveBroker:
    """Close the channel to a broker that died: what it had queued is dropped."""

    broker_id: int


@dataclass(frozen=True, slots=True)
class WatchTopic:
    """Watch /brokers/topics/<topic> (PartitionModifications); idempotent."""

    topic: str


@dataclass(frozen=True, slots=True)
class UnwatchTopic:
    topic: str


@dataclass(frozen=True, slots=True)
class SendLeaderAndIsr:
    broker_id: int
    request: cr.LeaderAndIsrRequest


@dataclass(frozen=True, slots=True)
class SendStopReplica:
    """Its answer comes back as StopReplicaResponseReceived."""

    broker_id: int
    request: cr.StopReplicaRequest


@dataclass(frozen=True, slots=True)
class SendUpdateMetadata:
    """The same UpdateMetadata to each of `broker_ids`: partitions (with the replicas of each
    that are offline, parallel) and the live brokers, whose endpoints the runtime encodes;
    `type` is cr.FULL (every partition) or cr.INCREMENTAL (those that changed)."""

    broker_ids: tuple[int, ...]
    controller_id: int
    controller_epoch: int
    partitions: tuple[cr.PartitionState, ...]
    offline_replicas: tuple[tuple[int, ...], ...]
    live_brokers: tuple[BrokerRegistration, ...]
    type: int = cr.FULL


@dataclass(frozen=True, slots=True)
class ReplyControlledShutdown:
    correlation_id: int
    error_code: int
    partitions_led: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class Note:
    """One line for the controller's event log: a change of leadership, ISR or membership.
    `event` (a name and JSON fields) also goes to the state-change log, as "elected" does."""

    line: str
    event: tuple[str, dict] | None = None
    warning: bool = False  # something the operator should fix (logged at WARNING)


@dataclass(frozen=True, slots=True)
class Resign:
    """This controller's term is over: stop watching, close the channels, drop the core."""

    reason: str


Action = (
    AddBroker | RemoveBroker | WatchTopic | UnwatchTopic | SendLeaderAndIsr | SendStopReplica
    | SendUpdateMetadata | ReplyControlledShutdown | Note | Resign
)  # fmt: skip


@dataclass(slots=True)
class Ready:
    actions: list[Action] = field(default_factory=list)
    store: StoreOperation | None = None


T = TypeVar("T")

# A handler that needs the store: it yields one store operation at a time and is sent back
# its result (the core's step loop drives it); what it returns is its outcome.
Operation = Generator[StoreOperation, "ev.StoreResult", T]
