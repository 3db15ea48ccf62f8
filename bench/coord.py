"""Coordination benchmark: the file backend and a real ZooKeeper side by side, in one run.

What is measured, per backend (file: a fresh store directory; zookeeper: a private standalone
ZooKeeper 3.8 started for the run, forceSync=no like the file backend's fsync=False):
- create / get / set operations per second: one client, one thread, each call waiting for its
  answer (as a broker's and the controller's calls do), on znodes under one parent.
- watch latency: a watcher process arms a data watch (get with watch), the benchmark process
  sets the znode; latency is from just before set() to the watcher's callback, both stamped
  with CLOCK_MONOTONIC (one clock for every process of the host). p50/p99 over --samples.
- ephemeral expiry: owner processes create an ephemeral each, the benchmark process watches
  them (exists with watch) and SIGKILLs the owners; latency is from the kill to the DELETED
  callback. ZooKeeper needs the session timeout for this (here --zookeeper-session-timeout-ms,
  Kafka's default is 18 s); the file backend sees the dead owner's session lock released.

Goals (issue 3), printed with a pass/miss mark and not asserted: file backend expiry p99
under 500 ms and watch latency p99 under 10 ms. Percentiles come from HdrHistogram
(microsecond resolution). Results: bench/results/coord.json. Every process and the ZooKeeper
server are killed by pid, and every temporary directory removed, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from hdrh.histogram import HdrHistogram

from bench.common import goal, print_goals, print_note, print_table, write_results
from bench.load import histogram
from localcluster.coord import connect
from localcluster.coord.zookeeper_server import ZooKeeperServer, installation_problem

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WATCHER = """
import logging, sys, time
logging.getLogger("kazoo").setLevel(logging.ERROR)
from localcluster.coord import connect
client = connect(sys.argv[1], session_timeout_ms=int(sys.argv[3]) or None)
path = sys.argv[2]
def on_change(event):
    print("fired", time.monotonic_ns(), flush=True)
for line in sys.stdin:
    client.get(path, watch=on_change)
    print("armed", flush=True)
"""

OWNER = """
import logging, sys
logging.getLogger("kazoo").setLevel(logging.ERROR)
from localcluster.coord import connect
client = connect(sys.argv[1], session_timeout_ms=int(sys.argv[3]) or None)
client.create(sys.argv[2], b"", ephemeral=True)
print("ready", flush=True)
sys.stdin.readline()
"""


def start_worker(script: str, *arguments) -> subprocess.Popen:
    environment = dict(os.environ, PYTHONPATH=REPOSITORY, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, arguments)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment,
    )  # fmt: skip


def expect(process: subprocess.Popen, word: str) -> list[str]:
    line = process.stdout.readline().split()
    if not line or line[0] != word:
        raise RuntimeError(
            f"worker {process.pid} said {line!r}, expected {word!r}; is the backend up?"
        )
    return line


def kill(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait()
        for stream in (process.stdin, process.stdout):
            if stream:
                stream.close()


def percentiles(recorded: HdrHistogram, samples_us: list[int]) -> dict:
    return {
        "p50_ms": recorded.get_value_at_percentile(50) / 1000,
        "p99_ms": recorded.get_value_at_percentile(99) / 1000,
        "max_ms": recorded.get_max_value() / 1000,
        "samples": len(samples_us),
        "samples_us": samples_us,
    }


def measure_operations(client, base: str, count: int) -> dict:
    client.ensure_path(base)
    names = [f"{base}/znode-{i}" for i in range(count)]
    rates = {}
    for operation, call in (
        ("create", lambda path: client.create(path, b"x" * 100)),
        ("get", client.get),
        ("set", lambda path: client.set(path, b"y" * 100)),
    ):
        started = time.perf_counter()
        for path in names:
            call(path)
        rates[f"{operation}_per_s"] = count / (time.perf_counter() - started)
    return rates


def measure_watch_latency(client, spec: str, base: str, samples: int, timeout_ms: int) -> dict:
    path = client.create(f"{base}/watched", b"0")
    watcher = start_worker(WATCHER, spec, path, timeout_ms)
    recorded, values = histogram(), []
    try:
        for sample in range(samples + 5):  # the first few warm both sides up
            watcher.stdin.write("arm\n")
            watcher.stdin.flush()
            expect(watcher, "armed")
            set_at = time.monotonic_ns()
            client.set(path, b"%d" % sample)
            fired_at = int(expect(watcher, "fired")[1])
            if sample >= 5:
                values.append(max(1, (fired_at - set_at) // 1000))
                recorded.record_value(values[-1])
    finally:
        kill([watcher])
    return percentiles(recorded, values)


def measure_expiry(client, spec: str, base: str, samples: int, batch: int, timeout_ms: int) -> dict:
    recorded, values = histogram(), []
    while len(values) < samples:
        size = min(batch, samples - len(values))
        paths = [f"{base}/ephemeral-{len(values) + i}" for i in range(size)]
        owners = [start_worker(OWNER, spec, path, timeout_ms) for path in paths]
        try:
            for owner in owners:
                expect(owner, "ready")
            deleted_at: dict[str, int] = {}

            def on_deleted(event, deleted_at=deleted_at):
                deleted_at.setdefault(event.path, time.monotonic_ns())

            for path in paths:
                client.exists(path, watch=on_deleted)
            killed_at = {}
            for path, owner in zip(paths, owners, strict=True):
                killed_at[path] = time.monotonic_ns()
                os.kill(owner.pid, signal.SIGKILL)
            deadline = time.monotonic() + 60 + timeout_ms / 1000
            while len(deleted_at) < size:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"ephemerals {set(paths) - set(deleted_at)} were never deleted"
                    )
                time.sleep(0.001)  # polling a dict the callback thread fills
            for path in paths:
                values.append(max(1, (deleted_at[path] - killed_at[path]) // 1000))
                recorded.record_value(values[-1])
        finally:
            kill(owners)
    return percentiles(recorded, values)


def run_backend(name: str, spec: str, args, timeout_ms: int) -> dict:
    client = connect(spec, session_timeout_ms=timeout_ms or None)
    try:
        base = "/bench"
        client.ensure_path(base)
        result = {"spec": spec, "session_timeout_ms": timeout_ms or client.session_timeout_ms}
        result["operations"] = measure_operations(client, f"{base}/operations", args.operations)
        result["watch_latency"] = measure_watch_latency(
            client, spec, base, args.samples, timeout_ms
        )
        result["expiry"] = measure_expiry(
            client, spec, base, args.expiry_samples, args.expiry_batch, timeout_ms
        )
        return result
    finally:
        client.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.coord", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--operations", type=int, default=2000, help="znodes per create/get/set pass"
    )
    parser.add_argument("--samples", type=int, default=300, help="watch latency samples")
    parser.add_argument("--expiry-samples", type=int, default=30, help="ephemeral expiry samples")
    parser.add_argument("--expiry-batch", type=int, default=5, help="owners killed together")
    parser.add_argument("--zookeeper-session-timeout-ms", type=int, default=2000)
    parser.add_argument("--json", action="store_true", help="also print the JSON results on stdout")
    parser.add_argument("--quick", action="store_true", help="fewer samples (the suite's --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.operations, args.samples = min(args.operations, 300), min(args.samples, 60)
        args.expiry_samples = min(args.expiry_samples, 10)
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # it warns on every connection it closes

    work_dir = tempfile.mkdtemp(prefix="localcluster-bench-coord-")
    results: dict = {"backends": {}}
    server = None
    try:
        results["backends"]["file"] = run_backend("file", os.path.join(work_dir, "store"), args, 0)
        problem = installation_problem()
        if problem:
            print_note(f"[yellow]real ZooKeeper skipped: {problem}[/]")
        else:
            server = ZooKeeperServer(os.path.join(work_dir, "zookeeper")).start()
            timeout_ms = args.zookeeper_session_timeout_ms
            results["backends"]["zookeeper"] = run_backend(
                "zookeeper", server.spec, args, timeout_ms
            )
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    report(results)
    path = write_results("coord", results, to_stdout=args.json)
    print_note(f"[dim]results: {path}[/]")


def report(results: dict) -> None:
    backends = results["backends"]
    names = list(backends)
    rows = []
    for operation in ("create", "get", "set"):
        rows.append(
            [
                f"{operation} ops/s",
                *(f"{backends[n]['operations'][f'{operation}_per_s']:,.0f}" for n in names),
            ]
        )
    rows.append(None)
    for key, label in (
        ("watch_latency", "watch set->callback"),
        ("expiry", "expiry SIGKILL->callback"),
    ):
        for figure in ("p50_ms", "p99_ms", "max_ms"):
            rows.append(
                [f"{label} {figure[:-3]} (ms)", *(f"{backends[n][key][figure]:.2f}" for n in names)]
            )
    rows.append(None)
    rows.append(["session timeout (ms)", *(str(backends[n]["session_timeout_ms"]) for n in names)])
    print_table("coordination: file backend vs real ZooKeeper", ["", *names], rows)
    file_backend = backends["file"]
    expiry, watch = file_backend["expiry"]["p99_ms"], file_backend["watch_latency"]["p99_ms"]
    results["goals"] = [
        goal("file backend: ephemeral expiry after SIGKILL, p99 < 500 ms", expiry, f"{expiry:.1f} ms", expiry < 500),
        goal("file backend: watch latency p99 < 10 ms", watch, f"{watch:.2f} ms", watch < 10),
    ]  # fmt: skip
    print_goals("Goals (issue 3)", results["goals"])


if __name__ == "__main__":
    main()
