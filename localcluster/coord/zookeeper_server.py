"""Start and stop a private standalone ZooKeeper server (Debian's `zookeeper` package).

Used by the test session (tests/zookeeper.py) and bench.coord to run the real backend: a
ZooKeeperServerMain JVM with its own config, data directory and free client port, the admin
server off, stopped by its pid. Rules: never touches the system's ZooKeeper configuration or
service; every file it writes is under the given work directory. `host` is the address it binds
and reports (127.0.0.1 by default); `command_prefix` runs the JVM under another command, e.g.
`ip netns exec NS` to put it in a network namespace (tests/netns.py), and `port` fixes its port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess

from localcluster.waiting import wait_until

ZOOKEEPER_HOME = "/usr/share/zookeeper"
ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"  # its manifest's Class-Path names the rest
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"


class ZooKeeperUnavailable(RuntimeError):
    """ZooKeeper or Java is not installed, or the server did not come up."""


def installation_problem() -> str | None:
    """None when a server can be started here, else what is missing and how to get it."""
    if not os.path.exists(ZOOKEEPER_JAR):
        return f"{ZOOKEEPER_JAR} is missing: install Debian's zookeeper package (make system-deps)"
    if not _java():
        return "no java on PATH: install a JRE (Debian's zookeeper package depends on one)"
    return None


def _java() -> str | None:
    for candidate in (
        "/usr/bin/java",
        os.path.join(os.environ.get("JAVA_HOME", "/nonexistent"), "bin/java"),
    ):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def four_letter_word(port: int, word: str = "ruok", timeout_s: float = 1.0,
                     host: str = "127.0.0.1") -> str:  # fmt: skip
    with socket.create_connection((host, port), timeout=timeout_s) as connection:
        connection.sendall(word.encode())
        return connection.recv(4096).decode(errors="replace")


class ZooKeeperServer:
    def __init__(self, work_dir: str, tick_time_ms: int = 500, force_sync: bool = False, *,
                 host: str = "127.0.0.1", port: int = 0, command_prefix: tuple[str, ...] = ()):  # fmt: skip
        self.work_dir = work_dir
        self.tick_time_ms = tick_time_ms  # sessions may be 2..20 ticks: 1 s..10 s here
        self.force_sync = force_sync
        self.host = host
        self.fixed_port = port  # 0: a free port of this namespace's loopback, probed per attempt
        self.command_prefix = tuple(command_prefix)
        self.port = port
        self.process: subprocess.Popen | None = None

    @property
    def spec(self) -> str:
        return f"zookeeper://{self.host}:{self.port}"

    @property
    def hosts(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0, attempts: int = 3) -> ZooKeeperServer:
        problem = installation_problem()
        if problem:
            raise ZooKeeperUnavailable(problem)
        for _attempt in range(attempts):  # a free port can be taken between probe and bind
            self.port = self.fixed_port or free_port()
            self._launch()
            if self._wait_ready(timeout_s):
                return self
            self.stop()
        raise ZooKeeperUnavailable(
            f"ZooKeeper did not answer 'ruok' within {timeout_s:.0f} s after {attempts} attempts; "
            f"see {os.path.join(self.work_dir, 'zookeeper.log')}"
        )

    def _launch(self) -> None:
        data_dir = os.path.join(self.work_dir, "data")
        os.makedirs(data_dir, exist_ok=True)
        config = os.path.join(self.work_dir, "zoo.cfg")
        with open(config, "w") as f:
            f.write(
                f"tickTime={self.tick_time_ms}\ndataDir={data_dir}\nclientPort={self.port}\n"
                f"clientPortAddress={self.host}\nadmin.enableServer=false\nmaxClientCnxns=0\n"
                f"forceSync={'yes' if self.force_sync else 'no'}\n"
                "4lw.commands.whitelist=ruok,srvr,mntr\n"
            )
        command = [
            *self.command_prefix, _java(), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.admin.enableServer=false", f"-Dzookeeper.log.dir={self.work_dir}",
            "-cp", ZOOKEEPER_JAR, MAIN_CLASS, config,
        ]  # fmt: skip
        log = open(os.path.join(self.work_dir, "zookeeper.log"), "ab")
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def _wait_ready(self, timeout_s: float) -> bool:
        def answered() -> str | None:
            if self.process.poll() is not None:
                return "exited"
            with contextlib.suppress(OSError):
                if four_letter_word(self.port, host=self.host) == "imok":
                    return "ready"
            return None

        # Polling a socket that is not listening yet: nothing else tells us it is.
        return wait_until(answered, timeout_s, 0.05) == "ready"

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
