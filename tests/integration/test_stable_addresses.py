"""A broker keeps its address for the cluster's lifetime: restarts by `start` after kill -9 or a
controlled shutdown, and chaos's restarts, bring it back on the port `up` chose, so clients
bootstrapped with that address (and the bootstrap line `up` printed) keep working."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import Producer

from localcluster import cluster
from tests.helpers import wait_until
from tests.integration.cli_cluster import Cli

TOPIC = "stable"


def registered_ports(cluster_dir) -> dict[int, int]:
    spec = cluster.load_spec(cluster_dir)
    with cluster.store(spec) as client:
        return {b: r.port for b, r in cluster.registrations(client).items()}


def produce(producer: Producer, values: list[str]) -> list[str]:
    """Send and flush; return the values whose delivery failed."""
    failed: list[str] = []
    for value in values:
        producer.produce(
            TOPIC, value.encode(), on_delivery=lambda e, m: e and failed.append(str(e))
        )
    assert producer.flush(30) == 0, "records still queued after 30 s"
    return failed


@pytest.fixture
def running(tmp_path):
    c = Cli(tmp_path / "cluster")
    try:
        c.run("up", "-n", "3", "--detach", "--set", "replica.lag.time.max.ms=2000", check=True)
        c.run("topic", "create", TOPIC, "-p", "3", "-r", "3", "--config",
              "min.insync.replicas=2", check=True)  # fmt: skip
        yield c
    finally:
        c.teardown()


def test_restarts_keep_the_address_and_a_single_bootstrap_address_keeps_working(running):
    c = running
    spec = cluster.load_spec(c.cluster_dir)
    assert sorted(spec.ports) == [0, 1, 2] and len(set(spec.ports.values())) == 3
    assert registered_ports(c.cluster_dir) == spec.ports
    printed = c.status()["bootstrap_servers"]
    assert printed == ",".join(f"127.0.0.1:{spec.ports[b]}" for b in (0, 1, 2))

    only_broker_1 = f"127.0.0.1:{spec.ports[1]}"
    producer = Producer({"bootstrap.servers": only_broker_1, "linger.ms": 5})
    assert produce(producer, [f"before-{i}" for i in range(100)]) == []
    for stop, how in ((("kill", "1"), "kill -9"), (("shutdown", "1"), "controlled shutdown")):
        c.run(*stop, check=True)
        c.run("start", "1", check=True)
        assert registered_ports(c.cluster_dir)[1] == spec.ports[1], f"after {how} and start"
        # The producer that knew only broker 1's address goes on across the restart ...
        assert produce(producer, [f"after-{how}-{i}" for i in range(100)]) == [], how
        # ... and a client that starts now with only that address (or the line `up` printed)
        # finds the cluster.
        fresh = Producer({"bootstrap.servers": only_broker_1})
        assert produce(fresh, [f"fresh-{how}"]) == [], how
        assert produce(Producer({"bootstrap.servers": printed}), [f"printed-{how}"]) == []
    assert c.status()["bootstrap_servers"] == printed


def test_chaos_restarts_brokers_on_their_ports(running):
    c = running
    spec = cluster.load_spec(c.cluster_dir)
    result = subprocess.run(
        [sys.executable, "-c", "from localcluster.cli.chaos import chaos; chaos()",
         "--dir", str(c.cluster_dir), "--duration", "4", "--kill-every", "400", "--seed", "3"],
        capture_output=True, text=True, timeout=180)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "verdict: OK" in result.stdout, result.stdout[-2000:]
    assert "restart" in result.stdout, "the schedule restarted no broker"
    ports = wait_until(lambda: (p := registered_ports(c.cluster_dir)) and len(p) == 3 and p,
                       timeout_s=30, message="all three brokers registered again")  # fmt: skip
    assert ports == spec.ports


def test_up_port_base_gives_broker_n_port_base_plus_n(tmp_path):
    import socket

    # Find three consecutive free ports by holding them, then let `up` take them.
    for _ in range(20):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + 2 > 65535:
            continue
        try:
            held = []
            for port in range(base, base + 3):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        break
    else:
        pytest.skip("found no three consecutive free ports")
    c = Cli(tmp_path / "cluster")
    try:
        c.run("up", "-n", "3", "--detach", "--port-base", str(base), check=True)
        assert registered_ports(c.cluster_dir) == {0: base, 1: base + 1, 2: base + 2}
    finally:
        c.teardown()


def test_up_refuses_listeners_in_set(tmp_path):
    result = Cli(tmp_path / "cluster").run("up", "-n", "1", "--set",
                                           "listeners=PLAINTEXT://127.0.0.1:9092")  # fmt: skip
    assert result.returncode == 2
    assert "listeners is set per broker by `up`" in result.stderr and "--port-base" in result.stderr
