"""Znode path validation and Kafka's ZooKeeper layout as helper functions.

What lives here: `validate_path` (ZooKeeper's PathUtils rules, raising BadPathError with a
message that names the path and the broken rule), `parent_of`/`name_of`/`join`, and one helper
per path Kafka's ZooKeeper-era brokers and controller use. Rules: pure functions, no I/O;
every backend calls `validate_path` before touching a path, so both backends reject the same
paths with the same error.
"""

from __future__ import annotations

import re

from localcluster.coord.interface import BadPathError

SEQUENCE_DIGITS = 10  # ZooKeeper appends a per-parent counter as %010d


# The characters ZooKeeper's PathUtils forbids: NUL, the C0 and C1 controls, the surrogates and
# the private use area, and U+FFF0-U+FFFF. One regular expression: a controller failover
# validates tens of thousands of paths, and a Python call per character was a fifth of it.
_BAD_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff]")


def validate_path(path: str, sequential: bool = False) -> str:
    """Return path when ZooKeeper accepts it, else raise BadPathError saying why.

    A sequential create may end with "/" (ZooKeeper then names the child by its number only).
    """
    if not isinstance(path, str):
        raise BadPathError(f"znode path must be a str, got {type(path).__name__}: {path!r}")
    hint = "a valid path is absolute and slash-separated, like /brokers/ids/0"
    if not path.startswith("/"):
        raise BadPathError(f"znode path {path!r} is not absolute: it must start with '/' ({hint})")
    if path == "/":
        return path
    checked = path[:-1] if sequential and path.endswith("/") else path
    if checked.endswith("/"):
        raise BadPathError(f"znode path {path!r} ends with '/': drop the trailing slash ({hint})")
    for name in checked[1:].split("/"):
        if name == "":
            raise BadPathError(f"znode path {path!r} has an empty name ('//') ({hint})")
        if name in (".", ".."):
            raise BadPathError(f"znode path {path!r} uses the relative name {name!r} ({hint})")
        bad = _BAD_CHARACTER.search(name)
        if bad is not None:
            ch = bad.group()
            raise BadPathError(
                f"znode path {path!r} contains the character {ch!r} "
                f"(U+{ord(ch):04X}), which ZooKeeper forbids ({hint})"
            )
    return path


def parent_of(path: str) -> str:
    assert path != "/", "the root has no parent"
    head = path.rsplit("/", 1)[0]
    return head or "/"


def name_of(path: str) -> str:
    return path.rsplit("/", 1)[1]


def join(parent: str, name: str) -> str:
    return ("" if parent == "/" else parent) + "/" + name


def ancestors(path: str) -> list[str]:
    """Every proper ancestor of path except the root, shallowest first."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def sequence_suffix(counter: int) -> str:
    return f"{counter:0{SEQUENCE_DIGITS}d}"


# Kafka's ZooKeeper layout (kafka.zk.ZkData in the ZooKeeper-era releases).
BROKER_IDS = "/brokers/ids"
BROKER_TOPICS = "/brokers/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
ADMIN = "/admin"
REASSIGN_PARTITIONS = "/admin/reassign_partitions"
PREFERRED_REPLICA_ELECTION = "/admin/preferred_replica_election"
# Ours (Kafka asks with the ElectLeaders API instead): partitions to elect uncleanly.
UNCLEAN_LEADER_ELECTION = "/admin/unclean_leader_election"
DELETE_TOPICS = "/admin/delete_topics"
ISR_CHANGE_NOTIFICATION = "/isr_change_notification"
ISR_CHANGE_PREFIX = "isr_change_"

# Created at cluster start so watchers can watch their children (KafkaZkClient.createTopLevelPaths).
PERSISTENT_PATHS = (BROKER_IDS, BROKER_TOPICS, ADMIN, DELETE_TOPICS, ISR_CHANGE_NOTIFICATION)


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{int(broker_id)}"


def topic_path(topic: str) -> str:
    return validate_path(f"{BROKER_TOPICS}/{topic}")


def topic_partitions_path(topic: str) -> str:
    return f"{topic_path(topic)}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{topic_partitions_path(topic)}/{int(partition)}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{partition_path(topic, partition)}/state"


def delete_topic_path(topic: str) -> str:
    return validate_path(f"{DELETE_TOPICS}/{topic}")


def isr_change_notification_prefix() -> str:
    """Pass to create(..., sequence=True): ZooKeeper appends the 10-digit sequence number."""
    return f"{ISR_CHANGE_NOTIFICATION}/{ISR_CHANGE_PREFIX}"
