"""`localcluster groups list/describe/delete/reset-offsets` and `consume --group` against a
3-broker cluster: describe shows committed offsets, log end offsets and lag as
kafka-consumer-groups.sh does; a second `consume --group` resumes after the first one's
commits; reset-offsets and delete refuse a group with members (one line, exit 1) and work once
it is empty; reset-offsets keeps --to-offset within the log, and --dry-run commits nothing.

`consume --group` runs as a real process (it is the member); the groups commands run in this
process through click's runner (the same code as the shell's, without paying the client's
import time for each of them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from localcluster.cli import main
from localcluster.client import Admin, Consumer, Producer
from localcluster.client.group_consumer import MemberState
from tests.helpers import wait_until
from tests.integration.cli_cluster import Cli

PARTITIONS = 3


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    c = Cli(tmp_path_factory.mktemp("groups-cli") / "cluster")
    try:
        c.run("up", "-n", "3", "--detach", "--set", "group.min.session.timeout.ms=1000",
              check=True)  # fmt: skip
        yield c
    finally:
        c.teardown()


@pytest.fixture(scope="module")
def bootstrap(cli) -> str:
    return cli.status()["bootstrap_servers"]


def invoke(cli: Cli, *args: str):
    return CliRunner().invoke(main, [*args, "--dir", str(cli.cluster_dir)])


def invoke_json(cli: Cli, *args: str):
    result = invoke(cli, *args, "--json")
    assert result.exit_code == 0, (args, result.output, result.exception)
    return json.loads(result.stdout)


def failure_line(result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def setup_topic(bootstrap: str, name: str, count: int) -> list[str]:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topic(name, PARTITIONS, 3, {"min.insync.replicas": "2"})
        admin.wait_for_leaders(name)
    values = [f"{name}-{i}" for i in range(count)]
    with Producer(bootstrap_servers=bootstrap) as producer:
        futures = [producer.send(name, v.encode(), key=v.encode()) for v in values]
        producer.flush()
        for f in futures:
            f.result()
    return values


def consume_process(cli: Cli, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "localcluster", "consume", *args,
                           "--dir", str(cli.cluster_dir)],
                          capture_output=True, text=True, timeout=90, env=env)  # fmt: skip


def test_describe_shows_lag_and_a_second_consumer_resumes_after_the_commits(cli, bootstrap):
    values = setup_topic(bootstrap, "orders", 30)
    first = consume_process(cli, "orders", "--group", "billing", "--from-beginning",
                            "--max-messages", "20")  # fmt: skip
    assert first.returncode == 0, first.stderr
    first_read = first.stdout.splitlines()
    assert len(first_read) == 20

    listed = invoke_json(cli, "groups", "list")
    assert {"group": "billing", "state": "Empty", "protocol_type": "consumer"}.items() <= next(
        g for g in listed if g["group"] == "billing").items()  # fmt: skip

    described = invoke_json(cli, "groups", "describe", "billing")
    assert described["state"] == "Empty" and described["members"] == []
    rows = described["partitions"]
    assert sorted(r["partition"] for r in rows) == [0, 1, 2]
    assert sum(r["current_offset"] for r in rows) == 20  # the commit on close: what was printed
    assert sum(r["log_end_offset"] for r in rows) == 30
    assert all(r["lag"] == r["log_end_offset"] - r["current_offset"] for r in rows)
    assert sum(r["lag"] for r in rows) == 10

    text = invoke(cli, "groups", "describe", "billing")
    assert text.exit_code == 0, text.output
    assert "state Empty" in text.stdout
    for header in ("current-offset", "log-end-offset", "lag"):
        assert header in text.stdout
    lagging = next(r for r in rows if r["lag"])
    row = next(line for line in text.stdout.splitlines()
               if line.split("│")[1:3] and line.split("│")[2].strip() == str(lagging["partition"]))  # fmt: skip
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[:5] == ["orders", str(lagging["partition"]), str(lagging["current_offset"]),
                         str(lagging["log_end_offset"]), str(lagging["lag"])]  # fmt: skip

    # status: the group with its coordinator and total lag; __consumer_offsets in one line
    status = invoke_json(cli, "status")
    group = next(g for g in status["groups"] if g["group"] == "billing")
    assert (group["state"], group["members"], group["lag"]) == ("Empty", 0, 10)
    assert group["coordinator"] == described["coordinator"]
    shown = invoke(cli, "status")
    assert shown.exit_code == 0, shown.output
    assert "__consumer_offsets: 50 partitions, 0 offline" in shown.stdout
    assert not any(line.lstrip("│ ").startswith("__consumer_offsets ") for line in
                   shown.stdout.splitlines()), "the internal topic's 50 rows should be summarised"  # fmt: skip
    billing = next(line for line in shown.stdout.splitlines() if " billing " in line)
    assert [c.strip() for c in billing.split("│")[1:-1]] == [
        "billing", "Empty", str(described["coordinator"]), "0", "10"]  # fmt: skip

    # --from-beginning is only the reset policy: committed offsets come first
    second = consume_process(cli, "orders", "--group", "billing", "--from-beginning",
                             "--max-messages", "10")  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert sorted(first_read + second.stdout.splitlines()) == sorted(values)


def test_reset_and_delete_need_an_empty_group(cli, bootstrap):
    values = setup_topic(bootstrap, "ledger", 40)
    tps = [("ledger", p) for p in range(PARTITIONS)]
    member = Consumer({"group.id": "audit", "client.id": "auditor", "auto.offset.reset": "earliest",
                       "heartbeat.interval.ms": 300}, bootstrap_servers=bootstrap)  # fmt: skip
    admin = Admin(bootstrap_servers=bootstrap)
    try:
        member.subscribe(["ledger"])
        read = []
        wait_until(lambda: read.extend(member.poll(100)) or len(read) >= len(values), 30, 0,
                   "the member read the topic")  # fmt: skip
        member.commit()
        assert member.coordinator.state is MemberState.STABLE

        described = invoke_json(cli, "groups", "describe", "audit")
        assert described["state"] == "Stable"
        (m,) = described["members"]
        assert m["client_id"] == "auditor" and m["host"].startswith("/")
        assert sorted(tuple(tp) for tp in m["assignment"]) == tps
        assert {r["member_id"] for r in described["partitions"]} == {m["member_id"]}
        assert all(r["lag"] == 0 for r in described["partitions"])

        refused = invoke(cli, "groups", "reset-offsets", "audit", "--topic", "ledger",
                         "--to-earliest")  # fmt: skip
        assert "inactive" in failure_line(refused) and "Stable" in refused.stderr
        assert "active members" in failure_line(invoke(cli, "groups", "delete", "audit"))
    finally:
        member.close()  # leaves: the group is Empty
    try:
        ends = dict(admin.list_group_offsets("audit", tps))
        assert sum(ends.values()) == len(values)

        plan = invoke_json(cli, "groups", "reset-offsets", "audit", "--topic", "ledger",
                           "--to-earliest", "--dry-run")  # fmt: skip
        assert [p["new_offset"] for p in plan["partitions"]] == [0, 0, 0]
        assert admin.list_group_offsets("audit", tps) == ends  # nothing committed

        invoke_json(cli, "groups", "reset-offsets", "audit", "--topic", "ledger", "--to-earliest")
        assert admin.list_group_offsets("audit", tps) == {tp: 0 for tp in tps}

        invoke_json(cli, "groups", "reset-offsets", "audit", "--topic", "ledger:1",
                    "--to-offset", "5")  # fmt: skip
        assert admin.list_group_offsets("audit", tps) == {**{tp: 0 for tp in tps},
                                                          ("ledger", 1): min(5, ends[("ledger", 1)])}  # fmt: skip

        invoke_json(cli, "groups", "reset-offsets", "audit", "--topic", "ledger",
                    "--to-offset", str(10**12))  # fmt: skip
        assert admin.list_group_offsets("audit", tps) == ends  # kept within the log

        invoke_json(cli, "groups", "reset-offsets", "audit", "--topic", "ledger", "--to-earliest")
        invoke_json(cli, "groups", "reset-offsets", "audit", "--topic", "ledger", "--to-latest")
        assert admin.list_group_offsets("audit", tps) == ends

        usage = invoke(cli, "groups", "reset-offsets", "audit", "--topic", "ledger")
        assert usage.exit_code == 2 and "exactly one of" in usage.output
        assert "no partition 7" in failure_line(invoke(cli, "groups", "reset-offsets", "audit",
                                                       "--topic", "ledger:7", "--to-latest"))  # fmt: skip

        assert invoke_json(cli, "groups", "delete", "audit") == {"group": "audit", "deleted": True}
        assert "audit" not in [g["group"] for g in invoke_json(cli, "groups", "list")]
        assert "does not exist" in failure_line(invoke(cli, "groups", "describe", "audit"))
        assert "does not exist" in failure_line(invoke(cli, "groups", "delete", "audit"))
    finally:
        admin.close()
