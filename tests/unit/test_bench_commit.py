"""bench.commit's batch-size sweep: the cost split it fits, the goals it picks, the load's
batch.size setting it runs on, and the bare chain that measures the machine's latency floor."""

from __future__ import annotations

import glob
import multiprocessing

import pytest

from bench import commit
from localcluster.tools.load import BATCH_BYTES, load_batch_bytes


def _row(batch_bytes: int, records_per_s: float, cpu_us: float | None, half_p99: float) -> dict:
    return {"batch_bytes": batch_bytes, "batch_records": commit.batch_records_for(100, batch_bytes),
            "records_per_s": records_per_s, "pipe_fraction": records_per_s / 10e6,
            "latency_ms": {"p50": 5.0, "p99": 9.0, "p99.9": 10.0}, "broker_cpu_us_per_record": cpu_us,
            "half": {"records_per_s": records_per_s / 2, "latency_ms": {"p50": 1.0, "p99": half_p99, "p99.9": 7.5}},
            "errors": 0}  # fmt: skip


def test_the_cost_split_recovers_what_each_record_and_each_batch_cost():
    per_record, per_batch = 0.5, 800.0
    rows = [_row(size, 1e6, None, 1.0) for size in commit.BATCH_SIZES]
    for row in rows:
        row["broker_cpu_us_per_record"] = per_record + per_batch / row["batch_records"]
    split = commit.cost_split(rows)
    assert split["per_record_us"] == pytest.approx(per_record)
    assert split["per_batch_us"] == pytest.approx(per_batch)
    assert commit.cost_split(rows[:1]) is None  # one batch size cannot tell the two apart


def test_issue_19_goals_come_from_the_fastest_batch_size_and_its_half_rate_run():
    rows = [
        _row(16 << 10, 2e5, 6.0, 1.5),
        _row(256 << 10, 3.2e6, 0.6, 2.5),
        _row(1_000_000, 2e6, 0.7, 1.0),
    ]
    throughput, latency = commit.scaled_goals(rows)
    assert throughput["met"] is True and throughput["issue"] == 19
    assert "batch.size 262,144" in throughput["shown"] and "32.0% of the raw" in throughput["shown"]
    assert latency["met"] is False and latency["value"] == 2.5  # the 256 KiB row's half rate
    assert "p99.9 7.50" in latency["shown"] and "note" not in latency
    slower = commit.scaled_goals([_row(64 << 10, 9e5, 1.8, 1.9)])
    assert slower[0]["met"] is False and slower[1]["met"] is True
    assert "half of the best rate reached" in slower[1]["note"]


def test_the_load_takes_its_batch_size_from_batch_size_and_refuses_a_bad_one():
    assert load_batch_bytes({}) == BATCH_BYTES
    assert load_batch_bytes({"batch.size": "262144"}) == 262_144
    with pytest.raises(ValueError, match="batch.size 'big' is not a whole number of bytes"):
        load_batch_bytes({"batch.size": "big"})
    with pytest.raises(ValueError, match="batch.size 0 is below 1 byte"):
        load_batch_bytes({"batch.size": "0"})


def test_the_bare_chain_times_every_batch_from_when_it_was_due_and_leaves_nothing_behind():
    batch = commit.build_batch(commit.batch_records_for(commit.RECORD_VALUE_BYTES, 16 << 10))
    chain = commit.raw_chain_latency(batch, batches_per_s=200, seconds=0.25)
    assert chain["batches"] == 50 and chain["batch_bytes"] == len(batch)
    latency = chain["latency_ms"]
    assert 0 < latency["p50"] <= latency["p99"] <= latency["p99.9"] <= latency["max"]
    assert not glob.glob("/dev/shm/bench-commit-chain-*")
    assert not multiprocessing.active_children()


def test_bare_chains_run_at_the_floor_and_at_the_best_batch_size_half_rate(monkeypatch):
    calls = []

    def chain(batch, batches_per_s, seconds):
        calls.append((len(batch), batches_per_s, seconds))
        return {"latency_ms": {}}

    monkeypatch.setattr(commit, "raw_chain_latency", chain)
    rows = [_row(64 << 10, 9e5, 1.8, 1.9), _row(1_000_000, 4e6, 0.5, 7.0)]
    floor = {"latency_ms": {"p50": 2.0, "p99": 3.0, "p99.9": 4.0}}
    chains = commit.bare_chains(rows, floor, 5.0)
    best_records = rows[1]["batch_records"]
    assert [(rate, s) for _, rate, s in calls] == [(commit.FLOOR_BATCHES_PER_S, 5.0),
                                                   (2e6 / best_records, 5.0)]  # fmt: skip
    floor_records = commit.batch_records_for(commit.RECORD_VALUE_BYTES, commit.FLOOR_BATCH_BYTES)
    assert [size for size, _, _ in calls] == [len(commit.build_batch(floor_records)),
                                              len(commit.build_batch(best_records))]  # fmt: skip
    assert chains[0]["brokers_latency_ms"] == floor["latency_ms"]
    assert chains[1]["brokers_latency_ms"]["p99"] == 7.0
