"""Small helpers shared by every benchmark: timing, machine facts, tables, JSON results.

Rules for benchmarks built on these:
- A figure is only compared with figures measured in the same run on the same machine; the
  JSON keeps every sample next to the machine it came from, so runs can be compared later.
- Timing uses `time.perf_counter_ns`; a measurement is repeated and reported as its best
  (fastest) run, because other work on a shared machine only ever slows a run down; the median
  and every sample are kept in the JSON so the spread stays visible.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MB = 1_000_000  # rates are in decimal MB/s, as `dd` and most tools print them
MiB = 1 << 20


# -- timing -----------------------------------------------------------------------------------


class Timer:
    """`with Timer() as t: ...` then `t.seconds`."""

    def __enter__(self) -> Timer:
        self._start = time.perf_counter_ns()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = (time.perf_counter_ns() - self._start) / 1e9


def repeat(times: int, measure: Callable[[], float]) -> list[float]:
    """Run `measure` (which returns the seconds it timed itself) `times` times."""
    assert times >= 1
    return [measure() for _ in range(times)]


def best(samples: Sequence[float]) -> float:
    """The fastest of several timings (seconds)."""
    return min(samples)


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


# -- machine ----------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine_info() -> dict:
    try:
        import numpy

        numpy_version = numpy.__version__
    except ImportError:
        numpy_version = None
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": memory_total_bytes(),
        "kernel": platform.release(),
        "os": platform.system(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "numpy": numpy_version,
        "load_average": list(os.getloadavg()),  # others' work on a shared machine skews figures
    }


def filesystem_of(path: Path | str) -> dict:
    """The mount holding `path`: {"mount", "type", "device"} from /proc/mounts."""
    path = os.path.realpath(path)
    best = {"mount": "/", "type": "unknown", "device": "unknown"}
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        device, mount, fstype = line.split()[:3]
        mount = mount.replace("\\040", " ")
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best["mount"]):
            best = {"mount": mount, "type": fstype, "device": device}
    return best


# -- output -----------------------------------------------------------------------------------

_console = None


def console(*, stderr: bool | None = None):
    """The rich console tables go to; `stderr=True` keeps stdout free for JSON."""
    global _console
    from rich.console import Console

    if _console is None or stderr is not None:
        _console = Console(stderr=bool(stderr))
        if not _console.is_terminal and "COLUMNS" not in os.environ:
            _console = Console(stderr=bool(stderr), width=120)  # logs and pipes: no 80-col wrap
    return _console


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence | None], *,
                text_columns: int = 1, note: str | None = None) -> None:  # fmt: skip
    """A rich table: the first `text_columns` columns left-aligned, figures right-aligned.

    A row of None draws a separator; `note` is printed under the table, unwrapped by it.
    """
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, name in enumerate(columns):
        text = i < text_columns
        table.add_column(name, justify="left" if text else "right", no_wrap=text)
    for row in rows:
        if row is None:
            table.add_section()
        else:
            table.add_row(*(str(cell) for cell in row))
    console().print(table)
    if note:
        console().print(note, style="dim")


def print_note(text: str) -> None:
    console().print(text)


def goal(text: str, value, shown: str, met: bool, note: str | None = None) -> dict:
    """One goal in every benchmark's JSON `goals` list (the suite's report reads them):
    what is aimed at, the measured value (a number or None), how it reads, met or not."""
    out = {"goal": text, "value": value, "shown": shown, "met": bool(met)}
    if note:
        out["note"] = note
    return out


def print_goals(title: str, goals: Sequence[dict], note: str | None = None) -> None:
    print_table(title, ["goal", "measured", ""],
                [(g["goal"], g["shown"], "[green]pass[/]" if g["met"] else "[red]miss[/]") for g in goals],
                note=note)  # fmt: skip


def results_dir() -> Path:
    """Where results go: $BENCH_RESULTS_DIR (the suite's bench/results/<timestamp>/) or
    bench/results/."""
    return Path(os.environ.get("BENCH_RESULTS_DIR") or RESULTS_DIR)


def write_results(name: str, results: dict, *, to_stdout: bool = False) -> Path:
    """Write <results_dir()>/<name>.json with the machine and a UTC timestamp; returns the path."""
    document = {
        "benchmark": name,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine_info(),
        **results,
    }
    directory = results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    text = json.dumps(document, indent=2) + "\n"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    if to_stdout:
        sys.stdout.write(text)
    return path


def mb_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / MB


def per_s(count: int, seconds: float) -> float:
    return count / seconds
