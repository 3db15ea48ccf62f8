"""Helpers for the CLI tests: run `python -m localcluster ...` against a tmp cluster dir, and
always tear the cluster down (by the CLI, then by pid files and process groups)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from localcluster import cluster

TIMEOUT_S = 120


class Cli:
    def __init__(self, cluster_dir: Path):
        self.cluster_dir = cluster_dir

    def run(self, *args: str, input: str | None = None, timeout_s: float = TIMEOUT_S,
            check: bool = False) -> subprocess.CompletedProcess:  # fmt: skip
        result = subprocess.run([sys.executable, "-m", "localcluster", *args, "--dir", str(self.cluster_dir)],
                                input=input, capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
        if check:
            assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
        return result

    def json(self, *args: str, **kwargs):
        result = self.run(*args, "--json", check=True, **kwargs)
        return json.loads(result.stdout)

    def status(self) -> dict:
        return self.json("status")

    def live_pids(self) -> dict[int, int]:
        try:
            spec = cluster.load_spec(self.cluster_dir)
        except cluster.ClusterError:
            return {}
        return cluster.live_brokers(self.cluster_dir, spec)

    def teardown(self) -> None:
        """down --purge; then SIGKILL anything still running from the pid files."""
        try:
            self.run("down", "--purge", "--timeout", "5", timeout_s=60)
        except subprocess.TimeoutExpired:
            pass
        for pid in self.live_pids().values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        supervisor = cluster.supervisor_pid(self.cluster_dir)
        if supervisor is not None:
            os.kill(supervisor, signal.SIGKILL)
        from localcluster.metrics import MetricsBoard

        MetricsBoard.unlink(self.cluster_dir)
        cluster.purge(self.cluster_dir, None)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """Assert the command failed with one line and no traceback; return that line."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, result
    return lines[-1]


@contextlib.contextmanager
def detached_cluster(cluster_dir: Path):
    """`localcluster up -n 3 --detach`, torn down after. A killed follower leaves the ISR after
    replica.lag.time.max.ms: 2 s keeps tests that kill brokers short."""
    c = Cli(cluster_dir)
    try:
        c.run("up", "-n", "3", "--detach", "--set", "replica.lag.time.max.ms=2000", check=True)
        yield c
    finally:
        c.teardown()
