"""Producer state after kill -9: what each replica recovers equals what its log alone says.

Three brokers, a topic of 2 partitions with replication factor 3 (min.insync.replicas 2) and
64 KiB segments, so producer snapshots are written at segment rolls while the load runs. Three
idempotent producers (two of our client, one kafka-python 3 with its defaults) write to both
partitions; mid-stream a broker is killed -9 (the leader of partition 0, or a broker that only
follows), the producers go on, and the broker is restarted and catches up. Then:

- every broker is killed -9, and each replica's partition directory is opened twice, in copies,
  by the broker's own LogManager: as the crash left it (newest snapshot + replay of the log
  after it) and with every snapshot deleted (the log alone). Both equal, per producer id, the
  epoch, last sequence and last offset of that producer's last batch in the log (a plain scan),
  and the three replicas agree; DescribeProducers, asked before the kill, said the same;
- the brokers are restarted on their own directories with the snapshots deleted on one,
  replaced by garbage on another and kept on the third: each says so in its log (the state is
  rebuilt from the log), none crashes, and DescribeProducers answers as before.

The storage-level rules (which snapshot is used, a corrupt one is deleted and the next tried)
are tests/unit/test_producer_state.py's; this checks them through real processes and kill -9.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from localcluster.broker.log_manager import LogManager
from localcluster.client import Admin, Producer
from localcluster.storage import LogConfig
from localcluster.storage.producer_snapshot import list_snapshots
from localcluster.storage.producer_state import last_sequence
from tests.helpers import scan_log, wait_until

TOPIC = "recovery"
PARTITIONS = 2
SEGMENT_BYTES = 64 << 10
RECORDS_PER_PRODUCER = 3000
KILL_AFTER_ACKED = 2500  # of all producers together: mid-stream
# Partition 0 led by broker 1, partition 1 by broker 2; broker 3 only follows.
ASSIGNMENT = {0: [1, 2, 3], 1: [2, 3, 1]}


def start_cluster(brokers):
    started = {b: brokers.start(b, replica_lag_time_max_ms="3000") for b in (1, 2, 3)}
    admin = Admin(bootstrap_servers=started[1].bootstrap)
    try:
        admin.create_topic(TOPIC, config={"min.insync.replicas": "2",
                                          "segment.bytes": str(SEGMENT_BYTES)},
                           replica_assignment=ASSIGNMENT)  # fmt: skip
        admin.wait_for_leaders(TOPIC, 30)
    finally:
        admin.close()
    return started


def describe(started):
    admin = Admin(bootstrap_servers=",".join(b.bootstrap for b in started.values() if b.is_alive()))
    try:
        return admin.describe_topic(TOPIC).partitions
    finally:
        admin.close()


def describe_producers(started) -> dict[int, set[tuple[int, int, int]]]:
    """{partition: {(producer id, epoch, last sequence)}} from the leaders (DescribeProducers)."""
    admin = Admin(bootstrap_servers=",".join(b.bootstrap for b in started.values() if b.is_alive()))
    try:
        answer = admin.describe_producers(TOPIC)
    finally:
        admin.close()
    return {p: {(a["producer_id"], a["producer_epoch"], a["last_sequence"]) for a in active}
            for p, active in answer.items()}  # fmt: skip


def full_isrs(started) -> bool:
    try:
        return all(p.leader >= 0 and len(p.isr) == 3 for p in describe(started))
    except Exception:  # a broker still starting: ask again
        return False


# -- the load -------------------------------------------------------------------------------


class Load:
    """Each producer in a thread, sending RECORDS_PER_PRODUCER records round robin over the
    partitions; `acked` counts acknowledgements of all of them together."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self.acked = 0
        self.failed: list[str] = []
        self.producer_ids: list[int] = []
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._own, args=(f"own-{i}",), daemon=True)
                        for i in range(2)]  # fmt: skip
        self.threads.append(threading.Thread(target=self._kafka_python, daemon=True))

    def start(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            assert not thread.is_alive(), "a producer did not finish"

    def _done(self, ok: bool, what: str) -> None:
        with self._lock:
            if ok:
                self.acked += 1
            else:
                self.failed.append(what)

    def _own(self, name: str) -> None:
        with Producer(bootstrap_servers=self.bootstrap) as producer:  # idempotent by default
            futures = []
            for i in range(RECORDS_PER_PRODUCER):
                future = producer.send(TOPIC, f"{name}-{i:06d}".encode(), partition=i % PARTITIONS)
                future.add_done_callback(
                    lambda f: self._done(f.exception() is None, repr(f.exception()))
                )
                futures.append(future)
                if i % 50 == 49:
                    futures[-50].result(60)  # a steady stream, not one burst
            producer.flush(60)
            assert producer.idempotent
            self.producer_ids.append(producer.producer_id_and_epoch[0])

    def _kafka_python(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap)  # defaults: idempotent, acks=all
        try:
            futures = []
            for i in range(RECORDS_PER_PRODUCER):
                future = producer.send(TOPIC, f"kp-{i:06d}".encode(), partition=i % PARTITIONS)
                future.add_callback(lambda _: self._done(True, ""))
                future.add_errback(lambda e: self._done(False, repr(e)))
                futures.append(future)
                if i % 50 == 49:
                    futures[-50].get(60)
            producer.flush(60)
        finally:
            producer.close(5)


# -- what a replica's directory recovers ---------------------------------------------------


Summary = dict[int, tuple[int, int, int]]  # producer id -> (epoch, last sequence, last offset)


def recovered(data_dir: Path, into: Path, delete_snapshots: bool) -> tuple[dict, dict, dict, dict]:
    """Open a copy of `data_dir` with the broker's LogManager: per partition its producer
    summary, the snapshots it started from and its log end offset."""
    shutil.copytree(data_dir, into)
    snapshots = {}
    for p in range(PARTITIONS):
        directory = into / f"{TOPIC}-{p}"
        if delete_snapshots:
            for path in directory.glob("*.snapshot"):
                path.unlink()
        snapshots[p] = list_snapshots(directory)
    manager = LogManager(into, into / "checkpoints", lambda _: LogConfig(segment_bytes=SEGMENT_BYTES),
                         lambda: int(time.time() * 1000))  # fmt: skip
    manager.open_logs()
    try:
        summaries = {p: {pid: (e.producer_epoch, e.last_seq, e.last_data_offset)
                         for pid, e in manager.producer_states[(TOPIC, p)].state.producers.items()}
                     for p in range(PARTITIONS)}  # fmt: skip
        ends = {p: manager.logs[(TOPIC, p)].log_end_offset for p in range(PARTITIONS)}
        oracle = {p: scanned(manager.logs[(TOPIC, p)]) for p in range(PARTITIONS)}
    finally:
        manager.close({})
    return summaries, snapshots, ends, oracle


def scanned(lg) -> Summary:
    """Each producer's last batch in the log, by a plain scan of every batch: the oracle."""
    out: Summary = {}
    for _, _, header, _ in scan_log(lg):
        if header.producer_id >= 0:
            out[header.producer_id] = (header.producer_epoch, last_sequence(header),
                                       header.last_offset)  # fmt: skip
    return out


@pytest.mark.parametrize("victim_role", ["leader", "follower"])
def test_recovered_producer_state_equals_the_state_rebuilt_from_the_log(brokers, tmp_path,
                                                                       victim_role):  # fmt: skip
    started = start_cluster(brokers)
    bootstrap = ",".join(b.bootstrap for b in started.values())
    victim = started[1 if victim_role == "leader" else 3]  # broker 3 leads no partition

    load = Load(bootstrap).start()
    wait_until(
        lambda: load.acked >= KILL_AFTER_ACKED or load.failed, 60, message="acks before the kill"
    )
    victim.kill()
    load.join(120)
    assert not load.failed, f"{len(load.failed)} records failed, first: {load.failed[0]}"
    assert load.acked == 3 * RECORDS_PER_PRODUCER
    brokers.restart(victim)
    wait_until(lambda: full_isrs(started), 60, message="full ISRs after the restart")
    described = describe_producers(started)

    for broker in started.values():  # a crash at rest: no clean shutdown, no closing snapshot
        broker.kill()
    images = {}
    for b, broker in started.items():
        with_snapshots = recovered(broker.data_dir, tmp_path / f"as-left-{b}", False)
        log_alone = recovered(broker.data_dir, tmp_path / f"log-alone-{b}", True)
        images[b] = (with_snapshots, log_alone)

    for b, (
        (summaries, snapshots, ends, oracle),
        (alone, no_snapshots, alone_ends, _),
    ) in images.items():
        assert ends == alone_ends
        assert all(no_snapshots[p] == [] for p in range(PARTITIONS))
        assert any(snapshots[p] and snapshots[p][-1] > 0 for p in range(PARTITIONS)), (
            f"broker {b}: no snapshot to recover from; the comparison would prove nothing")  # fmt: skip
        for p in range(PARTITIONS):
            assert summaries[p] == oracle[p], f"broker {b} partition {p}: from its snapshots"
            assert alone[p] == oracle[p], f"broker {b} partition {p}: from its log alone"
            assert set(load.producer_ids) <= set(oracle[p])
            assert len(oracle[p]) >= 3, f"broker {b} partition {p}: producers {sorted(oracle[p])}"
    first = images[1][0]
    for b, ((summaries, _, ends, _), _) in images.items():
        assert ends == first[2], f"replica {b}'s log ends differ from broker 1's"
        assert summaries == first[0], f"replica {b}'s producer state differs from broker 1's"
    assert described == {p: {(pid, epoch, seq) for pid, (epoch, seq, _) in first[0][p].items()}
                         for p in range(PARTITIONS)}  # fmt: skip

    # Restart on their own directories: snapshots gone on 1, garbage on 2, kept on 3.
    for p in range(PARTITIONS):
        for path in (started[1].data_dir / f"{TOPIC}-{p}").glob("*.snapshot"):
            path.unlink()
        for path in (started[2].data_dir / f"{TOPIC}-{p}").glob("*.snapshot"):
            path.write_bytes(b"\x00\x01 not a producer snapshot " * 7)
    for broker in started.values():
        brokers.restart(broker)
    wait_until(lambda: full_isrs(started), 60, message="full ISRs after restarting all")
    assert all(broker.is_alive() for broker in started.values())
    assert describe_producers(started) == described
    assert "cannot be used" in started[2].log_text(), "broker 2 did not log its corrupt snapshots"
    for b in (1, 2):
        loaded = [line for line in started[b].log_text().splitlines()
                  if "producer state of" in line and f"{TOPIC}-0" in line]  # fmt: skip
        assert loaded and "no snapshot" in loaded[-1], f"broker {b}: {loaded[-1:]}"
