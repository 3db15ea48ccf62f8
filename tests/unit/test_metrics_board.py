"""The shared-memory metrics board: writer rows, consistent reads, rates, bounds, lifecycle."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

from localcluster.metrics import MetricsBoard, NullMetricsWriter, rates
from localcluster.metrics import board as b


@pytest.fixture
def cluster_dir(tmp_path):
    directory = tmp_path / "cluster"
    directory.mkdir()
    MetricsBoard.create(directory)
    try:
        yield directory
    finally:
        MetricsBoard.unlink(directory)


def test_hash_matches_the_brokers_data_dir_hash(tmp_path):
    from localcluster.broker.server import cluster_hash

    assert b.cluster_hash(tmp_path) == cluster_hash(tmp_path)


def test_no_board_means_no_reader_and_a_no_op_writer(tmp_path):
    assert MetricsBoard.open_reader(tmp_path) is None
    assert not MetricsBoard.exists(tmp_path)
    writer = MetricsBoard.open_writer(tmp_path, 0)  # a broker not started by `up`
    assert isinstance(writer, NullMetricsWriter)
    writer.record_produce(1, 1, 1)
    assert not MetricsBoard.exists(tmp_path)  # it created nothing to leak


def test_writer_counts_and_reader_sees_them(cluster_dir):
    writer = MetricsBoard.open_writer(cluster_dir, 3)
    writer.record_produce(1000, 10, 1500)
    writer.record_produce(500, 5, 3)
    writer.record_fetch(700)
    writer.record_isr_change(shrink=True)
    writer.record_isr_change(shrink=False)
    writer.record_isr_change(shrink=False)
    writer.update_replicas([("orders", 0, True, 42, 40), ("orders", 1, False, 7, 7)])
    reader = MetricsBoard.open_reader(cluster_dir)
    snapshot = reader.snapshot()
    assert list(snapshot) == [3]
    m = snapshot[3]
    assert (m.messages_in, m.bytes_in, m.bytes_out) == (15, 1500, 700)
    assert (m.produce_requests, m.fetch_requests, m.isr_shrinks, m.isr_expands) == (2, 1, 1, 2)
    assert m.latency_count == 2 and m.latency_sum_us == 1503
    assert m.latency_buckets[b.latency_bucket(1500)] == 1 and m.latency_buckets[2] == 1
    assert m.replicas == (("orders", 0, True, 42, 40), ("orders", 1, False, 7, 7))
    assert m.pid == os.getpid() and not m.torn
    reader.close()
    writer.close()


def test_buckets_are_powers_of_two():
    assert b.latency_bucket(0) == 0
    assert b.latency_bucket(1) == 1
    assert b.latency_bucket(1023) == 10 and b.latency_bucket(1024) == 11
    assert b.latency_bucket(10**12) == b.LATENCY_BUCKETS - 1
    assert b.latency_bucket(-5) == 0
    for us in (1, 5, 100, 999, 1 << 20):
        assert us < b.bucket_upper_us(b.latency_bucket(us))


def test_percentiles_and_rates(cluster_dir):
    writer = MetricsBoard.open_writer(cluster_dir, 0)
    reader = MetricsBoard.open_reader(cluster_dir)
    before = reader.snapshot()[0]
    for _ in range(99):
        writer.record_produce(100, 1, 1000)  # bucket [512, 1024)
    writer.record_produce(100, 1, 100_000)  # one slow request
    after = reader.snapshot()[0]
    r = rates(before, after, 2.0)
    assert r.messages_in_per_s == pytest.approx(50) and r.bytes_in_per_s == pytest.approx(5000)
    assert r.produce_p50_us == 1024
    assert r.produce_p99_us == 1024 and b.percentile_us(after.latency_buckets, 1.0) == 131072
    assert b.percentile_us([0] * b.LATENCY_BUCKETS, 0.5) is None


def test_a_restart_zeroes_the_row_and_rates_restart(cluster_dir):
    first = MetricsBoard.open_writer(cluster_dir, 1)
    first.record_produce(10, 10, 5)
    reader = MetricsBoard.open_reader(cluster_dir)
    old = reader.snapshot()[1]
    first.close()
    second = MetricsBoard.open_writer(cluster_dir, 1)
    new = reader.snapshot()[1]
    assert new.messages_in == 0 and new.started_ms >= old.started_ms
    r = rates(old, new, 1.0)  # another incarnation: counts from its start, never negative
    assert r.messages_in_per_s == 0
    second.close()


def test_bounds(cluster_dir):
    assert isinstance(MetricsBoard.open_writer(cluster_dir, b.MAX_BROKERS), NullMetricsWriter)
    assert isinstance(MetricsBoard.open_writer(cluster_dir, -1), NullMetricsWriter)
    writer = MetricsBoard.open_writer(cluster_dir, 0)
    writer.update_replicas(("t" * 300, p, False, p, p) for p in range(b.REPLICA_SLOTS + 10))
    m = MetricsBoard.open_reader(cluster_dir).snapshot()[0]
    assert len(m.replicas) == b.REPLICA_SLOTS
    assert len(m.replicas[0][0]) == b.TOPIC_BYTES
    assert os.path.getsize(f"/dev/shm/{b.segment_name(cluster_dir).lstrip('/')}") == b.SIZE


def test_a_row_mid_update_is_retried_then_reported_torn(cluster_dir):
    writer = MetricsBoard.open_writer(cluster_dir, 2)
    reader = MetricsBoard.open_reader(cluster_dir)
    writer._begin()  # the writer is "inside" an update: sequence odd
    m = reader.snapshot()[2]
    assert m.torn  # the reader gave up after its bounded retries instead of waiting
    writer._end()
    assert not reader.snapshot()[2].torn


def _hammer(directory, count):
    writer = MetricsBoard.open_writer(directory, 5)
    for _ in range(count):
        writer.record_produce(3, 1, 7)
    writer.close()


def test_concurrent_reader_sees_consistent_rows(cluster_dir):
    """messages_in * 3 == bytes_in in every untorn snapshot while another process writes."""
    reader = MetricsBoard.open_reader(cluster_dir)
    process = multiprocessing.get_context("fork").Process(
        target=_hammer, args=(cluster_dir, 100_000)
    )
    process.start()
    checked = 0
    try:
        while process.is_alive() or checked == 0:
            m = reader.snapshot().get(5)
            if m is not None and not m.torn:
                assert m.bytes_in == 3 * m.messages_in
                assert m.latency_count == m.produce_requests == m.messages_in
                checked += 1
    finally:
        process.join(60)
    assert process.exitcode == 0 and checked > 0
    assert reader.snapshot()[5].messages_in == 100_000


def test_layout_is_fixed():
    assert b.ROW.itemsize % 8 == 0
    assert b.SIZE == b.HEADER_BYTES + b.MAX_BROKERS * b.ROW.itemsize
    assert np.dtype(b.ROW)["counters"].shape == (len(b.COUNTERS),)
