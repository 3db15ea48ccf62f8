"""A full log filesystem with real brokers and a real client: an error, never a signal (issue 18).

Three brokers keep their logs on one small tmpfs of the test's own; a filler file takes part of
it first. confluent-kafka produces (acks=all, no retries, so every delivery report is the
broker's first answer) until the filesystem is full. Then:
- no broker died, none by a signal;
- the client got KAFKA_STORAGE_ERROR (librdkafka: "Broker: Disk error when trying to access
  log file on disk") where the leader could not append; where the leader appended and its
  followers could not, the produce timed out instead (the broker's REQUEST_TIMED_OUT, or
  librdkafka's own request timeout, which is the same request.timeout.ms). Nothing else;
- a record answered KAFKA_STORAGE_ERROR is in no log (nothing of it was written); every
  acknowledged record is read back at its offset, already while the filesystem is full; a
  timed-out one is read back once space returns (the leader had it; followers catch up);
- the brokers' logs name the directory and its free bytes, the leader's and the followers';
then the filler is deleted and the same producer succeeds again.

The ISR stays whole (replica.lag.time.max.ms is long), so NOT_ENOUGH_REPLICAS cannot occur and
the allowed answers are exactly the ones above. Needs root (mount); skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers import wait_until

TOPIC = "full"
PARTITIONS = 3
MOUNT_SIZE = "48m"
FILLER_BYTES = 16 << 20
SEGMENT_BYTES = 2 << 20  # each partition holds ~3.5 MiB when full: every one rolls
VALUE_BYTES = 1000
ROUND_RECORDS = 300
MAX_ROUNDS = 200
FILL_DEADLINE_S = 150
ROUNDS_WHILE_FULL = 3  # after the first storage error: the full state goes on for a while
REQUEST_TIMEOUT_MS = 3000
QUIET = {"log_level": 3}

STORAGE = KafkaError.KAFKA_STORAGE_ERROR
TIMEOUTS = {KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT}


@pytest.fixture
def log_tmpfs(brokers, tmp_path):
    """A tmpfs for the brokers' log dirs; brokers are killed before it is unmounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "logs"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={MOUNT_SIZE}", "tmpfs",
                              str(mount_point)], capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        brokers.cleanup()  # nothing may hold files there any more
        if subprocess.run(["umount", str(mount_point)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def start_cluster(brokers, mount_point: Path) -> list:
    started = [brokers.start(i, log_dirs=str(mount_point / f"broker-{i}"),
                             log_segment_bytes=SEGMENT_BYTES, replica_lag_time_max_ms=60_000)
               for i in (1, 2, 3)]  # fmt: skip
    bootstrap = ",".join(b.bootstrap for b in started)
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    future = admin.create_topics(
        [NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})]
    )[TOPIC]
    assert future.result(30) is None
    return started


class Producing:
    """Rounds of acks=all produces; every delivery report, by value."""

    def __init__(self, bootstrap: str):
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
            "enable.idempotence": False, "message.send.max.retries": 0,
            "request.timeout.ms": REQUEST_TIMEOUT_MS, "message.timeout.ms": 30_000, **QUIET,
        })  # fmt: skip
        self.acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.failed: dict[bytes, KafkaError] = {}
        self.sent = 0

    def round(self) -> dict[int, int]:
        """Produce one round and wait for every report; {error code: count} of this round."""
        codes: dict[int, int] = {}

        def report(error, message):
            if error is None:
                self.acked[message.value()] = (message.partition(), message.offset())
            else:
                self.failed[message.value()] = error
                codes[error.code()] = codes.get(error.code(), 0) + 1

        for _ in range(ROUND_RECORDS):
            value = b"%08d" % self.sent + b"." * (VALUE_BYTES - 8)
            self.producer.produce(TOPIC, value, partition=self.sent % PARTITIONS,
                                  on_delivery=report)  # fmt: skip
            self.sent += 1
        assert self.producer.flush(40) == 0, "reports still missing after 40 s"
        return codes

    def with_code(self, codes: set[int]) -> set[bytes]:
        return {v for v, e in self.failed.items() if e.code() in codes}


def read_all(bootstrap: str) -> dict[bytes, tuple[int, int]]:
    """Every record a consumer sees (up to each high watermark): value -> (partition, offset)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "disk-full-check",
                         "enable.auto.commit": False, "enable.partition.eof": True, **QUIET})  # fmt: skip
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen: dict[bytes, tuple[int, int]] = {}
    eof: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while eof != set(range(PARTITIONS)):
            assert time.monotonic() < deadline, f"EOF only on {sorted(eof)} after 30 s"
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                eof.add(m.partition())
                continue
            assert m.value() not in seen, f"{m.value()[:8]!r} read twice"
            seen[m.value()] = (m.partition(), m.offset())
    finally:
        consumer.close()
    return seen


def high_watermarks(bootstrap: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "disk-full-hw", **QUIET})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
                for p in range(PARTITIONS)]  # fmt: skip
    finally:
        consumer.close()


def assert_all_alive(started) -> None:
    for b in started:
        code = b.process.poll()
        assert code is None, (f"broker {b.broker_id} exited with {code} (negative: a signal)\n"
                              + "".join(b.log_text().splitlines(True)[-30:]))  # fmt: skip


def test_a_full_log_filesystem_answers_storage_errors_loses_nothing_and_recovers(brokers,
                                                                                log_tmpfs):  # fmt: skip
    filler = log_tmpfs / "filler"
    filler.write_bytes(b"\1" * FILLER_BYTES)  # freed later: the space that "returns"
    started = start_cluster(brokers, log_tmpfs)
    bootstrap = ",".join(b.bootstrap for b in started)
    producing = Producing(bootstrap)

    # Fill the filesystem, bounded in rounds and time.
    deadline = time.monotonic() + FILL_DEADLINE_S
    full_rounds = 0
    for _ in range(MAX_ROUNDS):
        codes = producing.round()
        assert_all_alive(started)
        full_rounds += bool(full_rounds or STORAGE in codes)
        if full_rounds > ROUNDS_WHILE_FULL:
            break
        assert time.monotonic() < deadline, f"not full after {FILL_DEADLINE_S} s: {codes}"
    else:
        raise AssertionError(f"no KAFKA_STORAGE_ERROR in {MAX_ROUNDS} rounds")
    assert free_bytes(log_tmpfs) < 4 << 20  # it really is (nearly) full: pages, not a guess

    assert_all_alive(started)
    kinds = {e.code() for e in producing.failed.values()}
    assert kinds <= {STORAGE} | TIMEOUTS, {KafkaError(c).name() for c in kinds}
    refused = producing.with_code({STORAGE})
    timed_out = producing.with_code(TIMEOUTS)
    print(f"\ndisk full: {len(producing.acked)} acknowledged, {len(refused)} KAFKA_STORAGE_ERROR, "
          f"{len(timed_out)} timed out, {free_bytes(log_tmpfs)} bytes free")  # fmt: skip
    assert refused and len(producing.acked) > 5_000
    example = next(e for e in producing.failed.values() if e.code() == STORAGE)
    assert example.str() == "Broker: Disk error when trying to access log file on disk"

    # The brokers say where and how much: the leaders' log line and the followers' one.
    logs = "".join(b.log_text() for b in started)
    assert "no space left for log " + str(log_tmpfs) in logs
    assert "bytes free" in logs and "follower append refused" in logs

    # Still serving while full: every acknowledged record is there, no refused one is.
    seen = read_all(bootstrap)
    assert {v: seen.get(v) for v in producing.acked} == producing.acked
    assert not refused & seen.keys()
    assert seen.keys() <= producing.acked.keys() | timed_out

    # Space returns: the followers catch up, the HW covers what the leaders had, and the
    # same producer succeeds again.
    filler.unlink()
    expected = [sum(1 for v in producing.acked.keys() | timed_out
                    if int(v[:8]) % PARTITIONS == p) for p in range(PARTITIONS)]  # fmt: skip
    wait_until(lambda: high_watermarks(bootstrap) == expected, timeout_s=30,
               message=f"high watermarks reach {expected}")  # fmt: skip
    before = len(producing.failed)
    assert producing.round() == {}
    assert len(producing.failed) == before
    assert_all_alive(started)
    seen = read_all(bootstrap)
    assert {v: seen.get(v) for v in producing.acked} == producing.acked
    assert seen.keys() == producing.acked.keys() | timed_out  # timed out: written, kept
    assert not refused & seen.keys()
    assert any("appends again" in b.log_text() for b in started)
