"""A chaos run against a cluster that goes away gives up within seconds: one error line, exit
1, and no broker started again. The cluster is a detached one (`up --detach`), removed while
the faults run: by `down --purge`, or by deleting its dir under the running brokers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from localcluster import cluster
from tests.helpers import wait_until
from tests.integration.cli_cluster import Cli

GIVE_UP_WITHIN_S = 20.0  # the watch notices at once; the producer gets 0.5 s to close


def start_chaos(c: Cli) -> tuple[subprocess.Popen, list[str]]:
    """`localcluster chaos --dir` for far longer than the test; its output collected."""
    run = subprocess.Popen([sys.executable, "-m", "localcluster", "chaos", "--dir", str(c.cluster_dir),
                            "--duration", "600", "--kill-every", "2000", "--targets", "follower",
                            "--rate", "200"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(run.stdout), daemon=True).start()
    return run, lines


def wait_gave_up(run: subprocess.Popen, lines: list[str]) -> float:
    """Seconds until the run ended by itself; it is killed if it did not."""
    removed = time.monotonic()
    try:
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    took = time.monotonic() - removed
    output = "".join(lines)
    assert run.returncode == 1, output[-3000:]
    # The last line is the command's own error (the coordination client may log a traceback
    # of its store vanishing before that: a log line, not the command failing).
    last = [line for line in lines if line.strip()][-1]
    assert last.startswith("error: ") and "cluster in" in last, output[-3000:]
    return took


def running_in(cluster_dir) -> set[int]:
    """Live processes whose command line names the cluster dir (brokers, supervisors)."""
    out = set()
    for proc in os.listdir("/proc"):
        if proc.isdigit() and str(cluster_dir) in " ".join(cluster.cmdline(int(proc))):
            if cluster.process_state(int(proc)) not in (None, "Z", "X"):
                out.add(int(proc))
    return out


def remove_tree(path) -> bool:
    """One `rm -rf` of `path`; whether anything is left (a file made during the walk)."""
    shutil.rmtree(path, ignore_errors=True)
    return path.exists()


@pytest.mark.parametrize("how", ["down --purge", "dir deleted"])
def test_chaos_gives_up_when_its_cluster_is_removed(tmp_path, how):
    c = Cli(tmp_path / "cluster")
    pids: dict[int, int] = {}
    spec = None
    try:
        c.run("up", "-n", "3", "--detach", check=True)
        spec = cluster.load_spec(c.cluster_dir)
        run, lines = start_chaos(c)
        wait_until(lambda: any("faults as they happen" in line for line in lines), timeout_s=90,
                   message="chaos reaches its fault phase")  # fmt: skip
        pids = dict(enumerate(running_in(c.cluster_dir)))  # right before the removal
        if how == "down --purge":
            c.run("down", "--purge", "--timeout", "5", check=True)
        else:  # as `rm -rf` again until it is gone: the live brokers keep writing files into it
            wait_until(lambda: not remove_tree(c.cluster_dir), timeout_s=10,
                       message=f"{c.cluster_dir} is removed under its running brokers")  # fmt: skip
        took = wait_gave_up(run, lines)
        assert took < GIVE_UP_WITHIN_S, f"gave up after {took:.1f} s"
        print(f"{how}: chaos gave up {took:.1f} s after the removal")
        assert "is gone" in [line for line in lines if line.strip()][-1]
        started_since = {pid: cluster.cmdline(pid)[:4] for pid in running_in(c.cluster_dir)
                         if pid not in pids.values()}  # fmt: skip
        assert not started_since, f"processes of the removed cluster started: {started_since}"
    finally:
        for pid in pids.values():  # the brokers of a deleted dir run on: end them by pid
            if pid > 0:
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
        if spec is not None:
            for broker in spec.brokers:
                shutil.rmtree(cluster.data_dir_of(c.cluster_dir, spec, broker), ignore_errors=True)
        if c.cluster_dir.exists():
            c.teardown()
