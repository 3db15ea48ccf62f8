"""Pytest plugin for the coordination tests: a private ZooKeeper, backends, processes, waiting.

What lives here: the session-scoped `zookeeper_server` fixture (a standalone ZooKeeper on a
free port with its own temp data dir, stopped by pid when the session ends; when the Debian
package is missing it tries to install it once and skips only if that fails), the
`coord_backend` fixture parametrized over "file" and "zookeeper" (ZooKeeper is the oracle the
file backend is held to), `processes` (starts worker scripts and kills every one by pid at the
end). Waiting on a condition is tests/helpers.py's wait_until. Registered from
tests/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass

import pytest

from localcluster.coord import connect
from localcluster.coord.zookeeper_server import ZooKeeperServer, installation_problem

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOOKEEPER_SESSION_TIMEOUT_MS = 2000  # the server's tickTime is 500 ms: sessions of 1..10 s


def _try_install_zookeeper() -> str | None:
    problem = installation_problem()
    if problem is None or os.geteuid() != 0 or not shutil.which("apt-get"):
        return problem
    environment = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "zookeeper"]):
        if subprocess.run(command, env=environment, capture_output=True, timeout=600).returncode:
            break
    return installation_problem()


@pytest.fixture(scope="session")
def zookeeper_server():
    problem = _try_install_zookeeper()
    if problem:
        pytest.skip(f"real ZooKeeper unavailable and not installable here: {problem}")
    work_dir = tempfile.mkdtemp(prefix="localcluster-zookeeper-")
    server = ZooKeeperServer(work_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)


@dataclass
class Backend:
    """One backend under test: how to reach it and a fresh base path inside it."""

    name: str
    spec: str
    base: str
    session_timeout_ms: int | None
    clients: list

    def connect(self, **options):
        client = connect(self.spec, session_timeout_ms=self.session_timeout_ms, **options)
        self.clients.append(client)
        return client

    def path(self, *names: str) -> str:
        return "/".join((self.base, *names))


@pytest.fixture(params=["file", "zookeeper"])
def coord_backend(request, tmp_path):
    if request.param == "file":
        backend = Backend("file", str(tmp_path / "store"), "/test", None, [])
    else:
        server = request.getfixturevalue("zookeeper_server")
        backend = Backend(
            "zookeeper",
            server.spec,
            f"/test-{uuid.uuid4().hex[:12]}",
            ZOOKEEPER_SESSION_TIMEOUT_MS,
            [],
        )
    admin = backend.connect()
    admin.ensure_path(backend.base)
    try:
        yield backend
    finally:
        for client in reversed(backend.clients):
            client.stop()


class Processes:
    """Worker scripts run as real processes; each prints lines the test reads."""

    def __init__(self):
        self.started: list[subprocess.Popen] = []

    def start(self, script: str, *arguments: str) -> subprocess.Popen:
        environment = dict(os.environ, PYTHONPATH=REPOSITORY, PYTHONUNBUFFERED="1")
        process = subprocess.Popen(
            [sys.executable, "-c", script, *map(str, arguments)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment, cwd=REPOSITORY,
        )  # fmt: skip
        self.started.append(process)
        return process

    @staticmethod
    def read_line(process: subprocess.Popen, timeout_s: float = 20.0) -> str:
        """The next stdout line (a worker announcing a state), or fail at the deadline."""
        import selectors

        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout_s):
                pytest.fail(f"worker {process.pid} printed nothing within {timeout_s} s")
        line = process.stdout.readline()
        if not line:
            pytest.fail(f"worker {process.pid} exited (code {process.wait()}) before printing")
        return line.strip()

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)  # a SIGSTOPped worker must die too
                os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            for stream in (process.stdin, process.stdout):
                if stream:
                    stream.close()


@pytest.fixture
def processes():
    group = Processes()
    try:
        yield group
    finally:
        group.kill_all()
