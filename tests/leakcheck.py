"""Session-wide leak check: no localcluster process may outlive the test session.

At configure time this plugin puts a marker (a fresh id) in the environment, so every process
the suite starts, and everything those start (brokers in their own sessions included),
inherits it. At the end of the session it scans /proc for live processes that carry this
session's marker and run one of this checkout's `localcluster` modules (`python -m
localcluster...`, the `localcluster` console script, or a file under localcluster/),
excluding the pytest process itself and its ancestors. Processes still exiting get a short
deadline; whatever is left is reported, SIGKILLed, and the session fails.

Other test sessions running at the same time (other engineers, other checkouts) carry other
markers and are never touched.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

MARKER = "LOCALCLUSTER_LEAKCHECK_SESSION"
PACKAGE_DIR = Path(__file__).resolve().parent.parent / "localcluster"
GRACE_S = 10.0


def pytest_configure(config) -> None:
    os.environ[MARKER] = uuid.uuid4().hex


def _ancestors() -> set[int]:
    out = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        out.add(pid)
    return out


def _runs_localcluster(args: list[str]) -> bool:
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            module = args[i + 1]
            if module == "localcluster" or module.startswith("localcluster."):
                return True
        if arg.endswith("/bin/localcluster") or arg == "localcluster":
            return True
        if arg.endswith(".py") and str(Path(arg).resolve()).startswith(str(PACKAGE_DIR) + os.sep):
            return True
    return False


def leaked_processes(marker: str) -> dict[int, str]:
    """{pid: command line} of live processes with this session's marker running localcluster."""
    wanted = f"{MARKER}={marker}".encode()
    skip = _ancestors()
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat[stat.rindex(")") + 2 :].split()[0] in ("Z", "X"):
                continue
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            args = [
                a.decode(errors="replace")
                for a in (entry / "cmdline").read_bytes().split(b"\0")
                if a
            ]
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
        if _runs_localcluster(args):
            out[int(entry.name)] = " ".join(args)
    return out


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    marker = os.environ.get(MARKER)
    if not marker:
        return
    deadline = time.monotonic() + GRACE_S
    leaked = leaked_processes(marker)
    while leaked and time.monotonic() < deadline:
        time.sleep(0.1)
        leaked = leaked_processes(marker)
    if not leaked:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"leak check: {len(leaked)} localcluster processes outlived the test session "
             f"(SIGKILLed now):"]  # fmt: skip
    lines += [f"  pid {pid}: {command}" for pid, command in sorted(leaked.items())]
    for pid in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if reporter is not None:
        for line in lines:
            reporter.write_line(line, red=True)
    else:
        print("\n".join(lines))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
