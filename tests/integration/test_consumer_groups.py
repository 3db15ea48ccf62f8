"""Consumer groups with real clients and their defaults: confluent-kafka, kafka-python 3,
aiokafka and kcat -G consume in a group, commit, and a second consumer of the same group goes on
where the first stopped; two members share a topic's partitions and one takes all when the other
leaves; committed offsets survive kill -9 of the group's coordinator; the group APIs of
confluent-kafka's AdminClient (list, describe, offsets, alter, delete); `__consumer_offsets` is
made on first use with a replication factor the live brokers allow, and no client may write it.

The only setting changed from a client's defaults is auto.offset.reset=earliest (their default,
latest, would skip the records the test produced before the group existed).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time

import pytest

from localcluster.client import Admin
from localcluster.group import partition_for
from tests.brokers import BrokerProcess
from tests.helpers import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

KCAT = shutil.which("kcat")
PARTITIONS = 3
FIRST, SECOND = 300, 50


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster_dir = tmp_path_factory.mktemp("groups") / "cluster"
    cluster_dir.mkdir()
    started = [BrokerProcess(b, cluster_dir, {"replica.lag.time.max.ms": "3000"})
               for b in (1, 2, 3)]  # fmt: skip
    try:
        for broker in started:
            broker.start()
        yield started
    finally:
        for broker in started:
            broker.kill()


def bootstrap(brokers) -> str:
    return ",".join(b.bootstrap for b in brokers if b.is_alive())


def create_topic(brokers, topic: str, partitions: int = PARTITIONS) -> None:
    with Admin(bootstrap_servers=bootstrap(brokers)) as admin:
        admin.create_topic(topic, partitions, 3, {"min.insync.replicas": "2"})
        admin.wait_for_leaders(topic)


def produce(brokers, topic: str, values) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap(brokers)})
    for value in values:
        producer.produce(topic, value.encode(), key=value.encode())
    assert producer.flush(30) == 0


# -- each client in a group ------------------------------------------------------------------


def consume_confluent(boot, topic, group, count) -> list[str]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": boot, "group.id": group,
                                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe([topic])
    got, deadline = [], time.monotonic() + 40
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value().decode())
    finally:
        consumer.close()  # commits what was consumed (enable.auto.commit's final commit)
    return got


def consume_kafka_python(boot, topic, group, count) -> list[str]:
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=boot, group_id=group,
                                   auto_offset_reset="earliest")  # fmt: skip
    got, deadline = [], time.monotonic() + 40
    try:
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                got.extend(r.value.decode() for r in records)
    finally:
        consumer.close()  # autocommit: commits on close
    return got


def consume_aiokafka(boot, topic, group, count) -> list[str]:
    async def run():
        consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=boot, group_id=group,
                                             auto_offset_reset="earliest")  # fmt: skip
        await consumer.start()
        got, deadline = [], time.monotonic() + 40
        try:
            while len(got) < count and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                got.extend(r.value.decode() for rs in batches.values() for r in rs)
        finally:
            await consumer.stop()  # commits on stop
        return got

    return asyncio.run(run())


def consume_kcat(boot, topic, group, count) -> list[str]:
    # -e: exit at the end of every partition; the final commit happens on its close. (kcat's
    # -o in -G mode would override the committed offsets: auto.offset.reset is the setting.)
    result = subprocess.run([KCAT, "-b", boot, "-G", group, "-X", "auto.offset.reset=earliest",
                             "-e", "-q", "-f", "%s\n", topic],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


CLIENTS = {
    "confluent-kafka": consume_confluent,
    "kafka-python": consume_kafka_python,
    "aiokafka": consume_aiokafka,
    "kcat": consume_kcat,
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_group_consumes_everything_once_and_the_next_member_goes_on_from_its_commits(
    cluster, client
):
    if client == "kcat" and KCAT is None:
        pytest.skip("kcat is not installed (Debian package kcat; `make test` installs it)")
    topic, group = f"orders-{client}", f"billing-{client}"
    create_topic(cluster, topic)
    first = [f"a{i}" for i in range(FIRST)]
    produce(cluster, topic, first)
    consume = CLIENTS[client]
    got = consume(bootstrap(cluster), topic, group, FIRST)
    assert sorted(got) == sorted(first), f"{client} read {len(got)} of {FIRST}"
    second = [f"b{i}" for i in range(SECOND)]
    produce(cluster, topic, second)
    again = consume(bootstrap(cluster), topic, group, SECOND)
    assert sorted(again) == sorted(second), (
        f"{client}: the second member should start at the group's committed offsets; it read "
        f"{len(again)} records, {len(set(again) & set(first))} of them from the first batch"
    )


def test_two_members_share_the_partitions_and_one_takes_all_when_the_other_leaves(cluster):
    topic, group = "shared", "sharers"
    create_topic(cluster, topic, partitions=4)
    config = {"bootstrap.servers": bootstrap(cluster), "group.id": group}
    members = [confluent_kafka.Consumer(config), confluent_kafka.Consumer(config)]
    try:
        for member in members:
            member.subscribe([topic])

        def assignments():
            for member in members:
                member.poll(0.1)
            return [{tp.partition for tp in member.assignment()} for member in members]

        wait_until(lambda: all(assignments()) and set.union(*assignments()) == set(range(4)),
                   timeout_s=40, message="both members should get partitions")  # fmt: skip
        first, second = assignments()
        assert not first & second, f"a partition is assigned twice: {first} {second}"
        members.pop().close()  # LeaveGroup: the group rebalances without waiting for a timeout
        wait_until(lambda: {tp.partition for tp in (members[0].poll(0.1) or True)
                            and members[0].assignment()} == set(range(4)),
                   timeout_s=40, message="the remaining member should own every partition")  # fmt: skip
    finally:
        for member in members:
            member.close()


def test_admin_client_lists_describes_alters_and_deletes_groups(cluster):
    topic = "admin-groups"
    create_topic(cluster, topic)
    produce(cluster, topic, [f"v{i}" for i in range(30)])
    assert len(consume_confluent(bootstrap(cluster), topic, "audit", 30)) == 30
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    listed = admin.list_consumer_groups().result(20)
    assert "audit" in {g.group_id for g in listed.valid} and not listed.errors
    described = admin.describe_consumer_groups(["audit"])["audit"].result(20)
    assert described.state == confluent_kafka.ConsumerGroupState.EMPTY
    assert described.coordinator.id in {b.broker_id for b in cluster}
    request = [ConsumerGroupTopicPartitions("audit")]
    offsets = admin.list_consumer_group_offsets(request)["audit"].result(20)
    assert sum(tp.offset for tp in offsets.topic_partitions) == 30
    admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("audit", [TopicPartition(topic, 0, 0)])])["audit"].result(20)  # fmt: skip
    offsets = admin.list_consumer_group_offsets(request)["audit"].result(20)
    assert {tp.partition: tp.offset for tp in offsets.topic_partitions}[0] == 0
    # the commits are records of __consumer_offsets in Kafka's layouts, on the coordinator
    coordinator = next(b for b in cluster if b.broker_id == described.coordinator.id)
    directory = coordinator.data_dir / f"__consumer_offsets-{partition_for('audit', 50)}"
    dump = subprocess.run([sys.executable, "-m", "localcluster", "log", "dump", "--records",
                           str(directory)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "400"})  # fmt: skip
    assert dump.returncode == 0, dump.stderr
    words = dump.stdout.split()  # a long record wraps inside its table cell
    assert "offset_commit" in words and "group_metadata" in words, dump.stdout
    assert "group='audit'" in words and f"topic='{topic}'" in words, dump.stdout
    admin.delete_consumer_groups(["audit"])["audit"].result(20)
    assert "audit" not in {g.group_id for g in admin.list_consumer_groups().result(20).valid}


def test_a_client_cannot_write_the_offsets_topic(cluster):
    consume_confluent(bootstrap(cluster), "orders-kafka-python", "make-offsets-topic", 0)
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap(cluster)})
    reports = []
    producer.produce("__consumer_offsets", b"forged", partition=0,
                     on_delivery=lambda error, message: reports.append(error))  # fmt: skip
    producer.flush(30)
    assert len(reports) == 1 and reports[0] is not None, "the forged record was accepted"
    assert reports[0].code() == confluent_kafka.KafkaError.TOPIC_EXCEPTION, reports[0]


# -- the coordinator dies ---------------------------------------------------------------------


def coordinator_of(brokers, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    return admin.describe_consumer_groups([group])[group].result(20).coordinator.id


def committed_offsets(brokers, group: str) -> dict[tuple[str, int], int]:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    found = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    return {(tp.topic, tp.partition): tp.offset for tp in found[group].result(20).topic_partitions
            if tp.error is None}  # fmt: skip


def test_committed_offsets_and_the_group_survive_kill_9_of_the_coordinator(brokers):
    started = [brokers.start(b, replica_lag_time_max_ms="3000") for b in (1, 2, 3)]
    topic, group, total = "payments", "settlement", 1000
    create_topic(started, topic)
    produce(started, topic, [f"p{i}" for i in range(total)])
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=bootstrap(started), group_id=group,
                                   auto_offset_reset="earliest", enable_auto_commit=False,
                                   max_poll_records=100)  # fmt: skip
    try:
        seen: list[str] = []
        wait_until(lambda: seen.extend(r.value.decode() for rs in consumer.poll(200).values()
                                       for r in rs) or len(seen) >= 400,
                   timeout_s=40, message="the group should consume")  # fmt: skip
        consumer.commit()
        before = committed_offsets(started, group)
        assert sum(before.values()) == len(seen)
        victim = next(b for b in started if b.broker_id == coordinator_of(started, group))
        victim.kill()
        alive = [b for b in started if b is not victim]
        # the new coordinator (another replica of the group's offsets partition) loads them
        wait_until(lambda: committed_offsets(alive, group) == before, timeout_s=40,
                   message="the committed offsets should survive the coordinator")  # fmt: skip
        wait_until(lambda: seen.extend(r.value.decode() for rs in consumer.poll(200).values()
                                       for r in rs) or len(seen) >= total,
                   timeout_s=60, message="the member should go on consuming")  # fmt: skip
        consumer.commit()
        assert sorted(seen) == sorted(f"p{i}" for i in range(total)), "a record lost or twice"
        assert sum(committed_offsets(alive, group).values()) == total
        assert coordinator_of(alive, group) != victim.broker_id
    finally:
        consumer.close(autocommit=False)


def test_the_offsets_topic_is_made_on_first_use_with_the_replication_factor_alive(brokers):
    broker = brokers.start(1)
    consumer = kafka.KafkaConsumer("lonely", bootstrap_servers=broker.bootstrap,
                                   group_id="first-use")  # fmt: skip
    try:  # an assignment means the group found its coordinator
        wait_until(lambda: consumer.poll(100) is not None and consumer.assignment(),
                   timeout_s=40, message="the group should get its partition")  # fmt: skip
    finally:
        consumer.close()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        offsets = admin.wait_for_leaders("__consumer_offsets", timeout_s=30)
    assert len(offsets.partitions) == 50
    assert {len(p.replicas) for p in offsets.partitions} == {1}
    wait_until(lambda: "only 1 broker(s) are alive" in broker.log_text(), timeout_s=10,
               message="the lowered replication factor should be logged")  # fmt: skip
