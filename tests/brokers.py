"""Real broker processes for tests: start, wait until ready, stop or kill, always clean up.

A broker runs as `python -m localcluster.broker` in its own process group; readiness is its
"ready on host:port" line on stdout (printed after it registered in the store), awaited with a
deadline. Logs go to a fresh directory the caller owns. The `brokers` fixture kills every
process it started, by process group, whatever the test did.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

READY = re.compile(r"broker (\d+) ready on ([\d.]+):(\d+) \(pid (\d+)\)")


class BrokerProcess:
    def __init__(self, broker_id: int, cluster_dir: Path, settings: dict[str, str] | None = None):
        self.broker_id = broker_id
        self.cluster_dir = cluster_dir
        self.settings = {"log.dirs": str(cluster_dir / f"data-{broker_id}"), **(settings or {})}
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.output: list[str] = []
        self._ready = threading.Event()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def socket_path(self) -> Path:
        from localcluster.broker.server import socket_path

        return socket_path(self.cluster_dir, self.broker_id)

    @property
    def data_dir(self) -> Path:
        return Path(self.settings["log.dirs"])

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout_s: float = 20.0) -> BrokerProcess:
        args = [sys.executable, "-m", "localcluster.broker", "--id", str(self.broker_id),
                "--cluster-dir", str(self.cluster_dir)]  # fmt: skip
        for key, value in self.settings.items():
            args += ["--set", f"{key}={value}"]
        self._ready.clear()
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)  # fmt: skip
        threading.Thread(target=self._drain, args=(self.process,), daemon=True).start()
        if not self._ready.wait(timeout_s):
            self.kill()
            raise AssertionError(f"broker {self.broker_id} not ready within {timeout_s} s:\n"
                                 + "".join(self.output[-40:]))  # fmt: skip
        return self

    def _drain(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.output.append(line)
            match = READY.search(line)
            if match:
                self.port = int(match.group(3))
                self._ready.set()

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM (a clean shutdown) and wait; returns the exit code."""
        if not self.is_alive():
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"broker {self.broker_id} ignored SIGTERM for {timeout_s} s"
            ) from None

    def kill(self) -> None:
        """SIGKILL the broker's whole process group and reap it."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def log_text(self) -> str:
        return "".join(self.output)


class BrokerSet:
    """Starts brokers in one cluster dir and kills all of them at the end of a test."""

    def __init__(self, cluster_dir: Path):
        self.cluster_dir = cluster_dir
        self.started: list[BrokerProcess] = []

    def start(self, broker_id: int = 1, **settings: str) -> BrokerProcess:
        props = {k.replace("_", "."): str(v) for k, v in settings.items()}
        broker = BrokerProcess(broker_id, self.cluster_dir, props)
        self.started.append(broker)
        return broker.start()

    def restart(self, broker: BrokerProcess) -> BrokerProcess:
        assert not broker.is_alive()
        return broker.start()

    def cleanup(self) -> None:
        for broker in self.started:
            broker.kill()


@pytest.fixture
def brokers(tmp_path):
    """`brokers.start(1)` starts broker 1 in a fresh cluster dir; all are killed afterwards."""
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    started = BrokerSet(cluster)
    try:
        yield started
    finally:
        started.cleanup()
