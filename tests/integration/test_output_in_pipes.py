"""Output without a terminal: tables at their natural width, nothing cut, copied lines whole.

A long cluster dir makes long Unix socket paths: at 80 columns rich squeezed the status table
("partit…", "lea…", socket paths cut) and wrapped the bootstrap line inside a port."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from localcluster import cluster
from tests.integration.cli_cluster import Cli


def run_piped(cluster_dir, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    result = subprocess.run([sys.executable, "-m", "localcluster", *args, "--dir", str(cluster_dir)],
                            capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_up_and_status_print_whole_lines_in_a_pipe(tmp_path):
    directory = tmp_path / ("a-cluster-dir-with-a-long-name-" + "x" * 40)
    c = Cli(directory)
    try:
        out = run_piped(directory, "up", "-n", "2", "--detach")
        spec = cluster.load_spec(directory)
        expected = ",".join(f"127.0.0.1:{spec.ports[b]}" for b in (0, 1))
        assert f"bootstrap servers: {expected}\n" in out, out
        status = run_piped(directory, "status")
        for text in (out, status):
            assert "…" not in text, text
            assert max(len(line) for line in text.splitlines()) > 80, "rendered for 80 columns"
        for broker in (0, 1):
            socket_path = str(cluster.broker_dir(directory, broker)) + ".sock"
            if len(socket_path) <= 100:  # else it lives under the temp dir
                assert socket_path in status, status
        assert re.search(r"^bootstrap servers: " + re.escape(expected) + "$", status, re.M), status
    finally:
        c.teardown()
