"""PNG plots shared by the benchmarks and the suite's report (matplotlib, Agg backend).

Every function returns the path written, or None when matplotlib is not installed (it comes
with the bench extra; a benchmark without it still prints and writes its JSON).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

PERCENTILE_TICKS = ([1, 2, 10, 100, 1000, 10000], ["0%", "50%", "90%", "99%", "99.9%", "99.99%"])


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def finish(fig, axes, path: Path, title: str, legend_fontsize: int = 8) -> Path:
    """Title, grid and legend on the axes, then write the PNG and free the figure."""
    plt = pyplot()
    axes.set_title(title, fontsize=9)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=legend_fontsize)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def percentile_spectrum(series: Sequence[tuple[str, Sequence[Sequence[float]]]], path: Path, title: str,
                        ylabel: str, goal_ms: float | None = None, goal_label: str = "") -> Path | None:  # fmt: skip
    """Latency against percentile (HdrHistogram style: the x axis stretches the tail); each
    series is (label, [(percentile, ms), ...]) as bench.load.curve makes them."""
    plt = pyplot()
    series = [(label, points) for label, points in series if points]
    if plt is None or not series:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for label, points in series:
        xs = [1 / max(1e-6, 1 - p / 100) for p, _ in points]
        ax.plot(xs, [v for _, v in points], marker=".", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(*PERCENTILE_TICKS)
    ax.set_xlabel("percentile")
    ax.set_ylabel(ylabel)
    if goal_ms is not None:
        ax.axhline(goal_ms, color="grey", linestyle=":", label=goal_label)
    return finish(fig, ax, path, title, legend_fontsize=7)
