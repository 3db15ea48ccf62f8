"""bench.groups run as a command at its smallest quick setting, and its analysis on made-up rows.

The run (`--quick --members 1 --kills 1 --commits 30`) starts its own three brokers, measures a
few commits with both clients, one single-member join and one kill -9 of the group's coordinator,
and writes groups.json; the test checks the document's shape and that the figures are the kind
that can be true (every latency positive and ordered, another broker named coordinator, every
acknowledged record received, the committed offset read back). The at-least-once
analysis is checked on made-up commits and records. Assertions are never on speed: this box is
shared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.groups import exposure, failover_summary

pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")

REPOSITORY = Path(__file__).resolve().parents[2]


def test_the_quick_run_writes_plausible_figures(tmp_path):
    env = {**os.environ, "BENCH_RESULTS_DIR": str(tmp_path), "PYTHONPATH": str(REPOSITORY)}
    result = subprocess.run([sys.executable, "-m", "bench.groups", "--quick", "--members", "1", "--kills", "1",
                             "--commits", "30", "--json"], cwd=REPOSITORY, env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert doc == json.loads((tmp_path / "groups.json").read_text())
    assert doc["benchmark"] == "groups" and doc["config"]["group_initial_rebalance_delay_ms"] == 0

    assert [r["client"] for r in doc["commit"]] == ["confluent", "kafka-python"]
    for row in doc["commit"]:
        assert row["errors"] == {}, row["errors"]
        for key in ("offset_commit_ms", "produce_ms"):
            figures = row[key]
            assert figures["samples"] == 30
            assert 0 < figures["p50"] <= figures["p99"] <= figures["p99.9"] <= figures["max"]
        assert row["ratio_p50"] > 0 and len(row["replicas"]) == 3

    (run,) = doc["rebalance"]["runs"]
    assert (
        run["members"] == 1 and run["join_s"] > 0 and run["leave_s"] is None and not run["errors"]
    )
    assert run["assignments_per_member"] == [1]

    failover = doc["failover"]
    (kill,) = failover["kills"]
    assert kill["new_coordinator"] not in (None, failover["victim"])
    assert (
        0 < kill["coordinator_named_s"] and 0 < kill["commit_ok_s"] and 0 < kill["records_again_s"]
    )
    assert kill["sentinel_ok"], kill
    check = failover["check"]
    assert check["lost"] == 0, check["lost_examples"]
    assert check["acknowledged"] > 0 and check["unique"] >= check["acknowledged"]
    assert check["received"] == check["unique"] + check["redelivered"]
    assert failover["reader_error"] is None
    assert {g["goal"].split(":")[0] for g in doc["goals"]} == {"coordinator failover"}


def test_exposure_counts_records_beyond_the_last_acknowledged_commit():
    kill = {"killed_at": 10.0}
    commits = [(9.0, 9.1, {0: 2}, None),  # acknowledged before the kill: offsets 0, 1 are safe
               (9.95, 10.4, {0: 4}, "_TRANSPORT"),  # in flight at the kill, failed
               (10.5, 10.9, {0: 6}, None)]  # fmt: skip  # the first commit that succeeds after it
    received = [
        (0, offset, 0.0, at) for offset, at in enumerate((8.0, 8.5, 9.5, 9.9, 10.2, 10.45, 10.6))
    ]
    found = exposure(kill, received, commits)
    assert found == {"uncommitted_at_kill": 2, "uncommitted_at_recovery": 4,
                     "failed_commits": {"_TRANSPORT": 1}}  # fmt: skip


def test_a_kill_without_recovery_is_counted_but_not_measured():
    kills = [{"coordinator_named_s": 0.2, "commit_ok_s": 0.5, "records_again_s": 0.6},
             {"coordinator_named_s": 0.3, "commit_ok_s": None, "records_again_s": 0.9}]  # fmt: skip
    summary = failover_summary(kills)
    assert summary["commit_ok_s"] == {"measured": 1, "of": 2, "p50": 0.5, "p99": 0.5, "max": 0.5}
    assert summary["records_again_s"]["p99"] == 0.9
