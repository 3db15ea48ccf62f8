"""bench.e2e: the batch-level end-to-end latency measurement the benchmark suite calls.

The header walk is checked on hand-made record sets; `measure_e2e` runs at a low rate against
a real three-broker cluster (bench.broker.Cluster, RF 3, min.insync.replicas 2). Assertions
are on counts and sanity, never on speed: this box is shared.
"""

from __future__ import annotations

import array
import struct

import pytest

from bench.broker import Cluster, build_batch, create_topic
from bench.e2e import measure_e2e, walk_batches

TOPIC = "e2e-test"
PARTITIONS = 3
LATENCY_KEYS = ("p50", "p95", "p99", "p99.9", "max", "mean", "count")


def _at(batch: bytes, base_offset: int, attributes_or: int = 0) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">q", out, 0, base_offset)
    if attributes_or:
        struct.pack_into(">h", out, 21, struct.unpack_from(">h", out, 21)[0] | attributes_or)
    return bytes(out)


def test_walk_batches_notes_complete_batches_and_skips_control_and_partial():
    batch = build_batch(7, 10)  # offsets base .. base + 6
    data = _at(batch, 100) + _at(batch, 107, 0x20) + _at(batch, 114) + _at(batch, 121)[:40]
    out = (array.array("i"), array.array("q"), array.array("q"), array.array("i"))
    positions = {2: 100}
    assert walk_batches(data, 2, 555, out, positions) == 2
    assert list(out[0]) == [2, 2] and list(out[1]) == [100, 114]
    assert list(out[2]) == [555, 555] and list(out[3]) == [7, 7]
    assert positions == {2: 121}  # after the control batch and the last complete one
    assert walk_batches(b"", 2, 556, out, positions) == 0 and positions == {2: 121}


def test_walk_batches_counts_the_records_of_compressed_batches_by_header():
    from bench.e2e import prebuilt_batch

    data = b"".join(_at(prebuilt_batch(9, 10, codec), 9 * i)
                    for i, codec in enumerate(["gzip", "snappy", "lz4", "zstd"]))  # fmt: skip
    out = (array.array("i"), array.array("q"), array.array("q"), array.array("i"))
    positions = {0: 0}
    assert walk_batches(data, 0, 1, out, positions) == 4
    assert list(out[1]) == [0, 9, 18, 27] and list(out[3]) == [9] * 4 and positions == {0: 36}


@pytest.fixture(scope="module")
def cluster():
    c = Cluster({"auto.create.topics.enable": "false", "auto.leader.rebalance.enable": "false"})
    try:
        c.start((0, 1, 2))
        create_topic(c.bootstrap, TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
        c.wait_until(lambda: all(len(c.partition_state(TOPIC, p).isr) == 3
                                 for p in range(PARTITIONS)), 30, "full ISRs")  # fmt: skip
        yield c
    finally:
        c.close()


def test_measure_e2e_every_acked_batch_is_consumed(cluster):
    r = measure_e2e(cluster.bootstrap, TOPIC, PARTITIONS, rate=20_000, seconds=1.0)
    assert r["errors"] == 0, r["first_error"]
    assert r["missing_batches"] == 0 and r["duplicate_batches"] == 0
    assert r["unmatched_batches"] == 0
    assert r["batches"] > 0 and r["records"] == r["batches"] * 580
    assert r["batches"] == pytest.approx(20_000 / 580, abs=2)  # 1 s on the schedule
    produce, e2e = r["produce_latency_ms"], r["e2e_latency_ms"]
    assert set(LATENCY_KEYS) <= set(produce) and set(LATENCY_KEYS) <= set(e2e)
    assert produce["count"] == e2e["count"] == r["batches"]
    # a batch can be fetched before its producer sees the ack: e2e >= produce is not a rule,
    # but every batch is received after it was due, within a generous bound
    assert r["nonpositive_e2e_batches"] == 0 and e2e["min"] > 0
    assert e2e["max"] < 5_000 and produce["max"] < 5_000
    assert e2e["p50"] <= e2e["p99"] <= e2e["p99.9"] <= e2e["max"]
    assert r["records_per_s"] > 0 and r["target_records_per_s"] == 20_000
    assert r["consumer"]["fetch_max_wait_ms"] == 5 and r["consumer"]["fetches"] > 0
    assert r["consumer"]["reached_targets"] is True
    assert r["e2e_curve_ms"][-1] == (100.0, e2e["max"])


def test_measure_e2e_with_compressed_batches(cluster):
    r = measure_e2e(cluster.bootstrap, TOPIC, PARTITIONS, rate=10_000, seconds=0.5,
                    compression="zstd")  # fmt: skip
    assert r["errors"] == 0, r["first_error"]
    assert r["config"]["compression"] == "zstd"
    assert r["batches"] > 0 and r["missing_batches"] == 0 and r["duplicate_batches"] == 0
