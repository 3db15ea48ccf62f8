"""Incremental cooperative rebalancing (KIP-429) on a live cluster: our consumers with
partition.assignment.strategy=cooperative-sticky, alone and in one group with confluent-kafka
consumers configured the same way (each client leading once). A member joins and leaves while
records keep arriving: the members keep consuming the partitions that do not move (records
arrive in polls made during the rebalance), no partition is ever owned by two members, and
every record is consumed. `localcluster consume --group G --assignor cooperative-sticky` joins
with that protocol.

One broker (`localcluster up -n 1`; three offsets partitions to keep the start quick);
session.timeout.ms 3000, heartbeat.interval.ms 300 (group.min.session.timeout.ms 1000).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster.client import Admin, Consumer, Producer
from localcluster.client.group_consumer import MemberState
from tests.helpers import wait_until
from tests.integration.cli_cluster import Cli

PARTITIONS = 6
SESSION_TIMEOUT_MS = 3_000
HEARTBEAT_MS = 300
OURS = {"auto.offset.reset": "earliest", "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": HEARTBEAT_MS, "auto.commit.interval.ms": 200,
        "partition.assignment.strategy": "cooperative-sticky"}  # fmt: skip


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    c = Cli(tmp_path_factory.mktemp("cooperative") / "cluster")
    try:
        c.run("up", "-n", "1", "--detach", "--set", "group.min.session.timeout.ms=1000",
              "--set", "offsets.topic.num.partitions=3", check=True)  # fmt: skip
        yield c
    finally:
        c.teardown()


@pytest.fixture(scope="module")
def bootstrap(cli) -> str:
    return cli.status()["bootstrap_servers"]


def create_topic(bootstrap: str, name: str) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topic(name, PARTITIONS, 1)
        admin.wait_for_leaders(name)


class OurMember:
    def __init__(self, bootstrap: str, group: str, name: str):
        self.name = name
        self.consumer = Consumer({**OURS, "group.id": group, "client.id": name},
                                 bootstrap_servers=bootstrap)  # fmt: skip
        self.read: list[str] = []
        self.read_rebalancing = 0  # records from polls made while the member was rebalancing
        self.closed = False

    def subscribe(self, topic: str) -> None:
        self.consumer.subscribe([topic])

    def poll(self) -> None:
        k = self.consumer.coordinator
        rebalancing = k.rejoin_needed or k.state is not MemberState.STABLE
        records = self.consumer.poll(30)
        self.read += [r.value.decode() for r in records]
        self.read_rebalancing += len(records) if rebalancing and k.rebalances else 0

    def owned(self) -> set:
        return set(self.consumer.assignment())

    def settled(self) -> bool:
        k = self.consumer.coordinator
        return k.state is MemberState.STABLE and not k.rejoin_needed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.consumer.close()


class TheirMember:
    """A confluent-kafka consumer; librdkafka does the incremental assign itself."""

    def __init__(self, bootstrap: str, group: str, name: str):
        confluent_kafka = pytest.importorskip("confluent_kafka")
        self.name = name
        self.consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
            "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "partition.assignment.strategy": "cooperative-sticky"})  # fmt: skip
        self.read: list[str] = []
        self.closed = False

    def subscribe(self, topic: str) -> None:
        self.consumer.subscribe([topic])

    def poll(self) -> None:
        for message in self.consumer.consume(100, 0.03):
            if message.error() is None:
                self.read.append(message.value().decode())

    def owned(self) -> set:
        return {(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    def settled(self) -> bool:
        return True  # its assignment() is the whole story

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.consumer.close()


class Run:
    """Polls every member and produces a few records per round; checks no double ownership
    after each round."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.producer = Producer(bootstrap_servers=bootstrap)
        self.sent: list[str] = []
        self.numbers = itertools.count()
        self.members: list = []  # polled now
        self.everyone: list = []  # whose reads count
        self.kept: dict[str, set] = {}  # partitions each member held the whole time

    def round(self) -> None:
        for _ in range(PARTITIONS):
            n = next(self.numbers)
            self.sent.append(f"r{n}")
            self.producer.send(self.topic, f"r{n}".encode(), partition=n % PARTITIONS)
        for m in self.members:
            m.poll()
        owned = [(m.name, tp) for m in self.members for tp in m.owned()]
        tps = [tp for _, tp in owned]
        assert len(tps) == len(set(tps)), f"a partition owned twice: {sorted(owned)}"
        for m in self.members:
            if m.name in self.kept:
                self.kept[m.name] &= m.owned()

    def until(self, done, what: str, timeout_s: float = 30) -> None:
        wait_until(lambda: self.round() or done(), timeout_s, 0, what)

    def split(self, count: int) -> bool:
        owned = [tp for m in self.members for tp in m.owned()]
        return (all(m.settled() for m in self.members) and len(set(owned)) == PARTITIONS
                and all(len(m.owned()) == PARTITIONS // count for m in self.members))  # fmt: skip

    def drain(self) -> None:
        self.producer.flush()
        read = lambda: {v for m in self.everyone for v in m.read}  # noqa: E731
        wait_until(lambda: [m.poll() for m in self.members] and read() >= set(self.sent), 30, 0,
                   "every record consumed")  # fmt: skip

    def close(self) -> None:
        self.producer.close()


def join_and_leave(bootstrap: str, run: Run, first, second) -> None:
    """`first` alone, then `second` joins (3 partitions each), then `second` leaves."""
    run.members = [first]
    run.everyone = [first, second]
    first.subscribe(run.topic)
    run.until(lambda: run.split(1), f"{first.name} owns every partition")
    run.kept[first.name] = first.owned()
    second.subscribe(run.topic)
    run.members.append(second)
    run.until(lambda: run.split(2), "the two members own three partitions each")
    kept = set(run.kept[first.name])
    assert len(kept) == PARTITIONS // 2, f"{first.name} kept only {kept} throughout"
    with Admin(bootstrap_servers=bootstrap) as admin:
        assert admin.describe_group(run.topic).protocol == "cooperative-sticky"
    run.drain()
    run.members.remove(second)
    second.close()
    run.until(lambda: run.split(1), f"{first.name} owns every partition again")
    assert run.kept[first.name] == kept  # the leave took nothing from it
    run.drain()


def test_our_members_keep_consuming_what_they_keep(bootstrap):
    create_topic(bootstrap, "coop-ours")
    run = Run(bootstrap, "coop-ours")
    first, second = (OurMember(bootstrap, "coop-ours", n) for n in ("first", "second"))
    try:
        join_and_leave(bootstrap, run, first, second)
    finally:
        for m in (first, second):
            m.close()
        run.close()
    assert {v for m in (first, second) for v in m.read} >= set(run.sent)
    # the first member read through the rebalances; eager rebalancing would read nothing
    assert first.read_rebalancing > 0
    # two rounds on the join (it revoked three partitions), one on the leave
    assert first.consumer.coordinator.rebalances >= 3


@pytest.mark.parametrize("leader", ["ours", "confluent"])
def test_a_group_with_confluent_kafka_on_cooperative_sticky(bootstrap, leader):
    group = f"coop-mixed-{leader}"
    create_topic(bootstrap, group)
    run = Run(bootstrap, group)
    ours, theirs = OurMember(bootstrap, group, "ours"), TheirMember(bootstrap, group, "confluent")
    first, second = (ours, theirs) if leader == "ours" else (theirs, ours)
    try:
        join_and_leave(bootstrap, run, first, second)
    finally:
        for m in (ours, theirs):
            m.close()
        run.close()
    assert {v for m in (ours, theirs) for v in m.read} >= set(run.sent)
    if leader == "ours":
        assert ours.read_rebalancing > 0


def test_consume_group_assignor_option(cli, bootstrap):
    create_topic(bootstrap, "coop-cli")
    assert "need --group" in cli.run("consume", "coop-cli", "--assignor", "range").stderr
    command = [sys.executable, "-m", "localcluster", "consume", "coop-cli", "--group", "coop-cli",
               "--assignor", "cooperative-sticky", "--dir", str(cli.cluster_dir)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    member = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=env, start_new_session=True)  # fmt: skip
    try:
        with Admin(bootstrap_servers=bootstrap) as admin:

            def stable():
                described = admin.describe_group("coop-cli")
                return described if described.state == "Stable" else None

            described = wait_until(stable, 30, 0.05, "the CLI member stable")
        assert described.protocol == "cooperative-sticky" and len(described.members) == 1
    finally:
        os.killpg(member.pid, signal.SIGKILL)
        member.wait(10)
