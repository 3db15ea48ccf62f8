"""The supervisor: the foreground event log and Ctrl-C, and that it is no single point of
failure (SIGKILL it: brokers keep serving, status works, down stops every broker)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

from localcluster import cluster
from localcluster.metrics import MetricsBoard
from tests.helpers import wait_until
from tests.integration.cli_cluster import Cli


class Foreground:
    """`localcluster up` in the foreground, its output lines on a queue."""

    def __init__(self, cluster_dir: Path, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "localcluster", "up", *args, "--dir", str(cluster_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, text: str, timeout_s: float = 60.0) -> str:
        """The first output line containing text, among those seen so far or to come."""

        def found():
            for line in self.seen:
                if text in line:
                    return line
            while True:
                try:
                    line = self.lines.get_nowait()
                except queue.Empty:
                    return None
                self.seen.append(line)
                if text in line:
                    return line

        return wait_until(
            found, timeout_s, 0.02, f"{text!r} in the supervisor's output: {self.seen[-20:]}"
        )

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def test_foreground_reports_events_and_ctrl_c_stops_the_cluster(tmp_path):
    cli = Cli(tmp_path / "cluster")
    up = Foreground(cli.cluster_dir, "-n", "3", "--set", "replica.lag.time.max.ms=2000")
    try:
        up.wait_for("streaming events")
        pids = cli.live_pids()
        assert sorted(pids) == [0, 1, 2]
        assert cluster.supervisor_pid(cli.cluster_dir) == up.process.pid
        cli.run("topic", "create", "events", "-p", "1", "-r", "3", check=True)
        up.wait_for("topic events created")
        leader = cli.json("topic", "describe", "events")["partitions"][0]["leader"]
        cli.run("kill", str(leader), check=True)
        up.wait_for(f"broker {leader} died")
        if cli.status()["controller"] is not None:
            up.wait_for("elected", 30)  # a new leader for events-0, once the controller acts
        cli.run("start", str(leader), check=True)
        up.wait_for(f"broker {leader} registered")

        up.process.send_signal(signal.SIGINT)
        assert up.process.wait(60) == 0
        up.wait_for("cluster stopped")
        assert cli.live_pids() == {}
        assert all(cluster.process_state(p) in (None, "Z") for p in pids.values())
        assert not MetricsBoard.exists(cli.cluster_dir)
        assert not (cli.cluster_dir / cluster.SUPERVISOR_PID).exists()
    finally:
        up.kill()
        cli.teardown()


def test_sigterm_stops_the_cluster_after_the_reader_of_its_output_is_gone(tmp_path):
    """`localcluster up | tee up.log` and Ctrl-C: the signal stops tee as well, and the
    supervisor's "stopping the cluster" line met a broken pipe before it stopped a broker."""
    cli = Cli(tmp_path / "cluster")
    up = subprocess.Popen([sys.executable, "-m", "localcluster", "up", "-n", "2", "--dir", str(cli.cluster_dir)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        seen = b""
        while b"streaming events" not in seen:  # bounded by the supervisor's own ready timeout
            line = up.stdout.readline()
            assert line, f"up ended before it was ready: {seen!r} {up.stderr.read()!r}"
            seen += line
        pids = cli.live_pids()
        assert sorted(pids) == [0, 1]
        up.stdout.close()  # the reader is gone
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0, up.stderr.read()
        assert cli.live_pids() == {}
        assert all(cluster.process_state(p) in (None, "Z") for p in pids.values())
        assert not (cli.cluster_dir / cluster.SUPERVISOR_PID).exists()
    finally:
        if up.poll() is None:
            up.kill()
        up.wait()
        cli.teardown()


def test_brokers_outlive_a_sigkilled_supervisor_and_down_stops_them(tmp_path):
    cli = Cli(tmp_path / "cluster")
    try:
        cli.run("up", "-n", "2", "--detach", check=True)
        supervisor = cluster.supervisor_pid(cli.cluster_dir)
        assert supervisor is not None
        pids = cli.live_pids()
        os.kill(supervisor, signal.SIGKILL)
        wait_until(lambda: cluster.supervisor_pid(cli.cluster_dir) is None, 10)

        state = cli.status()
        assert state["supervisor_pid"] is None
        assert all(b["alive"] and b["registered"] for b in state["brokers"])
        assert cli.live_pids() == pids
        cli.run("topic", "create", "after", "-p", "1", "-r", "2", check=True)
        cli.run("produce", "after", input="one\ntwo\nthree\n", check=True)
        result = cli.run("consume", "after", "--from-beginning", "--max-messages", "3", check=True)
        assert result.stdout.split() == ["one", "two", "three"]
        again = cli.run("up", "-n", "2", "--detach")
        assert again.returncode == 1 and "already running" in again.stderr

        result = cli.run("down", check=True)
        assert "stopped brokers 0, 1" in result.stdout or "SIGKILLed" in result.stdout
        assert cli.live_pids() == {}
        assert all(cluster.process_state(p) in (None, "Z") for p in pids.values())
        assert "no broker was running" in cli.run("down", check=True).stdout

        # a stopped cluster starts again with its data
        cli.run("up", "-n", "2", "--detach", check=True)
        result = cli.run("consume", "after", "--from-beginning", "--max-messages", "3", check=True)
        assert result.stdout.split() == ["one", "two", "three"]
        from localcluster.broker.server import default_data_dir

        data = default_data_dir(cli.cluster_dir, 0)
        cli.run("down", "--purge", check=True)
        assert not cli.cluster_dir.exists() and not data.exists()
        assert not MetricsBoard.exists(cli.cluster_dir)
    finally:
        cli.teardown()


def test_a_cluster_on_a_real_zookeeper(tmp_path, zookeeper_server):
    import uuid

    from localcluster import coord

    chroot = f"/localcluster-cli-{uuid.uuid4().hex[:8]}"
    cli = Cli(tmp_path / "cluster")
    try:
        cli.run(
            "up",
            "-n",
            "2",
            "--detach",
            "--zookeeper",
            f"{zookeeper_server.hosts}{chroot}",
            check=True,
        )
        state = cli.status()
        assert state["coordination"] == f"zookeeper://{zookeeper_server.hosts}{chroot}"
        assert [b["alive"] and b["registered"] for b in state["brokers"]] == [True, True]
        assert not (cli.cluster_dir / "store").exists()
        cli.run("topic", "create", "zk", "-p", "1", "-r", "2", check=True)
        cli.run("produce", "zk", input="a\nb\n", check=True)
        result = cli.run("consume", "zk", "--from-beginning", "--max-messages", "2", check=True)
        assert result.stdout.split() == ["a", "b"]
        cli.run("down", "--purge", check=True)
        client = coord.connect(f"zookeeper://{zookeeper_server.hosts}")
        try:
            assert client.exists(chroot) is None
        finally:
            client.stop()
    finally:
        cli.teardown()
