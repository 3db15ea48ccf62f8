"""bench.scaling's pure parts: py-spy profile summaries, percentiles over few kills, readiness
of a Metadata view and the goals. No cluster (its smallest run takes ~25 s, too long here)."""

from __future__ import annotations

import pytest

from bench.scaling import (
    EVENT_LOOP_LABEL,
    FULL,
    QUICK,
    descriptors_needed,
    percentile,
    ready,
    scaling_goals,
    top_functions,
)

ENTRY = "_run_module_as_main (<frozen runpy>:198);<module> (localcluster/broker/__main__.py:99)"


def test_top_functions_counts_leaves_and_the_packages_own_frames():
    collapsed = "\n".join([
        f"{ENTRY};elect (localcluster/controller/x.py:10);encode (localcluster/coord/y.py:5) 6",
        f"{ENTRY};elect (localcluster/controller/x.py:12) 3",
        "thread (0x1);Thread.run (threading.py:1) 1",
        "garbage line",
    ])  # fmt: skip
    summary = top_functions(collapsed)
    assert summary["samples"] == 10
    assert summary["self"] == [("encode (coord/y.py)", 0.6), ("elect (controller/x.py)", 0.3),
                               ("Thread.run (threading.py)", 0.1)]  # fmt: skip
    # the entry point holds every sample and is left out; line numbers merge
    assert summary["inclusive"] == [("elect (controller/x.py)", 0.9), ("encode (coord/y.py)", 0.6)]
    assert top_functions("") == {"samples": 0, "self": [], "inclusive": []}


def test_the_event_loop_frame_is_named_as_uvloop_waiting():
    summary = top_functions(
        f"{ENTRY};main (localcluster/broker/__main__.py:83);Runner.run (asyncio/runners.py:118) 4"
    )
    assert summary["self"] == [(EVENT_LOOP_LABEL, 1.0)]


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert percentile([5.0], 99) == 5.0


def test_ready_needs_every_partition_led_by_a_live_broker_with_a_full_isr():
    view = {0: (1, 3), 1: (2, 3)}
    assert ready(view, 2, {1, 2}, full_isr=True)
    assert not ready(view, 3, {1, 2}, full_isr=True)  # a partition missing from the metadata
    assert not ready(view, 2, {1}, full_isr=True)  # led by a dead broker
    assert not ready({0: (1, 2), 1: (2, 3)}, 2, {1, 2}, full_isr=True)
    assert ready({0: (1, 2), 1: (2, 3)}, 2, {1, 2}, full_isr=False)
    assert not ready(None, 2, {1, 2}, full_isr=False)


def cell(partitions: int, records_per_s: float) -> dict:
    return {"partitions": partitions, "records_per_s": records_per_s}


@pytest.mark.parametrize(("at_600", "met"), [(150.0, True), (149.0, False)])
def test_the_partition_goal_compares_600_with_6(at_600, met):
    goals = scaling_goals({"partitions": [cell(6, 300.0), cell(600, at_600)], "controller": []})
    assert [g["met"] for g in goals] == [met]


def test_the_failover_goal_is_missed_below_10000_partitions_whatever_the_figure():
    small = {"partitions": 1000, "failover_p99_s": 0.1, "kills": [{}]}
    big = {"partitions": 10000, "failover_p99_s": 1.5, "kills": [{}, {}]}
    (only_small,) = scaling_goals({"partitions": [], "controller": [small]})
    assert not only_small["met"] and "1,000" in only_small["note"]
    (with_big,) = scaling_goals({"partitions": [], "controller": [small, big]})
    assert with_big["met"] and "note" not in with_big


def test_the_full_run_has_the_issues_sizes():
    assert FULL.partitions == (1, 6, 60, 600, 3000)
    assert FULL.brokers == (3, 5, 9)
    assert {100, 1000, 10000} <= set(FULL.controller_partitions)
    assert set(QUICK.partitions) <= set(FULL.partitions)


def test_partition_counts_beyond_the_open_files_limit_are_known_before_they_run():
    # 10,000 RF 3 on 5 brokers: 6,000 replicas each, 4 descriptors per replica with maps that keep one
    assert descriptors_needed(10000, 5, per_map=1) > 20000 >= descriptors_needed(6000, 5, per_map=1)
    assert descriptors_needed(10000, 5, per_map=0) == 7000  # maps that keep no descriptor


def test_the_report_section_lists_every_cell_and_what_was_skipped(tmp_path):
    from bench.report import section_scaling

    latency = {"p50": 1.0, "p99": 2.0, "p99.9": 3.0}
    doc = {"config": {"broker_curve_partitions": 18},
           "partitions": [{"partitions": 6, "brokers": 3, "records_per_s": 1000.0, "latency_ms": latency, "errors": 0}],
           "brokers": [], "skipped": [{"partitions": 10000, "brokers": 5, "skipped": "not run: open files"}],
           "controller": [{"partitions": 100, "brokers": 5, "create_s": 1.0, "up_s": 2.0, "kills": [{}],
                           "failover_p50_s": 0.3, "failover_p99_s": 0.4}]}  # fmt: skip
    text = "\n".join(section_scaling({"scaling": doc}, tmp_path))
    assert "| 6 | 3 | 1,000 |" in text and "| 100 | 5 | 1.00 | 2.00 | 1 | 300 | 400 |" in text
    assert "10,000 partitions on 5 brokers: not run: open files" in text
    assert section_scaling({}, tmp_path) == ["_bench.scaling did not run._", ""]
