"""Topic configs through confluent-kafka's AdminClient against real brokers: a bad value is
refused with INVALID_CONFIG naming the property and creates nothing; max.message.bytes of a
topic refuses a larger batch with MESSAGE_TOO_LARGE while another topic takes it; a topic's
segment.bytes still applies after its broker restarted (the log opens with the broker's
defaults and takes the topic's config from the next LeaderAndIsr)."""

from __future__ import annotations

import pytest

from localcluster.client import Admin
from tests.helpers import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


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
    # one record per batch (each below max.message.bytes): 100 x 1 KB fill two 64 KiB segments
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "batch.num.messages": 1})  # fmt: skip
    failed = []
    for _ in range(100):
        producer.produce("small", b"y" * 1000, on_delivery=lambda e, m: e and failed.append(e))
    assert producer.flush(20) == 0 and not failed, failed[:3]
    log_dir = broker.data_dir / "small-0"
    wait_until(lambda: len(list(log_dir.glob("*.log"))) >= 2, timeout_s=10,
               message="the topic's segment.bytes should roll its log after the restart")  # fmt: skip
