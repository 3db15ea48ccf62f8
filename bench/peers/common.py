"""What the peer drivers share: private server processes in a temporary directory, free ports,
non-blocking connections, and the load loop (window, open-loop schedule, latency histogram).

The load runs in the calling process (one process, single-threaded); the servers are separate
processes, each in its own session so that a Ctrl-C at the terminal reaches only us and our
`finally` kills them (SIGKILL to each process group: their data is thrown away anyway).
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bench.common import MB, filesystem_of
from bench.load import curve, histogram, latency_summary

SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"
DRAIN_S = 10.0  # after the run, how long outstanding batches may take to be acknowledged


class PeerError(RuntimeError):
    """A peer system did not come up or misbehaved; the message says what and where."""


def find_binary(name: str) -> str | None:
    """`name` on PATH, else in the sbin directories (Debian puts nats-server in /usr/sbin)."""
    return shutil.which(name) or shutil.which(name, path=SBIN_PATH)


def free_ports(count: int) -> list[int]:
    """Ports the kernel says are free now: bind port 0 on 127.0.0.1 (all at once), then close."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def disk_tempdir_parent(workdir: str | os.PathLike | None) -> Path:
    """Where temporary directories go: `workdir`, else tempfile's default unless that is a
    tmpfs (then /var/tmp), so that 'on disk' means a disk-backed filesystem's page cache."""
    if workdir is not None:
        return Path(workdir)
    default = Path(tempfile.gettempdir())
    if filesystem_of(default)["type"] in ("tmpfs", "ramfs") and Path("/var/tmp").is_dir():
        return Path("/var/tmp")
    return default


def wait_until(condition: Callable[[], object], timeout_s: float, what: str,
               interval_s: float = 0.02) -> object:  # fmt: skip
    """Poll `condition` until it returns something truthy (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except (OSError, ValueError, PeerError) as exc:  # not up yet
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise PeerError(f"timed out after {timeout_s:g} s waiting for {what}{detail}")
        time.sleep(interval_s)


class Servers:
    """Server processes and the temporary directory they live in; `close()` kills and removes.

    Use as a context manager; close() is idempotent and runs on any exception, Ctrl-C included.
    """

    def __init__(self, prefix: str, workdir: str | os.PathLike | None = None) -> None:
        parent = disk_tempdir_parent(workdir)
        parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        self.procs: dict[str, subprocess.Popen] = {}
        self.pids: list[int] = []

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 (the child keeps it)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=self.dir, start_new_session=True)  # fmt: skip
        finally:
            log.close()
        self.procs[name] = proc
        self.pids.append(proc.pid)
        return proc

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise PeerError(f"{name} exited with {proc.returncode}: {self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 5) -> str:
        try:
            text = (self.dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover (SIGKILL is not ignored)
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class Conn:
    """A non-blocking TCP connection with an output buffer (the load never blocks on a send)."""

    def __init__(self, port: int, timeout_s: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.out = bytearray()
        self.inbuf = b""

    def send(self, data: bytes) -> None:
        self.out += data
        self.flush()

    def flush(self) -> None:
        while self.out:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                return
            del self.out[:sent]

    def recv(self) -> bytes:
        """What is readable now (b"" when nothing); PeerError when the server closed."""
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return b""
        if not data:
            raise PeerError("the server closed the connection")
        return data

    def recv_blocking(self, timeout_s: float) -> bytes:
        """Wait up to `timeout_s` for bytes (setup only, not on the load path)."""
        self.flush()
        sel = selectors.DefaultSelector()
        try:
            sel.register(self.sock, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                return b""
        finally:
            sel.close()
        return self.recv()

    def close(self) -> None:
        self.sock.close()


class Driver:
    """What run_load needs from a peer: queue a batch, and report completed batches."""

    conns: list[Conn]

    def send_batch(self, batch_id: int) -> None:
        raise NotImplementedError

    def on_data(self, conn: Conn, data: bytes) -> Iterable[tuple[int, int, str | None]]:
        """Parse `data` from `conn`; yield (batch_id, records acknowledged, error or None) per
        completed batch."""
        raise NotImplementedError


def run_load(driver: Driver, *, batch_records: int, outstanding: int, seconds: float,
             rate: float, record_size: int) -> dict:  # fmt: skip
    """Send batches for `seconds` (at most `outstanding` unacknowledged), then wait for the rest.

    rate > 0: open loop, batch i is due at start + i * batch_records / rate and its latency is
    from then (a stall delays every later slot and is counted); rate 0: as fast as the window
    allows, latency from the send. Latency is per batch (its last record's acknowledgement).
    """
    hist = histogram()
    interval_ns = int(batch_records / rate * 1e9) if rate > 0 else 0
    sel = selectors.DefaultSelector()
    for conn in driver.conns:
        sel.register(conn.sock, selectors.EVENT_READ, conn)
    waiting_write: set[Conn] = set()
    due: dict[int, int] = {}  # batch id -> when it was due (ns)
    acked = errors = 0
    first_error: str | None = None
    next_id = 0
    cpu0 = time.process_time()
    start = time.perf_counter_ns()
    end = start + int(seconds * 1e9)
    drain_end = end + int(DRAIN_S * 1e9)
    last_ack = start
    try:
        while True:
            now = time.perf_counter_ns()
            if now < end:
                while len(due) < outstanding:
                    slot = start + next_id * interval_ns if interval_ns else now
                    if slot > now or slot >= end:
                        break
                    driver.send_batch(next_id)
                    due[next_id] = slot
                    next_id += 1
            elif not due:
                break
            elif now >= drain_end:
                errors += len(due)
                first_error = first_error or (f"{len(due)} batches not acknowledged "
                                              f"{DRAIN_S:g} s after the run")  # fmt: skip
                break
            # Wait for acks; when a slot comes up sooner and the window has room, only until then.
            timeout_ns = (end if now < end else drain_end) - now
            if interval_ns and now < end and len(due) < outstanding:
                timeout_ns = min(timeout_ns, start + next_id * interval_ns - now)
            for conn in driver.conns:
                if conn.out and conn not in waiting_write:
                    sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
                    waiting_write.add(conn)
            for key, events in sel.select(max(0, timeout_ns) / 1e9):
                conn = key.data
                if events & selectors.EVENT_WRITE:
                    conn.flush()
                    if not conn.out:
                        sel.modify(conn.sock, selectors.EVENT_READ, conn)
                        waiting_write.discard(conn)
                if events & selectors.EVENT_READ:
                    data = conn.recv()
                    if not data:
                        continue
                    done = list(driver.on_data(conn, data))
                    if not done:
                        continue
                    t = time.perf_counter_ns()
                    for batch_id, ok, error in done:
                        slot = due.pop(batch_id)
                        acked += ok
                        if error is None:
                            hist.record_value(max(1, (t - slot) // 1000))
                        else:
                            errors += 1
                            first_error = first_error or error
                    last_ack = t
    finally:
        sel.close()
    elapsed = ((last_ack if acked else time.perf_counter_ns()) - start) / 1e9

    return {
        "record_size": record_size, "target_records_per_s": rate or None,
        "seconds": elapsed, "records": acked,
        "records_per_s": acked / elapsed, "mb_per_s": acked * record_size / elapsed / MB,
        "errors": errors, "first_error": first_error,
        "batch_records": batch_records, "outstanding": outstanding, "batches_sent": next_id,
        "latency_ms": latency_summary(hist),
        "curve_ms": [list(point) for point in curve(hist)],
        "load_cpu_cores": (time.process_time() - cpu0) / elapsed,
    }  # fmt: skip


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process from /proc (None when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def print_result(result: dict) -> None:
    """The short table `python -m bench.peers.<name>` prints."""
    from bench.common import print_table

    lat = result["latency_ms"]
    print_table(
        f"{result['system']}: {result['setup']}",
        ["records", "records/s", "MB/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "errors",
         "server CPU", "load CPU"],
        [(f"{result['records']:,}", f"{result['records_per_s']:,.0f}", f"{result['mb_per_s']:,.1f}",
          f"{lat['p50']:.2f}", f"{lat['p99']:.2f}", f"{lat['p99.9']:.2f}", f"{lat['max']:.2f}",
          str(result["errors"]), f"{result.get('server_cpu_cores', 0):.2f}",
          f"{result.get('load_cpu_cores', 0):.2f}")],
        text_columns=0,
        note=(f"{result['record_size']}-byte records, {result['seconds']:.1f} s, "
              f"{'rate ' + format(result['target_records_per_s'], ',.0f') + '/s (open loop)' if result.get('target_records_per_s') else 'full speed'}; "
              f"batches of {result['batch_records']} records, at most {result['outstanding']} outstanding, "
              f"{result['load_processes']} load process; latency per batch from when it was due to its "
              f"acknowledgement ({result['latency_ms']['count']:,} batches). {result['semantics']}"
              + (f" First error: {result['first_error']}" if result["first_error"] else "")),
    )  # fmt: skip


def cli(measure: Callable[..., dict], prog: str, description: str, argv: list[str] | None) -> int:
    """The `main()` of a peer module."""
    import argparse
    import json
    import sys

    from bench.common import console

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of load (default 5)")
    parser.add_argument("--record-size", type=int, default=100, help="bytes per record (100)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="records/s, open loop (default 0: as fast as possible)")  # fmt: skip
    parser.add_argument("--workdir", help="where the temporary directory goes")
    parser.add_argument("--batch-records", type=int, help="records per batch (module default)")
    parser.add_argument("--outstanding", type=int, help="batches unacknowledged at most")
    parser.add_argument("--json", action="store_true", help="also print the JSON to stdout")
    args = parser.parse_args(argv)
    if args.json:
        console(stderr=True)

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)  # `finally` kills the servers and removes the dir
    tuning = {k: v for k in ("batch_records", "outstanding") if (v := getattr(args, k))}
    result = measure(record_size=args.record_size, seconds=args.seconds, rate=args.rate,
                     workdir=args.workdir, **tuning)  # fmt: skip
    print_result(result)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0
