"""One broker as a child process: start it, wait until it is ready, stop or kill it.

For tests and benchmarks that manage brokers by hand (the supervisor has its own spawning,
with pid files and logs in the cluster dir). The broker runs as `python -m
localcluster.broker` in its own process group; it is ready when it prints its "ready on
host:port" line (after it registered in the store), awaited with a deadline. Its output is
kept, bounded, for failure messages.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

READY = re.compile(r"broker (\d+) ready on ([\d.]+):(\d+) \(pid (\d+)\)")
OUTPUT_LINES = 5000


class BrokerProcessError(RuntimeError):
    pass


class BrokerProcess:
    def __init__(self, broker_id: int, cluster_dir: Path, settings: dict[str, str] | None = None,
                 data_dir: Path | None = None):  # fmt: skip
        self.broker_id = broker_id
        self.cluster_dir = cluster_dir
        data = data_dir if data_dir is not None else cluster_dir / f"data-{broker_id}"
        self.settings = {"log.dirs": str(data), **(settings or {})}
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.output: collections.deque[str] = collections.deque(maxlen=OUTPUT_LINES)
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

    def start(self, timeout_s: float = 30.0) -> BrokerProcess:
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
            raise BrokerProcessError(f"broker {self.broker_id} not ready within {timeout_s} s:\n"
                                      + "".join(list(self.output)[-40:]))  # fmt: skip
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
            raise BrokerProcessError(
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
