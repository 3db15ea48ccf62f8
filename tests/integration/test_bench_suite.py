"""The benchmark suite's parts that can be checked without timing anything.

- bench.load against a real three-broker cluster: a matrix cell with each client is
  acknowledged without error, every acknowledged record is stored, and the cell's topic is
  deleted afterwards.
- bench.suite as a command: a run of two quick steps writes its JSON, logs and report.md into a
  fresh results directory; a bad step name is a clear usage error.

Assertions are on counts and contents, never on speed: this box is shared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.broker import Cluster
from bench.load import LoadPool, batch_records_for
from bench.matrix import FULL as MATRIX_FULL
from bench.matrix import Topics, cells, measure_cell

REPOSITORY = Path(__file__).resolve().parents[2]


def test_full_matrix_has_every_combination_the_issue_names():
    every = cells(MATRIX_FULL)
    # acks x RF x size x partitions x client, and our client's acks=all cells twice (idempotent
    # and not: issue 14's same-run ratio)
    assert len(every) == 3 * 2 * 2 * 2 * 2 + 2 * 2 * 2
    assert {(c["acks"], c["replication_factor"], c["record_size"], c["partitions"], c["client"])
            for c in every} == {(a, rf, s, p, cl) for a in ("0", "1", "all") for rf in (1, 3)
                                for s in (100, 1024) for p in (1, 6) for cl in ("own", "confluent")}  # fmt: skip
    both = [c for c in every if c["client"] == "own" and c["acks"] == "all"]
    assert sorted(c["idempotence"] for c in both) == [False] * 8 + [True] * 8


def test_batch_records_fill_about_64_kib():
    assert batch_records_for(100) * 110 <= 64 << 10 < (batch_records_for(100) + 1) * 110 + 61
    assert batch_records_for(1 << 20) == 1


@pytest.fixture(scope="module")
def cluster():
    c = Cluster({"auto.create.topics.enable": "false", "auto.leader.rebalance.enable": "false"})
    try:
        c.start((0, 1, 2))
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def pool():
    with LoadPool(2) as p:
        yield p


@pytest.mark.parametrize("client", ["own", "confluent"])
def test_a_matrix_cell_stores_every_acknowledged_record_and_deletes_its_topic(
    cluster, pool, client
):
    topics = Topics(cluster)
    cell = {
        "replication_factor": 3,
        "partitions": 2,
        "record_size": 100,
        "acks": "all",
        "client": client,
    }
    result = measure_cell(pool, cluster, topics, cell, seconds=0.5, rate=20_000)
    assert result["errors"] == 0, result["first_error"]
    assert result["records"] > 0 and result["latency_ms"]["count"] > 0
    assert result["stored"] >= result["records"]  # acks=all: nothing acknowledged is missing
    assert result["curve_ms"][-1][0] == 100.0
    cluster.wait_until(lambda: result["topic"] not in cluster.zk().topics(), 30,
                       f"the controller to delete {result['topic']}")  # fmt: skip


def _suite(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "BENCH_RESULTS_DIR"}
    return subprocess.run([sys.executable, "-m", "bench.suite", *args, "--results", str(tmp_path)],
                          cwd=REPOSITORY, capture_output=True, text=True, timeout=300, env=env)  # fmt: skip


def test_suite_runs_the_chosen_steps_into_a_fresh_results_directory(tmp_path):
    done = _suite("--quick", "--only", "storage,startup", tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.is_symlink()]
    assert (tmp_path / "latest").resolve() == run.resolve()
    for name in ("storage", "startup", "suite"):
        assert json.loads((run / f"{name}.json").read_text())["benchmark"] == name
    assert (run / "storage.log").read_text().strip()
    report = (run / "report.md").read_text()
    assert "| memcpy |" in report and "| append shm |" in report  # limits of this run
    assert "bench.startup" in report and "peak RSS per broker" in report  # its goals
    assert "_The matrix did not run._" in report and "_bench.failover did not run._" in report
    steps = json.loads((run / "suite.json").read_text())["steps"]
    assert [(s["name"], s["status"]) for s in steps] == [("storage", "ok"), ("startup", "ok")]


def test_suite_names_the_steps_when_given_an_unknown_one(tmp_path):
    done = _suite("--only", "storage,nosuch", tmp_path=tmp_path)
    assert done.returncode == 2
    assert "unknown step nosuch" in done.stderr and "matrix" in done.stderr
    assert not any(tmp_path.iterdir())


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # exited, not yet reaped by its parent


def test_a_failing_and_an_overrunning_step_are_reported_and_stopped(tmp_path, monkeypatch):
    from bench import suite

    monkeypatch.delenv("BENCH_RESULTS_DIR", raising=False)  # main() sets it; restored after
    monkeypatch.setattr(suite, "STEPS", {"fail": ("tests.bench_step_stub fail", 60, 60, True),
                                         "hang": ("tests.bench_step_stub hang", 3, 3, True)})  # fmt: skip
    assert suite.main(["--quick", "--results", str(tmp_path)]) == 1
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.is_symlink()]
    steps = {s["name"]: s["status"] for s in json.loads((run / "suite.json").read_text())["steps"]}
    assert steps == {"fail": "failed (exit code 3)", "hang": "stopped after its 3 s limit"}
    assert "failing on purpose" in (run / "fail.log").read_text()
    pids = [int(p) for p in (run / "hang.pids").read_text().split()]
    deadline = time.monotonic() + 10  # SIGTERM reached the group; the child dies on its own time
    while not all(_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, "the step's process group outlived the suite"
        time.sleep(0.02)
    report = (run / "report.md").read_text()
    assert (
        "| fail | failed (exit code 3) |" in report
        and "| hang | stopped after its 3 s limit |" in report
    )
