"""Starting broker processes: the one spawner, and BrokerProcess for tests and benchmarks.

`spawn_broker` is the only place a broker process starts: `python -m localcluster.broker`
with its id, cluster dir and `--set` properties, in its own session (so it outlives whoever
started it and a signal to its process group reaches only it), stdin closed, working in the
cluster dir. cluster.spawn_broker (the supervisor, `start`, chaos, perf) sends its output to
broker-N/broker.log and writes the pid file; BrokerProcess reads it from a pipe.

BrokerProcess manages one broker by hand: it is ready when it prints its "ready on
host:port" line (after it registered in the store), awaited with a deadline; its output is
kept, bounded, for failure messages; stop is SIGTERM, kill SIGKILLs the process group.
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


def spawn_broker(broker_id: int, cluster_dir: Path, settings: dict[str, str], output,
                 coordination: str | None = None, source_tree: Path | None = None) -> subprocess.Popen:  # fmt: skip
    """Start broker `broker_id` with these properties; its stdout and stderr go to `output`
    (an open file, or subprocess.PIPE for a text pipe). `source_tree`: run the broker from that
    checkout's code (its PYTHONPATH), as benchmarks comparing two commits' brokers do."""
    cluster_dir = Path(cluster_dir).resolve()  # the broker works there, so no relative path
    args = [sys.executable, "-m", "localcluster.broker", "--id", str(broker_id),
            "--cluster-dir", str(cluster_dir)]  # fmt: skip
    if coordination is not None:
        args += ["--coordination", coordination]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    env = (
        None
        if source_tree is None
        else {**os.environ, "PYTHONPATH": str(Path(source_tree).resolve())}
    )
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, cwd=cluster_dir, env=env)  # fmt: skip


class BrokerProcess:
    def __init__(self, broker_id: int, cluster_dir: Path, settings: dict[str, str] | None = None,
                 data_dir: Path | None = None, source_tree: Path | None = None):  # fmt: skip
        self.broker_id = broker_id
        self.source_tree = source_tree
        self.cluster_dir = Path(cluster_dir).resolve()  # the broker's working dir
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
        self._ready.clear()
        self.process = spawn_broker(self.broker_id, self.cluster_dir, self.settings,
                                    subprocess.PIPE, source_tree=self.source_tree)  # fmt: skip
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
