"""ControllerContext: everything the controller knows, loaded from the store on failover.

Only the controller core touches it, one event at a time. `leadership` holds each partition's
state znode (LeaderAndIsr) with the version the next conditional write must name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from localcluster.controller.state_machines import (
    IllegalStateTransition,
    StateTable,
    partition_states,
    replica_states,
)
from localcluster.metadata_types import BrokerRegistration, LeaderAndIsr, TopicPartition
from localcluster.topic_config import unclean_leader_election

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Leadership:
    """A partition state znode as read or written: its LeaderAndIsr and its version."""

    state: LeaderAndIsr
    zk_version: int


@dataclass
class ControllerContext:
    epoch: int = 0
    epoch_zk_version: int = -1
    live_brokers: dict[int, BrokerRegistration] = field(default_factory=dict)
    shutting_down: set[int] = field(default_factory=set)
    assignments: dict[TopicPartition, tuple[int, ...]] = field(default_factory=dict)
    leadership: dict[TopicPartition, Leadership] = field(default_factory=dict)
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    # topics whose config znode did not decode, with why: no unclean election for them until
    # it does (Kafka fails the election of such a topic's partitions that have no live ISR)
    unreadable_configs: dict[str, str] = field(default_factory=dict)
    # topics whose assignment znode did not decode, with why: left alone (no partitions known)
    # until a change of that znode reads it again
    unreadable_assignments: dict[str, str] = field(default_factory=dict)
    reassignments: dict[TopicPartition, tuple[int, ...]] = field(default_factory=dict)
    # each reassignment's (adding, removing) replicas, written into the topic's znode for all
    # its partitions under way (ListPartitionReassignments reads them there)
    reassignment_changes: dict[TopicPartition, tuple[tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=dict)  # fmt: skip
    topics_to_delete: set[str] = field(default_factory=set)
    partition_states: StateTable = field(default_factory=partition_states)
    replica_states: StateTable = field(default_factory=replica_states)

    @property
    def live_ids(self) -> set[int]:
        return set(self.live_brokers) - self.shutting_down

    def topics(self) -> set[str]:
        return {t for t, _ in self.assignments}

    def partitions_of(self, topic: str) -> list[TopicPartition]:
        return sorted(tp for tp in self.assignments if tp[0] == topic)

    def live_replicas(self, tp: TopicPartition) -> list[int]:
        live = set(self.live_brokers)
        return [r for r in self.assignments.get(tp, ()) if r in live]

    def partitions_on(self, broker_id: int) -> list[TopicPartition]:
        return sorted(tp for tp, replicas in self.assignments.items() if broker_id in replicas)

    def partitions_led_by(self, broker_id: int) -> list[TopicPartition]:
        return sorted(tp for tp, lead in self.leadership.items() if lead.state.leader == broker_id)

    def unclean_enabled(self, tp: TopicPartition, default: bool) -> bool:
        if tp[0] in self.unreadable_configs:
            return False
        return unclean_leader_election(self.topic_configs.get(tp[0]), default)

    def move_partition(self, tp: TopicPartition, target) -> bool:
        """Transition a partition; an illegal transition is logged and changes nothing."""
        return self._move(self.partition_states, tp, target)

    def move_replica(self, tp: TopicPartition, replica: int, target) -> bool:
        return self._move(self.replica_states, (tp, replica), target)

    @staticmethod
    def _move(table: StateTable, key, target) -> bool:
        try:
            table.move(key, target)
        except IllegalStateTransition as e:
            log.warning("controller: %s; left as it is", e)
            return False
        return True

    def remove_topic(self, topic: str) -> None:
        for tp in self.partitions_of(topic):
            for replica in self.assignments[tp]:
                self.replica_states.forget((tp, replica))
            self.partition_states.forget(tp)
            self.assignments.pop(tp, None)
            self.leadership.pop(tp, None)
            self.reassignments.pop(tp, None)
            self.reassignment_changes.pop(tp, None)
        self.topic_configs.pop(topic, None)
        self.unreadable_configs.pop(topic, None)
        self.topics_to_delete.discard(topic)
