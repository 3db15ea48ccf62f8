"""Our client's group consumer in a 3-broker cluster (`localcluster up -n 3`, topics RF 3):
two members share a topic's partitions and together read every record once; a member running
as `localcluster consume --group` killed with -9 loses its partitions to the other only after
its session timeout, and the survivor starts them at the dead member's commits; a mixed group
of our client and confluent-kafka, both on the range assignor, reads every record once.

Timings are shortened through Kafka's settings (session.timeout.ms 3000, heartbeat.interval.ms
300; the brokers' group.min.session.timeout.ms 1000 allows it), so each rebalance is quick.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from localcluster.client import Admin, Consumer, Producer
from localcluster.client.group_consumer import MemberState
from tests.helpers import wait_until
from tests.integration.cli_cluster import Cli

PARTITIONS = 6
SESSION_TIMEOUT_MS = 3_000
HEARTBEAT_MS = 300
GROUP_SETTINGS = {"auto.offset.reset": "earliest", "session.timeout.ms": SESSION_TIMEOUT_MS,
                  "heartbeat.interval.ms": HEARTBEAT_MS, "auto.commit.interval.ms": 200}  # fmt: skip


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    c = Cli(tmp_path_factory.mktemp("group-consumer") / "cluster")
    try:
        c.run("up", "-n", "3", "--detach", "--set", "replica.lag.time.max.ms=2000",
              "--set", "group.min.session.timeout.ms=1000", check=True)  # fmt: skip
        yield c
    finally:
        c.teardown()


@pytest.fixture(scope="module")
def bootstrap(cli) -> str:
    return cli.status()["bootstrap_servers"]


def create_topic(bootstrap: str, name: str) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topic(name, PARTITIONS, 3, {"min.insync.replicas": "2"})
        admin.wait_for_leaders(name)


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    with Producer(bootstrap_servers=bootstrap) as producer:
        futures = [producer.send(topic, v.encode(), key=v.encode()) for v in values]
        producer.flush()
        for f in futures:
            f.result()


def member(bootstrap: str, group: str, client_id: str) -> Consumer:
    consumer = Consumer({**GROUP_SETTINGS, "group.id": group, "client.id": client_id},
                        bootstrap_servers=bootstrap)  # fmt: skip
    return consumer


def stable(consumers: list[Consumer]) -> bool:
    """Every member stable in one generation and the assignments split the topic."""
    coordinators = [c.coordinator for c in consumers]
    if any(k.state is not MemberState.STABLE or k.rejoin_needed for k in coordinators):
        return False
    if len({k.generation_id for k in coordinators}) != 1:
        return False
    owned = [tp for c in consumers for tp in c.assignment()]
    return len(owned) == len(set(owned)) == PARTITIONS


def poll_all(consumers, got: dict, timeout_ms: int = 100) -> None:
    for c in consumers:
        for r in c.poll(timeout_ms):
            got.setdefault(c, []).append(r)


def test_two_members_share_the_partitions_and_read_each_record_once(bootstrap):
    create_topic(bootstrap, "shared")
    members = [member(bootstrap, "pair", f"member-{i}") for i in (1, 2)]
    try:
        for c in members:
            c.subscribe(["shared"])
        got: dict = {}
        wait_until(lambda: poll_all(members, got) or stable(members), 30, 0,
                   "both members stable with 3 partitions each")  # fmt: skip
        assert all(len(c.assignment()) == PARTITIONS // 2 for c in members)
        values = [f"v{i}" for i in range(120)]
        produce(bootstrap, "shared", values)
        wait_until(lambda: poll_all(members, got) or sum(map(len, got.values())) >= len(values),
                   30, 0, "120 records consumed")  # fmt: skip
        poll_all(members, got)  # nothing more arrives: no record twice
        read = [r.value.decode() for rs in got.values() for r in rs]
        assert sorted(read) == sorted(values)
        for c, records in got.items():  # each read only what it was assigned
            assert {(r.topic, r.partition) for r in records} <= set(c.assignment())
    finally:
        for c in members:
            c.close()
    with Admin(bootstrap_servers=bootstrap) as admin:
        committed = admin.list_group_offsets("pair")
        assert admin.describe_group("pair").state == "Empty"  # both left on close
    assert sum(committed.values()) == len(values)  # close committed everything read


class LineReader:
    """Collects a subprocess's stdout lines in a thread (a pipe read never blocks the test)."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))


def test_a_killed_member_is_replaced_after_its_session_timeout_and_commits_survive(cli, bootstrap):
    create_topic(bootstrap, "failover")
    old = [f"old-{i}" for i in range(60)]
    produce(bootstrap, "failover", old)
    properties = [f"{k}={v}" for k, v in GROUP_SETTINGS.items() if k != "auto.offset.reset"]
    command = [sys.executable, "-m", "localcluster", "consume", "failover", "--group", "fo",
               "--from-beginning", "--dir", str(cli.cluster_dir)]  # fmt: skip
    for p in properties:
        command += ["--consumer-property", p]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    victim = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env=env, start_new_session=True)  # fmt: skip
    survivor = member(bootstrap, "fo", "survivor")
    admin = Admin(bootstrap_servers=bootstrap)
    try:
        output = LineReader(victim.stdout)
        wait_until(lambda: len(output.lines) >= len(old), 30, 0.05, "the victim read the topic")
        assert sorted(output.lines) == sorted(old)
        wait_until(lambda: sum(max(o, 0) for o in admin.list_group_offsets("fo").values())
                   == len(old), 15, 0.1, "the victim committed what it read")  # fmt: skip

        survivor.subscribe(["failover"])
        got: dict = {}
        wait_until(lambda: poll_all([survivor], got) or (
            survivor.coordinator.state is MemberState.STABLE
            and len(survivor.assignment()) == PARTITIONS // 2), 30, 0,
            "the survivor shares the partitions with the victim")  # fmt: skip
        assert len(admin.describe_group("fo").members) == 2

        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(10)
        killed_at = time.monotonic()
        new = [f"new-{i}" for i in range(60)]
        produce(bootstrap, "failover", new)
        wait_until(lambda: poll_all([survivor], got) or len(survivor.assignment()) == PARTITIONS,
                   30, 0, "the survivor took over every partition")  # fmt: skip
        took_over_s = time.monotonic() - killed_at
        wait_until(lambda: poll_all([survivor], got) or len(got.get(survivor, [])) >= len(new),
                   30, 0, "the survivor read every new record")  # fmt: skip
        poll_all([survivor], got)
        read = sorted(r.value.decode() for r in got.get(survivor, []))
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(10)
        survivor.close()
        admin.close()
    # the coordinator learns of the death only by the missing heartbeats
    assert took_over_s >= (SESSION_TIMEOUT_MS - HEARTBEAT_MS) / 1000 * 0.9, took_over_s
    # the victim's commits hold: the survivor starts after them, not at the beginning
    assert read == sorted(new)


def test_a_group_of_our_client_and_confluent_kafka_reads_each_record_once(bootstrap):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    create_topic(bootstrap, "mixed")
    ours = member(bootstrap, "mixed-group", "ours")
    theirs = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "mixed-group", "client.id": "confluent",
        "auto.offset.reset": "earliest", "partition.assignment.strategy": "range",
        "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_MS})  # fmt: skip
    values = [f"m{i}" for i in range(120)]
    read_ours: list[str] = []
    read_theirs: list[str] = []

    def poll_both() -> None:
        read_ours.extend(r.value.decode() for r in ours.poll(50))
        message = theirs.poll(0.05)
        if message is not None and message.error() is None:
            read_theirs.append(message.value().decode())

    def split() -> bool:
        mine = set(ours.assignment())
        other = {(tp.topic, tp.partition) for tp in theirs.assignment()}
        return (ours.coordinator.state is MemberState.STABLE and not (mine & other)
                and len(mine | other) == PARTITIONS and bool(mine) and bool(other))  # fmt: skip

    try:
        ours.subscribe(["mixed"])
        theirs.subscribe(["mixed"])
        wait_until(lambda: poll_both() or split(), 40, 0, "both clients own half the partitions")
        with Admin(bootstrap_servers=bootstrap) as admin:
            described = admin.describe_group("mixed-group")
        assert described.protocol == "range" and described.state == "Stable"
        halves = sorted(sorted(p for _, p in m.assignment) for m in described.members)
        assert halves == [[0, 1, 2], [3, 4, 5]]  # range: contiguous runs
        produce(bootstrap, "mixed", values)
        wait_until(lambda: poll_both() or len(read_ours) + len(read_theirs) >= len(values), 30, 0,
                   "every record consumed")  # fmt: skip
        for _ in range(5):
            poll_both()  # nothing more arrives: no record twice
    finally:
        ours.close()
        theirs.close()
    assert read_ours and read_theirs
    assert sorted(read_ours + read_theirs) == sorted(values)


def test_a_static_member_restarted_within_its_session_keeps_its_partitions(bootstrap):
    create_topic(bootstrap, "static")
    settings = {**GROUP_SETTINGS, "group.id": "static-group", "session.timeout.ms": 10_000}
    first = Consumer({**settings, "group.instance.id": "a"}, bootstrap_servers=bootstrap)
    other = Consumer({**settings, "group.instance.id": "b"}, bootstrap_servers=bootstrap)
    restarted = None
    try:
        for c in (first, other):
            c.subscribe(["static"])
        wait_until(lambda: poll_all([first, other], {}) or stable([first, other]), 30, 0,
                   "both static members stable")  # fmt: skip
        owned, generation = first.assignment(), other.coordinator.generation_id
        # 1, or 2 when the first join raced the new topic's metadata: what counts is no more
        rebalances = other.coordinator.rebalances
        first.close()  # a static member sends no LeaveGroup: the group keeps its place
        restarted = Consumer({**settings, "group.instance.id": "a"}, bootstrap_servers=bootstrap)
        restarted.subscribe(["static"])
        wait_until(lambda: poll_all([restarted, other], {}) or stable([restarted, other]), 30, 0,
                   "the restarted member is back")  # fmt: skip
        assert sorted(restarted.assignment()) == sorted(owned)
        assert restarted.coordinator.generation_id == generation  # no rebalance
        assert other.coordinator.rebalances == rebalances
    finally:
        for c in (other, restarted):
            if c is not None:
                c.close()
