"""Broker configuration: Kafka's property names and defaults, with reasons where we differ.

`BrokerConfig.from_properties({"min.insync.replicas": "2", ...})` parses and checks every value;
an unknown name or a bad value is a ConfigError naming the property and what it accepts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from localcluster.broker.listeners import (
    DEFAULT_PROTOCOL_MAP,
    ListenerConfigError,
    ListenerSettings,
    listener_settings,
)


class ConfigError(ValueError):
    pass


def _prop(name: str, default, doc: str = ""):
    return field(default=default, metadata={"property": name, "doc": doc})


@dataclass(frozen=True)
class BrokerConfig:
    broker_id: int = _prop("broker.id", 0)
    broker_rack: str | None = _prop("broker.rack", None)
    # Kafka's listener settings (broker/listeners.py checks them together). A port of 0 picks a
    # free one at start; `localcluster up` passes fixed ports so a restart keeps its address.
    listeners: str = _prop("listeners", "PLAINTEXT://127.0.0.1:0")
    advertised_listeners: str | None = _prop("advertised.listeners", None, "default: listeners")
    listener_security_protocol_map: str = _prop("listener.security.protocol.map",
                                                DEFAULT_PROTOCOL_MAP)  # fmt: skip
    # Kafka's default is the PLAINTEXT listener; ours is none: brokers on one host talk over
    # their Unix sockets, and across hosts only an authenticated (SASL) listener is accepted.
    inter_broker_listener_name: str | None = _prop("inter.broker.listener.name", None)
    # Ours: false sends inter-broker traffic over the inter-broker listener even when the other
    # broker's Unix socket is reachable (to measure TCP replication on one host).
    inter_broker_unix_socket_enable: bool = _prop("inter.broker.unix.socket.enable", True)
    # Kafka's defaults are GSSAPI; Kerberos does not exist here.
    sasl_enabled_mechanisms: str = _prop("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-256")
    sasl_mechanism_inter_broker_protocol: str = _prop("sasl.mechanism.inter.broker.protocol",
                                                      "PLAIN")  # fmt: skip
    # Kafka reads this as a JVM system property (-Djava.security.auth.login.config); here it is
    # a broker property naming the JAAS file whose KafkaServer section holds the broker's own
    # credential (username/password) and PLAIN's users (user_<name>="password").
    java_security_auth_login_config: str | None = _prop("java.security.auth.login.config", None)
    super_users: str = _prop("super.users", "", "User:<name> entries separated by ';'")
    connection_failed_authentication_delay_ms: int = _prop(
        "connection.failed.authentication.delay.ms", 100)  # fmt: skip
    zookeeper_connect: str | None = _prop("zookeeper.connect", None,
                                          "host:port[,host:port][/chroot] of a real ZooKeeper")  # fmt: skip
    log_dirs: str | None = _prop("log.dirs", None, "default: /dev/shm/localcluster-<id>/broker-N")
    num_partitions: int = _prop("num.partitions", 1)
    default_replication_factor: int = _prop("default.replication.factor", 1)
    min_insync_replicas: int = _prop("min.insync.replicas", 1)
    unclean_leader_election_enable: bool = _prop("unclean.leader.election.enable", False)
    # One host: a follower that has not caught up in 10 s is in trouble; Kafka's 30 s is
    # sized for networks and GC pauses across machines.
    replica_lag_time_max_ms: int = _prop("replica.lag.time.max.ms", 10_000)
    replica_fetch_wait_max_ms: int = _prop("replica.fetch.wait.max.ms", 500)
    # KIP-227's session cache (protocol/incremental_fetch.py), Kafka's names and defaults.
    max_incremental_fetch_session_cache_slots: int = _prop(
        "max.incremental.fetch.session.cache.slots", 1000)  # fmt: skip
    min_incremental_fetch_session_eviction_ms: int = _prop(
        "min.incremental.fetch.session.eviction.ms", 120_000)  # fmt: skip
    replica_high_watermark_checkpoint_interval_ms: int = _prop(
        "replica.high.watermark.checkpoint.interval.ms", 5_000)  # fmt: skip
    log_segment_bytes: int = _prop("log.segment.bytes", 1 << 30)
    log_index_size_max_bytes: int = _prop("log.index.size.max.bytes", 10 << 20)
    log_cleanup_policy: str = _prop("log.cleanup.policy", "delete", "delete, compact or both")
    log_retention_bytes: int = _prop("log.retention.bytes", -1)
    log_retention_ms: int = _prop("log.retention.ms", 7 * 24 * 3600 * 1000)
    log_retention_check_interval_ms: int = _prop("log.retention.check.interval.ms", 300_000)
    log_roll_ms: int = _prop("log.roll.ms", 7 * 24 * 3600 * 1000, "Kafka's log.roll.hours=168")
    log_message_timestamp_type: str = _prop("log.message.timestamp.type", "CreateTime",
                                            "CreateTime or LogAppendTime")  # fmt: skip
    log_flush_offset_checkpoint_interval_ms: int = _prop(
        "log.flush.offset.checkpoint.interval.ms", 60_000, "recovery-point checkpoint interval"
    )
    # The log cleaner (broker/log_cleaner.py, storage/cleaner.py): Kafka's names and defaults
    # but the backoff. Kafka's cleaner threads sleep 15 s when no log is dirty enough; a local
    # cluster's compacted topics are small and tests and demos want to see them cleaned within
    # a second or two, and a check that finds nothing reads only segment sizes (no I/O).
    log_cleaner_enable: bool = _prop("log.cleaner.enable", True)
    log_cleaner_backoff_ms: int = _prop("log.cleaner.backoff.ms", 1_000,
                                        "pause between checks when no log is dirty enough")  # fmt: skip
    log_cleaner_min_compaction_lag_ms: int = _prop("log.cleaner.min.compaction.lag.ms", 0)
    log_cleaner_delete_retention_ms: int = _prop("log.cleaner.delete.retention.ms", 86_400_000)
    log_cleaner_min_cleanable_ratio: float = _prop("log.cleaner.min.cleanable.ratio", 0.5)
    message_max_bytes: int = _prop("message.max.bytes", 1048588)
    producer_id_expiration_ms: int = _prop("producer.id.expiration.ms", 86_400_000)
    # The group coordinator (broker/group_coordinator.py), Kafka's names and defaults but one.
    offsets_topic_num_partitions: int = _prop("offsets.topic.num.partitions", 50)
    offsets_topic_replication_factor: int = _prop(
        "offsets.topic.replication.factor", 3, "lowered to the live brokers, with a log line")  # fmt: skip
    offsets_topic_segment_bytes: int = _prop("offsets.topic.segment.bytes", 104_857_600)
    offsets_commit_timeout_ms: int = _prop("offsets.commit.timeout.ms", 5_000)
    offsets_retention_minutes: int = _prop("offsets.retention.minutes", 10_080)
    offsets_retention_check_interval_ms: int = _prop(
        "offsets.retention.check.interval.ms", 600_000)  # fmt: skip
    offset_metadata_max_bytes: int = _prop("offset.metadata.max.bytes", 4_096)
    group_min_session_timeout_ms: int = _prop("group.min.session.timeout.ms", 6_000)
    group_max_session_timeout_ms: int = _prop("group.max.session.timeout.ms", 1_800_000)
    # Kafka's 3000 holds the first JoinGroup of an empty group 3 s so that consumers started
    # together join one rebalance. On a test cluster most groups start one consumer and wait
    # for it, so 0 (what Kafka's own test and container setups use); set 3000 for Kafka's.
    group_initial_rebalance_delay_ms: int = _prop("group.initial.rebalance.delay.ms", 0)
    group_max_size: int = _prop("group.max.size", 2**31 - 1)
    socket_request_max_bytes: int = _prop("socket.request.max.bytes", 100 * 1024 * 1024)
    auto_create_topics_enable: bool = _prop("auto.create.topics.enable", True)
    auto_leader_rebalance_enable: bool = _prop("auto.leader.rebalance.enable", True)
    leader_imbalance_check_interval_seconds: int = _prop(
        "leader.imbalance.check.interval.seconds", 300)  # fmt: skip
    controlled_shutdown_enable: bool = _prop("controlled.shutdown.enable", True)
    # One host: a dead process is noticed through its dropped flock at once; the timeout only
    # matters for a hung (SIGSTOPped) broker. Kafka's 18 s is sized for networks.
    zookeeper_session_timeout_ms: int = _prop("zookeeper.session.timeout.ms", 6_000)
    # Ours, not Kafka's: false keeps this broker out of controller elections, so a test can
    # play the controller by hand (tests/replication.py) with nobody interfering.
    controller_eligible: bool = _prop("controller.eligible", True)
    replication_protocol: str = _prop("replication.protocol", "leader-epoch",
                                      "leader-epoch (KIP-101/279) or hw-truncation (0.8)")  # fmt: skip

    @classmethod
    def from_properties(cls, properties: dict[str, str], **overrides) -> BrokerConfig:
        by_name = {f.metadata["property"]: f for f in dataclasses.fields(cls)}
        values = dict(overrides)
        for name, raw in properties.items():
            f = by_name.get(name)
            if f is None:
                raise ConfigError(
                    f"unknown broker property {name!r}; known: {', '.join(sorted(by_name))}"
                )
            values[f.name] = _parse(name, f.type, raw)
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        if self.replication_protocol not in ("leader-epoch", "hw-truncation"):
            raise ConfigError(
                f"replication.protocol={self.replication_protocol!r}: use leader-epoch or "
                "hw-truncation"
            )
        for name in (
            "num_partitions",
            "default_replication_factor",
            "min_insync_replicas",
            "offsets_topic_num_partitions",
            "offsets_topic_replication_factor",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{_property(name)} must be at least 1")
        if self.log_cleaner_backoff_ms < 0:
            raise ConfigError("log.cleaner.backoff.ms must be at least 0")
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ConfigError(
                f"group.min.session.timeout.ms={self.group_min_session_timeout_ms} must not "
                f"exceed group.max.session.timeout.ms={self.group_max_session_timeout_ms}"
            )
        from localcluster.topic_config import TopicConfigError, resolve_broker_defaults

        try:
            resolve_broker_defaults(self)
        except TopicConfigError as e:
            raise ConfigError(str(e)) from None
        settings = self.listener_settings  # raises ConfigError naming the property
        self._check_sasl(settings)
        if self.replica_fetch_wait_max_ms > self.replica_lag_time_max_ms:
            # Kafka's rule: on an idle partition a caught-up follower fetches once per wait, so
            # a wait longer than the lag time drops it from the ISR between two fetches.
            raise ConfigError(
                f"replica.fetch.wait.max.ms={self.replica_fetch_wait_max_ms} must not exceed "
                f"replica.lag.time.max.ms={self.replica_lag_time_max_ms}, or idle followers "
                "fall out of the ISR between fetches"
            )

    @property
    def listener_settings(self) -> ListenerSettings:
        try:
            return listener_settings(self.listeners, self.advertised_listeners,
                                     self.listener_security_protocol_map,
                                     self.inter_broker_listener_name)  # fmt: skip
        except ListenerConfigError as e:
            raise ConfigError(str(e)) from None

    @property
    def enabled_mechanisms(self) -> tuple[str, ...]:
        return tuple(m.strip().upper() for m in self.sasl_enabled_mechanisms.split(",")
                     if m.strip())  # fmt: skip

    @property
    def super_user_names(self) -> frozenset[str]:
        return frozenset(u.strip() for u in self.super_users.split(";") if u.strip())

    def _check_sasl(self, settings: ListenerSettings) -> None:
        from localcluster.protocol.sasl import SUPPORTED_MECHANISMS

        for mechanism in self.enabled_mechanisms:
            if mechanism not in SUPPORTED_MECHANISMS:
                raise ConfigError(f"sasl.enabled.mechanisms: {mechanism} is not supported here; "
                                  f"use {', '.join(SUPPORTED_MECHANISMS)}")  # fmt: skip
        uses_sasl = any(e.security_protocol == "SASL_PLAINTEXT" for e in settings.listeners)
        if uses_sasl and not self.java_security_auth_login_config:
            raise ConfigError(
                "a SASL_PLAINTEXT listener needs credentials: set "
                "java.security.auth.login.config to a JAAS file with a KafkaServer section"
            )
        inter = self.sasl_mechanism_inter_broker_protocol.strip().upper()
        if settings.inter_broker is not None and inter not in self.enabled_mechanisms:
            raise ConfigError(f"sasl.mechanism.inter.broker.protocol={inter} is not in "
                              f"sasl.enabled.mechanisms ({self.sasl_enabled_mechanisms})")  # fmt: skip

    def properties(self) -> dict[str, object]:
        return {f.metadata["property"]: getattr(self, f.name) for f in dataclasses.fields(self)}


def _property(attribute: str) -> str:
    return next(f.metadata["property"] for f in dataclasses.fields(BrokerConfig)
                if f.name == attribute)  # fmt: skip


def parse_property(name: str, raw: str):
    """One property's value typed as BrokerConfig holds it (a ConfigError naming it when it
    does not parse); the dynamic layers' values go through here (broker/dynamic_config.py)."""
    f = next(f for f in dataclasses.fields(BrokerConfig) if f.metadata["property"] == name)
    return _parse(name, f.type, raw)


def _parse(name: str, annotation: str, raw: str):
    text = str(raw).strip()
    if annotation == "bool":
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ConfigError(f"{name}={raw!r}: expected true or false")
    if annotation == "int":
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: expected an integer") from None
    if annotation == "float":
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: expected a number") from None
    if annotation == "str | None":
        return text or None
    return text


def read_properties_file(path) -> dict[str, str]:
    """A Java .properties file (server.properties): `key=value` or `key: value` lines, `#` and
    `!` comments, a trailing backslash continues a line. A line without a separator is a
    ConfigError naming the file and line."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    out: dict[str, str] = {}
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip() if not pending else raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        if not pending:
            start = number
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        assignment = split_assignment(line, separators="=:")
        if assignment is None:
            raise ConfigError(f"{path} line {start}: expected key=value, got {raw.strip()!r}")
        out[assignment[0]] = assignment[1]
    return out


def parse_assignments(items: list[str] | tuple[str, ...], option: str = "--set",
                      example: str = "min.insync.replicas=2") -> dict[str, str]:  # fmt: skip
    """`key=value` strings (repeated --set, --config, ...) to a dict, the last one winning; a
    string without '=' or without a key is a ConfigError naming `option` and an example."""
    out = {}
    for item in items:
        assignment = split_assignment(item)
        if assignment is None:
            where = f"{option} " if option else ""
            raise ConfigError(f"{where}{item!r}: expected key=value, e.g. {example}")
        out[assignment[0]] = assignment[1]
    return out


def split_assignment(text: str, separators: str = "=") -> tuple[str, str] | None:
    """The one key=value rule: cut at the first separator, strip both sides; None when there
    is no separator or no key. (Java's .properties also take ':', hence `separators`.)"""
    cut = min((i for i in map(text.find, separators) if i >= 0), default=-1)
    key = text[:cut].strip() if cut >= 0 else ""
    return (key, text[cut + 1 :].strip()) if key else None
