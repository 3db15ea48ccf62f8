"""metrics/loop_probe.py: the histogram's buckets, and a stall's split into the loop thread's
CPU, blocked time and the stack the watchdog saw."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

from localcluster.metrics import loop_probe
from localcluster.metrics.loop_probe import Histogram, LoopProbe

DEADLINE_S = 10.0


def test_every_value_lands_in_the_bucket_bounding_it():
    for value in [*range(0, 5000), *(random.randrange(1 << 40) for _ in range(5000))]:
        index = Histogram.index(value)
        assert Histogram.upper_us(index) >= value
        assert index == 0 or Histogram.upper_us(index - 1) < value
        assert Histogram.upper_us(index) <= value * 1.125 + 1  # within an eighth


def test_percentiles_bound_the_exact_ones_within_an_eighth():
    values = [random.expovariate(1 / 1000) for _ in range(20_000)]
    histogram = Histogram()
    for value in values:
        histogram.record(int(value))
    values.sort()
    for q in (50, 99, 99.9):
        exact = int(values[int(len(values) * q / 100) - 1])
        assert exact <= histogram.percentile_us(q) <= exact * 1.125 + 1
    assert histogram.percentile_us(100) == int(values[-1])


def spin_cpu(seconds: float) -> None:
    """Busy on this thread's CPU clock, so the CPU is spent whatever else the machine runs."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


async def run_until_stall(probe: LoopProbe, blocker, late_ms: float = 150) -> dict:
    """The stall the blocker caused (a busy machine may add shorter ones of its own)."""

    def found():
        return next((s for s in probe.stalls if s["late_ms"] >= late_ms), None)

    probe.start(asyncio.get_running_loop())
    try:
        asyncio.get_running_loop().call_later(0.02, blocker)
        deadline = time.monotonic() + DEADLINE_S
        while found() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # the probe's own ticks notice the stall
        assert found() is not None, f"no stall of {late_ms} ms recorded: {list(probe.stalls)}"
        return found()
    finally:
        probe.stop()


def test_a_long_callback_is_a_stall_on_the_loop_threads_cpu_with_its_stack(tmp_path):
    probe = LoopProbe(tmp_path / "p.json", "test", interval_ms=5, stall_ms=20)
    stall = asyncio.run(run_until_stall(probe, lambda: spin_cpu(0.2)))
    assert stall["cpu_ms"] >= 180  # the spin's 200 ms of CPU, in the stalled interval
    assert any("spin_cpu" in stack for stack in stall["stacks"])
    assert stall["threads"]["MainThread"]["cpu_ms"] > 0  # from the watchdog's look to the end
    figures = json.loads((tmp_path / "p.json").read_text())
    assert figures["lag"]["count"] >= 1 and figures["totals"]["stalls"] >= 1
    lines = (tmp_path / "p.stalls.jsonl").read_text().splitlines()
    assert stall["late_ms"] in [json.loads(line)["late_ms"] for line in lines]


def test_a_blocking_call_is_a_stall_off_the_cpu(tmp_path):
    probe = LoopProbe(None, "test", interval_ms=5, stall_ms=20)
    stall = asyncio.run(run_until_stall(probe, lambda: time.sleep(0.2)))
    assert stall["cpu_ms"] < 50
    # asleep, or (on a busy machine) waiting for a core once the sleep ended
    assert stall["blocked_ms"] + stall["run_queue_ms"] >= 150


def test_off_unless_the_environment_names_a_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(loop_probe.ENV, raising=False)

    async def started():
        return loop_probe.start_from_env("x")

    assert asyncio.run(started()) is None
    monkeypatch.setenv(loop_probe.ENV, str(tmp_path / "probes"))

    async def started_and_stopped():
        probe = loop_probe.start_from_env("broker-7")
        probe.stop()
        return probe

    probe = asyncio.run(started_and_stopped())
    assert probe.path.parent == tmp_path / "probes" and probe.path.name.startswith("broker-7-")
    assert probe.path.exists()


@pytest.mark.parametrize("value", [0, 1, 7, 8, 9, 1000, 123_456_789])
def test_summary_of_one_value(value):
    histogram = Histogram()
    histogram.record(value)
    assert histogram.summary()["p100_ms"] == value / 1000
