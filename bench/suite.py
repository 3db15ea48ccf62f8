"""The benchmark suite: every benchmark in one run, one report (`make bench`).

    python -m bench.suite            # the full run, about 14 minutes on a 2-core machine
    python -m bench.suite --quick    # about 3 minutes: shorter runs, tmpfs only, fewer cells
    python -m bench.suite --only matrix,peers     # some steps (names below)
    python -m bench.suite --skip peers

Each step runs as its own process (`python -m bench.<step>`) with BENCH_RESULTS_DIR set to
bench/results/<timestamp>/, where it writes <step>.json; its output goes to <step>.log there.
A step that fails or overruns its time limit is recorded as such and the suite goes on; the
report says which step failed and where its log is. At the end bench.report writes report.md
with tables and PNG plots from the JSON documents, and bench/results/latest points at the run.

Steps, in order (limits first, while nothing else runs):
- storage: memcpy, pwrite append, Unix-socket sendfile (the limits), the log's rates.
- commit: the producer -> leader -> two followers pipe (a limit), acks=1/all on 3 partitions.
- matrix: acks x RF x record size x partitions x client x filesystem; the open-loop
  latency-throughput curves; end-to-end latency at half the maximum rate.
- failover: kill -9 of leaders and of the controller under acks=all load.
- groups: OffsetCommit latency beside Produce, rebalance times of 1/3/10 members, kill -9 of a
  group's coordinator while it consumes and commits.
- scaling: acks=all against partitions (1-3,000) and brokers (3-9); `up` and controller failover
  against partitions (100-10,000 on 5 brokers).
- cleaner: the log cleaner's MB/s, and acks=all latency without and while every replica cleans.
- peers: NATS JetStream (3 nodes, R3 file stream) and Redis 7 (primary + 2 replicas, WAIT 2),
  set up, measured and torn down; skipped with the reason when not installed.
- coord, startup, and (full run only) broker: the coordination store, `up -n 5`, RF 1 fetch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.common import RESULTS_DIR, console, machine_info, print_note, write_results

REPOSITORY = Path(__file__).resolve().parent.parent
# name -> (module, seconds allowed full, seconds allowed quick, in quick runs)
STEPS: dict[str, tuple[str, int, int, bool]] = {
    "storage": ("bench.storage", 300, 60, True),
    "commit": ("bench.commit", 600, 240, True),  # with the batch size rows: ~270 s and ~80 s here
    "matrix": ("bench.matrix", 1800, 240, True),
    "failover": ("bench.failover", 900, 120, True),
    "groups": ("bench.groups", 400, 120, True),
    "scaling": ("bench.scaling", 3600, 180, True),
    "cleaner": ("bench.cleaner", 300, 120, True),
    "peers": ("bench.suite --peers-step", 300, 120, True),
    "coord": ("bench.coord", 300, 120, True),
    "startup": ("bench.startup", 300, 120, True),
    "broker": ("bench.broker", 600, 120, False),
}
PEER_SECONDS = {"full": 8.0, "quick": 3.0}


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY, capture_output=True,
                              text=True, timeout=10).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPOSITORY,
                               capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+changes" if dirty else "")


def run_step(name: str, quick: bool, directory: Path) -> dict:
    module, full_limit, quick_limit, _ = STEPS[name]
    limit = quick_limit if quick else full_limit
    command = [sys.executable, "-m", *module.split()] + (["--quick"] if quick else [])
    log = directory / f"{name}.log"
    env = {**os.environ, "BENCH_RESULTS_DIR": str(directory), "COLUMNS": "160"}
    started = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=REPOSITORY, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)  # fmt: skip
        try:
            code = process.wait(timeout=limit)
            status = "ok" if code == 0 else f"failed (exit code {code})"
        except subprocess.TimeoutExpired:
            status = f"stopped after its {limit} s limit"
            _stop(process)
        except BaseException:
            _stop(process)
            raise
    return {"name": name, "command": " ".join(command[1:]), "status": status,
            "seconds": time.perf_counter() - started, "log": log.name}  # fmt: skip


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the step's process group (the benchmarks clean up on SIGTERM), then SIGKILL."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def peers_step(quick: bool) -> int:
    """Measure every peer system (each sets itself up and tears itself down); peers.json."""
    from bench.peers import nats, redis

    seconds = PEER_SECONDS["quick" if quick else "full"]
    results = []
    for name, peer in (("NATS JetStream", nats), ("Redis", redis)):
        reason = peer.unavailable()
        if reason:
            print_note(f"{name}: skipped: {reason}")
            results.append({"name": name, "skipped": reason})
            continue
        print_note(f"{name}: measuring for {seconds:g} s ...")
        try:
            result = peer.measure(record_size=100, seconds=seconds)
        except Exception as e:  # noqa: BLE001 (the report says what failed)
            print_note(f"{name}: failed: {type(e).__name__}: {e}")
            results.append({"name": name, "skipped": f"failed: {type(e).__name__}: {e}"})
            continue
        result["name"] = name
        print_note(f"{name}: {result['records_per_s']:,.0f} acknowledged records/s, p99 "
                   f"{result['latency_ms']['p99']:.2f} ms ({result['setup']})")  # fmt: skip
        try:  # the latency spectrum compares every system at half its own maximum
            half = peer.measure(record_size=100, seconds=seconds, rate=result["records_per_s"] / 2)
            result["half_rate"] = {k: half[k] for k in ("target_records_per_s", "records_per_s", "errors",
                                                        "latency_ms", "curve_ms")}  # fmt: skip
            print_note(f"{name} at half that rate: p50 {half['latency_ms']['p50']:.2f} ms, "
                       f"p99 {half['latency_ms']['p99']:.2f} ms")  # fmt: skip
        except Exception as e:  # noqa: BLE001 (the maximum stands; the report shows no curve)
            print_note(f"{name} at half rate: failed: {type(e).__name__}: {e}")
        results.append(result)
    write_results("peers", {"record_size": 100, "seconds": seconds, "peers": results})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.suite", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="about 3 minutes, rougher figures")
    parser.add_argument("--only", help=f"comma-separated steps to run, of: {', '.join(STEPS)}")
    parser.add_argument("--skip", help="comma-separated steps to leave out")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR,
                        help="where the <timestamp>/ directory goes (default bench/results)")  # fmt: skip
    parser.add_argument("--peers-step", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peers_step:
        return peers_step(args.quick)
    chosen = [name for name, (_, _, _, in_quick) in STEPS.items() if in_quick or not args.quick]
    for option, names in (("--only", args.only), ("--skip", args.skip)):
        unknown = [n for n in (names or "").split(",") if n and n not in STEPS]
        if unknown:
            parser.error(
                f"{option}: unknown step {', '.join(unknown)}; the steps are {', '.join(STEPS)}"
            )
    if args.only:
        chosen = [name for name in STEPS if name in args.only.split(",")]
    if args.skip:
        chosen = [name for name in chosen if name not in args.skip.split(",")]

    from bench.report import render

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    directory = args.results.resolve() / stamp
    try:
        directory.mkdir(parents=True)
    except OSError as e:
        parser.error(f"cannot create the results directory {directory}: {e.strerror}")
    mode = "quick" if args.quick else "full"
    command = " ".join(["python -m bench.suite", *(argv if argv is not None else sys.argv[1:])])
    machine = machine_info()
    print_note(f"benchmark suite ({mode}): {', '.join(chosen)}; results in {directory}")
    started = time.perf_counter()
    steps: list[dict] = []
    summary = {"timestamp": stamp, "mode": mode, "command": command, "commit": git_commit(),
               "machine": machine, "steps": steps}  # fmt: skip
    try:
        for name in chosen:
            with console().status(f"{name} ..."):
                step = run_step(name, args.quick, directory)
            steps.append(step)
            colour = "green" if step["status"] == "ok" else "red"
            print_note(f"  [{colour}]{name}: {step['status']}[/] in {step['seconds']:.0f} s "
                       f"(log: {directory / step['log']})")  # fmt: skip
    except KeyboardInterrupt:
        steps.append({"name": "(interrupted)", "status": "stopped by Ctrl-C or SIGTERM"})
        print_note("[yellow]interrupted: writing the report of what ran[/]")
    summary["elapsed_s"] = time.perf_counter() - started
    os.environ["BENCH_RESULTS_DIR"] = str(directory)
    write_results("suite", summary)
    report = render(directory, steps)
    latest = directory.parent / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(stamp)
    except OSError:
        pass
    failed = [s["name"] for s in steps if s["status"] != "ok"]
    print_note(f"report: {report}" + (f" ([red]failed: {', '.join(failed)}[/])" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
