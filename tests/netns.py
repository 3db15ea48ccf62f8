"""Network namespaces standing in for hosts: several machines' worth of network on one.

What lives here: `Network`, a context manager that makes one network namespace per host, a
bridge in the root namespace and a veth pair per namespace joining it, with addresses from an
RFC 5737 documentation range (TEST-NET-1 192.0.2.0/24 first: never routed anywhere real; the
root namespace is .1 and each host gets the last octet it asks for), and removes everything it
made when it closes; `NamespaceProcess`, a process run inside one namespace in its own process
group, killed by that group; `skip_unless_namespaces`, a clear pytest.skip where this cannot work.

Rules: every name carries a random run id, so parallel runs never clash on names (interface
names stay within Linux's 15 characters); the address range is held by an flock for the
network's lifetime, so a parallel run takes the next TEST-NET (TEST-NET-2, then TEST-NET-3)
instead of a clashing route, and a range whose lock is free but whose bridge is still there was
left by a dead run and is removed first. Namespaces get no default route, so nothing leaves the
machine. Teardown kills every process still inside a namespace, then deletes namespaces, veths
and the bridge, even when setup failed half-way. Every loop is bounded in count and time.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

# RFC 5737's three documentation ranges, in the order a run tries them.
SUBNETS = ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
ROOT_HOST_NUMBER = 1
LOCK_DIRECTORY = Path("/run/lock")
IP_TIMEOUT_S = 10.0
LOCK_WAIT_S = 300.0
MAX_HOSTS = 50  # veth names carry the host's index in two digits
PROCESS_OUTPUT_LINES = 20_000
NAME_PREFIX = "lc"  # every interface and namespace this module makes starts with lc<run id>
RUN_ID_HEX = 6
STALE_BRIDGE = re.compile(rf"^{NAME_PREFIX}([0-9a-f]{{{RUN_ID_HEX}}})br$")


class NamespaceUnavailable(RuntimeError):
    """Namespaces, veths or the bridge cannot be made here (the reason is the message)."""


def namespaces_problem() -> str | None:
    """None when this process can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN); run as root"
    if not shutil.which("ip"):
        return "no `ip` binary on PATH: install iproute2"
    return None


def skip_unless_namespaces() -> None:
    import pytest

    problem = namespaces_problem()
    if problem:
        pytest.skip(problem)


def ip(*arguments: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run `ip ARGUMENTS`; with check, a failure raises NamespaceUnavailable with ip's message."""
    result = subprocess.run(["ip", *arguments], capture_output=True, text=True,
                            timeout=IP_TIMEOUT_S)  # fmt: skip
    if check and result.returncode:
        raise NamespaceUnavailable(
            f"`ip {' '.join(arguments)}` failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result


class Network:
    """Hosts (network namespaces) on one bridge; `with Network({"zookeeper": 2, ...}) as n:`.

    `hosts` maps a host name to the last octet of its address. Raises NamespaceUnavailable on
    entry when anything cannot be made (after removing what was).
    """

    def __init__(self, hosts: dict[str, int]):
        assert 0 < len(hosts) <= MAX_HOSTS, hosts
        numbers = list(hosts.values())
        assert len(set(numbers)) == len(numbers), f"two hosts share an address: {hosts}"
        assert all(1 < n < 255 for n in numbers), f"host numbers must be 2..254: {hosts}"
        self.hosts = dict(hosts)
        self.run_id = secrets.token_hex(RUN_ID_HEX // 2)
        self.subnet: ipaddress.IPv4Network | None = None
        self.bridge = f"{NAME_PREFIX}{self.run_id}br"
        self.processes: list[NamespaceProcess] = []
        self._made: list[tuple[str, str]] = []  # ("netns" | "link", name), in creation order
        self._lock_file = None

    # -- names and addresses ------------------------------------------------------------------

    def namespace(self, host: str) -> str:
        assert host in self.hosts, host
        return f"{NAME_PREFIX}{self.run_id}-{host}"

    def address(self, host: str) -> str:
        """The host's IPv4 address; "root" is the root namespace's side of the bridge."""
        assert self.subnet is not None, "the network is not up"
        number = ROOT_HOST_NUMBER if host == "root" else self.hosts[host]
        return str(self.subnet.network_address + number)

    def exec_prefix(self, host: str) -> tuple[str, ...]:
        """The command prefix that runs a program inside the host's namespace."""
        return ("ip", "netns", "exec", self.namespace(host))

    def _veth_names(self, index: int) -> tuple[str, str]:
        root_side = f"{NAME_PREFIX}{self.run_id}v{index:02d}"
        host_side = f"{NAME_PREFIX}{self.run_id}h{index:02d}"
        assert len(root_side) <= 15 and len(host_side) <= 15, (root_side, host_side)
        return root_side, host_side

    # -- setup ------------------------------------------------------------------------------

    def __enter__(self) -> Network:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> Network:
        """Make the hosts; NamespaceUnavailable (after removing what was made) if impossible."""
        assert not self._made, "the network is already open"
        problem = namespaces_problem()
        if problem:
            raise NamespaceUnavailable(problem)
        try:
            self._take_subnet()
            self._make_bridge()
            for index, host in enumerate(self.hosts):
                self._make_host(index, host)
        except BaseException:
            self.close()
            raise
        return self

    def _take_subnet(self, wait_s: float = LOCK_WAIT_S) -> None:
        """Hold the first free documentation range's lock; wait (bounded) when all are held."""
        LOCK_DIRECTORY.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + wait_s
        while True:
            for subnet in SUBNETS:
                if self._try_lock(subnet):
                    return
            if time.monotonic() >= deadline:
                raise NamespaceUnavailable(
                    f"every RFC 5737 range is held by another run for {wait_s:.0f} s: {SUBNETS}"
                )
            time.sleep(0.2)  # waiting for another run to release a range: no event to wait on

    def _try_lock(self, subnet: str) -> bool:
        path = LOCK_DIRECTORY / f"localcluster-netns-{subnet.replace('/', '_')}.lock"
        lock_file = open(path, "a")  # noqa: SIM115 - held for the network's lifetime
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.close()
            return False
        network = ipaddress.ip_network(subnet)
        if not remove_stale_runs(network):
            lock_file.close()  # an interface this module did not make uses the range: skip it
            return False
        self._lock_file, self.subnet = lock_file, network
        return True

    def _make_bridge(self) -> None:
        self._made.append(("link", self.bridge))
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.address('root')}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def _make_host(self, index: int, host: str) -> None:
        namespace = self.namespace(host)
        root_side, host_side = self._veth_names(index)
        self._made.append(("netns", namespace))
        ip("netns", "add", namespace)
        ip("-n", namespace, "link", "set", "lo", "up")
        self._made.append(("link", root_side))
        ip("link", "add", root_side, "type", "veth", "peer", "name", host_side, "netns", namespace)
        ip("link", "set", root_side, "master", self.bridge)
        ip("link", "set", root_side, "up")
        address = f"{self.address(host)}/{self.subnet.prefixlen}"
        ip("-n", namespace, "addr", "add", address, "dev", host_side)
        ip("-n", namespace, "link", "set", host_side, "up")

    # -- processes --------------------------------------------------------------------------

    def start(self, host: str, argv: list[str], log_path: Path, **popen) -> NamespaceProcess:
        """Start argv inside the host's namespace, its output teed to log_path."""
        process = NamespaceProcess(self.exec_prefix(host), argv, log_path, **popen)
        self.processes.append(process)
        return process.start()

    def run(self, host: str, argv: list[str], timeout_s: float = 30.0,
            **run) -> subprocess.CompletedProcess:  # fmt: skip
        """Run argv to completion inside the host's namespace (output captured as text)."""
        return subprocess.run([*self.exec_prefix(host), *argv], capture_output=True, text=True,
                              timeout=timeout_s, **run)  # fmt: skip

    # -- teardown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Kill what runs inside, delete what was made (newest first), release the range."""
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.kill()
        for kind, name in self._made:
            if kind == "netns":
                kill_namespace_processes(name)  # ZooKeeper and anything started by others
        for kind, name in reversed(self._made):
            if kind == "netns":
                ip("netns", "delete", name, check=False)
            else:
                ip("link", "delete", name, check=False)
        self._made.clear()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def leftovers(self) -> list[str]:
        """Namespaces and interfaces of this run that still exist (empty after close)."""
        names = set(ip("netns", "list", check=False).stdout.split())
        links = ip("-j", "link", "show", check=False).stdout or "[]"
        names |= {link["ifname"] for link in json.loads(links)}
        return sorted(n for n in names if n.startswith(f"{NAME_PREFIX}{self.run_id}"))


def kill_namespace_processes(namespace: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process inside the namespace and wait (bounded) until none is left."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = [int(p) for p in ip("netns", "pids", namespace, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)  # the kernel reaps asynchronously; `ip netns pids` is the only signal


def remove_stale_runs(subnet: ipaddress.IPv4Network) -> bool:
    """Remove what dead runs left on this range; False if something else uses the range.

    Called with the range's lock held, so a bridge of ours that holds an address in it belongs
    to a run that died without closing (kill -9 of pytest).
    """
    listing = json.loads(ip("-j", "-4", "addr", "show", check=False).stdout or "[]")
    stale_runs = set()
    for link in listing[:1000]:
        for entry in link.get("addr_info", []):
            if ipaddress.ip_address(entry["local"]) not in subnet:
                continue
            match = STALE_BRIDGE.match(link["ifname"])
            if not match:
                return False
            stale_runs.add(match.group(1))
    for run_id in sorted(stale_runs):
        remove_run(run_id)
    return True


def remove_run(run_id: str) -> None:
    """Delete every namespace and interface named after run_id."""
    prefix = f"{NAME_PREFIX}{run_id}"
    for namespace in ip("netns", "list", check=False).stdout.split():
        if namespace.startswith(prefix + "-"):
            kill_namespace_processes(namespace)
            ip("netns", "delete", namespace, check=False)
    links = json.loads(ip("-j", "link", "show", check=False).stdout or "[]")
    for link in links:
        if link["ifname"].startswith(prefix):
            ip("link", "delete", link["ifname"], check=False)


class ProcessExited(RuntimeError):
    pass


class NamespaceProcess:
    """One program inside a namespace, in its own process group, its output teed to a file."""

    def __init__(self, prefix: tuple[str, ...], argv: list[str], log_path: Path, **popen):
        self.argv = [*prefix, *map(str, argv)]
        self.log_path = Path(log_path)
        self.popen = popen
        self.process: subprocess.Popen | None = None
        self.lines: collections.deque[str] = collections.deque(maxlen=PROCESS_OUTPUT_LINES)
        self.line_count = 0  # lines printed so far (self.lines keeps the newest)
        self._changed = threading.Condition()
        self._drained = threading.Event()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid  # `ip netns exec` execs the program: this is its pid

    def start(self) -> NamespaceProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, text=True, errors="replace",
                                        start_new_session=True, **self.popen)  # fmt: skip
        threading.Thread(target=self._drain, daemon=True, name=f"drain-{self.pid}").start()
        return self

    def _drain(self) -> None:
        with open(self.log_path, "a") as log:
            for line in self.process.stdout:
                log.write(line)
                log.flush()
                with self._changed:
                    self.lines.append(line.rstrip("\n"))
                    self.line_count += 1
                    self._changed.notify_all()
        with self._changed:
            self._drained.set()
            self._changed.notify_all()

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_for_line(self, pattern: str | re.Pattern, timeout_s: float = 30.0) -> re.Match:
        """The first output line matching pattern; TimeoutError or ProcessExited otherwise."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        scanned = 0  # lines of self.line_count already searched: each line is searched once
        with self._changed:
            while True:
                fresh = min(self.line_count - scanned, len(self.lines))
                for line in list(self.lines)[len(self.lines) - fresh :]:
                    match = regex.search(line)
                    if match:
                        return match
                scanned = self.line_count
                if self._drained.is_set():
                    raise ProcessExited(f"{self.describe()} exited without printing {regex.pattern!r}"
                                        f" (code {self.process.wait()}):\n{self.tail()}")  # fmt: skip
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self.describe()} printed no {regex.pattern!r} within "
                                       f"{timeout_s} s:\n{self.tail()}")  # fmt: skip
                self._changed.wait(remaining)

    def output(self) -> str:
        """Everything the process printed so far (the log file, complete)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, count: int = 40) -> str:
        return "\n".join(list(self.lines)[-count:])

    def describe(self) -> str:
        return f"`{' '.join(self.argv)}` (pid {self.process.pid if self.process else '-'})"

    def signal(self, number: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, number)

    def kill(self, timeout_s: float = 10.0) -> None:
        """SIGKILL the whole process group and reap the process."""
        if self.process is None:
            return
        self.signal(signal.SIGKILL)
        self.process.wait(timeout_s)

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM the group, wait; SIGKILL if it does not exit in time. The exit code."""
        if self.process is None:
            return 0
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
