"""Replication with real broker processes: HW, ISR, the commit path, truncation, KIP-101/279.

The test plays the controller (tests/replication.py): it writes partition state znodes and
sends LeaderAndIsr, as the controller will.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.brokers import pause
from tests.helpers import wait_until
from tests.replication import TestController, log_bytes_below, log_end_offset, record_values

TOPIC = "r"


@pytest.fixture
def cluster(brokers):
    started = {}

    def start(ids, **settings):
        for i in ids:  # no broker runs a controller: the test plays it
            started[i] = brokers.start(i, controller_eligible="false", **settings)
        return controller

    controller = TestController(brokers.cluster_dir, started)
    controller.start = start
    controller.brokers_set = brokers
    try:
        yield controller
    finally:
        controller.close()


def produce(bootstrap: str, values, acks="all", retries=0, timeout_ms=10_000) -> list:
    """Produce to partition 0; returns the delivery errors (None for each success)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 1,
                         "message.send.max.retries": retries, "request.timeout.ms": timeout_ms,
                         "message.timeout.ms": timeout_ms + 5000})  # fmt: skip
    results = []
    for v in values:
        producer.produce(TOPIC, v, partition=0, on_delivery=lambda e, m: results.append(e))
    assert producer.flush(timeout_ms / 1000 + 10) == 0
    return results


def high_watermark(bootstrap: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)[1]
    finally:
        consumer.close()


def data_dir(controller, broker_id):
    return controller.brokers[broker_id].data_dir / f"{TOPIC}-0"


def isr(controller) -> list[int]:
    return list(controller.state(TOPIC)[0].isr)


def test_leader_and_two_followers_replicate_and_the_hw_waits_for_every_isr_member(cluster):
    c = cluster.start([1, 2, 3], replica_lag_time_max_ms=60_000)
    c.create_topic(TOPIC, (1, 2, 3))
    c.elect(TOPIC, leader=1, leader_epoch=1, isr=[1, 2, 3], replicas=[1, 2, 3])
    leader = c.brokers[1].bootstrap
    assert produce(leader, [f"v{i}".encode() for i in range(500)]) == [None] * 500
    assert high_watermark(leader) == 500
    wait_until(lambda: all(log_end_offset(data_dir(c, b)) == 500 for b in (1, 2, 3)))
    reference = log_bytes_below(data_dir(c, 1), 500)
    assert all(log_bytes_below(data_dir(c, b), 500) == reference for b in (2, 3))

    pause(c.brokers[3])  # still in the ISR (lag time 60 s), not fetching
    try:
        assert produce(leader, [b"late"], acks="1") == [None]
        wait_until(lambda: log_end_offset(data_dir(c, 2)) == 501)
        assert high_watermark(leader) == 500  # broker 3 has not got offset 500
    finally:
        os.kill(c.brokers[3].pid, signal.SIGCONT)
    wait_until(lambda: high_watermark(leader) == 501, timeout_s=10)
    assert record_values(data_dir(c, 3))[-1] == b"late"


def test_a_stopped_follower_leaves_the_isr_and_rejoins_after_catching_up(cluster):
    c = cluster.start([1, 2, 3], replica_lag_time_max_ms=1000)
    c.create_topic(TOPIC, (1, 2, 3))
    c.elect(TOPIC, leader=1, leader_epoch=1, isr=[1, 2, 3], replicas=[1, 2, 3])
    pause(c.brokers[3])
    try:
        wait_until(lambda: isr(c) == [1, 2], timeout_s=10, message="ISR shrinks to [1, 2]")
        assert produce(c.brokers[1].bootstrap, [b"x"] * 50) == [None] * 50  # commits without 3
    finally:
        os.kill(c.brokers[3].pid, signal.SIGCONT)
    wait_until(lambda: isr(c) == [1, 2, 3], timeout_s=10, message="ISR expands back")
    assert log_end_offset(data_dir(c, 3)) == 50
    # Each ISR write lands in one transaction with an /isr_change_notification naming it.
    assert len(c.coord.get_children("/isr_change_notification")) >= 2
    state, _ = c.state(TOPIC)
    assert (state.leader, state.leader_epoch) == (1, 1)  # ISR changes keep leader and epoch


def test_idle_followers_stay_in_the_isr_while_their_fetch_sessions_name_nothing(cluster):
    # An incremental fetch names only what changed and the leader reads only that: an idle
    # partition's followers are counted caught up by their sessions' fetches (Kafka records a
    # caught-up time on every fetch), for many times replica.lag.time.max.ms. The fetches'
    # long poll is well inside the lag time: at Kafka's allowed maximum (equal to it) an idle
    # follower's next fetch lands just after the lag time, and a shrink check in between
    # drops it, in Kafka as here.
    c = cluster.start([1, 2, 3], replica_lag_time_max_ms=500, replica_fetch_wait_max_ms=100)
    c.create_topic(TOPIC, (1, 2, 3))
    c.elect(TOPIC, leader=1, leader_epoch=1, isr=[1, 2, 3], replicas=[1, 2, 3])
    assert produce(c.brokers[1].bootstrap, [b"x"] * 5) == [None] * 5
    watched_until = time.monotonic() + 3.0  # six lag periods of nothing
    while time.monotonic() < watched_until:
        assert isr(c) == [1, 2, 3]
        time.sleep(0.1)
    assert produce(c.brokers[1].bootstrap, [b"y"] * 5) == [None] * 5
    assert high_watermark(c.brokers[1].bootstrap) == 10
    assert isr(c) == [1, 2, 3]


def test_acks_all_honours_min_insync_replicas(cluster):
    c = cluster.start([1, 2], replica_lag_time_max_ms=1500)
    c.create_topic(TOPIC, (1, 2), {"min.insync.replicas": "2"})
    c.elect(TOPIC, leader=1, leader_epoch=1, isr=[1, 2], replicas=[1, 2])
    leader = c.brokers[1].bootstrap
    assert produce(leader, [b"a"]) == [None]
    pause(c.brokers[2])
    try:
        # Appended while 2 is still in the ISR, then 2 drops out: the HW passes the record
        # with one replica in sync, so the producer hears NOT_ENOUGH_REPLICAS_AFTER_APPEND.
        errors = produce(leader, [b"b"], timeout_ms=20_000)
        assert (
            errors[0] is not None
            and errors[0].code() == KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        )
        wait_until(lambda: isr(c) == [1])
        errors = produce(leader, [b"c"])
        assert errors[0] is not None and errors[0].code() == KafkaError.NOT_ENOUGH_REPLICAS
        assert produce(leader, [b"d"], acks="1") == [None]  # acks=1 ignores the ISR size
    finally:
        os.kill(c.brokers[2].pid, signal.SIGCONT)
    wait_until(lambda: isr(c) == [1, 2], timeout_s=10)
    assert produce(leader, [b"e"]) == [None]
    assert record_values(data_dir(c, 1)) == [b"a", b"b", b"d", b"e"]  # "c" was never appended


@pytest.mark.parametrize("protocol", ["leader-epoch", "hw-truncation"])
def test_a_killed_follower_truncates_and_catches_up_byte_identically(cluster, protocol):
    c = cluster.start([1, 2, 3], replica_lag_time_max_ms=1000, replication_protocol=protocol)
    c.create_topic(TOPIC, (1, 2, 3))
    c.elect(TOPIC, leader=1, leader_epoch=1, isr=[1, 2, 3], replicas=[1, 2, 3])
    leader = c.brokers[1].bootstrap
    assert produce(leader, [f"a{i}".encode() for i in range(300)]) == [None] * 300
    c.brokers[3].kill()
    assert produce(leader, [f"b{i}".encode() for i in range(300)]) == [None] * 300
    c.brokers_set.restart(c.brokers[3])
    state, _ = c.state(TOPIC)
    c.elect(TOPIC, leader=1, leader_epoch=1, isr=state.isr, replicas=[1, 2, 3], send_to=[3])
    wait_until(lambda: log_end_offset(data_dir(c, 3)) == 600, timeout_s=15)
    assert log_bytes_below(data_dir(c, 3), 600) == log_bytes_below(data_dir(c, 1), 600)
    wait_until(lambda: isr(c) == [1, 2, 3], timeout_s=10)


@pytest.mark.parametrize("protocol, lost", [("hw-truncation", True), ("leader-epoch", False)])
def test_kip_101_scenario_1_stale_hw_truncation_loses_a_committed_record(cluster, protocol, lost):
    """A follower restarts with a HW one fetch behind the leader's, truncates to it, and is
    elected when the leader dies: in hw-truncation mode the committed m2 is gone."""
    settings = dict(replication_protocol=protocol, replica_lag_time_max_ms=60_000,
                    replica_fetch_wait_max_ms=20_000,  # the response carrying HW 2 waits
                    replica_high_watermark_checkpoint_interval_ms=20)  # fmt: skip
    c = cluster.start([1, 2], **settings)
    follower, leader = 2, 1
    c.create_topic(TOPIC, (leader, follower))
    c.elect(TOPIC, leader=leader, leader_epoch=1, isr=[1, 2], replicas=[1, 2])
    bootstrap = c.brokers[leader].bootstrap
    assert produce(bootstrap, [b"m1"]) == [None]
    assert produce(bootstrap, [b"m2"]) == [None]  # committed: HW 2 on the leader
    # The follower's in-memory HW is 1 until its parked fetch returns (20 s): kill it now.
    wait_until(lambda: _checkpointed_hw(c, follower) == 1, message="follower checkpointed HW 1")
    c.brokers[follower].kill()
    c.brokers_set.restart(c.brokers[follower])
    pause(c.brokers[leader])  # the follower cannot refetch m2
    try:
        c.elect(
            TOPIC, leader=leader, leader_epoch=1, isr=[1, 2], replicas=[1, 2], send_to=[follower]
        )
        if protocol == "hw-truncation":
            wait_until(lambda: log_end_offset(data_dir(c, follower)) == 1)
    finally:
        c.brokers[leader].kill()
    c.elect(
        TOPIC, leader=follower, leader_epoch=2, isr=[follower], replicas=[1, 2], send_to=[follower]
    )
    values = record_values(data_dir(c, follower))
    wait_until(lambda: high_watermark(c.brokers[follower].bootstrap) == len(values))
    assert values == ([b"m1"] if lost else [b"m1", b"m2"])


def _checkpointed_hw(c, broker_id) -> int | None:
    path = c.brokers_set.cluster_dir / f"broker-{broker_id}" / "replication-offset-checkpoint"
    try:
        lines = path.read_text().split("\n")
    except FileNotFoundError:
        return None
    for line in lines[2:]:
        fields = line.split(" ")
        if fields[:2] == [TOPIC, "0"]:
            return int(fields[2])
    return None


@pytest.mark.parametrize("protocol, diverges", [("hw-truncation", True), ("leader-epoch", False)])
def test_kip_279_fast_leader_changes_diverge_only_with_hw_truncation(cluster, protocol, diverges):
    """A leads epoch 1 and keeps an unreplicated batch; B leads epoch 2 and writes another at
    the same offset; A leads again in epoch 3 before truncating. B then follows A."""
    c = cluster.start([1, 2], replication_protocol=protocol, replica_lag_time_max_ms=60_000)
    a, b = 1, 2
    c.create_topic(TOPIC, (a, b))
    c.elect(TOPIC, leader=a, leader_epoch=1, isr=[a, b], replicas=[a, b])
    assert produce(c.brokers[a].bootstrap, [b"x1"]) == [None]  # on both
    wait_until(lambda: log_end_offset(data_dir(c, b)) == 1)
    c.brokers[b].kill()  # (a SIGSTOP would not do: A's parked fetch response may hold x2)
    assert produce(c.brokers[a].bootstrap, [b"x2"], acks="1") == [None]  # on A only
    c.brokers[a].kill()
    c.brokers_set.restart(c.brokers[b])
    c.elect(TOPIC, leader=b, leader_epoch=2, isr=[b], replicas=[a, b], send_to=[b])
    assert produce(c.brokers[b].bootstrap, [b"y2"], acks="1") == [None]  # offset 1 on B
    c.brokers_set.restart(c.brokers[a])
    c.elect(TOPIC, leader=a, leader_epoch=3, isr=[a], replicas=[a, b], send_to=[a])
    assert produce(c.brokers[a].bootstrap, [b"z3"], acks="1") == [None]  # offset 2 on A
    c.elect(TOPIC, leader=a, leader_epoch=3, isr=[a], replicas=[a, b], send_to=[b])
    wait_until(lambda: log_end_offset(data_dir(c, b)) == 3, timeout_s=15)
    a_values, b_values = record_values(data_dir(c, a)), record_values(data_dir(c, b))
    assert a_values == [b"x1", b"x2", b"z3"]
    if diverges:
        assert b_values == [b"x1", b"y2", b"z3"]  # offset 1 differs between the replicas
    else:
        assert log_bytes_below(data_dir(c, b), 3) == log_bytes_below(data_dir(c, a), 3)


def test_stale_leader_and_isr_is_rejected_and_changes_nothing(cluster):
    from localcluster.protocol.controller_requests import LeaderAndIsrRequest, PartitionState

    c = cluster.start([1, 2])
    c.create_topic(TOPIC, (1, 2))
    c.elect(TOPIC, leader=1, leader_epoch=5, isr=[1, 2], replicas=[1, 2])
    _, version = c.state(TOPIC)

    def request(controller_epoch, leader_epoch):
        return LeaderAndIsrRequest(0, controller_epoch, (PartitionState(
            TOPIC, 0, controller_epoch, 2, leader_epoch, (1, 2), version, (1, 2)),))  # fmt: skip

    response = c.leader_and_isr(1, request(1, 4))  # an older leader epoch
    assert response.error_code == 0 and response.partitions == ((TOPIC, 0, 11),)
    assert produce(c.brokers[1].bootstrap, [b"still leader"]) == [None]
    response = c.leader_and_isr(1, request(0, 6))  # an older controller epoch
    assert response.error_code == 11  # STALE_CONTROLLER_EPOCH
    assert produce(c.brokers[1].bootstrap, [b"and still"]) == [None]
    assert record_values(data_dir(c, 1)) == [b"still leader", b"and still"]


def test_stop_replica_with_delete_removes_the_log(cluster):
    from localcluster.protocol.controller_requests import StopReplicaRequest

    c = cluster.start([1, 2])
    c.create_topic(TOPIC, (1, 2))
    c.elect(TOPIC, leader=1, leader_epoch=1, isr=[1, 2], replicas=[1, 2])
    assert produce(c.brokers[1].bootstrap, [b"v"]) == [None]
    wait_until(lambda: log_end_offset(data_dir(c, 2)) == 1)
    response = c.stop_replica(2, StopReplicaRequest(0, 1, False, ((TOPIC, 0),)))
    assert response.partitions == ((TOPIC, 0, 0),)
    assert data_dir(c, 2).exists()
    response = c.stop_replica(2, StopReplicaRequest(0, 1, True, ((TOPIC, 0),)))
    assert response.partitions == ((TOPIC, 0, 0),)
    wait_until(lambda: not data_dir(c, 2).exists())
    assert json.loads(c.coord.get(f"/brokers/topics/{TOPIC}")[0])["partitions"]["0"] == [1, 2]
