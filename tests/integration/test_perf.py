"""`localcluster perf produce | e2e | failover` against a real three-broker cluster.

One cluster serves the module (`up -n 3 --detach`, `down --purge` at the end, also on
failure). The commands run standalone, as the click group localcluster/cli/perf.py gives
`localcluster perf`. Assertions are on the structure and sanity of the JSON
(counts, ordered percentiles, nothing lost) and never on speed: this box is shared.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from localcluster.tools.load import batch_records_for
from tests.helpers import wait_until
from tests.integration.cli_cluster import Cli, detached_cluster, one_line_error

TIMEOUT_S = 180
PERCENTILES = ("p50", "p95", "p99", "p99.9", "max")
PERF = [sys.executable, "-c", "from localcluster.cli.perf import perf; perf()"]


def perf(*args: str, timeout_s: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([*PERF, *args], capture_output=True, text=True, timeout=timeout_s)


def perf_json(cli: Cli, *args: str) -> dict:
    result = perf(*args, "--dir", str(cli.cluster_dir), "--json")
    assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
    return json.loads(result.stdout)


def check_latency(latency: dict, count: int) -> None:
    assert latency["count"] == count
    values = [latency[p] for p in PERCENTILES]
    assert all(v > 0 for v in values), latency
    assert values == sorted(values), latency
    assert latency["min"] <= latency["p50"] and latency["mean"] <= latency["max"], latency


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    with detached_cluster(tmp_path_factory.mktemp("perf") / "cluster") as c:
        yield c


def test_produce_own_client(cli):
    r = perf_json(cli, "produce", "--topic", "p-own", "--num-records", "3000", "--record-size", "100",
                  "--throughput", "3000", "--partitions", "2", "--replication-factor", "3")  # fmt: skip
    assert r["command"] == "produce" and r["client"] == "own" and r["ok"] is True
    assert (r["partitions"], r["replication_factor"], r["acks"]) == (2, 3, "all")
    assert r["records_sent"] == r["records_acked"] == 3000 and r["errors"] == 0
    assert r["records_per_s"] > 0 and r["mb_per_s"] == pytest.approx(
        r["records_per_s"] * 100 / 1e6, rel=0.01
    )
    check_latency(r["latency_ms"], 3000)
    # the benchmarks' engine: two processes of 1500 records each, in batches of up to 595
    assert r["batch_records"] == batch_records_for(100) == 595 and r["load_processes"] == 2
    assert r["client_cpu_cores"] >= 0 and r["client_bound"] in (True, False)  # 10 ms CPU ticks


def test_produce_own_client_batches_of_its_batch_size(cli):
    r = perf_json(cli, "produce", "--topic", "p-batches", "--num-records", "600", "--record-size", "100",
                  "--producer-config", "batch.size=16384")  # fmt: skip
    assert r["ok"] is True and r["records_acked"] == 600 and r["errors"] == 0
    assert r["batch_records"] == batch_records_for(100, 16384) == 148  # not the 595 of 64 KiB


def test_produce_own_client_dates_its_records_when_it_sends_them(cli):
    """Its batches are built once; each send is dated then (CreateTime), as a producer dates
    its records. Undated they said 1970, which the next retention check deletes."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    before = int(time.time() * 1000)
    r = perf_json(cli, "produce", "--topic", "p-dated", "--num-records", "400", "--record-size", "100",
                  "--partitions", "1", "--producer-config", "batch.size=16384")  # fmt: skip
    after = int(time.time() * 1000)
    assert r["ok"] is True and r["records_acked"] == 400
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cli.status()["bootstrap_servers"],
                                         "group.id": "p-dated", "enable.auto.commit": False})  # fmt: skip
    try:
        consumer.assign([confluent_kafka.TopicPartition("p-dated", 0, 0)])
        stamps = []
        expected = 400 + r["warmup_records"]  # each load process's first record, uncounted
        deadline = time.monotonic() + 30
        while len(stamps) < expected and time.monotonic() < deadline:
            for message in consumer.consume(500, 0.5):
                assert message.error() is None, message.error()
                stamps.append(message.timestamp())
    finally:
        consumer.close()
    assert len(stamps) == expected
    assert {kind for kind, _ in stamps} == {confluent_kafka.TIMESTAMP_CREATE_TIME}
    assert all(before <= stamp <= after for _, stamp in stamps), (before, after, stamps[:3])


def test_produce_confluent_acks_1_existing_topic(cli):
    cli.run("topic", "create", "p-confluent", "-p", "2", "-r", "3", check=True)
    r = perf_json(cli, "produce", "--topic", "p-confluent", "--num-records", "2000", "--record-size", "512",
                  "--client", "confluent", "--acks", "1", "--producer-config", "linger.ms=1")  # fmt: skip
    assert r["client"] == "confluent" and r["ok"] is True
    assert r["partitions"] == 2  # the topic existed: --partitions is only for creation
    assert r["producer_config"] == {"acks": "1", "linger.ms": "1"}
    assert r["records_acked"] == 2000 and r["errors"] == 0
    check_latency(r["latency_ms"], 2000)


def test_e2e(cli):
    r = perf_json(cli, "e2e", "--topic", "e2e", "--num-records", "1500", "--record-size", "100",
                  "--throughput", "1000", "--partitions", "3")  # fmt: skip
    assert r["command"] == "e2e" and r["ok"] is True and r["partitions"] == 3
    assert r["records_acked"] == r["records_received"] == 1500
    assert r["missing"] == 0 and r["duplicates"] == 0
    check_latency(r["e2e_latency_ms"], 1500)
    check_latency(r["produce_latency_ms"], 1500)


def test_e2e_confluent_producer(cli):
    r = perf_json(cli, "e2e", "--topic", "e2e-confluent", "--num-records", "500", "--record-size", "64",
                  "--throughput", "1000", "--client", "confluent")  # fmt: skip
    assert r["client"] == "confluent" and r["ok"] is True
    assert r["records_received"] == 500 and r["missing"] == 0
    check_latency(r["e2e_latency_ms"], 500)


def test_e2e_consumes_through_a_group(cli):
    r = perf_json(cli, "e2e", "--topic", "e2e-group", "--num-records", "500", "--record-size", "64",
                  "--throughput", "1000", "--partitions", "2", "--group", "perf-e2e",
                  "--assignor", "cooperative-sticky")  # fmt: skip
    assert r["group"] == "perf-e2e" and r["ok"] is True
    assert r["records_received"] == 500 and r["missing"] == 0
    check_latency(r["e2e_latency_ms"], 500)
    from localcluster.client import Admin

    with Admin(bootstrap_servers=cli.status()["bootstrap_servers"]) as admin:
        described = admin.describe_group("perf-e2e")
        committed = admin.list_group_offsets("perf-e2e")
    assert described.state == "Empty"  # the member left when the run ended
    # it committed what it read (plus each partition's connection record, not this run's)
    assert sum(committed.values()) >= 500


def test_failover_leader_then_controller(cli):
    r = perf_json(cli, "failover", "--topic", "fo", "--kills", "2", "--throughput", "500")
    assert r["command"] == "failover" and r["target"] == "leader" and r["ok"] is True, r
    assert len(r["kill_results"]) == 2 and r["unclosed_windows"] == 0
    for row in r["kill_results"]:
        assert row["broker"] == row["leader_before"]
        assert row["window_ms"] > 0 and row["new_leader"] not in (None, row["broker"])
        assert row["new_leader_epoch"] > row["leader_epoch_before"]
    assert (
        r["window_ms"]["count"] == 2
        and r["window_ms"]["p50"] <= r["window_ms"]["p99"] <= r["window_ms"]["max"]
    )
    assert r["lost"] == 0 and r["lost_sequences"] == []
    assert r["records_acked"] > 0 and r["records_consumed"] >= r["records_acked"]
    assert r["errors"] == 0 and r["duplicates"] >= 0

    r = perf_json(cli, "failover", "--topic", "fo", "--kills", "1", "--target", "controller",
                  "--throughput", "500")  # fmt: skip
    assert r["ok"] is True and r["lost"] == 0, r
    (row,) = r["kill_results"]
    assert row["broker"] == row["controller_before"]
    assert row["new_controller"] not in (None, row["broker"])

    # every broker killed was started again and rejoined the ISR
    def all_alive():
        state = cli.status()
        return state if all(b["alive"] for b in state["brokers"]) else None

    state = wait_until(all_alive, timeout_s=30, message="all brokers alive")
    (partition,) = [p for p in state["partitions"] if p["topic"] == "fo"]
    assert sorted(partition["isr"]) == [0, 1, 2]


def test_text_output(cli):
    result = perf("produce", "--topic", "p-text", "--num-records", "200", "--record-size", "10",
                  "--dir", str(cli.cluster_dir))  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("200 records sent, 200 acknowledged, 0 failed;"), lines
    assert lines[1].startswith("latency ms: p50 "), lines


def test_bad_input(tmp_path):
    line = one_line_error(perf("produce", "--topic", "t", "--num-records", "10", "--record-size", "10",
                               "--dir", str(tmp_path / "none")))  # fmt: skip
    assert "no cluster" in line and "localcluster up" in line
    for args, hint in [
        (("produce", "--topic", "t", "--num-records", "0", "--record-size", "10"), "--num-records"),
        (("produce", "--topic", "t", "--num-records", "1", "--record-size", "10", "--producer-config", "x"),
         "key=value"),
        (("produce", "--topic", "t", "--num-records", "1", "--record-size", "10", "--producer-config", "no.such=1"),
         "unknown producer setting no.such"),
        (("e2e", "--topic", "t", "--num-records", "1", "--record-size", "4"), "--record-size"),
        (("failover", "--topic", "t", "--target", "follower"), "--target"),
    ]:  # fmt: skip
        result = perf(*args, "--dir", str(tmp_path / "none"))
        assert result.returncode == 2, (args, result.stderr)
        assert hint in one_line_error(result), (args, result.stderr)


@pytest.mark.parametrize("client", ["own", "confluent"])
def test_a_run_ends_in_one_line_when_its_cluster_is_purged(tmp_path, client):
    c = Cli(tmp_path / "cluster")
    try:
        c.run("up", "-n", "2", "--detach", check=True)
        run = subprocess.Popen([*PERF, "produce",
                                "--topic", "gone", "--num-records", "100000000", "--record-size",
                                "100", "--throughput", "2000", "--client", client,
                                "--dir", str(c.cluster_dir)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            wait_until(lambda: c.status()["partitions"], timeout_s=60, message="the topic exists")
            c.run("down", "--purge", "--timeout", "5", check=True)
            _, stderr = run.communicate(timeout=60)  # the run must end by itself
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        assert run.returncode == 1, stderr
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert "Traceback" not in stderr and "is gone" in lines[-1], stderr
    finally:
        c.teardown()
