"""The four partition leader elections, pure functions with Kafka's names and rules.

Each returns the new leader, or None when no replica qualifies (the partition then stays
offline, or keeps its leader, as the caller decides). None of them looks at anything but its
arguments: `assignment` is AR in order (its head is the preferred replica), `isr` the current
ISR, `live_replicas` the replicas on live brokers. `PartitionLeaderElectionStrategy` names
which one a state change uses; its values are the words the event log prints.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence


class PartitionLeaderElectionStrategy(enum.Enum):
    OFFLINE = "offline"
    REASSIGN = "reassign"
    PREFERRED = "preferred"
    CONTROLLED_SHUTDOWN = "controlled shutdown"
    # The offline election with unclean election allowed whatever the topic's config says
    # (Kafka's ElectLeaders with ElectionType.UNCLEAN).
    UNCLEAN = "unclean (requested)"


def offline_partition_leader_election(assignment: Sequence[int], isr: Collection[int],
                                      live_replicas: Collection[int],
                                      unclean_enabled: bool) -> int | None:  # fmt: skip
    """The first replica of AR that is live and in the ISR; failing that, when unclean leader
    election is enabled, the first live replica (which may lack committed records)."""
    for replica in assignment:
        if replica in live_replicas and replica in isr:
            return replica
    if unclean_enabled:
        for replica in assignment:
            if replica in live_replicas:
                return replica
    return None


def reassign_partition_leader_election(reassignment: Sequence[int], isr: Collection[int],
                                       live_replicas: Collection[int]) -> int | None:  # fmt: skip
    """The first replica of the new replica list that is live and in the ISR."""
    for replica in reassignment:
        if replica in live_replicas and replica in isr:
            return replica
    return None


def preferred_replica_partition_leader_election(assignment: Sequence[int], isr: Collection[int],
                                                live_replicas: Collection[int]) -> int | None:  # fmt: skip
    """AR's head, if it is live and in the ISR."""
    if assignment and assignment[0] in live_replicas and assignment[0] in isr:
        return assignment[0]
    return None


def controlled_shutdown_partition_leader_election(assignment: Sequence[int], isr: Collection[int],
                                                  live_replicas: Collection[int],
                                                  shutting_down: Collection[int]) -> int | None:  # fmt: skip
    """The first replica of AR that is live, in the ISR and not shutting down."""
    for replica in assignment:
        if replica in live_replicas and replica in isr and replica not in shutting_down:
            return replica
    return None
