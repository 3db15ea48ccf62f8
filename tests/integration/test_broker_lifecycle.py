"""A broker process starts, serves, shuts down cleanly on SIGTERM, and recovers after SIGKILL."""

from __future__ import annotations

import subprocess
import sys

from confluent_kafka import Consumer, Producer, TopicPartition

from localcluster.storage import read_partition_offsets


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1})
    failures = []
    for v in values:
        producer.produce(topic, v, partition=0, on_delivery=lambda e, m: e and failures.append(e))
    assert producer.flush(20) == 0
    assert not failures


def consume_all(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    out = []
    try:
        while len(out) < count:
            message = consumer.poll(10)
            assert message is not None, f"only {len(out)} of {count} records came back"
            assert not message.error(), message.error()
            out.append(message.value())
    finally:
        consumer.close()
    return out


def test_sigterm_is_a_clean_shutdown_and_data_survives_a_restart(brokers):
    broker = brokers.start(1)
    values = [f"value-{i}".encode() for i in range(200)]
    produce(broker.bootstrap, "t", values)
    assert broker.stop() == 0
    assert "stopped cleanly" in broker.log_text()
    hw = read_partition_offsets(brokers.cluster_dir / "broker-1" / "replication-offset-checkpoint")
    assert hw[("t", 0)] == 200
    assert (broker.data_dir / "t-0" / "clean-shutdown").exists()
    brokers.restart(broker)
    assert consume_all(broker.bootstrap, "t", 200) == values


def test_sigkill_then_restart_keeps_every_acknowledged_record(brokers):
    broker = brokers.start(1)
    values = [f"value-{i}".encode() for i in range(500)]
    produce(broker.bootstrap, "k", values)
    broker.kill()
    brokers.restart(broker)
    assert consume_all(broker.bootstrap, "k", 500) == values
    produce(broker.bootstrap, "k", [b"after"])
    assert consume_all(broker.bootstrap, "k", 501)[-1] == b"after"


def test_a_second_broker_with_the_same_id_refuses_to_start(brokers):
    broker = brokers.start(1)
    result = subprocess.run(
        [sys.executable, "-m", "localcluster.broker", "--id", "1", "--cluster-dir",
         str(brokers.cluster_dir), "--set", f"log.dirs={brokers.cluster_dir}/other"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 1
    assert "already registered" in result.stderr and str(broker.pid) in result.stderr
    assert broker.is_alive()


def test_a_bad_setting_is_a_usage_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "localcluster.broker", "--id", "1", "--cluster-dir", str(tmp_path),
         "--set", "min.insync.replicas=two"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2
    assert "min.insync.replicas='two': expected an integer" in result.stderr


def test_a_broker_paused_past_its_session_timeout_registers_again(brokers):
    import os
    import signal

    from localcluster import coord
    from localcluster.cluster import stop_and_wait
    from localcluster.coord import paths
    from localcluster.coord.file_store import lock_held
    from tests.helpers import wait_until

    brokers.start(1, zookeeper_session_timeout_ms=1000)
    paused = brokers.start(2, zookeeper_session_timeout_ms=1000)
    store = coord.connect(str(brokers.cluster_dir / "store"))
    try:
        # stopped inside the store's lock it would stop us too, and nobody would resume it
        with lock_held(str(brokers.cluster_dir / "store")):
            stop_and_wait(paused.pid)  # every thread stopped before the lock is released
        try:
            wait_until(lambda: store.exists(paths.broker_path(2)) is None, timeout_s=10,
                       message="the paused broker's session expires")  # fmt: skip
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        wait_until(lambda: store.exists(paths.broker_path(2)) is not None, timeout_s=10,
                   message="the broker registers again with a new session")  # fmt: skip
        # its output reaches us through a reader thread: the line may follow the znode
        wait_until(lambda: "registering again" in paused.log_text(), timeout_s=10,
                   message="the broker's log says it registers again")  # fmt: skip
        assert paused.is_alive()
    finally:
        store.stop()
