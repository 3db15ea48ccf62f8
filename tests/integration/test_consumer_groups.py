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
from tests.brokers import BrokerProcess, remove_socket_dir
from tests.helpers import poll_kafka_python, wait_until

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
        remove_socket_dir(cluster_dir)


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


def kafka_python_subscribed(topic: str, **config):
    """A kafka-python KafkaConsumer subscribed to `topic` once it has seen the topic's partitions.

    kafka-python 3.0 races its first metadata against its first rebalance (see
    test_the_offsets_topic_is_made_on_first_use_with_the_replication_factor_alive): with
    group.initial.rebalance.delay.ms at 0, a JoinGroup answered before the first Metadata left
    a member with no partitions and no rejoin, in 1 of 2 runs under load. An application that
    subscribes right after creating its topic meets the same race against any broker."""
    consumer = kafka.KafkaConsumer(**config)
    try:
        wait_until(lambda: consumer.partitions_for_topic(topic), timeout_s=20,
                   message=f"kafka-python should see topic {topic}")  # fmt: skip
    except BaseException:
        consumer.close()
        raise
    consumer.subscribe([topic])
    return consumer


def poll_values(consumer, got: list[str], count: int, timeout_s: float,
                broker_killed: bool = False) -> list[str]:  # fmt: skip
    """Values into `got` until it holds `count` or `timeout_s` passed (tests/helpers.py's
    poll_kafka_python: polls that never give up on a rejoin)."""
    records = poll_kafka_python(consumer, count - len(got), timeout_s, broker_killed)
    got.extend(r.value.decode() for r in records)
    return got


def consume_kafka_python(boot, topic, group, count) -> list[str]:
    consumer = kafka_python_subscribed(topic, bootstrap_servers=boot, group_id=group,
                                       auto_offset_reset="earliest")  # fmt: skip
    try:
        return poll_values(consumer, [], count, 40)
    finally:
        consumer.close()  # autocommit: commits on close


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


COORDINATOR_MOVING = {confluent_kafka.KafkaError.NOT_COORDINATOR,
                      confluent_kafka.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                      confluent_kafka.KafkaError.COORDINATOR_NOT_AVAILABLE}  # fmt: skip


def coordinator_of(brokers, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    return wait_until(lambda: _unless_moving(
        lambda: admin.describe_consumer_groups([group])[group].result(20).coordinator.id),
        timeout_s=40, message=f"the coordinator of {group}")  # fmt: skip


def committed_offsets(brokers, group: str) -> dict[tuple[str, int], int] | None:
    """The group's committed offsets, None while its coordinator moves (ask again)."""
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})

    def ask():
        found = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
        return {(tp.topic, tp.partition): tp.offset
                for tp in found[group].result(20).topic_partitions if tp.error is None}  # fmt: skip

    return _unless_moving(ask)


def _committed(consumer) -> bool:
    try:
        consumer.commit()
    except kafka.errors.KafkaConnectionError:
        return False
    return True


def _unless_moving(ask):
    try:
        return ask()
    except confluent_kafka.KafkaException as e:
        if e.args[0].code() not in COORDINATOR_MOVING:
            raise
        return None


def test_committed_offsets_and_the_group_survive_kill_9_of_the_coordinator(brokers):
    started = [brokers.start(b, replica_lag_time_max_ms="3000") for b in (1, 2, 3)]
    topic, group, total = "payments", "settlement", 1000
    create_topic(started, topic)
    produce(started, topic, [f"p{i}" for i in range(total)])
    consumer = kafka_python_subscribed(topic, bootstrap_servers=bootstrap(started), group_id=group,
                                       auto_offset_reset="earliest", enable_auto_commit=False,
                                       max_poll_records=100)  # fmt: skip
    try:
        seen = poll_values(consumer, [], 400, 40)
        assert len(seen) >= 400, f"the group should consume: {len(seen)} records in 40 s"
        consumer.commit()
        before = wait_until(lambda: committed_offsets(started, group), timeout_s=40)
        assert sum(before.values()) == len(seen)
        victim = next(b for b in started if b.broker_id == coordinator_of(started, group))
        victim.kill()
        alive = [b for b in started if b is not victim]
        # the new coordinator (another replica of the group's offsets partition) loads them
        wait_until(lambda: committed_offsets(alive, group) == before, timeout_s=40,
                   message="the committed offsets should survive the coordinator")  # fmt: skip
        poll_values(consumer, seen, total, 60, broker_killed=True)
        assert len(seen) >= total, (
            f"the member should go on consuming: {len(seen)} of {total} in 60 s"
        )
        # kafka-python 3.0's sync commit can raise the connection error of the dead coordinator
        # instead of retrying it (its net/inet.py raises where a failed future would retry):
        # an application retries, and so does this test
        wait_until(lambda: _committed(consumer), timeout_s=40, interval_s=0.2,
                   message="a commit to the new coordinator")  # fmt: skip
        assert sorted(seen) == sorted(f"p{i}" for i in range(total)), "a record lost or twice"
        final = wait_until(lambda: committed_offsets(alive, group), timeout_s=40)
        assert sum(final.values()) == total
        assert coordinator_of(alive, group) != victim.broker_id
    finally:
        consumer.close(autocommit=False)


def test_the_offsets_topic_is_made_on_first_use_with_the_replication_factor_alive(brokers):
    broker = brokers.start(1)
    # kafka-python 3.0 races its first metadata against its first rebalance: a leader that
    # assigns while its cluster view lacks the topic's partitions ("No partition metadata for
    # topic") records the metadata it has since received as the assignment's basis, assigns
    # nothing and never rejoins (its snapshots match). Faster topic creation (the controller's
    # batched writes) made a subscription to an auto-created topic hit that 3 runs in 4 here.
    # As an application that creates its topic first, the test creates it, and the consumer
    # sees its partition before it subscribes; the offsets topic is still made on first use.
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topic("lonely", 1, 1)
        admin.wait_for_leaders("lonely")
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="first-use")
    try:
        wait_until(lambda: consumer.partitions_for_topic("lonely"), timeout_s=20,
                   message="kafka-python should see the topic")  # fmt: skip
        consumer.subscribe(["lonely"])
        # an assignment means the group found its coordinator
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


# -- membership: many members, a member killed -9, static members ----------------------------

MEMBER_SCRIPT = """
import sys, confluent_kafka
consumer = confluent_kafka.Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                                     "session.timeout.ms": 6000})
consumer.subscribe([sys.argv[3]])
while True:
    consumer.poll(0.2)
"""


def described_assignments(brokers, group: str) -> dict[str, set[int]]:
    """The coordinator's view: member id -> the partitions its SyncGroup assignment names."""
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    try:
        described = admin.describe_consumer_groups([group])[group].result(20)
    except confluent_kafka.KafkaException as e:
        # the coordinator is not known yet, loads, or moved (its LeaderAndIsr arrives after
        # the others' UpdateMetadata): ask again, as a client does
        if e.args[0].code() not in COORDINATOR_MOVING:
            raise
        return {}
    if described.state != confluent_kafka.ConsumerGroupState.STABLE:
        return {}
    return {m.member_id: {tp.partition for tp in m.assignment.topic_partitions}
            for m in described.members}  # fmt: skip


def owned_once(assignments: dict[str, set[int]], partitions: int) -> bool:
    owned = [p for ps in assignments.values() for p in ps]
    return sorted(owned) == list(range(partitions))


def test_three_members_own_six_partitions_once_and_a_member_killed_9_is_dropped(cluster):
    topic, group = "six", "trio"
    create_topic(cluster, topic, partitions=6)
    # session.timeout.ms 6000 (the broker's minimum) so that dropping the killed member takes
    # 6 s rather than the client default's 45 s
    config = {"bootstrap.servers": bootstrap(cluster), "group.id": group,
              "session.timeout.ms": 6000}  # fmt: skip
    local = [confluent_kafka.Consumer(config) for _ in range(2)]
    member = subprocess.Popen([sys.executable, "-c", MEMBER_SCRIPT, bootstrap(cluster), group,
                               topic], start_new_session=True, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for consumer in local:
            consumer.subscribe([topic])

        def settled(count: int) -> bool:
            for consumer in local:
                consumer.poll(0.1)
            found = described_assignments(cluster, group)
            return len(found) == count and owned_once(found, 6)

        wait_until(lambda: settled(3), timeout_s=60, message="three members, six partitions")

        def mine() -> list[int]:
            for consumer in local:
                consumer.poll(0.1)  # a member applies its assignment in its poll
            return sorted(tp.partition for consumer in local for tp in consumer.assignment())

        # range over 6 partitions and 3 members: 2 each, so the two local members own 4
        wait_until(lambda: len(mine()) == 4, timeout_s=30,
                   message="two of three members should own 4 of 6 partitions")  # fmt: skip
        os.killpg(member.pid, 9)
        member.wait(10)
        wait_until(lambda: settled(2), timeout_s=60,
                   message="the killed member's partitions should move after its session timeout")  # fmt: skip
        wait_until(lambda: mine() == list(range(6)), timeout_s=30,
                   message="the two members should own all six partitions, each once")  # fmt: skip
    finally:
        if member.poll() is None:
            os.killpg(member.pid, 9)
            member.wait(10)
        for consumer in local:
            consumer.close()


def test_a_static_member_rejoins_without_a_rebalance(cluster):
    topic, group = "static", "statics"
    create_topic(cluster, topic, partitions=2)
    config = {"bootstrap.servers": bootstrap(cluster), "group.id": group}
    revoked: list[int] = []
    other = confluent_kafka.Consumer(config)
    other.subscribe([topic], on_revoke=lambda c, ps: revoked.append(len(ps)))
    static_config = {**config, "group.instance.id": "static-1", "session.timeout.ms": 30000}
    static = confluent_kafka.Consumer(static_config)
    static.subscribe([topic])
    try:

        def stable_with_both() -> bool:
            other.poll(0.1)
            static.poll(0.1)
            # Both clients must have taken their assignment too, not only the coordinator:
            # librdkafka 2.16 closed between its SyncGroup answer and the poll that hands the
            # assignment to the application never returns from close() (6 of 15 runs alone did).
            if not (other.assignment() and static.assignment()):
                return False
            found = described_assignments(cluster, group)
            return len(found) == 2 and owned_once(found, 2)

        wait_until(stable_with_both, timeout_s=60, message="two members sharing two partitions")
        before = described_assignments(cluster, group)
        revoked.clear()
        static.close()  # a static member sends no LeaveGroup (KIP-345): its seat is kept
        static = confluent_kafka.Consumer(static_config)
        static.subscribe([topic])
        wait_until(lambda: static.poll(0.1) is None and static.assignment(), timeout_s=30,
                   message="the static member should get its partition back")  # fmt: skip
        for _ in range(10):
            other.poll(0.1)
        after = described_assignments(cluster, group)
        assert sorted(after.values(), key=sorted) == sorted(before.values(), key=sorted)
        assert revoked == [], "the other member went through a rebalance"
    finally:
        static.close()
        other.close()


# -- bad input: Kafka's error codes, the group intact ----------------------------------------

INCONSISTENT_GROUP_PROTOCOL, ILLEGAL_GENERATION, UNKNOWN_TOPIC_OR_PARTITION = 23, 22, 3
INVALID_REQUEST = 42
COORDINATOR_NOT_READY = (14, 15, 16)  # load in progress, not available, not coordinator


def test_bad_group_requests_get_kafka_error_codes_and_the_group_stays(cluster):
    from localcluster.protocol import messages
    from localcluster.protocol.api import ApiKey
    from tests.raw_connection import RawConnection

    group = "bad-input"
    first = RawConnection(cluster[0].port)

    def ask(raw, api_key, version, body):
        correlation_id = raw.send(api_key, version, messages.encode_request(api_key, version, body))
        return messages.decode_response(
            api_key, version, *raw.recv(api_key, version, correlation_id)
        )

    def join(raw, protocols, metadata=b""):
        return ask(raw, ApiKey.JOIN_GROUP, 3, {
            "group_id": group, "session_timeout": 10_000, "rebalance_timeout": 10_000,
            "member_id": "", "protocol_type": "consumer",
            "protocols": [{"name": p, "metadata": metadata} for p in protocols]})  # fmt: skip

    def coordinator_answering_join():
        """The coordinator's connection and its answer to a JoinGroup without protocols, once
        it is ready. On a fresh cluster the first FindCoordinator creates the offsets topic,
        and the broker it names may not have taken the leadership yet (NOT_COORDINATOR) or
        may still be loading (COORDINATOR_LOAD_IN_PROGRESS): a client asks again, so do we."""
        found = ask(first, ApiKey.FIND_COORDINATOR, 1, {"key": group, "key_type": 0})
        if found.error_code != 0:
            return None
        raw = RawConnection(found.port)
        answer = join(raw, [])
        if answer.error_code in COORDINATOR_NOT_READY:
            raw.close()
            return None
        return raw, answer

    try:
        raw, answer = wait_until(coordinator_answering_join, timeout_s=30, interval_s=0.05)
        try:
            assert answer.error_code == INCONSISTENT_GROUP_PROTOCOL
            assert join(raw, ["range"], b"x" * (2 << 20)).error_code == INVALID_REQUEST
            joined = join(raw, ["range"])
            assert joined.error_code == 0 and joined.generation_id == 1
            synced = ask(raw, ApiKey.SYNC_GROUP, 2, {
                "group_id": group, "generation_id": 1, "member_id": joined.member_id,
                "assignments": [{"member_id": joined.member_id, "assignment": b""}]})  # fmt: skip
            assert synced.error_code == 0
            beat = ask(raw, ApiKey.HEARTBEAT, 2, {"group_id": group, "generation_id": 5,
                                                  "member_id": joined.member_id})  # fmt: skip
            assert beat.error_code == ILLEGAL_GENERATION
            committed = ask(raw, ApiKey.OFFSET_COMMIT, 5, {
                "group_id": group, "generation_id_or_member_epoch": 1, "member_id": joined.member_id,
                "topics": [{"name": "no-such-topic", "partitions": [
                    {"partition_index": 0, "committed_offset": 7}]}]})  # fmt: skip
            assert committed.topics[0].partitions[0].error_code == UNKNOWN_TOPIC_OR_PARTITION
            beat = ask(raw, ApiKey.HEARTBEAT, 2, {"group_id": group, "generation_id": 1,
                                                  "member_id": joined.member_id})  # fmt: skip
            assert beat.error_code == 0, "the member should still be in its generation"
        finally:
            raw.close()
    finally:
        first.close()
