"""The produce matrix and the latency-throughput curves, on 3 brokers, in one run.

- Matrix: acks 0/1/all x replication factor 1/3 x record size 100 B/1 KiB x partitions 1/6, with
  our client and with confluent-kafka (librdkafka), each cell at full speed for --seconds, with
  the brokers' logs on /dev/shm (tmpfs, the brokers' default) and on a disk-backed directory.
  Each cell gets a fresh topic (min.insync.replicas 2 with RF 3), deleted after the cell so the
  logs do not fill memory. A cell's figure: acknowledged records/s and MB/s (record value bytes)
  over the timed window, per-batch (ours) or per-record (librdkafka) latency p50/p99, and the
  partitions' end offsets afterwards (records stored, which is what acks=0 can be judged by).
  Our client's acks=all cells run twice, idempotent (`enable.idempotence=true`, its default)
  and then not (`false`), one after the other; the table shows the idempotent cell's records/s
  as a fraction of the other's (issue 14's goal: >= 95%). acks 0/1 cells are not idempotent
  (idempotence needs acks=all); librdkafka's cells run without it (bench.load's setting).
- Curves (open loop, tmpfs): acks=all, RF 3, 100 B, 6 partitions; target rates at fractions of
  the full-speed rate of the same cell just measured (10% ... 100%), each client at its own
  maximum. Latency counts from when a batch or record was due on the schedule, so a saturated
  system shows its queueing instead of hiding it.
- End-to-end at half the maximum rate (bench.e2e): produce-to-consume latency per batch; a
  consumer sees a batch only when the high watermark passed it, so it includes replication.

Load: bench.load's pool of 2 processes (as bench.commit). Brokers, load processes and this
process share the machine's cores; the JSON records CPU per process. Writes
bench/results/matrix.json (or $BENCH_RESULTS_DIR/matrix.json); never asserts.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from dataclasses import dataclass

from bench.broker import Cluster, create_topic, install_sigterm, settled_end_offsets
from bench.common import filesystem_of, print_note, print_table, write_results
from bench.load import CLIENTS, LoadPool

BROKERS = (0, 1, 2)
ACKS = ("0", "1", "all")
REPLICATION_FACTORS = (1, 3)
RECORD_SIZES = (100, 1024)
PARTITIONS = (1, 6)
CURVE_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
CURVE_CELL = {"acks": "all", "replication_factor": 3, "record_size": 100, "partitions": 6}
FILESYSTEMS = {"shm": "/dev/shm", "disk": "/var/tmp"}
GOAL_IDEMPOTENT_RATIO = 0.95
DELETE_WAIT_S = 60.0  # a cell's topic is gone before the next cell starts


@dataclass(frozen=True)
class Scale:
    cell_s: float  # seconds of load per matrix cell
    curve_s: float  # seconds per curve point
    e2e_s: float
    filesystems: tuple[str, ...]
    acks: tuple[str, ...]
    partitions: tuple[int, ...]
    confluent_everywhere: bool  # False: librdkafka on the acks=all RF 3 cells only
    curve_fractions: tuple[float, ...]


FULL = Scale(cell_s=4.0, curve_s=4.0, e2e_s=8.0, filesystems=("shm", "disk"), acks=ACKS, partitions=PARTITIONS,
             confluent_everywhere=True, curve_fractions=CURVE_FRACTIONS)  # fmt: skip
QUICK = Scale(cell_s=2.0, curve_s=2.0, e2e_s=3.0, filesystems=("shm",), acks=("1", "all"), partitions=(6,),
              confluent_everywhere=False, curve_fractions=(0.25, 0.5, 0.75, 1.0))  # fmt: skip


def cells(scale: Scale) -> list[dict]:
    out = []
    for rf, partitions, size, acks, client in itertools.product(
        REPLICATION_FACTORS, scale.partitions, RECORD_SIZES, scale.acks, CLIENTS
    ):
        if client == "confluent" and not scale.confluent_everywhere and (rf, acks) != (3, "all"):
            continue
        cell = {"replication_factor": rf, "partitions": partitions, "record_size": size,
                "acks": acks, "client": client}  # fmt: skip
        if client == "own" and acks == "all":  # idempotent first: find_cell's curve cell
            out += [{**cell, "idempotence": True}, {**cell, "idempotence": False}]
        else:
            out.append(cell)
    return out


def client_config(cell: dict) -> dict[str, str]:
    """Our client's enable.idempotence as the cell says (set explicitly either way)."""
    if "idempotence" not in cell:
        return {}
    return {"enable.idempotence": "true" if cell["idempotence"] else "false"}


def idempotence_ratios(results: list[dict]) -> list[dict]:
    """Each idempotent cell's records/s over its non-idempotent twin's, measured after it."""
    out = []
    for cell in results:
        if cell.get("idempotence") is not True:
            continue
        same = {
            k: cell[k]
            for k in ("replication_factor", "partitions", "record_size", "acks", "client")
        }
        twin = find_cell(results, **same, idempotence=False)
        if twin is None:
            continue
        base = twin["records_per_s"]
        out.append({**same, "idempotent_records_per_s": cell["records_per_s"],
                    "not_idempotent_records_per_s": base,
                    "ratio": cell["records_per_s"] / base if base else None})  # fmt: skip
    return out


def delete_topic(cluster: Cluster, topic: str, wait_s: float = 0.0) -> None:
    """Ask the controller to delete the topic (our brokers have no DeleteTopics API); with
    `wait_s`, wait until its znodes are gone (the controller removes them once every replica
    deleted its log), so that the next cell does not run beside the deletion."""
    cluster.zk().request_topic_deletion(topic)
    if wait_s:
        cluster.wait_until(lambda: topic not in cluster.zk().topics(), wait_s,
                           f"{topic} deleted", 0.05)  # fmt: skip


class Topics:
    """Fresh topics on one cluster, numbered: `topics.create(rf, partitions)` returns the name
    once every partition has a leader (and, with RF > 1, a full ISR)."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.count = 0

    def create(self, replication_factor: int, partitions: int) -> str:
        self.count += 1
        name = f"matrix-{self.count}-rf{replication_factor}-p{partitions}"
        config = {"min.insync.replicas": "2" if replication_factor == 3 else "1"}
        create_topic(self.cluster.bootstrap, name, partitions, replication_factor, config)
        if replication_factor > 1:
            self.cluster.wait_until(
                lambda: all(len(self.cluster.partition_state(name, p).isr) == replication_factor
                            for p in range(partitions)), 30, f"full ISRs of {name}")  # fmt: skip
        return name


def measure_cell(pool: LoadPool, cluster: Cluster, topics: Topics, cell: dict, seconds: float,
                 rate: float = 0.0, keep: bool = False) -> dict:  # fmt: skip
    """One cell on a fresh topic (deleted afterwards unless `keep`)."""
    topic = topics.create(cell["replication_factor"], cell["partitions"])
    try:
        result = pool.measure(client=cell["client"], bootstrap=cluster.bootstrap, topic=topic,
                              partitions=list(range(cell["partitions"])), acks=cell["acks"],
                              record_size=cell["record_size"], seconds=seconds, rate=rate,
                              client_config=client_config(cell),
                              cpu_of={f"broker {b.broker_id}": b.pid for b in cluster.brokers.values()})  # fmt: skip
        result["stored"], result["stored_after_s"] = settled_end_offsets(
            cluster.bootstrap, topic, cell["partitions"], result["records"]
        )
    finally:
        if not keep:
            # Until Dec 2026 the logs went while the next cell ran: each curve point measured
            # the deletion of the previous point's topic, whose brokers then freed its pages on
            # their event loops (bench/README.md, "Stalls on the commit path").
            delete_topic(cluster, topic, wait_s=DELETE_WAIT_S)
    for worker in result.pop("workers"):
        result.setdefault("load_errors", []).append(worker.get("first_error"))
    result["replication_factor"] = cell["replication_factor"]
    if "idempotence" in cell:
        result["idempotence"] = cell["idempotence"]
    result["topic"] = topic
    return result


def run_filesystem(fs: str, scale: Scale, pool: LoadPool, *, with_curves: bool, say) -> dict:
    """The matrix (and, on tmpfs, the curves and e2e) on a fresh 3-broker cluster."""
    root = FILESYSTEMS[fs]
    cluster = Cluster(
        {"auto.create.topics.enable": "false", "auto.leader.rebalance.enable": "false"},
        data_root=root,
    )
    out: dict = {"filesystem": {"label": fs, **filesystem_of(root)}, "cells": [], "curves": []}
    try:
        cluster.start(BROKERS)
        topics = Topics(cluster)
        todo = cells(scale)
        for i, cell in enumerate(todo):
            result = measure_cell(pool, cluster, topics, cell, scale.cell_s)
            result["filesystem"] = fs
            out["cells"].append(result)
            say(f"  {fs} {i + 1}/{len(todo)}: {describe(cell)}: {result['records_per_s']:,.0f} records/s, "
                f"p99 {fmt_ms(result['latency_ms']['p99'])} ms")  # fmt: skip
        out["idempotence"] = idempotence_ratios(out["cells"])
        if with_curves:
            for client in CLIENTS:
                out["curves"].append(
                    run_curve(pool, cluster, topics, client, out["cells"], scale, say)
                )
            out["e2e"] = run_e2e(cluster, topics, out["cells"], scale, say)
    finally:
        cluster.close()
    return out


def describe(cell: dict) -> str:
    idempotence = {True: " idempotent", False: " not idempotent"}.get(cell.get("idempotence"), "")
    return (f"acks={cell['acks']} RF {cell['replication_factor']} {cell['record_size']} B "
            f"P {cell['partitions']} {cell['client']}{idempotence}")  # fmt: skip


def fmt_ms(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def find_cell(results: list[dict], **want) -> dict | None:
    for cell in results:
        if all(str(cell.get(k)) == str(v) for k, v in want.items()):
            return cell
    return None


def run_curve(pool: LoadPool, cluster: Cluster, topics: Topics, client: str, matrix: list[dict],
              scale: Scale, say) -> dict:  # fmt: skip
    """Open-loop points at fractions of the client's full-speed rate on the curve cell."""
    cell = {**CURVE_CELL, "client": client}
    full = find_cell(matrix, **cell) or measure_cell(pool, cluster, topics, cell, scale.cell_s)
    points = []
    for fraction in scale.curve_fractions:
        rate = full["records_per_s"] * fraction
        point = measure_cell(pool, cluster, topics, cell, scale.curve_s, rate=rate)
        point["fraction"] = fraction
        points.append(point)
        say(f"  curve {client} {fraction:.0%} of {full['records_per_s']:,.0f}/s: "
            f"{point['records_per_s']:,.0f} records/s, p50 {fmt_ms(point['latency_ms']['p50'])} ms, "
            f"p99 {fmt_ms(point['latency_ms']['p99'])} ms")  # fmt: skip
    return {"client": client, **CURVE_CELL, "max_records_per_s": full["records_per_s"],
            "points": points}  # fmt: skip


def run_e2e(cluster: Cluster, topics: Topics, matrix: list[dict], scale: Scale, say) -> dict | None:
    """Produce-to-consume latency at half the curve cell's full-speed rate (our client)."""
    try:
        from bench.e2e import measure_e2e
    except ImportError as e:
        say(f"  e2e skipped: {e}")
        return None
    full = find_cell(matrix, **CURVE_CELL, client="own")
    rate = full["records_per_s"] / 2
    topic = topics.create(CURVE_CELL["replication_factor"], CURVE_CELL["partitions"])
    try:
        # two producer processes, as the curves' load: the same load, now also consumed
        result = measure_e2e(cluster.bootstrap, topic, CURVE_CELL["partitions"], rate, scale.e2e_s,
                             record_size=CURVE_CELL["record_size"], producers=2)  # fmt: skip
    finally:
        delete_topic(cluster, topic)
    say(f"  e2e at {rate:,.0f}/s: produce p99 {fmt_ms(result['produce_latency_ms']['p99'])} ms, "
        f"end-to-end p99 {fmt_ms(result['e2e_latency_ms']['p99'])} ms")  # fmt: skip
    return result


def run(scale: Scale, filesystems: tuple[str, ...], say=print_note) -> dict:
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    runs = []
    with LoadPool(2) as pool:
        for fs in filesystems:
            runs.append(
                run_filesystem(fs, scale, pool, with_curves=(fs == filesystems[0]), say=say)
            )
    return {"config": {"cell_s": scale.cell_s, "curve_s": scale.curve_s, "e2e_s": scale.e2e_s,
                       "brokers": len(BROKERS), "load_processes": 2, "curve_cell": CURVE_CELL,
                       "curve_fractions": scale.curve_fractions, "acks": scale.acks,
                       "partitions": scale.partitions, "confluent_everywhere": scale.confluent_everywhere,
                       "load_average_before": load_before, "elapsed_s": time.perf_counter() - t0},
            "runs": runs}  # fmt: skip


def print_results(results: dict) -> None:
    for run in results["runs"]:
        fs = run["filesystem"]
        rows = [(describe(c), f"{c['records_per_s']:,.0f}", f"{c['mb_per_s']:,.1f}",
                 fmt_ms(c["latency_ms"]["p50"]), fmt_ms(c["latency_ms"]["p99"]), f"{c['stored']:,}",
                 str(c["errors"])) for c in run["cells"]]  # fmt: skip
        print_table(f"Produce matrix, logs on {fs['label']} ({fs['type']} at {fs['mount']})",
                    ["cell", "records/s", "MB/s", "p50 ms", "p99 ms", "stored", "errors"], rows)  # fmt: skip
        ratios = run.get("idempotence") or []
        if ratios:
            print_table(f"Idempotent vs not, our client, acks=all, logs on {fs['label']} (goal >= {GOAL_IDEMPOTENT_RATIO:.0%})",
                        ["cell", "idempotent/s", "not idempotent/s", "ratio", "goal"],
                        [(describe(r), f"{r['idempotent_records_per_s']:,.0f}", f"{r['not_idempotent_records_per_s']:,.0f}",
                          "-" if r["ratio"] is None else f"{r['ratio']:.1%}",
                          "met" if (r["ratio"] or 0) >= GOAL_IDEMPOTENT_RATIO else "missed") for r in ratios])  # fmt: skip
        for curve in run["curves"]:
            rows = [(f"{p['fraction']:.0%}", f"{p['target_records_per_s']:,.0f}", f"{p['records_per_s']:,.0f}",
                     fmt_ms(p["latency_ms"]["p50"]), fmt_ms(p["latency_ms"]["p99"]),
                     fmt_ms(p["latency_ms"]["p99.9"])) for p in curve["points"]]  # fmt: skip
            print_table(f"Latency vs throughput, {curve['client']}, acks=all RF 3 100 B P 6 (open loop)",
                        ["of max", "target/s", "achieved/s", "p50 ms", "p99 ms", "p99.9 ms"], rows)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.matrix", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 s cells, tmpfs only, 6 partitions, acks 1/all, librdkafka on acks=all RF 3 only",
    )
    parser.add_argument("--json", action="store_true", help="also print the JSON to stdout")
    parser.add_argument("--filesystems", help="comma-separated: shm,disk (default: by --quick)")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    filesystems = tuple(args.filesystems.split(",")) if args.filesystems else scale.filesystems
    unknown = [fs for fs in filesystems if fs not in FILESYSTEMS]
    if unknown:
        parser.error(f"unknown filesystem {', '.join(unknown)}; use {', '.join(FILESYSTEMS)}")
    for fs in filesystems:
        if not os.path.isdir(FILESYSTEMS[fs]):
            parser.error(f"{FILESYSTEMS[fs]} does not exist on this machine; leave out {fs}")
    if args.json:
        from bench.common import console

        console(stderr=True)
    install_sigterm()
    results = run(scale, filesystems)
    print_results(results)
    path = write_results("matrix", results, to_stdout=args.json)
    print_note(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
