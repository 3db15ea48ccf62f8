"""Dynamic broker configs against three real brokers (one cluster for the module).

Our Admin sets the cluster-wide default (resource name "": librdkafka refuses an empty name and
kafka-python wants a broker id) and confluent-kafka's AdminClient (incremental_alter_configs)
one broker's layer; every broker's DescribeConfigs then shows the value with its source
and synonyms in Kafka's order, and a topic without an override shows the inherited value as
DYNAMIC_DEFAULT_BROKER_CONFIG while an override still wins. A cluster-wide log.retention.bytes
deletes old segments of a topic without an override on every replica, live, and leaves a topic
with its own retention.bytes alone. kafka-python's KafkaAdminClient (alter_configs, the
non-incremental AlterConfigs) sets one broker's min.insync.replicas; that broker, restarted and
leading again, refuses an acks=all produce with NOT_ENOUGH_REPLICAS once only two replicas are
in sync, while a topic with its own min.insync.replicas=1 takes it. A static property and bad
values are refused with Kafka's error and change nothing. Each test removes what it set."""

from __future__ import annotations

import pytest

from localcluster import coord
from localcluster.client import Admin
from localcluster.client import KafkaError as OurKafkaError
from localcluster.coord.kafka_zk import KafkaZkClient
from tests.brokers import BrokerSet
from tests.helpers import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import ElectionType, KafkaError, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

kafka = pytest.importorskip("kafka")
BROKER = ConfigResource.Type.BROKER
DEFAULT = ConfigSource.DEFAULT_CONFIG.value
STATIC = ConfigSource.STATIC_BROKER_CONFIG.value
DYNAMIC_DEFAULT = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
DYNAMIC_BROKER = ConfigSource.DYNAMIC_BROKER_CONFIG.value
DYNAMIC_TOPIC = ConfigSource.DYNAMIC_TOPIC_CONFIG.value


class Cluster:
    def __init__(self, brokers: BrokerSet):
        self.set = brokers
        # retention checked often (the live retention test); a static log.retention.ms to see
        # STATIC_BROKER_CONFIG beneath the dynamic layers
        self.brokers = {b: brokers.start(b, replica_fetch_wait_max_ms="100",
                                         log_retention_check_interval_ms="200",
                                         log_retention_ms="86400000")
                        for b in (1, 2, 3)}  # fmt: skip
        self.zk = KafkaZkClient(coord.connect(str(brokers.cluster_dir / "store")))
        self._admin = None
        wait_until(lambda: self.zk.controller_id() is not None, timeout_s=10)

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values() if b.is_alive())

    def admin(self) -> AdminClient:
        """One client for the module (a future dies with its client if that is collected)."""
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return self._admin

    def fresh_admin(self) -> None:
        self._admin = None

    def alter(self, name: str, operation=AlterConfigOpType.SET, validate_only=False, **configs):
        """IncrementalAlterConfigs on broker resource `name` ("": the cluster-wide default,
        through our Admin; a broker id through confluent-kafka's); (error code, message) or
        None."""
        configs = {k.replace("_", "."): v for k, v in configs.items()}
        if name == "":
            assert not validate_only, "ours has no validate_only"
            deleting = operation == AlterConfigOpType.DELETE
            with Admin(bootstrap_servers=self.bootstrap) as ours:
                try:
                    ours.alter_broker_configs(None, {} if deleting else configs,
                                              list(configs) if deleting else [])  # fmt: skip
                except OurKafkaError as e:
                    return e.code, str(e)
            return None
        entries = [ConfigEntry(k, v, incremental_operation=operation) for k, v in configs.items()]
        resource = ConfigResource(BROKER, name, incremental_configs=entries)
        futures = self.admin().incremental_alter_configs([resource], validate_only=validate_only)
        error = futures[resource].exception(20)
        return None if error is None else (error.args[0].code(), error.args[0].str())

    def describe(self, resource_type, name: str) -> dict:
        resource = ConfigResource(resource_type, name)
        return self.admin().describe_configs([resource])[resource].result(20)

    def create(self, topic: str, config: dict, assignment=None) -> None:
        if assignment:
            with Admin(bootstrap_servers=self.bootstrap) as ours:
                ours.create_topic(topic, config=config, replica_assignment=assignment)
        else:
            new = NewTopic(topic, 1, 3, config=config)
            self.admin().create_topics([new], operation_timeout=10)[topic].result(20)
        wait_until(lambda: self.isr(topic) == 3, timeout_s=10, message=f"{topic}: ISR of 3")

    def isr(self, topic: str) -> int:
        found = self.zk.partition_state(topic, 0)
        return len(found[0].isr) if found else 0

    def leader(self, topic: str) -> int:
        found = self.zk.partition_state(topic, 0)
        return found[0].leader if found else -1

    def segment_bases(self, broker_id: int, topic: str) -> list[int]:
        log_dir = self.brokers[broker_id].data_dir / f"{topic}-0"
        return sorted(int(p.stem) for p in log_dir.glob("*.log"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = BrokerSet(tmp_path_factory.mktemp("cluster"))
    try:
        yield Cluster(started)
    finally:
        started.cleanup()


SOURCES = {source.value: source.name for source in ConfigSource}


def synonyms(cluster, resource_type: int, name: str, key: str) -> list[tuple[str, str, int]]:
    """kafka-python's DescribeConfigs with synonyms (confluent-kafka keys its synonyms by
    name, and these all share one): (name, value, source) in the broker's order."""
    from kafka.admin import ConfigResource as KafkaPythonResource
    from kafka.admin import ConfigResourceType

    client = kafka.KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        resource = KafkaPythonResource(ConfigResourceType(resource_type), name)
        described = client.describe_configs([resource],
                                            include_synonyms=True, config_filter="all")  # fmt: skip
    finally:
        client.close()
    entry = next(iter(next(iter(described.values())).values()))[key]
    by_name = {v: k for k, v in SOURCES.items()}
    return [(s["name"], s["value"], by_name[s["source"]]) for s in entry["synonyms"]]


def test_confluent_default_and_per_broker_layers_described_by_every_broker(cluster):
    ratio = "log.cleaner.min.cleanable.ratio"
    assert cluster.alter("", log_cleaner_min_cleanable_ratio="0.3") is None
    assert cluster.alter("2", log_cleaner_min_cleanable_ratio="0.4") is None
    assert cluster.zk.broker_config("<default>") == {ratio: "0.3"}  # Kafka's znode names
    assert cluster.zk.broker_config("2") == {ratio: "0.4"}
    try:
        for broker_id in (1, 2, 3):
            entries = cluster.describe(BROKER, str(broker_id))
            entry = entries[ratio]
            if broker_id == 2:
                assert (entry.value, entry.source) == ("0.4", DYNAMIC_BROKER)
                assert synonyms(cluster, 4, "2", ratio) == [(ratio, "0.4", DYNAMIC_BROKER),
                                           (ratio, "0.3", DYNAMIC_DEFAULT),
                                           (ratio, "0.5", DEFAULT)]  # fmt: skip
            else:
                assert (entry.value, entry.source) == ("0.3", DYNAMIC_DEFAULT), broker_id
            assert not entry.is_read_only
            retention = entries["log.retention.ms"]  # set in the broker's properties
            assert (retention.value, retention.source) == ("86400000", STATIC)
            assert entries["listeners"].is_read_only
        assert synonyms(cluster, 4, "1", "log.retention.ms") == [
            ("log.retention.ms", "86400000", STATIC), ("log.retention.ms", "604800000", DEFAULT)]  # fmt: skip
        # the empty name is the cluster-wide layer alone, as Kafka describes it
        with Admin(bootstrap_servers=cluster.bootstrap) as ours:
            default = ours.describe_broker_configs(None)
        assert {k: (v.value, v.source) for k, v in default.items()} == {
            ratio: ("0.3", "DYNAMIC_DEFAULT_BROKER_CONFIG")}  # fmt: skip
    finally:
        assert (
            cluster.alter("", AlterConfigOpType.DELETE, log_cleaner_min_cleanable_ratio="") is None
        )
        assert (
            cluster.alter("2", AlterConfigOpType.DELETE, log_cleaner_min_cleanable_ratio="") is None
        )
    entry = cluster.describe(BROKER, "2")[ratio]
    assert (entry.value, entry.source) == ("0.5", DEFAULT)


def test_a_topic_inherits_the_default_layer_and_its_override_still_wins(cluster):
    cluster.create("inherits-deletes", {})
    cluster.create("overrides-deletes", {"delete.retention.ms": "5000"})
    assert cluster.alter("", log_cleaner_delete_retention_ms="1000") is None
    name, broker_name = "delete.retention.ms", "log.cleaner.delete.retention.ms"
    try:
        entry = cluster.describe(ConfigResource.Type.TOPIC, "inherits-deletes")[name]
        assert (entry.value, entry.source) == ("1000", DYNAMIC_DEFAULT)
        assert synonyms(cluster, 2, "inherits-deletes", name) == [
            (broker_name, "1000", DYNAMIC_DEFAULT),
                                   (broker_name, "86400000", DEFAULT)]  # fmt: skip
        entry = cluster.describe(ConfigResource.Type.TOPIC, "overrides-deletes")[name]
        assert (entry.value, entry.source) == ("5000", DYNAMIC_TOPIC)
        assert [s[2] for s in synonyms(cluster, 2, "overrides-deletes", name)] == [
            DYNAMIC_TOPIC,
            DYNAMIC_DEFAULT,
            DEFAULT,
        ]
    finally:
        assert (
            cluster.alter("", AlterConfigOpType.DELETE, log_cleaner_delete_retention_ms="") is None
        )


def test_a_cluster_wide_retention_deletes_segments_live_on_every_replica(cluster):
    cluster.create("inherits-retention", {"segment.bytes": "4096"})
    cluster.create("keeps-retention", {"segment.bytes": "4096", "retention.bytes": "-1"})
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                                         "batch.num.messages": 1, "linger.ms": 0})  # fmt: skip
    for topic in ("inherits-retention", "keeps-retention"):
        for i in range(60):  # 60 x ~270 bytes: several 4 KiB segments
            producer.produce(topic, b"%04d" % i + b"x" * 200)
    assert producer.flush(20) == 0
    for topic in ("inherits-retention", "keeps-retention"):
        for b in (1, 2, 3):
            wait_until(lambda b=b, t=topic: len(cluster.segment_bases(b, t)) >= 4, timeout_s=10,
                       message=f"broker {b} should hold every segment of {topic}")  # fmt: skip
    assert cluster.alter("", log_retention_bytes="4096") is None
    try:
        for b in (1, 2, 3):
            wait_until(lambda b=b: cluster.segment_bases(b, "inherits-retention")[0] > 0 and len(
                cluster.segment_bases(b, "inherits-retention")) <= 2, timeout_s=10,
                message=f"broker {b} should delete old segments at its next retention check")  # fmt: skip
        for b in (1, 2, 3):  # its own retention.bytes=-1 wins over the broker's
            bases = cluster.segment_bases(b, "keeps-retention")
            assert bases[0] == 0 and len(bases) >= 4, (b, bases)
    finally:
        assert cluster.alter("", AlterConfigOpType.DELETE, log_retention_bytes="") is None


def test_kafka_python_per_broker_min_insync_replicas_holds_after_a_restart(cluster):
    from kafka.admin import ConfigResource as KafkaPythonResource
    from kafka.admin import ConfigResourceType
    from kafka.errors import NotEnoughReplicasError

    for topic, config in (("strict", {}), ("lenient", {"min.insync.replicas": "1"})):
        cluster.create(topic, config, assignment={0: [3, 1, 2]})
    client = kafka.KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:  # AlterConfigs (not incremental), sent to broker 3 as Kafka wants
        result = client.alter_configs([KafkaPythonResource(
            ConfigResourceType.BROKER, "3", configs={"min.insync.replicas": "3"})],
            incremental=False)  # fmt: skip
        assert result == {"broker": {"3": "OK"}}, result
        described = client.describe_configs([KafkaPythonResource(ConfigResourceType.BROKER, "3")])
        entry = described["broker"]["3"]["min.insync.replicas"]
        assert (entry["value"], entry["config_source"]) == ("3", "DYNAMIC_BROKER_CONFIG")
    finally:
        client.close()
    # broker 3 restarted learns its layer from the store (no notification is replayed)
    cluster.brokers[3].kill()
    wait_until(lambda: cluster.leader("strict") not in (-1, 3), timeout_s=15)
    cluster.set.restart(cluster.brokers[3])
    try:
        for topic in ("strict", "lenient"):
            wait_until(lambda t=topic: cluster.isr(t) == 3, timeout_s=15)
        elected = cluster.admin().elect_leaders(ElectionType.PREFERRED, [
            TopicPartition("strict", 0), TopicPartition("lenient", 0)]).result(20)  # fmt: skip
        assert all(e is None or e.code() == KafkaError.ELECTION_NOT_NEEDED
                   for e in elected.values()), elected  # fmt: skip
        wait_until(lambda: cluster.leader("strict") == cluster.leader("lenient") == 3,
                   timeout_s=10)  # fmt: skip
        cluster.brokers[2].kill()  # two replicas left in sync
        wait_until(lambda: cluster.isr("strict") == cluster.isr("lenient") == 2, timeout_s=15)
        producer = kafka.KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all",
                                       retries=0)  # fmt: skip
        try:
            with pytest.raises(NotEnoughReplicasError):
                producer.send("strict", b"refused").get(timeout=20)
            assert producer.send("lenient", b"taken").get(timeout=20).offset >= 0
        finally:
            producer.close()
    finally:
        with Admin(bootstrap_servers=cluster.bootstrap) as ours:
            ours.alter_broker_configs(3, {}, ["min.insync.replicas"])
            assert ours.describe_broker_configs(3)["min.insync.replicas"].source == (
                "DEFAULT_CONFIG")  # fmt: skip
        if not cluster.brokers[2].is_alive():
            cluster.set.restart(cluster.brokers[2])
        cluster.fresh_admin()  # the restarted brokers listen on new ports


@pytest.mark.parametrize("name, configs, code, words", [
    ("1", {"listeners": "PLAINTEXT://127.0.0.1:1"}, KafkaError.INVALID_REQUEST,
     "Cannot update these configs dynamically: listeners"),
    ("", {"log.dirs": "/tmp/elsewhere"}, KafkaError.INVALID_REQUEST,
     "Cannot update these configs dynamically: log.dirs"),
    ("", {"log.retention.ms": "-2"}, KafkaError.INVALID_CONFIG, "log.retention.ms=-2"),
    ("2", {"log.cleanup.policy": "foo"}, KafkaError.INVALID_CONFIG, "log.cleanup.policy='foo'"),
    ("", {"min.insync.replicas": "0"}, KafkaError.INVALID_CONFIG, "min.insync.replicas=0"),
    ("", {"log.segment.byte": "4096"}, KafkaError.INVALID_CONFIG, "unknown broker property"),
])  # fmt: skip
def test_a_static_property_or_a_bad_value_is_refused_and_changes_nothing(cluster, name, configs,
                                                                          code, words):  # fmt: skip
    entity = name or "<default>"
    before = cluster.zk.broker_config(entity)
    # with a good change beside it: all or nothing
    error = cluster.alter(name, log_roll_ms="3600000", **{k.replace(".", "_"): v
                                                          for k, v in configs.items()})  # fmt: skip
    assert error is not None, f"{configs} was accepted"
    assert error[0] == code, error
    assert words in error[1], error
    assert cluster.zk.broker_config(entity) == before


def test_validate_only_writes_nothing(cluster):
    assert cluster.alter("1", validate_only=True, log_roll_ms="3600000") is None
    assert "log.roll.ms" not in cluster.zk.broker_config("1")
    entry = cluster.describe(BROKER, "1")["log.roll.ms"]
    assert entry.source == DEFAULT


def test_a_cluster_wide_unclean_election_brings_an_offline_partition_back(cluster):
    """The controller's broker takes the default layer's unclean.leader.election.enable live
    and elects for offline partitions at once (Kafka's enableDefaultUncleanLeaderElection)."""
    controller = cluster.zk.controller_id()
    leader, other = [b for b in (1, 2, 3) if b != controller]
    with Admin(bootstrap_servers=cluster.bootstrap) as ours:
        ours.create_topic("unclean-default", replica_assignment={0: [leader, other]})
        ours.wait_for_leaders("unclean-default")
    cluster.brokers[other].kill()
    wait_until(lambda: cluster.zk.partition_state("unclean-default", 0)[0].isr == (leader,),
               timeout_s=15, message="the ISR shrinks to the leader")  # fmt: skip
    cluster.brokers[leader].kill()
    cluster.set.restart(cluster.brokers[other])  # out of sync: no clean election for it
    try:
        wait_until(lambda: cluster.zk.partition_state("unclean-default", 0)[0].leader == -1,
                   timeout_s=15)  # fmt: skip
        assert cluster.alter("", unclean_leader_election_enable="true") is None
        wait_until(lambda: cluster.leader("unclean-default") == other, timeout_s=15,
                   message="the controller elects the out-of-sync replica at once")  # fmt: skip
    finally:
        assert (
            cluster.alter("", AlterConfigOpType.DELETE, unclean_leader_election_enable="") is None
        )
        cluster.set.restart(cluster.brokers[leader])
        cluster.fresh_admin()
