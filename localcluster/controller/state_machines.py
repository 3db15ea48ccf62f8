"""The controller's partition and replica state machines: Kafka's states and transition tables.

A transition is legal when the current state is among the target's valid previous states.
An illegal transition raises IllegalStateTransition and changes nothing; callers log it and
leave the partition or replica as it was. What a transition *does* (elect, send LeaderAndIsr,
StopReplica) lives in the controller; this module only keeps the states honest.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from typing import Generic, TypeVar


class PartitionState(enum.Enum):
    NON_EXISTENT = "NonExistentPartition"
    NEW = "NewPartition"
    ONLINE = "OnlinePartition"
    OFFLINE = "OfflinePartition"


class ReplicaState(enum.Enum):
    NON_EXISTENT = "NonExistentReplica"
    NEW = "NewReplica"
    ONLINE = "OnlineReplica"
    OFFLINE = "OfflineReplica"
    DELETION_STARTED = "ReplicaDeletionStarted"
    DELETION_SUCCESSFUL = "ReplicaDeletionSuccessful"
    DELETION_INELIGIBLE = "ReplicaDeletionIneligible"


P, R = PartitionState, ReplicaState

PARTITION_VALID_PREVIOUS: dict[PartitionState, frozenset[PartitionState]] = {
    P.NEW: frozenset({P.NON_EXISTENT}),
    P.ONLINE: frozenset({P.NEW, P.ONLINE, P.OFFLINE}),
    P.OFFLINE: frozenset({P.NEW, P.ONLINE, P.OFFLINE}),
    P.NON_EXISTENT: frozenset({P.OFFLINE}),
}

REPLICA_VALID_PREVIOUS: dict[ReplicaState, frozenset[ReplicaState]] = {
    R.NEW: frozenset({R.NON_EXISTENT}),
    R.ONLINE: frozenset({R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_INELIGIBLE}),
    R.OFFLINE: frozenset({R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_INELIGIBLE}),
    R.DELETION_STARTED: frozenset({R.OFFLINE}),
    R.DELETION_SUCCESSFUL: frozenset({R.DELETION_STARTED}),
    R.DELETION_INELIGIBLE: frozenset({R.OFFLINE, R.DELETION_STARTED}),
    R.NON_EXISTENT: frozenset({R.DELETION_SUCCESSFUL}),
}

K = TypeVar("K", bound=Hashable)
S = TypeVar("S", bound=enum.Enum)


class IllegalStateTransition(Exception):
    pass


class StateTable(Generic[K, S]):
    """Current state per key (a partition, or a (partition, replica) pair), with the rules."""

    def __init__(self, valid_previous: dict[S, frozenset[S]], initial: S, kind: str):
        self._valid_previous = valid_previous
        self._initial = initial
        self._kind = kind
        self._states: dict[K, S] = {}

    def state(self, key: K) -> S:
        return self._states.get(key, self._initial)

    def check(self, key: K, target: S) -> None:
        current = self.state(key)
        if current not in self._valid_previous[target]:
            raise IllegalStateTransition(
                f"{self._kind} {key}: {current.value} -> {target.value} is not a valid "
                f"transition (valid from: {', '.join(sorted(s.value for s in self._valid_previous[target]))})"
            )

    def move(self, key: K, target: S) -> S:
        """Move `key` to `target`; raises (changing nothing) when the transition is illegal."""
        self.check(key, target)
        previous = self.state(key)
        if target == self._initial:
            self._states.pop(key, None)
        else:
            self._states[key] = target
        return previous

    def put(self, key: K, state: S) -> None:
        """Set `key`'s state with no transition: a new controller's initial states (Kafka's
        initializePartitionState and initializeReplicaState put them the same way)."""
        if state == self._initial:
            self._states.pop(key, None)
        else:
            self._states[key] = state

    def keys_in(self, *states: S) -> list[K]:
        return [k for k, s in self._states.items() if s in states]

    def forget(self, key: K) -> None:
        self._states.pop(key, None)

    def clear(self) -> None:
        self._states.clear()


def partition_states() -> StateTable:
    return StateTable(PARTITION_VALID_PREVIOUS, P.NON_EXISTENT, "partition")


def replica_states() -> StateTable:
    return StateTable(REPLICA_VALID_PREVIOUS, R.NON_EXISTENT, "replica")
