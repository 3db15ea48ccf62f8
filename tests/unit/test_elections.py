"""The four leader elections, case by case (pure functions)."""

from __future__ import annotations

import pytest

from localcluster.controller.elections import (
    controlled_shutdown_partition_leader_election,
    offline_partition_leader_election,
    preferred_replica_partition_leader_election,
    reassign_partition_leader_election,
)


@pytest.mark.parametrize("assignment, isr, live, unclean, expected", [
    ((1, 2, 3), (1, 2, 3), {1, 2, 3}, False, 1),  # AR order decides
    ((1, 2, 3), (2, 3), {1, 2, 3}, False, 2),  # 1 is live but out of sync
    ((1, 2, 3), (3, 2), {2, 3}, False, 2),  # AR order, not ISR order
    ((1, 2, 3), (1,), {2, 3}, False, None),  # no live ISR member: offline
    ((1, 2, 3), (1,), {2, 3}, True, 2),  # unclean: first live replica of AR
    ((1, 2, 3), (1,), set(), True, None),  # nobody alive at all
    ((1, 2, 3), (4,), {4}, True, None),  # a live broker outside AR never leads
])  # fmt: skip
def test_offline_partition_leader_election(assignment, isr, live, unclean, expected):
    assert offline_partition_leader_election(assignment, isr, live, unclean) == expected


@pytest.mark.parametrize("reassignment, isr, live, expected", [
    ((4, 5), (1, 4, 5), {1, 4, 5}, 4),
    ((4, 5), (1, 5), {1, 4, 5}, 5),  # 4 not yet in sync
    ((4, 5), (1, 4, 5), {1, 5}, 5),  # 4 dead
    ((4, 5), (1,), {1, 4, 5}, None),
])  # fmt: skip
def test_reassign_partition_leader_election(reassignment, isr, live, expected):
    assert reassign_partition_leader_election(reassignment, isr, live) == expected


@pytest.mark.parametrize("assignment, isr, live, expected", [
    ((1, 2, 3), (1, 2, 3), {1, 2, 3}, 1),
    ((1, 2, 3), (2, 3), {1, 2, 3}, None),  # the preferred replica is not in sync
    ((1, 2, 3), (1, 2, 3), {2, 3}, None),  # the preferred replica is dead
    ((), (), set(), None),
])  # fmt: skip
def test_preferred_replica_partition_leader_election(assignment, isr, live, expected):
    assert preferred_replica_partition_leader_election(assignment, isr, live) == expected


@pytest.mark.parametrize("assignment, isr, live, shutting_down, expected", [
    ((1, 2, 3), (1, 2, 3), {1, 2, 3}, {1}, 2),
    ((1, 2, 3), (1, 3), {1, 2, 3}, {1}, 3),
    ((1, 2, 3), (1, 2), {1, 2, 3}, {1, 2}, None),
    ((1,), (1,), {1}, {1}, None),  # a single replica has nowhere to go
])  # fmt: skip
def test_controlled_shutdown_partition_leader_election(
    assignment, isr, live, shutting_down, expected
):
    assert (
        controlled_shutdown_partition_leader_election(assignment, isr, live, shutting_down)
        == expected
    )
