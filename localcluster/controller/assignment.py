"""Replica assignment: Kafka's assignReplicasToBrokers, rack-unaware and rack-aware. Pure.

A random start index spreads first replicas (leaders) over brokers; the replica shift grows by
one every len(brokers) partitions so followers spread too. With start index 0 and shift 0 it
reproduces the tables of the design documents (5 brokers, 10 partitions, RF 3). Rack-aware
placement orders brokers by alternating racks and skips a candidate whose rack already holds a
replica while some rack holds none.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence


class InvalidReplicationFactorError(ValueError):
    pass


def replica_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def assign_replicas_to_brokers(brokers: Sequence[int], partitions: int, replication_factor: int,
                               fixed_start_index: int = -1, start_partition_id: int = 0,
                               racks: Mapping[int, str | None] | None = None,
                               rng: random.Random | None = None) -> dict[int, list[int]]:  # fmt: skip
    """partition id -> replica list (its first entry is the preferred leader)."""
    if partitions <= 0:
        raise ValueError(f"number of partitions must be positive, got {partitions}")
    if replication_factor <= 0:
        raise InvalidReplicationFactorError(
            f"replication factor must be positive, got {replication_factor}")  # fmt: skip
    if replication_factor > len(brokers):
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is larger than the {len(brokers)} "
            "available brokers"
        )
    rng = rng or random.Random()
    racks = racks or {}
    if racks and any(racks.get(b) for b in brokers):
        if any(racks.get(b) is None for b in brokers):
            raise ValueError("some brokers have a rack and some do not; give every broker one")
        return _assign_rack_aware(list(brokers), partitions, replication_factor,
                                  fixed_start_index, start_partition_id, racks, rng)  # fmt: skip
    ordered = sorted(brokers)
    return _assign(ordered, partitions, replication_factor, fixed_start_index,
                   start_partition_id, rng)  # fmt: skip


def _placements(n, partitions, fixed_start_index, start_partition_id, rng):
    """(partition id, index of its first replica, replica shift), Kafka's walk: a start
    index and shift (random unless fixed), the shift growing every n partitions."""
    start_index = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    shift = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    for partition_id in range(start_partition_id, start_partition_id + partitions):
        if partition_id > 0 and partition_id % n == 0:
            shift += 1
        yield partition_id, (partition_id + start_index) % n, shift


def _assign(brokers, partitions, rf, fixed_start_index, start_partition_id, rng):
    n = len(brokers)
    out = {}
    for partition_id, first, shift in _placements(n, partitions, fixed_start_index,
                                                  start_partition_id, rng):  # fmt: skip
        replicas = [brokers[first]]
        replicas += [brokers[replica_index(first, shift, j, n)] for j in range(rf - 1)]
        out[partition_id] = replicas
    return out


def rack_alternated_broker_list(racks: Mapping[int, str]) -> list[int]:
    """One broker from each rack in turn (racks sorted, brokers ascending within a rack)."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(racks):
        by_rack.setdefault(racks[broker], []).append(broker)
    iterators = [iter(by_rack[r]) for r in sorted(by_rack)]
    out = []
    while len(out) < len(racks):
        for it in iterators:
            b = next(it, None)
            if b is not None:
                out.append(b)
    return out


def _assign_rack_aware(brokers, partitions, rf, fixed_start_index, start_partition_id, racks, rng):
    rack_of = {b: racks[b] for b in brokers}
    arranged = rack_alternated_broker_list(rack_of)
    n = len(arranged)
    num_racks = len(set(rack_of.values()))
    out = {}
    for partition_id, first, shift in _placements(n, partitions, fixed_start_index,
                                                  start_partition_id, rng):  # fmt: skip
        leader = arranged[first]
        replicas = [leader]
        racks_with_replica = {rack_of[leader]}
        brokers_with_replica = {leader}
        k = 0
        for _ in range(rf - 1):
            while True:
                broker = arranged[replica_index(first, shift * num_racks, k, n)]
                k += 1
                rack = rack_of[broker]
                if (rack not in racks_with_replica or len(racks_with_replica) == num_racks) and (
                    broker not in brokers_with_replica or len(brokers_with_replica) == n
                ):
                    replicas.append(broker)
                    racks_with_replica.add(rack)
                    brokers_with_replica.add(broker)
                    break
        out[partition_id] = replicas
    return out
