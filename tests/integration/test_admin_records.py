"""DeleteRecords, DescribeLogDirs, DescribeCluster and the reassignment APIs through
confluent-kafka's AdminClient and kafka-python's KafkaAdminClient (which has the reassignment
APIs; librdkafka has none) and our Admin client, against three real brokers (one cluster for the
module); topic configs segment.ms and message.timestamp.type with real producers and consumers.

DeleteRecords is read back on every replica: each broker's log-start-offset-checkpoint (written
when its start moves, so the followers' show they learnt it), ListOffsets earliest from the
leader and, after the leader is killed, from the new one, and the restarted old leader keeps it.
Reads below it get OFFSET_OUT_OF_RANGE, above the high watermark is OFFSET_OUT_OF_RANGE too."""

from __future__ import annotations

import pytest

from localcluster import coord
from localcluster.coord.kafka_zk import KafkaZkClient
from localcluster.protocol import fetch, messages
from localcluster.protocol.api import ApiKey
from localcluster.protocol.wire import Reader
from localcluster.storage import LOG_START_OFFSET_CHECKPOINT, read_partition_offsets
from tests.brokers import BrokerSet, pause
from tests.helpers import wait_until
from tests.raw_connection import RawConnection

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import ElectionType, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # noqa: E402

kafka = pytest.importorskip("kafka")
OFFSET_OUT_OF_RANGE = 1


class Cluster:
    def __init__(self, brokers: BrokerSet):
        self.set = brokers
        # a long session: the reassignment test stops a broker (SIGSTOP) for a few seconds;
        # a kill -9 is still noticed at once (its lock goes)
        self.brokers = {b: brokers.start(b, replica_fetch_wait_max_ms="100",
                                         zookeeper_session_timeout_ms="30000")
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

    def leader(self, topic: str) -> int:
        found = self.zk.partition_state(topic, 0)
        return found[0].leader if found else -1

    def create(self, topic: str, records: int) -> None:
        futures = self.admin().create_topics([NewTopic(topic, 1, 3, config={
            "segment.bytes": "4096"})], operation_timeout=10)  # fmt: skip
        futures[topic].result(20)
        wait_until(lambda: self.leader(topic) == self.zk.assignment(topic).partitions[0][0],
                   timeout_s=10)  # fmt: skip
        producer = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "acks": "all",
                                             "batch.num.messages": 1, "linger.ms": 0})  # fmt: skip
        for i in range(records):
            producer.produce(topic, b"%04d" % i + b"x" * 200)
        assert producer.flush(20) == 0
        # every replica has every record before the test moves starts
        wait_until(lambda: len(self.zk.partition_state(topic, 0)[0].isr) == 3, timeout_s=10)

    def checkpointed_start(self, broker_id: int, topic: str) -> int | None:
        path = self.set.cluster_dir / f"broker-{broker_id}" / LOG_START_OFFSET_CHECKPOINT
        return read_partition_offsets(path).get((topic, 0)) if path.exists() else None

    def earliest(self, topic: str, timeout_s: float = 20) -> int:
        tp = TopicPartition(topic, 0)
        return self.admin().list_offsets({tp: OffsetSpec.earliest()})[tp].result(timeout_s).offset


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = BrokerSet(tmp_path_factory.mktemp("cluster"))
    try:
        yield Cluster(started)
    finally:
        started.cleanup()


def fetch_error(port: int, topic: str, offset: int) -> int:
    raw = RawConnection(port)
    try:
        body = fetch.write_fetch_request(fetch.FetchRequest(
            -1, 0, 0, 1 << 20, 0, [(topic, [fetch.FetchPartition(0, offset, 1 << 20)])]), 11)  # fmt: skip
        correlation_id = raw.send(ApiKey.FETCH, 11, body)
        data, at = raw.recv(ApiKey.FETCH, 11, correlation_id)
        _, responses = fetch.read_fetch_response(Reader(data, at), 11)
        return responses[0][1][0].error_code
    finally:
        raw.close()


def test_confluent_delete_records_moves_every_replica_and_survives_a_leader_restart(cluster):
    topic = "deleted"
    cluster.create(topic, 60)  # 60 x ~270 bytes: several 4 KiB segments
    tp = TopicPartition(topic, 0)
    result = cluster.admin().delete_records([TopicPartition(topic, 0, 45)])[tp].result(20)
    assert result.low_watermark == 45  # the low watermark: every ISR replica starts there
    for broker_id in cluster.brokers:
        wait_until(lambda b=broker_id: cluster.checkpointed_start(b, topic) == 45, timeout_s=10,
                   message=f"broker {broker_id} should checkpoint the new start")  # fmt: skip
        log_dir = cluster.brokers[broker_id].data_dir / f"{topic}-0"
        bases = sorted(int(p.stem) for p in log_dir.glob("*.log"))
        assert bases[0] < 45 and (len(bases) == 1 or bases[1] > 45), bases
    assert cluster.earliest(topic) == 45
    leader = cluster.brokers[cluster.leader(topic)]
    assert fetch_error(leader.port, topic, 10) == OFFSET_OUT_OF_RANGE
    assert fetch_error(leader.port, topic, 45) == 0
    # kill -9 the leader: the new leader (a follower) starts at 45 too; the old one keeps it
    old = leader.broker_id
    leader.kill()
    wait_until(lambda: cluster.leader(topic) not in (-1, old), timeout_s=15,
               message="a new leader")  # fmt: skip
    new = cluster.brokers[cluster.leader(topic)]
    wait_until(lambda: raw_earliest(new.port, topic) == (0, 45), timeout_s=10,
               message="the new leader should start at 45")  # fmt: skip
    cluster.set.restart(leader)
    wait_until(lambda: len(cluster.zk.partition_state(topic, 0)[0].isr) == 3, timeout_s=15)
    # the old leader was the preferred replica: leading again, its reopened log starts at 45
    assert cluster.zk.assignment(topic).partitions[0][0] == old
    assert cluster.admin().elect_leaders(ElectionType.PREFERRED, [tp]).result(30)[tp] is None
    assert cluster.leader(topic) == old
    # the election is in the store when ElectLeaders answers; the broker leads once its
    # LeaderAndIsr arrives (a moment later on a loaded machine: NOT_LEADER_OR_FOLLOWER until then)
    wait_until(lambda: raw_earliest(leader.port, topic) == (0, 45), timeout_s=10,
               message="the old leader leads again and starts at 45")  # fmt: skip
    assert fetch_error(leader.port, topic, 44) == OFFSET_OUT_OF_RANGE


def raw_earliest(port: int, topic: str) -> tuple[int, int]:
    """ListOffsets earliest sent to one broker: (error code, offset)."""
    raw = RawConnection(port)
    try:
        body = messages.encode_request(ApiKey.LIST_OFFSETS, 5, {"replica_id": -1, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -2,
                                            "current_leader_epoch": -1}]}]})  # fmt: skip
        correlation_id = raw.send(ApiKey.LIST_OFFSETS, 5, body)
        data, at = raw.recv(ApiKey.LIST_OFFSETS, 5, correlation_id)
        (partition,) = (
            messages.decode_response(ApiKey.LIST_OFFSETS, 5, data, at).topics[0].partitions
        )
        return partition.error_code, partition.offset
    finally:
        raw.close()


def test_confluent_delete_records_above_the_high_watermark_is_out_of_range(cluster):
    topic = "above"
    cluster.create(topic, 3)
    tp = TopicPartition(topic, 0)
    future = cluster.admin().delete_records([TopicPartition(topic, 0, 100)])[tp]
    error = future.exception(20)
    assert (
        error is not None and error.args[0].code() == confluent_kafka.KafkaError.OFFSET_OUT_OF_RANGE
    )
    assert cluster.earliest(topic) == 0


def test_kafka_python_delete_records_to_the_high_watermark_and_log_dirs(cluster):
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition as KTopicPartition

    topic = "kp-deleted"
    cluster.create(topic, 20)
    cluster.create("kp-kept", 5)  # a log DescribeLogDirs must size, whatever ran before
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        answers = admin.delete_records({KTopicPartition(topic, 0): -1}, timeout_ms=10_000)
        (answer,) = answers.values()
        assert answer["low_watermark"] == 20, answers
        assert cluster.earliest(topic) == 20
        dirs = admin.describe_log_dirs()
        assert {d["broker"] for d in dirs} == {1, 2, 3}
        for d in dirs:
            (log_dir,) = d["log_dirs"]
            sizes = {(t["name"], p["partition_index"]): p["partition_size"]
                     for t in log_dir["topics"] for p in t["partitions"]}  # fmt: skip
            assert log_dir["error_code"] == 0 and sizes[("kp-kept", 0)] > 0, d
            assert all(not p["is_future_key"] for t in log_dir["topics"] for p in t["partitions"])
    finally:
        admin.close()


def test_confluent_describe_cluster_names_the_real_controller(cluster):
    described = cluster.admin().describe_cluster(request_timeout=20).result(20)
    assert described.controller.id == cluster.zk.controller_id()
    assert sorted(n.id for n in described.nodes) == [1, 2, 3]
    assert described.cluster_id == cluster.zk.cluster_id()
    assert described.authorized_operations is None  # not asked: Kafka's INT32_MIN


def test_log_append_time_is_what_a_real_consumer_sees(cluster):
    import time

    topic = "stamped"
    futures = cluster.admin().create_topics([NewTopic(topic, 1, 3, config={
        "message.timestamp.type": "LogAppendTime"})], operation_timeout=10)  # fmt: skip
    futures[topic].result(20)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    before = int(time.time() * 1000)
    producer.produce(topic, b"old", timestamp=1_000)  # the producer's CreateTime: 1970
    assert producer.flush(20) == 0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap,
                                         "group.id": "stamped", "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        message = wait_until(lambda: consumer.poll(0.5), timeout_s=20, message="the record")
        assert message.error() is None, message.error()
        kind, timestamp = message.timestamp()
        assert kind == confluent_kafka.TIMESTAMP_LOG_APPEND_TIME
        assert before <= timestamp <= int(time.time() * 1000)
    finally:
        consumer.close()


def test_segment_ms_rolls_the_active_segment_at_the_next_append(cluster):
    import time

    topic = "rolled"
    futures = cluster.admin().create_topics([NewTopic(topic, 1, 3, config={
        "segment.ms": "60000"})], operation_timeout=10)  # fmt: skip
    futures[topic].result(20)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                                         "linger.ms": 0})  # fmt: skip
    now = int(time.time() * 1000)
    producer.produce(topic, b"first", timestamp=now - 120_000)  # two minutes old
    assert producer.flush(20) == 0
    producer.produce(topic, b"second", timestamp=now - 90_000)  # 30 s later: same segment
    assert producer.flush(20) == 0
    producer.produce(topic, b"third", timestamp=now)  # 120 s after the first: a new one
    assert producer.flush(20) == 0
    for broker in cluster.brokers.values():  # followers roll their copies the same way
        log_dir = broker.data_dir / f"{topic}-0"
        wait_until(lambda d=log_dir: sorted(int(p.stem) for p in d.glob("*.log")) == [0, 2],
                   timeout_s=10, message=f"{log_dir} should hold segments 0 and 2")  # fmt: skip


def test_kafka_python_reassigns_lists_refuses_and_cancels(cluster):
    import os
    import signal

    from kafka.admin import KafkaAdminClient
    from kafka.errors import (
        InvalidReplicationAssignmentError,
        NoReassignmentInProgressError,
        UnknownTopicOrPartitionError,
    )
    from kafka.structs import TopicPartition as KTopicPartition

    from localcluster.client import Admin

    controller = cluster.zk.controller_id()
    a, b = sorted(set(cluster.brokers) - {controller})
    with Admin(bootstrap_servers=cluster.bootstrap) as ours:
        ours.create_topic("moved", replica_assignment={0: [controller, a]})
        ours.wait_for_leaders("moved")
    tp = KTopicPartition("moved", 0)
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        assert admin.alter_partition_reassignments({tp: [b, controller]}) == {tp: None}
        wait_until(lambda: cluster.zk.assignment("moved").partitions[0] == (b, controller)
                   and not admin.list_partition_reassignments(), timeout_s=20,
                   message="the replicas move and the list empties")  # fmt: skip
        assert admin.alter_partition_reassignments({tp: [b, 9]}) == {
            tp: InvalidReplicationAssignmentError}  # fmt: skip
        nosuch = KTopicPartition("nosuch", 0)
        assert admin.alter_partition_reassignments({nosuch: [b]}) == {
            nosuch: UnknownTopicOrPartitionError}  # fmt: skip
        assert admin.alter_partition_reassignments({tp: None}) == {
            tp: NoReassignmentInProgressError}  # fmt: skip
        # a stopped broker cannot catch up: the reassignment stays under way until cancelled
        pause(cluster.brokers[a])
        try:
            assert admin.alter_partition_reassignments({tp: [b, controller, a]}) == {tp: None}
            ongoing = admin.list_partition_reassignments()
            assert ongoing == {tp: {"replicas": [b, controller, a], "adding_replicas": [a],
                                    "removing_replicas": []}}, ongoing  # fmt: skip
            assert admin.alter_partition_reassignments({tp: None}) == {tp: None}
            wait_until(lambda: cluster.zk.assignment("moved").partitions[0] == (b, controller)
                       and not admin.list_partition_reassignments(), timeout_s=20,
                       message="the cancel restores the original replicas")  # fmt: skip
        finally:
            os.killpg(cluster.brokers[a].pid, signal.SIGCONT)
    finally:
        admin.close()
