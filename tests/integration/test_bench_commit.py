"""bench.commit's transport rows (issue 13), checked without timing anything.

One three-broker cluster as bench.commit's helpers set it up with both transports at once:
replication over TCP loopback with SASL PLAIN (no Unix socket between brokers) and a
SASL_PLAINTEXT client listener beside PLAINTEXT. A short acks=all load through the SASL listener
with each client is acknowledged without error and every acknowledged record is stored; the
brokers' logs show every route between them went over TCP, which is what the TCP row claims.
The idempotence rows' load really is idempotent or not (DescribeProducers sees a new producer
on every partition after the one, none after the other). The ratio rows are checked on
made-up runs. Assertions are on counts and contents, never on
speed: this box is shared.
"""

from __future__ import annotations

import pytest

from bench.broker import CLIENT_SASL, SASL_CLIENT_LISTENER, Cluster, end_offsets
from bench.commit import (
    BROKERS,
    IDEMPOTENT,
    NOT_IDEMPOTENT,
    TOPIC,
    idempotence_rows,
    replication_routes,
    start_cluster,
    transport_rows,
)
from bench.load import LoadPool
from localcluster.client import Admin

PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster():
    c = Cluster({"auto.create.topics.enable": "false", "auto.leader.rebalance.enable": "false"},
                replication="tcp", sasl_clients=True)  # fmt: skip
    try:
        start_cluster(c, PARTITIONS)
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def pool():
    with LoadPool(1) as p:
        yield p


def test_the_sasl_listener_is_a_listener_of_its_own(cluster):
    sasl = cluster.client_bootstrap(SASL_CLIENT_LISTENER).split(",")
    plain = cluster.bootstrap.split(",")
    assert len(sasl) == len(plain) == len(BROKERS)
    assert not set(sasl) & set(plain)


@pytest.mark.parametrize("client", ["own", "confluent"])
def test_acks_all_through_the_sasl_listener_stores_every_acknowledged_record(cluster, pool, client):
    before = sum(end_offsets(cluster.bootstrap, TOPIC, PARTITIONS))
    run = pool.measure(client=client, bootstrap=cluster.client_bootstrap(SASL_CLIENT_LISTENER),
                       topic=TOPIC, partitions=list(range(PARTITIONS)), acks="all", record_size=100,
                       seconds=0.5, rate=20_000, client_config=CLIENT_SASL,
                       cpu_of={f"broker {b}": p.pid for b, p in cluster.brokers.items()})  # fmt: skip
    assert run["errors"] == 0, run["first_error"]
    assert run["records"] > 0 and run["latency_ms"]["count"] > 0
    assert set(run["other_cores"]) == {f"broker {b}" for b in BROKERS}
    stored = sum(end_offsets(cluster.bootstrap, TOPIC, PARTITIONS)) - before
    assert stored >= run["records"]  # acks=all: nothing acknowledged is missing


def test_a_wrong_password_on_the_sasl_listener_is_an_error_not_a_row(cluster, pool):
    with pytest.raises(RuntimeError, match="load process failed"):
        pool.measure(client="own", bootstrap=cluster.client_bootstrap(SASL_CLIENT_LISTENER),
                     topic=TOPIC, partitions=[0], acks="all", record_size=100, seconds=0.2,
                     rate=1_000, client_config={**CLIENT_SASL, "sasl.password": "wrong"},
                     timeout_s=60)  # fmt: skip


def test_every_route_between_the_brokers_went_over_tcp(cluster):
    routes = replication_routes(cluster)
    assert routes["ok"], routes
    assert routes["expected"] == "tcp" and not routes["wrong"] and not routes["missing"]
    assert all(
        how == "tcp" and "BROKER://127.0.0.1:" in rest for _, _, how, rest in routes["routes"]
    )


def _run(records_per_s: float, records: int, seconds: float, broker_cores: list[float]) -> dict:
    return {"label": f"{records_per_s:g}/s", "records_per_s": records_per_s, "records": records,
            "seconds": seconds, "latency_ms": {"p50": 1.0, "p99": 2.0},
            "other_cores": {f"broker {i}": c for i, c in enumerate(broker_cores)}}  # fmt: skip


def test_transport_rows_are_ratios_to_the_first_run():
    base = _run(1000.0, 2000, 2.0, [0.25, 0.25, 0.5])
    rows = transport_rows(base, [_run(800.0, 1600, 2.0, [0.5, 0.5, None])])
    assert [r["ratio"] for r in rows] == [1.0, 0.8]
    assert rows[0]["brokers_cores"] == 1.0 and rows[1]["brokers_cores"] == 1.0
    assert rows[0]["broker_cpu_us_per_record"] == pytest.approx(1e6 / 1000)  # 2 CPU s / 2000
    assert rows[1]["broker_cpu_us_per_record"] == pytest.approx(2e6 / 1600)


def _producers(cluster) -> dict[int, set[int]]:
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        described = admin.describe_producers(TOPIC)
    return {p: {a["producer_id"] for a in active} for p, active in described.items()}


def test_the_idempotence_rows_load_is_idempotent_or_not_as_labelled(cluster, pool):
    def run(config):
        result = pool.measure(client="own", bootstrap=cluster.bootstrap, topic=TOPIC,
                              partitions=list(range(PARTITIONS)), acks="all", record_size=100,
                              seconds=0.3, rate=5_000, client_config=config)  # fmt: skip
        assert result["errors"] == 0 and result["records"] > 0
        return _producers(cluster)

    before = _producers(cluster)
    assert run(NOT_IDEMPOTENT) == before  # batches without a producer id
    after = run(IDEMPOTENT)
    assert all(len(after[p] - before.get(p, set())) == 1 for p in range(PARTITIONS)), (
        before,
        after,
    )


def test_idempotence_rows_pool_each_side_and_give_the_ratio():
    with_a, with_b = (
        _run(900.0, 1800, 2.0, [0.5, 0.5, 0.5]),
        _run(1100.0, 2200, 2.0, [0.5, 0.5, 0.5]),
    )
    without = [_run(1000.0, 2000, 2.0, [0.5, 0.5, 0.5]), _run(1000.0, 2000, 2.0, [0.5, 0.5, 0.5])]
    plain, idempotent = idempotence_rows([with_a, with_b], without)
    assert not plain["idempotent"] and idempotent["idempotent"]
    assert plain["records_per_s"] == 1000.0 and idempotent["records_per_s"] == 1000.0
    assert idempotent["ratio"] == 1.0 and idempotent["runs_records_per_s"] == [900.0, 1100.0]
    assert idempotent["broker_cpu_us_per_record"] == pytest.approx(1.5e6 / 1000)
