"""The group coordinator: consumer groups and committed offsets on `__consumer_offsets`.

One `GroupCoordinatorShard` per offsets partition this broker leads, a sans-I/O state machine
whose state is the replay of that partition (coordinator.py says how the runtime drives it).
records.py holds Kafka's record layouts and `partition_for`; messages.py the requests and
responses; metadata.py the group state machine; membership.py, rebalance.py and offsets.py the rules.
"""

import importlib

# Where each name lives. Imported on first use (PEP 562), so that a light user such as the
# client, which needs one module, does not load the rest.
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


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
