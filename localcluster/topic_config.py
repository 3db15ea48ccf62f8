"""TopicConfig: a topic's settings, parsed and checked once, with the broker's defaults beneath.

A topic's config znode holds only its overrides, as strings (Kafka's form). `validate` checks
overrides before anything is written (CreateTopics, and later AlterConfigs): an unknown name or
a bad value raises `TopicConfigError` with Kafka's error code and a message naming the property,
and nothing changes. `resolve` turns stored overrides plus the broker's defaults into one typed
`TopicConfig`, the only form the rest of the broker reads; a stored value that no longer parses
(a hand-edited znode) falls back to the broker's default with a warning instead of failing the
partition.

Kafka's names, types and ranges (its LogConfig). Supported and enforced here:
- `cleanup.policy` (delete, compact or both): time and size retention apply only with delete,
  as in Kafka; compact marks the topic for the log cleaner.
- `retention.ms`, `retention.bytes` (-1: no limit), `segment.bytes`;
- `max.message.bytes` (a larger batch gets MESSAGE_TOO_LARGE), `min.insync.replicas` (at most
  the replication factor when it is known: above it no acks=all produce could ever succeed),
  `unclean.leader.election.enable`;
- `min.compaction.lag.ms`, `delete.retention.ms`, `min.cleanable.dirty.ratio`: the log
  cleaner's (storage/cleaner.py), read only for compacted topics;
- `segment.ms` (the active segment rolls once a batch, or the retention check's clock, is this
  much newer than its first batch), `message.timestamp.type` (LogAppendTime: the leader stamps
  each batch with its clock, as Kafka).
Imports nothing of the broker: its defaults come in as any object with BrokerConfig's fields.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

INVALID_REPLICATION_FACTOR = 38
INVALID_CONFIG = 40
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
CLEANUP_POLICIES = ("delete", "compact")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")  # Kafka's spelling, case-sensitive as there
# Below this a segment cannot hold one batch header plus a record (our segments are maps).
MIN_SEGMENT_BYTES = 1024


class TopicConfigError(ValueError):
    def __init__(self, error_code: int, message: str):
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True, slots=True)
class TopicConfig:
    cleanup_policy: tuple[str, ...]
    retention_ms: int
    retention_bytes: int
    segment_bytes: int
    max_message_bytes: int
    min_insync_replicas: int
    unclean_leader_election_enable: bool
    # the log cleaner's (compacted topics only)
    min_compaction_lag_ms: int
    delete_retention_ms: int
    min_cleanable_dirty_ratio: float
    # the log's roll and the leader's timestamps
    segment_ms: int
    message_timestamp_type: str

    @property
    def deletes(self) -> bool:
        """Time and size retention apply (cleanup.policy holds delete)."""
        return "delete" in self.cleanup_policy

    @property
    def compacts(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"


def _integer(low: int, high: int) -> Callable[[str, str], int]:
    def parse(name: str, text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise TopicConfigError(
                INVALID_CONFIG, f"{name}={text!r}: expected an integer"
            ) from None
        if not low <= value <= high:
            bound = f"at least {low}" if high in (INT32_MAX, INT64_MAX) else f"in [{low}, {high}]"
            raise TopicConfigError(INVALID_CONFIG, f"{name}={value}: must be {bound}")
        return value

    return parse


def _ratio(name: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise TopicConfigError(INVALID_CONFIG, f"{name}={text!r}: expected a number") from None
    if not 0.0 <= value <= 1.0:
        raise TopicConfigError(INVALID_CONFIG, f"{name}={value}: must be in [0, 1]")
    return value


def _boolean(name: str, text: str) -> bool:
    if text.strip().lower() not in ("true", "false"):
        raise TopicConfigError(INVALID_CONFIG, f"{name}={text!r}: expected true or false")
    return text.strip().lower() == "true"


def _timestamp_type(name: str, text: str) -> str:
    if text.strip() not in TIMESTAMP_TYPES:
        raise TopicConfigError(INVALID_CONFIG, f"{name}={text!r}: use CreateTime or LogAppendTime")
    return text.strip()


def _policy(name: str, text: str) -> tuple[str, ...]:
    policies = tuple(dict.fromkeys(p.strip().lower() for p in text.split(",") if p.strip()))
    bad = [p for p in policies if p not in CLEANUP_POLICIES]
    if bad or not policies:
        raise TopicConfigError(INVALID_CONFIG, f"{name}={text!r}: use delete, compact or "
                                               "delete,compact")  # fmt: skip
    return policies


@dataclass(frozen=True, slots=True)
class _Spec:
    field: str  # TopicConfig's attribute
    parse: Callable[[str, str], object]
    default: Callable[[object], object]  # the broker's value (its BrokerConfig)
    broker_property: str  # the broker property it defaults to (DescribeConfigs' synonym)
    kind: int  # DescribeConfigs' config_type: Kafka's ConfigDef.Type
    documentation: str


BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = (
    1,
    2,
    3,
    5,
    6,
    7,
)  # Kafka's ConfigDef.Type, as DescribeConfigs numbers them

SPECS: dict[str, _Spec] = {
    "cleanup.policy": _Spec("cleanup_policy", _policy,
                            lambda b: _policy("log.cleanup.policy", b.log_cleanup_policy),
                            "log.cleanup.policy", LIST,
                            "delete: old segments go by retention; compact: the log cleaner keeps "
                            "the last record per key (storage/cleaner.py)"),
    "retention.ms": _Spec("retention_ms", _integer(-1, INT64_MAX), lambda b: b.log_retention_ms,
                          "log.retention.ms", LONG,
                          "delete a segment once its newest record is this old (-1: never)"),
    "retention.bytes": _Spec("retention_bytes", _integer(-1, INT64_MAX),
                             lambda b: b.log_retention_bytes, "log.retention.bytes", LONG,
                             "delete old segments while the partition is larger (-1: no limit)"),
    "segment.bytes": _Spec("segment_bytes", _integer(MIN_SEGMENT_BYTES, INT32_MAX),
                           lambda b: b.log_segment_bytes, "log.segment.bytes", INT,
                           "roll to a new segment file at this size"),
    "max.message.bytes": _Spec("max_message_bytes", _integer(0, INT32_MAX),
                               lambda b: b.message_max_bytes, "message.max.bytes", INT,
                               "the largest record batch a producer may send"),
    "min.insync.replicas": _Spec("min_insync_replicas", _integer(1, INT32_MAX),
                                 lambda b: b.min_insync_replicas, "min.insync.replicas", INT,
                                 "replicas that must be in sync for an acks=all produce"),
    "unclean.leader.election.enable": _Spec(
        "unclean_leader_election_enable", _boolean, lambda b: b.unclean_leader_election_enable,
        "unclean.leader.election.enable", BOOLEAN,
        "elect an out-of-sync replica when no in-sync one is alive (may lose records)"),
    # -- the log cleaner (storage/cleaner.py): read only when cleanup.policy holds compact --
    "min.compaction.lag.ms": _Spec("min_compaction_lag_ms", _integer(0, INT64_MAX),
                                   lambda b: b.log_cleaner_min_compaction_lag_ms,
                                   "log.cleaner.min.compaction.lag.ms", LONG,
                                   "a record stays uncompacted at least this long"),
    "delete.retention.ms": _Spec("delete_retention_ms", _integer(0, INT64_MAX),
                                 lambda b: b.log_cleaner_delete_retention_ms,
                                 "log.cleaner.delete.retention.ms", LONG,
                                 "a tombstone (null value) stays this long after its segment "
                                 "was first cleaned"),
    "min.cleanable.dirty.ratio": _Spec("min_cleanable_dirty_ratio", _ratio,
                                       lambda b: b.log_cleaner_min_cleanable_ratio,
                                       "log.cleaner.min.cleanable.ratio", DOUBLE,
                                       "clean a log once this share of it is dirty"),
    # -- segment.ms and message.timestamp.type ---------------------------------------------------
    "segment.ms": _Spec("segment_ms", _integer(1, INT64_MAX), lambda b: b.log_roll_ms,
                        "log.roll.ms", LONG,
                        "roll the active segment once its first batch is this old"),
    "message.timestamp.type": _Spec(
        "message_timestamp_type", _timestamp_type,
        lambda b: _timestamp_type("log.message.timestamp.type", b.log_message_timestamp_type),
        "log.message.timestamp.type", STRING,
        "CreateTime keeps the producer's timestamps; LogAppendTime: the leader's clock"),
}  # fmt: skip


def validate(overrides: Mapping[str, str | None], replication_factor: int | None = None
             ) -> dict[str, str]:  # fmt: skip
    """Check a topic's overrides; their normalised strings to store. Raises TopicConfigError."""
    unknown = sorted(set(overrides) - set(SPECS))
    if unknown:
        raise TopicConfigError(INVALID_CONFIG, f"unknown topic config {', '.join(unknown)}; "
                                               f"known here: {', '.join(sorted(SPECS))}")  # fmt: skip
    out = {}
    for name, given in overrides.items():
        if given is None:
            raise TopicConfigError(INVALID_CONFIG, f"{name}: a value is required")
        out[name] = text(SPECS[name].parse(name, str(given)))  # CreateTime keeps its case
    min_isr = out.get("min.insync.replicas")
    if min_isr is not None and replication_factor is not None and int(min_isr) > replication_factor:
        raise TopicConfigError(INVALID_CONFIG, f"min.insync.replicas={min_isr} is above the "
                               f"replication factor {replication_factor}: no acks=all produce "
                               "could ever succeed")  # fmt: skip
    return out


def resolve(overrides: Mapping[str, str] | None, broker, topic: str = "") -> TopicConfig:
    """The effective config: each override parsed, the broker's value for the rest."""
    values = {spec.field: spec.default(broker) for spec in SPECS.values()}
    for name, text in (overrides or {}).items():
        spec = SPECS.get(name)
        if spec is None:
            continue  # not ours (a config written by another tool): ignored, as Kafka does
        try:
            values[spec.field] = spec.parse(name, str(text))
        except TopicConfigError as e:
            log.warning("topic %s: ignoring the stored config %s (%s); using the broker's %r",
                        topic, name, e, values[spec.field])  # fmt: skip
    return TopicConfig(**values)


def unclean_leader_election(overrides: Mapping[str, str] | None, default: bool) -> bool:
    """The topic's unclean.leader.election.enable over the broker's (the controller's view)."""
    text = (overrides or {}).get("unclean.leader.election.enable")
    if text is None:
        return default
    try:
        return _boolean("unclean.leader.election.enable", text)
    except TopicConfigError:
        return default


def resolve_broker_defaults(broker) -> TopicConfig:
    """The broker's own log.* values as a topic's (raises TopicConfigError on a bad one)."""
    return TopicConfig(**{spec.field: spec.default(broker) for spec in SPECS.values()})


def text(value) -> str:
    """A typed value as a config string (a list as Kafka joins it)."""
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
