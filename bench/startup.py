"""Startup benchmark: `localcluster up -n 5` to ready, and each broker's peak RSS.

What is measured, in one run:
- bare interpreter: wall time of `python -c pass` (this venv's python) and its peak RSS
  (ru_maxrss from wait4), the floor any Python process pays.
- broker imports: wall time and peak RSS of `python -c "import localcluster.broker.server"`,
  what a broker pays before it does anything.
- cluster start: wall time of `localcluster up -n 5 --detach` from the command's start to its
  exit, which happens once all five brokers registered and a controller was elected (the
  command waits for both); in a fresh cluster dir each time, torn down with `down --purge`.
  Peak RSS per broker is VmHWM from /proc/<pid>/status read right after ready.

Goals (issue 7), printed with a pass/miss mark and not asserted: ready in under 1.5 s and under
60 MB RSS per broker. Figures are the best of --repeats runs (other work on the machine only
slows a run down); medians and all samples are in bench/results/startup.json. Every broker is
stopped (and its dir removed) also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.common import best, goal, median, print_note, print_table, write_results

GOAL_READY_S = 1.5
GOAL_RSS_MB = 60.0
BROKERS = 5


def timed_child(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one child process, measured with wait4."""
    start = time.perf_counter_ns()
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = (time.perf_counter_ns() - start) / 1e9
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{args} failed: {process.stderr.read().decode()}")
    return seconds, usage.ru_maxrss / 1024


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cli(cluster_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "localcluster", *args, "--dir", str(cluster_dir)],
                            capture_output=True, text=True, timeout=180)  # fmt: skip
    if check and result.returncode != 0:
        raise RuntimeError(f"localcluster {' '.join(args)} failed: {result.stderr.strip()}")
    return result


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) broker-(\d+) INFO (.*)$")


def log_events(cluster_dir: Path, started: float) -> dict:
    """Seconds from the command's start to each broker's "ready" log line and to the first
    "is the controller" line (wall clock, millisecond resolution), from the broker logs."""
    ready, controller = {}, None
    for log in sorted(cluster_dir.glob("broker-*/broker.log")):
        for line in log.read_text(errors="replace").splitlines():
            match = LOG_TIME.match(line)
            if not match:
                continue
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - started
            if "localcluster.broker.server: broker" in line and " ready: " in line:
                ready[int(match.group(2))] = stamp
            elif "is the controller" in line and (controller is None or stamp < controller):
                controller = stamp
    return {"broker_ready_s": ready, "controller_elected_s": controller}


def one_cluster_start(workdir: Path, run: int) -> dict:
    cluster_dir = workdir / f"cluster-{run}"
    try:
        wall_start = time.time()
        start = time.perf_counter_ns()
        cli(cluster_dir, "up", "-n", str(BROKERS), "--detach", "--json")
        seconds = (time.perf_counter_ns() - start) / 1e9
        state = json.loads(cli(cluster_dir, "status", "--json").stdout)
        rss = {b["id"]: peak_rss_mb(b["pid"]) for b in state["brokers"] if b["alive"]}
        events = log_events(cluster_dir, wall_start)
        return {"ready_s": seconds, "controller": state["controller"], "peak_rss_mb": rss, **events}
    finally:
        cli(cluster_dir, "down", "--purge", "--timeout", "10", check=False)
        shutil.rmtree(cluster_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.startup", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=3, help="cluster starts (default 3)")
    parser.add_argument("--quick", action="store_true", help="one cluster start")
    parser.add_argument("--json", action="store_true", help="also print the JSON document")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else max(args.repeats, 1)
    os.environ.setdefault("LOCALCLUSTER_CONTROLLER_GRACE_S", "2.0")

    bare = [timed_child([sys.executable, "-c", "pass"]) for _ in range(max(repeats, 3))]
    imports = [timed_child([sys.executable, "-c", "import localcluster.broker.server"])
               for _ in range(max(repeats, 3))]  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    runs = []
    try:
        for run in range(repeats):
            runs.append(one_cluster_start(workdir, run))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    ready = [r["ready_s"] for r in runs]
    per_broker = [mb for r in runs for mb in r["peak_rss_mb"].values() if mb is not None]
    worst_rss_per_run = [max(v for v in r["peak_rss_mb"].values() if v is not None) for r in runs
                         if any(v is not None for v in r["peak_rss_mb"].values())]  # fmt: skip
    best_ready = best(ready)
    rss_figure = min(worst_rss_per_run) if worst_rss_per_run else None

    def mark(ok: bool) -> str:
        return "pass" if ok else "miss"

    rows = [
        ("python -c pass", f"{best([s for s, _ in bare]) * 1000:.0f}", f"{min(m for _, m in bare):.1f}", "", ""),
        ("import localcluster.broker.server", f"{best([s for s, _ in imports]) * 1000:.0f}",
         f"{min(m for _, m in imports):.1f}", "", ""),
        (f"up -n {BROKERS} to ready (all registered, controller elected)", f"{best_ready * 1000:.0f}",
         f"{rss_figure:.1f}" if rss_figure else "-",
         f"< {GOAL_READY_S * 1000:.0f} ms / < {GOAL_RSS_MB:.0f} MB",
         f"{mark(best_ready < GOAL_READY_S)} / {mark(rss_figure is not None and rss_figure < GOAL_RSS_MB)}"),
    ]  # fmt: skip
    fastest = min(runs, key=lambda r: r["ready_s"])
    if fastest["broker_ready_s"]:
        first, last = (
            min(fastest["broker_ready_s"].values()),
            max(fastest["broker_ready_s"].values()),
        )
        rows.append(
            ("  of which: first broker ready (its log line)", f"{first * 1000:.0f}", "", "", "")
        )
        rows.append(("  of which: last broker ready", f"{last * 1000:.0f}", "", "", ""))
    if fastest["controller_elected_s"] is not None:
        rows.append(("  of which: controller elected", f"{fastest['controller_elected_s'] * 1000:.0f}",
                     "", "", ""))  # fmt: skip
    print_table(f"startup (best of {repeats}; RSS: peak of the largest broker)",
                ("what", "wall ms", "peak RSS MB", "goal", "met"), rows, text_columns=1,
                note="broker RSS is VmHWM right after ready; the command's time includes its own "
                     "interpreter start and the supervisor's")  # fmt: skip
    if any(r["controller"] is None for r in runs):
        print_note("no controller was elected in some runs: `up` then waits its grace period")
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1):
        print_note(
            f"load average {load:.1f} on {os.cpu_count()} cores: figures are slower than on a quiet machine"
        )
    results = {
        "goals": [
            goal(f"up -n {BROKERS} ready in < {GOAL_READY_S:g} s", best_ready, f"{best_ready * 1000:.0f} ms",
                 best_ready < GOAL_READY_S),
            goal(f"peak RSS per broker < {GOAL_RSS_MB:g} MB", rss_figure,
                 "-" if rss_figure is None else f"{rss_figure:.1f} MB",
                 rss_figure is not None and rss_figure < GOAL_RSS_MB),
        ],
        "bare_python": {"wall_s_best": best([s for s, _ in bare]), "wall_s_median": median([s for s, _ in bare]),
                        "peak_rss_mb": min(m for _, m in bare), "samples": bare},
        "broker_imports": {"wall_s_best": best([s for s, _ in imports]),
                           "wall_s_median": median([s for s, _ in imports]),
                           "peak_rss_mb": min(m for _, m in imports), "samples": imports},
        "cluster": {"brokers": BROKERS, "ready_s_best": best_ready, "ready_s_median": median(ready),
                    "ready_s_samples": ready, "peak_rss_mb_largest_broker": rss_figure,
                    "peak_rss_mb_median_broker": median(per_broker) if per_broker else None,
                    "runs": runs},
    }  # fmt: skip
    path = write_results("startup", results, to_stdout=args.json)
    print_note(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
