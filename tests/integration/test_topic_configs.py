"""Topic configs through confluent-kafka's AdminClient against real brokers: a bad value is
refused with INVALID_CONFIG naming the property and creates nothing; max.message.bytes of a
topic refuses a larger batch with MESSAGE_TOO_LARGE while another topic takes it; a topic's
segment.bytes still applies after its broker restarted (the log opens with it: the broker
reads its topics' configs before opening their logs, as Kafka's LogManager does)."""

from __future__ import annotations

import pytest

from localcluster.client import Admin
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey
from tests.helpers import wait_until
from tests.raw_connection import RawConnection

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)


def create(boot: str, name: str, config: dict, rf: int = 1):
    admin = AdminClient({"bootstrap.servers": boot})
    future = admin.create_topics([NewTopic(name, 1, rf, config=config)],
                                 operation_timeout=10)[name]  # fmt: skip
    return future.exception(20)


@pytest.mark.parametrize("config, words", [
    ({"retention.ms": "-2"}, "retention.ms=-2"),
    ({"cleanup.policy": "foo"}, "cleanup.policy='foo'"),
    ({"min.insync.replicas": "2"}, "above the replication factor 1"),
    ({"segment.byte": "1000000"}, "unknown topic config segment.byte"),
])  # fmt: skip
def test_a_bad_config_is_refused_naming_the_property_and_creates_nothing(brokers, config, words):
    broker = brokers.start(1)
    error = create(broker.bootstrap, "refused", config)
    assert error is not None, f"{config} was accepted"
    kafka_error = error.args[0]
    assert kafka_error.code() == confluent_kafka.KafkaError.INVALID_CONFIG, kafka_error
    assert words in kafka_error.str(), kafka_error.str()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert "refused" not in admin.list_topics()


def test_max_message_bytes_of_a_topic_is_enforced_and_its_segment_bytes_survive_a_restart(
    brokers,
):
    broker = brokers.start(1)
    assert create(broker.bootstrap, "small", {"max.message.bytes": "2000",
                                              "segment.bytes": "65536"}) is None  # fmt: skip
    assert create(broker.bootstrap, "large", {}) is None
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "linger.ms": 0})  # fmt: skip
    reports = {}
    for topic in ("small", "large"):
        producer.produce(topic, b"x" * 5000,
                         on_delivery=lambda e, m, t=topic: reports.setdefault(t, e))  # fmt: skip
    producer.flush(20)
    assert reports["small"] is not None
    assert reports["small"].code() == confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE
    assert reports["large"] is None
    del producer
    broker.stop()
    broker = brokers.restart(broker)
    log_dir = broker.data_dir / "small-0"
    # the active segment's file is made to the topic's segment.bytes at open, not to the
    # broker's log.segment.bytes (a sparse 1 GiB file until the next roll, until Dec 2026)
    (active,) = log_dir.glob("*.log")
    assert active.stat().st_size == 65536
    # one record per batch (each below max.message.bytes): 100 x 1 KB fill two 64 KiB segments
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "batch.num.messages": 1})  # fmt: skip
    failed = []
    for _ in range(100):
        producer.produce("small", b"y" * 1000, on_delivery=lambda e, m: e and failed.append(e))
    assert producer.flush(20) == 0 and not failed, failed[:3]
    wait_until(lambda: len(list(log_dir.glob("*.log"))) >= 2, timeout_s=10,
               message="the topic's segment.bytes should roll its log after the restart")  # fmt: skip


def test_a_topic_config_the_store_cannot_decode_does_not_keep_the_broker_from_starting(brokers):
    from localcluster import coord
    from localcluster.coord.kafka_zk import config_path

    broker = brokers.start(1)
    assert create(broker.bootstrap, "garbled", {"segment.bytes": "65536"}) is None
    broker.stop()
    store = coord.connect(str(brokers.cluster_dir / "store"))
    try:
        store.set(config_path("garbled"), b"not json")
    finally:
        store.stop()
    broker = brokers.restart(broker)
    wait_until(lambda: "could not read the topics' configs before opening their logs" in broker.log_text(),
               timeout_s=10, message="the broker says why its logs open with its defaults")  # fmt: skip
    assert broker.is_alive()
    # its controller too goes on (until Dec 2026 its failover read raised, and it resigned
    # and won again ~100 times a second): the topic has a leader and the log says why once
    wait_until(lambda: "garbled: its config cannot be read" in broker.log_text(), timeout_s=10,
               message="the controller says which topic's config it cannot read")  # fmt: skip
    with Admin(bootstrap_servers=broker.bootstrap) as ours:
        wait_until(lambda: ours.describe_topic("garbled").partitions[0].leader == 1, timeout_s=10,
                   message="the topic with the garbled config should have a leader")  # fmt: skip
    assert "failover failed" not in broker.log_text()
    assert broker.log_text().count("garbled: its config cannot be read") == 1
    # describing it names the znode; setting a config writes it whole again
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "garbled")
    refused = admin.describe_configs([resource])[resource].exception(20)
    assert "/config/topics/garbled" in str(refused)
    altered = admin.incremental_alter_configs([ConfigResource(
        ConfigResource.Type.TOPIC, "garbled",
        incremental_configs=[ConfigEntry("segment.bytes", "131072",
                                         incremental_operation=AlterConfigOpType.SET)])])  # fmt: skip
    assert altered[resource].exception(20) is None
    entries = admin.describe_configs([resource])[resource].result(20)
    assert entries["segment.bytes"].value == "131072"


def test_admin_client_describes_configs_with_sources_and_deletes_topics(brokers):
    from confluent_kafka.admin import ConfigResource, ConfigSource

    broker = brokers.start(1, log_retention_ms="3600000")
    assert create(broker.bootstrap, "described", {"min.insync.replicas": "1",
                                                  "cleanup.policy": "compact"}) is None  # fmt: skip
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = ConfigResource(ConfigResource.Type.TOPIC, "described")
    entries = admin.describe_configs([topic])[topic].result(20)
    assert entries["cleanup.policy"].value == "compact"
    assert entries["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    # retention.ms falls back to the broker's log.retention.ms, set in its properties
    assert entries["retention.ms"].value == "3600000"
    assert entries["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert entries["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    node = ConfigResource(ConfigResource.Type.BROKER, "1")
    assert admin.describe_configs([node])[node].result(20)["log.retention.ms"].value == "3600000"
    gone = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "missing")])
    with pytest.raises(confluent_kafka.KafkaException):
        next(iter(gone.values())).result(20)
    admin.delete_topics(["described"], operation_timeout=20)["described"].result(30)
    with Admin(bootstrap_servers=broker.bootstrap) as ours:
        assert "described" not in ours.list_topics()
    refused = admin.delete_topics(["never-was"], operation_timeout=5)["never-was"].exception(20)
    assert refused.args[0].code() == confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART


def test_altered_configs_are_validated_and_take_effect_live_on_every_broker(brokers):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    started = [brokers.start(b) for b in (1, 2, 3)]
    boot = ",".join(b.bootstrap for b in started)
    assert create(boot, "live", {"min.insync.replicas": "1"}, rf=3) is None
    admin = AdminClient({"bootstrap.servers": boot})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "live")

    def alter(*entries):
        change = ConfigResource(ConfigResource.Type.TOPIC, "live", incremental_configs=entries)
        return admin.incremental_alter_configs([change])[change].exception(20)

    refused = alter(ConfigEntry("min.insync.replicas", "4",
                                incremental_operation=AlterConfigOpType.SET))  # fmt: skip
    assert refused is not None and "above the replication factor 3" in refused.args[0].str()
    assert alter(ConfigEntry("max.message.bytes", "1500",
                             incremental_operation=AlterConfigOpType.SET)) is None  # fmt: skip
    assert alter(ConfigEntry("cleanup.policy", "compact",
                             incremental_operation=AlterConfigOpType.APPEND)) is None  # fmt: skip
    entries = admin.describe_configs([resource])[resource].result(20)
    assert entries["cleanup.policy"].value == "delete,compact"
    assert entries["min.insync.replicas"].value == "1", "the refused change wrote nothing"

    # every broker enforces the new max.message.bytes without a restart or a new leader
    producer = confluent_kafka.Producer({"bootstrap.servers": boot, "linger.ms": 0})
    reports = []

    def too_large_refused() -> bool:
        reports.clear()
        producer.produce("live", b"z" * 3000, on_delivery=lambda e, m: reports.append(e))
        producer.flush(20)
        return bool(reports) and reports[0] is not None and (
            reports[0].code() == confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE)  # fmt: skip

    wait_until(too_large_refused, timeout_s=20, interval_s=0.2,
               message="the leader should refuse a 3000-byte batch once max.message.bytes=1500")  # fmt: skip

    # kafka-python: its default is IncrementalAlterConfigs (one key set, the rest kept)
    kafka = pytest.importorskip("kafka")
    from kafka.admin import ConfigResource as KafkaPythonResource
    from kafka.admin import ConfigResourceType

    other = kafka.KafkaAdminClient(bootstrap_servers=boot)
    try:
        other.alter_configs([KafkaPythonResource(ConfigResourceType.TOPIC, "live",
                                                 configs={"retention.ms": "120000"})])  # fmt: skip
    finally:
        other.close()
    entries = admin.describe_configs([resource])[resource].result(20)
    assert (entries["retention.ms"].value, entries["max.message.bytes"].value) == (
        "120000", "1500")  # fmt: skip

    # confluent-kafka's alter_configs is AlterConfigs: the given set replaces every override
    whole = ConfigResource(ConfigResource.Type.TOPIC, "live", set_config={"retention.ms": "60000"})
    admin.alter_configs([whole])[whole].result(20)
    entries = admin.describe_configs([resource])[resource].result(20)
    assert entries["retention.ms"].value == "60000"
    assert entries["max.message.bytes"].value == "1048588", "the override should be gone"
    wait_until(lambda: not too_large_refused() and reports[0] is None, timeout_s=20,
               interval_s=0.2, message="the 3000-byte batch is accepted again")  # fmt: skip


def partitions_with_a_leader(port: int, topic: str) -> int:
    """How many of `topic`'s partitions this one broker's Metadata answer gives a leader."""
    raw = RawConnection(port)
    try:
        data, offset = raw.recv(ApiKey.METADATA, 8, raw.send(ApiKey.METADATA, 8, messages.encode_request(
            ApiKey.METADATA, 8, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})))  # fmt: skip
    finally:
        raw.close()
    answer = messages.decode_response(ApiKey.METADATA, 8, data, offset)
    return sum(p.leader_id >= 0 for t in answer.topics if t.name == topic for p in t.partitions)


def test_create_partitions_grows_a_topic_that_clients_then_use(brokers):
    from confluent_kafka.admin import NewPartitions

    started = [brokers.start(b) for b in (1, 2, 3)]
    boot = ",".join(b.bootstrap for b in started)
    assert create(boot, "growing", {}, rf=3) is None
    admin = AdminClient({"bootstrap.servers": boot})
    grown = admin.create_partitions([NewPartitions("growing", 3)], operation_timeout=20)
    grown["growing"].result(30)
    with Admin(bootstrap_servers=boot) as ours:
        described = ours.wait_for_leaders("growing", timeout_s=20)
    assert [p.partition for p in described.partitions] == [0, 1, 2]
    assert all(len(set(p.replicas)) == 3 for p in described.partitions)
    kafka = pytest.importorskip("kafka")
    from kafka.admin import NewPartitions as KafkaPythonNewPartitions

    other = kafka.KafkaAdminClient(bootstrap_servers=boot)
    try:  # kafka-python with an explicit assignment for the one new partition
        other.create_partitions({"growing": KafkaPythonNewPartitions(4, [[3, 1, 2]])})
    finally:
        other.close()
    # CreatePartitions answers once the broker that took it knows the new partition's leader
    # (as Kafka's does); the others learn it from the controller's UpdateMetadata a moment
    # later, and librdkafka fails a record for a partition its metadata lacks at once.
    for broker in started:
        wait_until(lambda b=broker: partitions_with_a_leader(b.port, "growing") == 4,
                   timeout_s=20, message=f"broker {broker.broker_id} sees 4 partitions")  # fmt: skip
    producer = confluent_kafka.Producer({"bootstrap.servers": boot})
    reports = []
    producer.produce("growing", b"v", partition=3, on_delivery=lambda e, m: reports.append(e))
    producer.flush(20)
    assert reports == [None], reports
    with Admin(bootstrap_servers=boot) as ours:
        assert ours.describe_topic("growing").partitions[3].replicas == (3, 1, 2)
    for bad, code in ((NewPartitions("growing", 2), confluent_kafka.KafkaError.INVALID_PARTITIONS),
                      (NewPartitions("growing", 5, [[1, 1, 2]]),
                       confluent_kafka.KafkaError.INVALID_REPLICA_ASSIGNMENT)):  # fmt: skip
        error = admin.create_partitions([bad], operation_timeout=10)["growing"].exception(20)
        assert error is not None and error.args[0].code() == code, error


def test_elect_leaders_preferred_and_unclean_through_the_admin_client(brokers):
    from confluent_kafka import ElectionType, TopicPartition

    started = {b: brokers.start(b, replica_lag_time_max_ms="1000",
                                auto_leader_rebalance_enable="false") for b in (1, 2)}  # fmt: skip
    boot = ",".join(b.bootstrap for b in started.values())
    with Admin(bootstrap_servers=boot) as ours:
        ours.create_topic("elected", replication_factor=2, partitions=1)
        preferred = ours.wait_for_leaders("elected").partitions[0].replicas[0]
    other = 3 - preferred
    tp = TopicPartition("elected", 0)

    def elect(kind, timeout_s=20):  # (its operation_timeout keyword fails in 2.16: SystemError)
        live = ",".join(b.bootstrap for b in started.values() if b.is_alive())
        client = AdminClient({"bootstrap.servers": live})  # restarts moved the ports
        return client.elect_leaders(kind, [tp]).result(timeout_s + 10)[tp]

    def state(topic="elected"):
        with Admin(bootstrap_servers=",".join(b.bootstrap for b in started.values()
                                              if b.is_alive())) as ours:  # fmt: skip
            return ours.describe_topic(topic).partitions[0]

    not_needed = elect(ElectionType.PREFERRED)
    assert (
        not_needed is not None
        and not_needed.code() == confluent_kafka.KafkaError.ELECTION_NOT_NEEDED
    )
    # the preferred replica restarts: the other leads, until a preferred election moves it back
    started[preferred].stop()
    started[preferred] = brokers.restart(started[preferred])
    wait_until(lambda: state().leader == other and len(state().isr) == 2, timeout_s=30,
               message="the other replica leads and the preferred one is back in the ISR")  # fmt: skip
    assert elect(ElectionType.PREFERRED) is None
    assert state().leader == preferred
    # unclean: the ISR shrinks to the leader, which dies; the out-of-sync replica comes back.
    # A second topic on the same two replicas goes the same way, and is brought back by
    # turning unclean.leader.election.enable on (live, as Kafka's controller does) instead.
    with Admin(bootstrap_servers=boot) as ours:
        ours.create_topic("enabled", replica_assignment={0: [preferred, other]})
        ours.wait_for_leaders("enabled")
    started[other].stop()
    wait_until(lambda: state().isr == (preferred,) and state("enabled").isr == (preferred,),
               timeout_s=30, message="the ISRs shrink")  # fmt: skip
    started[preferred].kill()
    started[other] = brokers.restart(started[other])
    wait_until(lambda: state().leader == -1 and state("enabled").leader == -1, timeout_s=30,
               message="both partitions are offline")  # fmt: skip
    assert elect(ElectionType.UNCLEAN) is None
    assert state().leader == other
    assert state("enabled").leader == -1  # an election for one topic leaves the other alone
    live = ",".join(b.bootstrap for b in started.values() if b.is_alive())
    client = AdminClient({"bootstrap.servers": live})  # kept: its results need the handle
    altered = client.incremental_alter_configs([
        ConfigResource("topic", "enabled", incremental_configs=[
            ConfigEntry("unclean.leader.election.enable", "true",
                        incremental_operation=AlterConfigOpType.SET)])])  # fmt: skip
    assert [f.result(20) for f in altered.values()] == [None]
    wait_until(lambda: state("enabled").leader == other, timeout_s=20,
               message="the controller elects the out-of-sync replica once the config allows it")  # fmt: skip
