"""The group coordinator: consumer groups and committed offsets on `__consumer_offsets`.

One `GroupCoordinatorShard` per offsets partition this broker leads, a sans-I/O state machine
whose state is the replay of that partition (coordinator.py says how the runtime drives it).
records.py holds Kafka's record layouts and `partition_for`; messages.py the requests and
responses; metadata.py the group state machine; membership.py, rebalance.py and offsets.py the rules.
"""

from localcluster.lazy_exports import lazy_getattr

# Where each name lives; each is imported on first use (lazy_exports.py says why).
_EXPORTS = {
    "Append": "localcluster.group.coordinator",
    "GroupConfig": "localcluster.group.coordinator",
    "GroupCoordinatorShard": "localcluster.group.coordinator",
    "Reply": "localcluster.group.coordinator",
    "Result": "localcluster.group.coordinator",
    "ShardState": "localcluster.group.coordinator",
    "describe_record": "localcluster.group.records",
    "java_string_hash": "localcluster.group.records",
    "partition_for": "localcluster.group.records",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(globals(), _EXPORTS)
