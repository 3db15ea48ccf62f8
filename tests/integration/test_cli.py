"""Every `localcluster` cluster command against a real detached cluster (subprocesses of
`python -m localcluster ... --dir TMP`), and the bad-input cases: one line, no traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from localcluster import cluster
from tests.helpers import wait_until
from tests.integration.cli_cluster import Cli, detached_cluster, one_line_error


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    with detached_cluster(tmp_path_factory.mktemp("cli") / "cluster") as c:
        yield c


def test_up_detach_then_status_json(cli):
    state = cli.status()
    assert [b["id"] for b in state["brokers"]] == [0, 1, 2]
    assert all(b["alive"] and b["registered"] and b["pid"] for b in state["brokers"])
    assert state["bootstrap_servers"].count(":") == 3
    assert "controller" in state and "partitions" in state
    text = cli.run("status", check=True).stdout
    assert "bootstrap servers" in text and "alive" in text


def test_up_on_a_running_cluster_says_so_and_changes_nothing(cli):
    before = cli.live_pids()
    spec_before = cluster.spec_path(cli.cluster_dir).read_text()
    result = cli.run("up", "-n", "5", "--detach")
    assert "already running" in one_line_error(result)
    assert cli.live_pids() == before
    assert cluster.spec_path(cli.cluster_dir).read_text() == spec_before


def test_topics_produce_consume(cli):
    created = cli.json(
        "topic", "create", "orders", "-p", "2", "-r", "3", "--config", "min.insync.replicas=2"
    )
    assert [len(p["replicas"]) for p in created["partitions"]] == [3, 3]
    assert "orders" in cli.json("topic", "list")
    described = cli.json("topic", "describe", "orders")
    assert {p["partition"] for p in described["partitions"]} == {0, 1}
    assert all(p["leader"] in p["replicas"] for p in described["partitions"])

    lines = [f"value-{i}" for i in range(30)]
    produced = cli.json("produce", "orders", "--acks", "all", "--key-separator", ":",
                        input="\n".join(f"k{i % 3}:{v}" for i, v in enumerate(lines)) + "\n")  # fmt: skip
    assert produced["records"] == 30 and produced["errors"] == 0
    result = cli.run(
        "consume", "orders", "--from-beginning", "--max-messages", "30", "--json", check=True
    )
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(r["value"] for r in records) == sorted(lines)
    assert {r["key"] for r in records} == {"k0", "k1", "k2"}
    assert "processed a total of 30 messages" in result.stderr

    state = cli.status()
    rows = [p for p in state["partitions"] if p["topic"] == "orders"]
    assert len(rows) == 2 and all(set(p["isr"]) <= set(p["replicas"]) for p in rows)

    one = cli.run("consume", "orders", "--partition", "0", "--from-beginning", "--timeout-ms", "500",
                  "--print-offset", check=True)  # fmt: skip
    assert all(line.startswith("0:") for line in one.stdout.splitlines())

    # `produce` is idempotent by default: each partition's leader knows the producer.
    producers = cli.json("topic", "producers", "orders")["partitions"]
    assert [p["partition"] for p in producers] == [0, 1]
    ids = {row["producer_id"] for p in producers for row in p["producers"]}
    assert len(ids) == 1 and min(ids) >= 0, producers
    assert all(row["producer_epoch"] == 0 and row["last_sequence"] >= 0
               for p in producers for row in p["producers"])  # fmt: skip
    assert "producer id" in cli.run("topic", "producers", "orders", check=True).stdout


def test_elect_reassign_and_delete_through_the_admin_api(cli):
    cli.run("topic", "create", "moves", "-p", "1", "-r", "2", check=True)
    result = cli.run("elect", "--preferred", "moves", check=True)
    assert "preferred replica election requested for 1 partitions" in result.stdout
    state = [p for p in cli.status()["partitions"] if p["topic"] == "moves"][0]
    target = [b for b in (0, 1, 2) if b not in state["replicas"]] + state["replicas"][:1]
    result = cli.run("reassign", "moves:0", "--replicas", ",".join(map(str, target)), check=True)
    assert "reassignment of moves:0" in result.stdout

    def moved():
        rows = [p for p in cli.status()["partitions"] if p["topic"] == "moves"]
        return rows and sorted(rows[0]["replicas"]) == sorted(target) and not rows[0]["rar"]

    wait_until(moved, 30, 0.2, "the controller applies the reassignment")
    result = cli.run("topic", "delete", "moves", check=True)
    assert "deletion of topic moves requested" in result.stdout
    wait_until(
        lambda: "moves" not in cli.json("topic", "list"), 30, 0.2, "the controller deletes it"
    )


def test_topic_configs_are_shown_with_their_source_and_altered_live(cli):
    cli.run("topic", "create", "tuned", "--config", "retention.ms=100000", check=True)

    def configs() -> dict:
        return {c["name"]: (c["value"], c["source"])
                for c in cli.json("topic", "describe", "tuned")["configs"]}  # fmt: skip

    before = configs()
    assert before["retention.ms"] == ("100000", "DYNAMIC_TOPIC_CONFIG")
    assert before["segment.bytes"][1] in ("STATIC_BROKER_CONFIG", "DEFAULT_CONFIG")
    shown = cli.run("topic", "describe", "tuned", check=True).stdout
    assert "configs set on the topic" in shown and "retention.ms" in shown
    assert "segment.bytes" not in shown  # only overrides unless --all-configs
    assert "segment.bytes" in cli.run("topic", "describe", "tuned", "--all-configs",
                                      check=True).stdout  # fmt: skip

    result = cli.run("topic", "alter", "tuned", "--config", "max.message.bytes=200000",
                     "--delete-config", "retention.ms", check=True)  # fmt: skip
    assert "its overrides now: max.message.bytes=200000" in result.stdout
    after = configs()
    assert after["max.message.bytes"] == ("200000", "DYNAMIC_TOPIC_CONFIG")
    assert after["retention.ms"][1] != "DYNAMIC_TOPIC_CONFIG"

    # a bad value: one line naming the property, and nothing changes
    line = one_line_error(cli.run("topic", "alter", "tuned", "--config", "retention.ms=-2"))
    assert "retention.ms=-2" in line
    assert configs() == after
    assert cli.run("topic", "alter", "tuned").returncode == 2  # nothing to change: usage


def test_kill_start_shutdown_and_signals(cli):
    cli.run("topic", "create", "kills", "-p", "1", "-r", "3", check=True)
    leader = cli.json("topic", "describe", "kills")["partitions"][0]["leader"]
    result = cli.json("kill", "leader:kills:0")
    assert result["id"] == leader and result["signal"] == "SIGKILL" and result["exited"]
    status = cli.status()
    assert not [b for b in status["brokers"] if b["id"] == leader][0]["alive"]

    def new_leader():
        p = cli.json("topic", "describe", "kills")["partitions"][0]
        return p["leader"] not in (-1, leader) and p

    wait_until(new_leader, 30, 0.2, "a new leader is elected")
    started = cli.json("start", str(leader))
    assert started["id"] == leader and cli.live_pids()[leader] == started["pid"]
    again = cli.run("start", str(leader))
    assert "already running" in one_line_error(again)

    paused = cli.json("kill", "2", "--signal", "STOP")
    assert cluster.process_state(paused["pid"]) == "T"
    assert [b for b in cli.status()["brokers"] if b["id"] == 2][0]["stopped"]
    cli.run("kill", "2", "--signal", "CONT", check=True)
    wait_until(lambda: cluster.process_state(paused["pid"]) in ("S", "R"), 10, 0.05)

    result = cli.run("shutdown", "1", check=True)
    assert "shut down" in result.stdout
    assert 1 not in cli.live_pids()
    cli.run("start", "1", check=True)


def test_controller_target_and_logs(cli):
    state = cli.status()
    if state["controller"] is None:
        assert "no controller" in one_line_error(cli.run("logs", "controller"))
        return
    result = cli.run("logs", "controller", "-n", "5", check=True)
    assert 0 < len(result.stdout.splitlines()) <= 5
    assert f"broker-{state['controller']}" in cli.run("logs", "controller", "-n", "200").stdout


def test_status_reads_the_metrics_board(cli):
    """A writer in this process stands in for a broker (row 100: no broker of the cluster)."""
    from localcluster.metrics import MetricsBoard

    cli.run("topic", "create", "board", "-p", "1", "-r", "1", check=True)
    writer = MetricsBoard.open_writer(cli.cluster_dir, 100)
    try:
        writer.record_produce(1000, 10, 1500)
        writer.record_isr_change(shrink=True)
        writer.update_replicas([("board", 0, True, 30, 28)])
        result = cli.run("status", "--watch", "--json", "--count", "1", check=True)
        frame = json.loads(result.stdout.splitlines()[0])
        rows = [r for r in frame["rates"] if r["id"] == 100]
        assert rows, (frame["rates"], result.stderr)
        row = rows[0]
        assert row["isr_shrinks"] == 1 and row["produce_p50_us"] == 2048
        board0 = [p for p in frame["partitions"] if p["topic"] == "board"][0]
        assert board0["replica_offsets"]["100"] == {"log_end_offset": 30, "high_watermark": 28}
        assert "100:30/28" in cli.run("status", check=True).stdout
    finally:
        writer.close()


def test_status_watch_json_refreshes(cli):
    result = cli.run("status", "--watch", "--json", "--count", "2", "--interval", "0.2", check=True)
    frames = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(frames) == 2 and all("rates" in f for f in frames)
    plain = cli.run("status", "--watch", "--count", "1", check=True)
    assert "brokers" in plain.stdout


def test_records_the_brokers_refuse_are_one_line_each_run_not_a_traceback_each_record(cli):
    cli.run("topic", "create", "small-segments", "-p", "1", "-r", "3", "--config",
            "segment.bytes=1024", check=True)  # fmt: skip
    # 100 records of ~60 bytes go as one batch, larger than the topic's segments
    result = cli.run(
        "produce", "small-segments", input="".join(f"{'x' * 60}-{i}\n" for i in range(100))
    )
    assert result.returncode == 1
    # what was sent and what failed, then the broker's reason, once: 2 lines in all
    produced, failed = result.stderr.splitlines()
    assert produced == "produced 0 records to small-segments"
    assert re.fullmatch(
        r"error: 100 records failed: produce to small-segments-0 \(producer \d+ epoch 0 sequence "
        r"0\): MESSAGE_TOO_LARGE \(batch of \d+ bytes is larger than the segment size, "
        r"segment\.bytes=1024 \(the topic's, or the broker's log\.segment\.bytes\)\)",
        failed,
    ), failed


def test_logs_follow_stops_on_interrupt(cli):
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "localcluster", "logs",
                                "0", "-f", "-n", "1", "--dir", str(cli.cluster_dir)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert process.stdout.readline()
        process.send_signal(signal.SIGINT)
        try:
            # Read all it prints meanwhile, as a terminal does (its pipe never fills).
            _, stderr = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            # Seen once in a make test run here and not in 72 runs since: say where it was.
            process.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            _, stderr = process.communicate(timeout=10)
            pytest.fail(f"`logs -f` still ran 20 s after SIGINT; where it was:\n{stderr}")
        assert process.returncode == 0, stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


BAD_INPUT = [
    (("kill", "9"), 1, "unknown broker 9"),
    (("kill", "leader:nosuch:0"), 1, "unknown topic"),
    (("kill", "leader:nocolon"), 1, "TOPIC:PARTITION"),
    (("kill", "somebody"), 1, "names no broker"),
    (("start", "7"), 1, "unknown broker 7"),
    (("topic", "describe", "nosuch"), 1, "nosuch"),
    (("consume", "nosuch", "--max-messages", "1"), 1, "nosuch"),
    (("topic", "create", "toowide", "-p", "1", "-r", "5"), 1, "replication"),
    (("topic", "delete", "nosuch"), 1, "unknown topic"),
    (("topic", "create", "badconfig", "--config", "novalue"), 2, "key=value"),
    (("reassign", "orders", "--replicas", "0,1"), 2, "TOPIC:PARTITION"),
    (("reassign", "orders:0", "--replicas", "0,x"), 2, "broker ids"),
    (("reassign", "orders:0", "--replicas", "0,9"), 1, "unknown broker 9"),
    (("reassign", "orders:0", "--replicas", "0,0"), 1, "twice"),
    (("elect",), 2, "--preferred or --unclean"),
    (("elect", "--preferred", "nosuch"), 1, "unknown topic"),
    (("up", "-n", "0"), 2, "-n"),
    (("up", "-n", "2", "--set", "nokey"), 2, "key=value"),
    (("up", "-n", "2", "--set", "no.such.property=1"), 2, "unknown broker property"),
    (("up", "-n", "2", "--racks", "a,b,c"), 2, "racks"),
    (("kill", "0", "--signal", "BOGUS"), 2, "BOGUS"),
]


@pytest.mark.parametrize("args,code,text", BAD_INPUT, ids=[" ".join(a) for a, _, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_no_traceback(cli, args, code, text):
    before = cli.live_pids()
    result = cli.run(*args, timeout_s=60)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert text in result.stderr, result.stderr
    if code == 1:
        assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, (
            result.stderr
        )
    assert cli.live_pids() == before


def test_no_cluster_and_stale_pid_files(tmp_path):
    empty = Cli(tmp_path / "nothing")
    for args in (("status",), ("down",), ("kill", "0"), ("topic", "list"), ("logs", "0")):
        line = one_line_error(empty.run(*args))
        assert "no cluster in" in line and "localcluster up" in line

    stale = Cli(tmp_path / "stale")
    spec = cluster.ClusterSpec(brokers=[0, 1], coordination=str(stale.cluster_dir / "store"),
                               created_ms=int(time.time() * 1000))  # fmt: skip
    cluster.save_spec(stale.cluster_dir, spec)
    for b in (0, 1):
        cluster.broker_dir(stale.cluster_dir, b).mkdir(parents=True)
        cluster.pid_file(stale.cluster_dir, b).write_text("999999\n")  # no such process
    state = stale.status()
    assert [b["stale_pid_file"] for b in state["brokers"]] == [True, True]
    assert not any(b["alive"] for b in state["brokers"])
    assert "stale pid files" in stale.run("status", check=True).stdout
    assert "not running" in one_line_error(stale.run("kill", "0"))
    assert "no broker is running" in one_line_error(stale.run("topic", "list"))
    result = stale.run("down", check=True)
    assert "removed 2 stale pid files" in result.stdout
    assert not cluster.pid_file(stale.cluster_dir, 0).exists()


def test_a_broker_that_cannot_start_fails_up_in_one_line(tmp_path):
    import socket

    c = Cli(tmp_path / "cluster")
    with socket.socket() as taken:  # another process holds broker 0's port
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        try:
            line = one_line_error(c.run("up", "-n", "2", "--detach", "--port-base", str(port)))
            assert "exited while starting" in line and "Address already in use" in line
            assert f"PLAINTEXT://127.0.0.1:{port}" in line, line
            assert c.live_pids() == {}
        finally:
            c.teardown()


# One codec here (the flag's path is the same for all); test_compression_clients.py reads all
# four from confluent-kafka, kafka-python and our producer.
@pytest.mark.parametrize("codec", ["snappy"])
def test_produce_compresses_and_consume_and_log_dump_read_it_back(cli, codec):
    topic = f"packed-{codec}"
    cli.json("topic", "create", topic, "-p", "1", "-r", "3")
    lines = [f"{codec}-{i}" for i in range(20)]
    produced = cli.json("produce", topic, "--compression", codec, input="\n".join(lines) + "\n")
    assert produced["records"] == 20 and produced["errors"] == 0
    result = cli.run("consume", topic, "--from-beginning", "--max-messages", "20", check=True)
    assert result.stdout.split() == lines
    leader = cli.json("topic", "describe", topic)["partitions"][0]["leader"]
    spec = cluster.load_spec(cli.cluster_dir)
    partition_dir = cluster.data_dir_of(cli.cluster_dir, spec, leader) / f"{topic}-0"
    dump = subprocess.run([sys.executable, "-m", "localcluster", "log", "dump", "--records",
                           str(partition_dir)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    assert dump.returncode == 0, dump.stderr
    assert codec in dump.stdout.split(), dump.stdout  # the batch's compression column
    assert f"-={codec}-19" in dump.stdout  # its last record, decompressed
