"""The group coordinator: consumer groups and committed offsets on `__consumer_offsets`.

One `GroupCoordinatorShard` per offsets partition this broker leads, a sans-I/O state machine
whose state is the replay of that partition (coordinator.py says how the runtime drives it).
records.py holds Kafka's record layouts and `partition_for`; messages.py the requests and
responses; metadata.py the group state machine; membership.py, rebalance.py and offsets.py the rules.
"""

from localcluster.group.coordinator import (
    Append,
    GroupConfig,
    GroupCoordinatorShard,
    Reply,
    Result,
    ShardState,
)
from localcluster.group.records import describe_record, java_string_hash, partition_for

__all__ = [
    "Append",
    "GroupConfig",
    "GroupCoordinatorShard",
    "Reply",
    "Result",
    "ShardState",
    "describe_record",
    "java_string_hash",
    "partition_for",
]
