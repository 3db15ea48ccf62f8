"""bench.failover's probes and analysis, checked without timing anything.

Each client's probe (our client with and without idempotence, confluent-kafka, kafka-python)
produces briefly to a real three-broker cluster (RF 3); read back, every record it says was
acknowledged is at the offset it was acknowledged with, under its own tag. The analysis (stall
per kill, duplicates per kill, a lost record) is checked on made-up rows. Assertions are on
counts and contents, never on speed: this box is shared.
"""

from __future__ import annotations

import time

import pytest

from bench.broker import Cluster, create_topic
from bench.failover import (
    BROKERS,
    PARTITIONS,
    TOPIC,
    analyse,
    client_goals,
    of_probe,
    read_back,
    summarise,
)
from bench.failover_probes import PROBES, TAGS, Probe
from tests.helpers import wait_until


@pytest.fixture(scope="module")
def cluster():
    c = Cluster({"auto.create.topics.enable": "false"})
    try:
        c.start(BROKERS)
        create_topic(c.bootstrap, TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
        yield c
    finally:
        c.close()


def test_every_probe_reads_back_at_the_offsets_it_was_acknowledged_with(cluster):
    settings = {"retry_backoff_ms": 10, "reconnect_backoff_ms": 10, "request_timeout_ms": 10_000}
    probes = [Probe(name, cluster.bootstrap, TOPIC, PARTITIONS, 5.0, settings) for name in PROBES]
    try:
        since = time.monotonic()
        for probe in probes:
            wait_until(lambda p=probe: all(t > since for t in p.last_acks().values()), 60,
                       message=f"{probe.name}: an acknowledgement on every partition")  # fmt: skip
        outcomes = {probe.name: probe.finish() for probe in probes}
    finally:
        for probe in probes:
            probe.kill()
    stored = read_back(cluster.bootstrap)
    for name, outcome in outcomes.items():
        assert not outcome["errors"], (name, outcome["errors"])
        rows = outcome["rows"]
        assert rows and {r[1] for r in rows} == set(range(PARTITIONS))
        _, check = analyse([], rows, of_probe(stored, TAGS[name]))
        assert check["acknowledged"] == check["sent"] == len(rows), name
        assert check["lost"] == 0 and check["stored"] == len(rows), (name, check)
        assert check["duplicates_stored"] == 0


def _row(sequence, partition, sent, acked, offset):
    return [sequence, partition, sent, acked, offset]


def test_the_analysis_finds_the_stall_duplicates_and_losses_of_one_kill():
    kill = {"series": "leader", "partition": 0, "epoch_before": 1, "killed_at": 10.0,
            "elected_s": 0.05}  # fmt: skip
    rows = [_row(0, 0, 9.9, 9.95, 0),  # before the kill, old leader
            _row(1, 0, 9.99, 10.30, 1),  # acknowledged after the kill, still epoch 1 in the log
            _row(2, 0, 10.1, 10.42, 2),  # the first one the new leader (epoch 2) appended
            _row(3, 1, 10.0, 10.05, 0),  # another partition, sent at the kill
            _row(4, 0, 10.2, 10.5, 3)]  # acknowledged at offset 3, which holds another record  # fmt: skip
    stored = {0: {0: (0, 1), 1: (1, 1), 2: (2, 2), 4: (2, 2)}, 1: {0: (3, 1)}}
    seen, check = analyse([kill], rows, stored)
    assert seen[0]["unavailable_s"] == pytest.approx(0.42)
    assert seen[0]["others_stalled_s"] == pytest.approx(0.05)
    assert "unavailable_s" not in kill  # the caller's kill is not changed
    assert check["duplicates_stored"] == 1 and check["duplicates_per_kill"] == 1.0
    assert check["lost"] == 1 and check["lost_examples"] == [(4, 0, 3)]
    summary = summarise(seen)
    assert summary["leader"]["unavailable_p99_s"] == pytest.approx(0.42)
    assert (
        summary["controller"]["kills"] == 0 and summary["controller"]["unavailable_p50_s"] is None
    )


def test_of_probe_keeps_one_probes_records():
    stored = {0: {0: (1, 5, 0), 1: (2, 5, 0), 2: (1, 6, 1)}}
    assert of_probe(stored, 1) == {0: {0: (5, 0), 2: (6, 1)}}


def test_goals_ask_no_duplicates_of_idempotent_clients_only():
    def client(duplicates, p99=0.2):
        stalls = {"unavailable_p99_s": p99}
        return {"summary": {"leader": stalls, "controller": stalls}, "all": {"p99_s": p99},
                "check": {"duplicates_stored": duplicates, "lost": 0}}  # fmt: skip

    goals = client_goals({"own": client(0), "own-no-idempotence": client(7),
                          "confluent": client(0, 0.9)})  # fmt: skip
    by_text = {g["goal"]: g["met"] for g in goals}
    assert not any("enable.idempotence=false" in text for text in by_text)
    assert [met for text, met in by_text.items() if "confluent-kafka: p99" in text] == [False]
    assert all(met for text, met in by_text.items() if "twice" in text or "lost" in text)
