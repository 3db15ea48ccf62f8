"""Brokers on several hosts: network namespaces stand in for machines (tests/netns.py).

Each test makes its own hosts (one namespace for ZooKeeper, one per broker, joined by a bridge
in the root namespace, addresses from RFC 5737's TEST-NET-1: nothing leaves the machine), runs a
real ZooKeeper (Debian's package) in its namespace and brokers from Kafka-style
server.properties files, each with its own data dir and JAAS file, and talks to them from the
root namespace with real clients over TCP. Brokers reach each other only over TCP with SASL on
their BROKER listener. Skipped with the reason where namespaces cannot be made (not root).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from localcluster.client.admin import Admin
from localcluster.coord.zookeeper_server import (
    ZooKeeperServer,
    four_letter_word,
    installation_problem,
)
from tests.helpers import wait_until
from tests.netns import (
    NamespaceProcess,
    NamespaceUnavailable,
    Network,
    ip,
    skip_unless_namespaces,
)

REPOSITORY = Path(__file__).resolve().parents[2]
HOSTS = {"zookeeper": 2, "broker-1": 11, "broker-2": 12, "broker-3": 13}
ZOOKEEPER_PORT = 2181
CLIENT_PORT = 9092
BROKER_PORT = 9093
BROKER_SECRET = "broker-secret"
QUIET = {"log_level": 3}  # librdkafka: errors only (a killed broker's connection noise)
READY = re.compile(r"broker (\d+) ready on ([\d.]+):(\d+) \(pid (\d+)\)")
AUTHENTICATION_FAILED = r"(?i)(?=.*authenticat)(?=.*fail)"


# -- hosts and ZooKeeper -------------------------------------------------------------------------


def open_network(hosts: dict[str, int]) -> Network:
    skip_unless_namespaces()
    try:
        return Network(hosts).open()
    except NamespaceUnavailable as e:
        pytest.skip(f"cannot make network namespaces here: {e}")


@pytest.fixture
def network():
    hosts = open_network(HOSTS)
    try:
        yield hosts
    finally:
        hosts.close()


@pytest.fixture
def zookeeper(network, tmp_path):
    problem = installation_problem()
    if problem:
        pytest.skip(f"real ZooKeeper unavailable: {problem}")
    work_dir = tmp_path / "zookeeper"
    work_dir.mkdir()
    server = ZooKeeperServer(str(work_dir), host=network.address("zookeeper"),
                             port=ZOOKEEPER_PORT, command_prefix=network.exec_prefix("zookeeper"))  # fmt: skip
    try:
        yield server.start()
    finally:
        server.stop()


KAZOO_PROBE = """
import socket, sys
from kazoo.client import KazooClient
host, port = sys.argv[1], int(sys.argv[2])
with socket.create_connection((host, port), timeout=5) as s:
    s.sendall(b"ruok")
    print("ruok:", s.recv(16).decode())
client = KazooClient(hosts=f"{host}:{port}", timeout=5)
client.start(timeout=10)
client.ensure_path("/probe/from-" + sys.argv[3])
print("children:", ",".join(sorted(client.get_children("/probe"))))
client.stop()
"""


def test_zookeeper_in_its_namespace_is_reachable_from_root_and_broker_hosts(network, zookeeper):
    host = network.address("zookeeper")
    assert host.startswith(("192.0.2.", "198.51.100.", "203.0.113.")), host  # RFC 5737 only
    assert zookeeper.hosts == f"{host}:{ZOOKEEPER_PORT}"
    assert four_letter_word(ZOOKEEPER_PORT, "ruok", host=host) == "imok"  # from the root namespace

    # ZooKeeper really runs inside its namespace: it is not listening in the root namespace.
    listening = network.run("zookeeper", ["ss", "-Htln", f"( sport = :{ZOOKEEPER_PORT} )"])
    assert host in listening.stdout, listening
    root = subprocess.run(["ss", "-Htln", f"( sport = :{ZOOKEEPER_PORT} )"],
                          capture_output=True, text=True, timeout=10)  # fmt: skip
    assert host not in root.stdout, root.stdout

    for broker_host in ("broker-1", "broker-2"):
        probe = network.run(broker_host, [sys.executable, "-c", KAZOO_PROBE, host,
                                          str(ZOOKEEPER_PORT), broker_host])  # fmt: skip
        assert probe.returncode == 0, probe.stderr
        assert "ruok: imok" in probe.stdout, probe.stdout
    assert "children: from-broker-1,from-broker-2" in probe.stdout, probe.stdout


def test_hosts_have_no_route_off_the_machine(network):
    for host in HOSTS:
        route = network.run(host, ["ip", "route", "get", "1.1.1.1"])
        assert route.returncode != 0 and "unreachable" in route.stderr, (host, route)
        routes = network.run(host, ["ip", "-j", "route", "show"])
        assert [r["dst"] for r in json.loads(routes.stdout)] == [str(network.subnet)], routes


def test_network_removes_everything_it_made_even_when_the_test_fails(tmp_path):
    made = open_network({"a": 2, "b": 3})
    with pytest.raises(RuntimeError, match="the test failed"):
        with contextlib.closing(made):
            assert len(made.leftovers()) == 1 + 2 * 2, made.leftovers()  # bridge, veths, netns
            sleeper = made.start("a", ["sh", "-c", "echo up; exec sleep 600"], tmp_path / "a.log")
            assert sleeper.wait_for_line("^up$", timeout_s=10)
            stray = subprocess.Popen([*made.exec_prefix("b"), "sleep", "600"],
                                     start_new_session=True)  # fmt: skip
            # inside once `ip netns exec` has entered it (under load that took a while, and a
            # stray not in yet was not killed: it is not the cleanup's to find)
            wait_until(lambda: str(stray.pid) in ip("netns", "pids", made.namespace("b")).stdout.split(),
                       10, 0.02, "the stray process inside namespace b")  # fmt: skip
            raise RuntimeError("the test failed")
    assert made.leftovers() == []
    assert not sleeper.is_alive()
    assert stray.wait(timeout=10) == -9  # killed because it was inside a namespace


# -- brokers from server.properties ----------------------------------------------------------------


def jaas_text(password: str) -> str:
    """A KafkaServer section: the broker's own credential, then PLAIN's users."""
    return (
        "KafkaServer {\n"
        "  org.apache.kafka.common.security.plain.PlainLoginModule required\n"
        f'    username="broker" password="{password}"\n'
        f'    user_broker="{BROKER_SECRET}" user_alice="alice-secret";\n'
        "};\n"
    )


class Broker:
    """One broker on its own host, run from its server.properties with a separate data dir."""

    def __init__(self, network: Network, zookeeper: ZooKeeperServer, directory: Path,
                 broker_id: int, password: str = BROKER_SECRET):  # fmt: skip
        self.network = network
        self.broker_id = broker_id
        self.host = f"broker-{broker_id}"
        self.address = network.address(self.host)
        self.client_listener = f"{self.address}:{CLIENT_PORT}"
        self.broker_listener = f"{self.address}:{BROKER_PORT}"
        self.directory = directory / self.host
        self.directory.mkdir()
        self.jaas = self.directory / "kafka_server_jaas.conf"
        self.jaas.write_text(jaas_text(password))
        self.config = self.directory / "server.properties"
        self.config.write_text(self._server_properties(zookeeper.hosts))
        self.process: NamespaceProcess | None = None

    def _server_properties(self, zookeeper_connect: str) -> str:
        listeners = f"CLIENT://{self.client_listener},BROKER://{self.broker_listener}"
        return "\n".join([
            f"broker.id={self.broker_id}",
            f"broker.rack=rack-{self.broker_id}",
            f"listeners={listeners}",
            f"advertised.listeners={listeners}",
            "listener.security.protocol.map=CLIENT:PLAINTEXT,BROKER:SASL_PLAINTEXT",
            "inter.broker.listener.name=BROKER",
            "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256",
            "sasl.mechanism.inter.broker.protocol=PLAIN",
            f"java.security.auth.login.config={self.jaas}",
            "super.users=User:broker",
            f"zookeeper.connect={zookeeper_connect}",
            f"log.dirs={self.directory / 'data'}",
            "",
        ])  # fmt: skip

    def start(self, *overrides: str, timeout_s: float = 60.0) -> Broker:
        argv = [sys.executable, "-m", "localcluster.broker", "--config", str(self.config)]
        for override in overrides:
            argv += ["--override", override]
        self.process = self.network.start(self.host, argv, self.directory / "broker.log",
                                          cwd=REPOSITORY)  # fmt: skip
        ready = self.process.wait_for_line(READY, timeout_s)
        assert int(ready.group(1)) == self.broker_id, ready.group(0)
        assert f"{ready.group(2)}:{ready.group(3)}" == self.client_listener, ready.group(0)
        return self

    def kill(self) -> None:
        """kill -9 the broker's process group: no shutdown, no goodbye to ZooKeeper."""
        self.process.kill()

    def log(self) -> str:
        return self.process.output()


@pytest.fixture
def cluster(network, zookeeper, tmp_path):
    """make(broker_id, password=...) -> Broker (not started); every broker dies at the end."""
    made: list[Broker] = []

    def make(broker_id: int, password: str = BROKER_SECRET) -> Broker:
        made.append(Broker(network, zookeeper, tmp_path, broker_id, password))
        return made[-1]

    try:
        yield make
    finally:
        for broker in made:
            if broker.process is not None:
                broker.kill()


def bootstrap(brokers: list[Broker]) -> str:
    return ",".join(b.client_listener for b in brokers)


def describe(brokers: list[Broker], topic: str):
    """The topic's partition 0 as Metadata tells it, or None while no live broker answers."""
    try:
        with Admin(bootstrap_servers=bootstrap(brokers), **{"request.timeout.ms": 5000}) as admin:
            return admin.describe_topic(topic).partitions[0]
    except Exception:  # a broker just killed, a topic not yet known: ask again
        return None


def established_tcp(network: Network, host: str, port: int) -> set[str]:
    """Remote host:port of every established TCP connection from host to port."""
    listing = network.run(host, ["ss", "-Htn", "state", "established", f"( dport = :{port} )"])
    assert listing.returncode == 0, listing.stderr
    return {line.split()[-1] for line in listing.stdout.splitlines() if line.strip()}


class Deliveries:
    """Delivery reports of one producer: acknowledged values and failures."""

    def __init__(self):
        self.acknowledged: list[bytes] = []
        self.failed: list[tuple[bytes, str]] = []

    def __call__(self, error, message) -> None:
        if error is None:
            self.acknowledged.append(message.value())
        else:
            self.failed.append((message.value(), str(error)))


def produce(producer: Producer, topic: str, values: list[bytes], deliveries: Deliveries) -> None:
    for value in values:
        producer.produce(topic, value=value, partition=0, on_delivery=deliveries)
        producer.poll(0)


def read_back(brokers: list[Broker], topic: str, timeout_s: float = 60.0) -> list[bytes]:
    """Every record of partition 0 below its high watermark, read from the beginning with an
    assigned partition (no consumer group)."""
    consumer = Consumer({"bootstrap.servers": bootstrap(brokers), "group.id": "unused-with-assign",
                         "enable.auto.commit": False, **QUIET})  # fmt: skip
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values: list[bytes] = []
        position, deadline = 0, time.monotonic() + timeout_s
        while position < high:
            assert time.monotonic() < deadline, f"read {position} of {high} in {timeout_s} s"
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
            position = message.offset() + 1
        return values
    finally:
        consumer.close()


def create_topic(brokers: list[Broker], topic: str, **new_topic) -> None:
    """CreateTopics through confluent-kafka's AdminClient, as docs/multi-host.md shows it."""
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers), **QUIET})
    request = NewTopic(topic, config={"min.insync.replicas": "2"}, **new_topic)
    admin.create_topics([request])[topic].result(timeout=30)
    wait_until(lambda: (p := describe(brokers, topic)) and p.leader >= 0, timeout_s=30,
               message=f"a leader for {topic}")  # fmt: skip


RECORDS_BEFORE_KILL = 2000
RECORDS_IN_FLIGHT = 200
RECORDS_AFTER_KILL = 1000


def test_three_hosts_lose_no_acknowledged_record_when_the_leader_is_killed(network, cluster):
    brokers = [cluster(broker_id).start() for broker_id in (1, 2, 3)]
    create_topic(brokers, "orders", num_partitions=1, replication_factor=3)
    values = [f"record-{i:05d}".encode() for i in range(RECORDS_BEFORE_KILL + RECORDS_IN_FLIGHT
                                                        + RECORDS_AFTER_KILL)]  # fmt: skip
    before = values[:RECORDS_BEFORE_KILL]
    in_flight = values[RECORDS_BEFORE_KILL : RECORDS_BEFORE_KILL + RECORDS_IN_FLIGHT]
    after = values[RECORDS_BEFORE_KILL + RECORDS_IN_FLIGHT :]

    deliveries = Deliveries()
    producer = Producer({"bootstrap.servers": bootstrap(brokers), "acks": "all", **QUIET})
    produce(producer, "orders", before, deliveries)
    assert producer.flush(60) == 0, "records still queued 60 s after the first batch"
    assert deliveries.failed == [] and len(deliveries.acknowledged) == len(before)

    # Replication really runs between hosts: all three replicas in the ISR, and each follower
    # holds a TCP connection to the leader's BROKER listener (there is no other way between them).
    state = wait_until(lambda: (p := describe(brokers, "orders")) and len(p.isr) == 3 and p,
                       timeout_s=30, message="all three replicas in the ISR")  # fmt: skip
    leader = next(b for b in brokers if b.broker_id == state.leader)
    survivors = [b for b in brokers if b is not leader]
    for follower in survivors:
        connections = established_tcp(network, follower.host, BROKER_PORT)
        assert leader.broker_listener in connections, (follower.host, connections)
        route = rf"broker {follower.broker_id} reaches broker {leader.broker_id} over tcp .*"
        assert re.search(route + re.escape(leader.broker_listener), follower.log()), (
            f"broker {follower.broker_id}'s log names no TCP route to the leader:\n"
            + follower.process.tail()
        )

    produce(producer, "orders", in_flight, deliveries)
    leader.kill()
    produce(producer, "orders", after, deliveries)
    assert producer.flush(120) == 0, "records still queued 120 s after the leader was killed"

    new_state = wait_until(lambda: (p := describe(survivors, "orders")) and p.leader != leader.broker_id
                           and set(p.isr) == {b.broker_id for b in survivors} and p,
                           timeout_s=30, message="a surviving leader and a two-replica ISR")  # fmt: skip
    assert new_state.leader in {b.broker_id for b in survivors}
    assert new_state.leader_epoch > state.leader_epoch

    read = set(read_back(survivors, "orders"))
    missing = [v for v in deliveries.acknowledged if v not in read]
    assert missing == [], f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
    assert set(before) <= set(deliveries.acknowledged)
    assert deliveries.failed == [], f"{len(deliveries.failed)} failed: {deliveries.failed[:3]}"
    assert set(after) <= read  # the cluster kept taking writes after the leader died


def test_a_broker_with_the_wrong_inter_broker_password_stays_out_of_the_isr(network, cluster):
    lag_ms = 3000  # a replica that cannot fetch leaves the ISR after this long (default 10 s)
    override = f"replica.lag.time.max.ms={lag_ms}"
    good = [cluster(1).start(override)]
    good.append(cluster(2).start(override))
    # The controller must be a broker with the right credential (the first to start wins it).
    wait_until(lambda: controller_of(good) in (1, 2), timeout_s=30, message="a controller")
    bad = cluster(3, password="not-the-broker-secret").start(override)
    everyone = [*good, bad]

    # A new partition's ISR is every live assigned replica (Kafka's rule), broker 3 included;
    # it cannot fetch, so it leaves the ISR after the lag time and never comes back.
    create_topic(everyone, "guarded", num_partitions=1, replica_assignment=[[1, 2, 3]])
    assert describe(everyone, "guarded").leader == 1  # the preferred replica: first assigned
    complaint = bad.process.wait_for_line(AUTHENTICATION_FAILED, timeout_s=30)
    assert "broker 1" in complaint.string or good[0].broker_listener in complaint.string, (
        f"the authentication failure does not say against which broker: {complaint.string}"
    )
    # The leader says who tried: the refused broker's address.
    good[0].process.wait_for_line(rf"(?i)authenticat.*{re.escape(bad.address)}.*fail", 30)

    wait_until(lambda: (p := describe(good, "guarded")) and p.isr and 3 not in p.isr,
               timeout_s=lag_ms / 1000 + 30, message="broker 3 out of the ISR")  # fmt: skip
    deliveries = Deliveries()
    producer = Producer({"bootstrap.servers": bootstrap(good), "acks": "all", **QUIET})
    produce(producer, "guarded", [f"guarded-{i}".encode() for i in range(100)], deliveries)
    assert producer.flush(60) == 0
    assert deliveries.failed == [] and len(deliveries.acknowledged) == 100  # 1 and 2 suffice
    state = describe(good, "guarded")
    assert state is not None and set(state.isr) == {1, 2}, state
    assert bad.process.is_alive()  # it keeps running and retrying; it is just never let in


def controller_of(brokers: list[Broker]) -> int | None:
    try:
        with Admin(bootstrap_servers=bootstrap(brokers)) as admin:
            return admin.describe_cluster().controller_id
    except Exception:
        return None
