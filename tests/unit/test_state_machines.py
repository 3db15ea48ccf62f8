"""Every legal and illegal transition of the partition and replica state machines."""

from __future__ import annotations

import itertools

import pytest

from localcluster.controller.state_machines import (
    PARTITION_VALID_PREVIOUS,
    REPLICA_VALID_PREVIOUS,
    IllegalStateTransition,
    PartitionState,
    ReplicaState,
    partition_states,
    replica_states,
)

P, R = PartitionState, ReplicaState

# Kafka's PartitionStateMachine and ReplicaStateMachine, written out independently.
KAFKA_PARTITION = {
    (P.NON_EXISTENT, P.NEW), (P.NEW, P.ONLINE), (P.ONLINE, P.ONLINE), (P.OFFLINE, P.ONLINE),
    (P.NEW, P.OFFLINE), (P.ONLINE, P.OFFLINE), (P.OFFLINE, P.OFFLINE), (P.OFFLINE, P.NON_EXISTENT),
}  # fmt: skip
KAFKA_REPLICA = {
    (R.NON_EXISTENT, R.NEW),
    (R.NEW, R.ONLINE), (R.ONLINE, R.ONLINE), (R.OFFLINE, R.ONLINE), (R.DELETION_INELIGIBLE, R.ONLINE),
    (R.NEW, R.OFFLINE), (R.ONLINE, R.OFFLINE), (R.OFFLINE, R.OFFLINE),
    (R.DELETION_INELIGIBLE, R.OFFLINE),
    (R.OFFLINE, R.DELETION_STARTED),
    (R.DELETION_STARTED, R.DELETION_SUCCESSFUL),
    (R.OFFLINE, R.DELETION_INELIGIBLE), (R.DELETION_STARTED, R.DELETION_INELIGIBLE),
    (R.DELETION_SUCCESSFUL, R.NON_EXISTENT),
}  # fmt: skip


def reach(table, key, state, path):
    """Drive `key` to `state` through legal transitions (a shortest path)."""
    for step in path[state]:
        table.move(key, step)


def paths_to(valid_previous, initial):
    """Shortest legal path from the initial state to every state."""
    found = {initial: []}
    frontier = [initial]
    while frontier:
        nxt = []
        for current in frontier:
            for target, previous in valid_previous.items():
                if current in previous and target not in found:
                    found[target] = found[current] + [target]
                    nxt.append(target)
        frontier = nxt
    return found


@pytest.mark.parametrize("source, target", list(itertools.product(P, P)))
def test_partition_transitions(source, target):
    table = partition_states()
    reach(table, "t-0", source, paths_to(PARTITION_VALID_PREVIOUS, P.NON_EXISTENT))
    assert table.state("t-0") == source
    if (source, target) in KAFKA_PARTITION:
        assert table.move("t-0", target) == source
        assert table.state("t-0") == target
    else:
        with pytest.raises(IllegalStateTransition, match=f"{source.value} -> {target.value}"):
            table.move("t-0", target)
        assert table.state("t-0") == source  # an illegal transition changes nothing


@pytest.mark.parametrize("source, target", list(itertools.product(R, R)))
def test_replica_transitions(source, target):
    table = replica_states()
    key = (("t", 0), 1)
    reach(table, key, source, paths_to(REPLICA_VALID_PREVIOUS, R.NON_EXISTENT))
    assert table.state(key) == source
    if (source, target) in KAFKA_REPLICA:
        table.move(key, target)
        assert table.state(key) == target
    else:
        with pytest.raises(IllegalStateTransition):
            table.move(key, target)
        assert table.state(key) == source


def test_every_state_is_reachable():
    assert set(paths_to(PARTITION_VALID_PREVIOUS, P.NON_EXISTENT)) == set(P)
    assert set(paths_to(REPLICA_VALID_PREVIOUS, R.NON_EXISTENT)) == set(R)


def test_keys_in_lists_keys_by_state():
    table = partition_states()
    table.move("a", P.NEW)
    table.move("b", P.NEW)
    table.move("b", P.ONLINE)
    assert table.keys_in(P.NEW) == ["a"]
    assert sorted(table.keys_in(P.NEW, P.ONLINE)) == ["a", "b"]
