"""Failover benchmark: SIGKILL a partition leader's broker under acks=all load; time to recover.

Setup: 3 brokers, one topic of 3 partitions with replication factor 3 and
min.insync.replicas=2; `auto.leader.rebalance.enable` with a 1 s check, so after each restart
every broker leads exactly one partition again (its preferred one). A probe process (our
client, acks=all) keeps producing to every partition: one 100-byte record per partition every
--interval-ms, each carrying its sequence number, with every send's and acknowledgement's time
(CLOCK_MONOTONIC, shared by all processes of the host).

Each kill: wait until every partition's ISR is full and every leader is its preferred
replica, and the probe has had a record acknowledged on every partition since; SIGKILL the
victim broker's process group (series 1: the leader of a partition whose broker is not the
controller; series 2: the controller's broker, which also leads one partition); restart it.

Unavailability of a kill = from the SIGKILL to the first acknowledgement of an acks=all produce
that the new leader appended: the earliest acknowledged record of the victim's partition whose
batch carries a partition leader epoch above the one in ZooKeeper at the kill (read back at
the end with confluent-kafka, whose messages carry their batch's leader epoch). Also shown:
when the new leader appeared in /brokers/topics/.../state (polled every few ms).

At the end every partition is consumed from offset 0 and every acknowledged record must be
found at the offset its acknowledgement named, with its sequence number: lost = acknowledged
but missing or different. Goal (issue 6), printed with pass/miss and not asserted: p99 < 1 s.
Every process started is killed by process group at the end and every temporary directory
removed, also on Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.broker import (
    RECORD_VALUE_BYTES,
    Cluster,
    _use_uvloop,
    create_topic,
    install_sigterm,
    kill_workers,
    spawn_context,
)
from bench.common import goal, print_goals, print_note, print_table, write_results
from bench.plots import finish, pyplot

TOPIC = "bench-failover"
PARTITIONS = 3
BROKERS = (0, 1, 2)
GOAL_P99_S = 1.0
SEQ = struct.Struct(">q")


@dataclass(frozen=True)
class Scale:
    kills: int  # per series


FULL = Scale(kills=20)
QUICK = Scale(kills=3)


# -- the probe producer (its own process) ----------------------------------------------------


def probe_worker(bootstrap: str, topic: str, partitions: int, interval_ms: float, settings: dict,
                 control, results) -> None:  # fmt: skip
    """Produce one record per partition every interval_ms until told to stop; report, per
    record: (sequence, partition, sent, acknowledged or -1, offset or -1).

    control: a queue; the parent puts "stop". The latest acknowledgement time per partition
    is published on `results` as ("acked", {partition: time}) when asked with "status".
    """
    from localcluster.client import AsyncProducer

    async def run() -> dict:
        rows: list[list] = []
        last_ack = dict.fromkeys(range(partitions), 0.0)
        errors: dict[str, int] = {}
        padding = b"p" * (RECORD_VALUE_BYTES - SEQ.size)

        def done(future, row) -> None:
            if future.cancelled() or future.exception() is not None:
                name = "cancelled" if future.cancelled() else type(future.exception()).__name__
                errors[name] = errors.get(name, 0) + 1
                return
            row[3] = time.monotonic()
            row[4] = future.result()[1]
            last_ack[row[1]] = row[3]

        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def listen() -> None:  # a thread: the control queue blocks
            while True:
                message = control.get()
                if message == "status":
                    loop.call_soon_threadsafe(lambda: results.put(("acked", dict(last_ack))))
                else:
                    loop.call_soon_threadsafe(stop.set)
                    return

        async with AsyncProducer(
            bootstrap_servers=bootstrap, acks=-1, linger_ms=0, **settings
        ) as producer:
            listener = loop.run_in_executor(None, listen)
            interval_s = interval_ms / 1000
            start = time.monotonic()
            sequence = 0
            tick = 0
            while not stop.is_set():
                for partition in range(partitions):
                    row = [sequence, partition, time.monotonic(), -1.0, -1]
                    rows.append(row)
                    future = await producer.send(
                        topic, SEQ.pack(sequence) + padding, partition=partition
                    )
                    future.add_done_callback(lambda f, r=row: done(f, r))
                    sequence += 1
                tick += 1
                delay = start + tick * interval_s - time.monotonic()
                if delay > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                    except TimeoutError:
                        pass
            await producer.flush(60)
            await listener
        return {"rows": rows, "errors": errors}

    _use_uvloop()
    outcome = asyncio.run(run())
    results.put(("done", outcome))


class Probe:
    def __init__(self, bootstrap: str, interval_ms: float, settings: dict):
        ctx = spawn_context()
        self.control, self.results = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(target=probe_worker, daemon=True,
                                   args=(bootstrap, TOPIC, PARTITIONS, interval_ms, settings,
                                         self.control, self.results))  # fmt: skip
        self.process.start()

    def last_acks(self) -> dict[int, float]:
        self.control.put("status")
        kind, value = self.results.get(timeout=30)
        assert kind == "acked"
        return value

    def finish(self) -> dict:
        self.control.put("stop")
        while True:
            kind, value = self.results.get(timeout=120)
            if kind == "done":
                self.process.join(10)
                return value

    def kill(self) -> None:
        kill_workers([self.process])


# -- cluster state ---------------------------------------------------------------------------


def steady(cluster: Cluster) -> dict | None:
    """{partition: (leader, epoch)} when every ISR is full and every leader is preferred."""
    zk = cluster.zk()
    assignment = zk.assignment(TOPIC)
    out = {}
    for p in range(PARTITIONS):
        state = cluster.partition_state(TOPIC, p)
        replicas = _replicas(assignment, p)
        if state is None or len(state.isr) != len(BROKERS) or state.leader != replicas[0]:
            return None
        out[p] = (state.leader, state.leader_epoch)
    return out


def _replicas(assignment, partition: int) -> tuple[int, ...]:
    table = getattr(assignment, "partitions", assignment)
    return tuple(table[partition])


def wait_steady(cluster: Cluster, probe: Probe, timeout_s: float = 60.0) -> dict:
    leaders = cluster.wait_until(
        lambda: steady(cluster), timeout_s, "full ISRs and preferred leaders", 0.02
    )
    since = time.monotonic()
    cluster.wait_until(lambda: all(t > since for t in probe.last_acks().values()), timeout_s,
                       "an acknowledged record on every partition", 0.02)  # fmt: skip
    return steady(cluster) or leaders


def current_controller(cluster: Cluster) -> int:
    found = cluster.wait_until(lambda: [cluster.controller_id()] if cluster.controller_id() is not None else None,
                               60, "a controller", 0.005)  # fmt: skip
    return found[0]


def one_kill(cluster: Cluster, probe: Probe, series: str) -> dict:
    leaders = wait_steady(cluster, probe)
    controller = current_controller(cluster)
    if series == "controller":
        victim = controller
        partition = next(p for p, (leader, _) in leaders.items() if leader == victim)
    else:
        partition = next(p for p, (leader, _) in leaders.items() if leader != controller)
        victim = leaders[partition][0]
    epoch_before = leaders[partition][1]
    broker = cluster.brokers[victim]
    killed_at = time.monotonic()
    os.killpg(broker.pid, signal.SIGKILL)
    broker.process.wait()

    def new_leader():
        state = cluster.partition_state(TOPIC, partition)
        if (
            state is not None
            and state.leader not in (victim, -1)
            and state.leader_epoch > epoch_before
        ):
            return state
        return None

    state = cluster.wait_until(new_leader, 60, f"a new leader for partition {partition}", 0.002)
    elected_s = time.monotonic() - killed_at
    new_controller = current_controller(cluster)
    broker.start()
    return {"series": series, "victim": victim, "was_controller": victim == controller,
            "partition": partition, "killed_at": killed_at, "epoch_before": epoch_before,
            "new_leader": state.leader, "new_epoch": state.leader_epoch, "elected_s": elected_s,
            "controller_after": new_controller}  # fmt: skip


# -- reading everything back -----------------------------------------------------------------


def read_back(bootstrap: str) -> dict[int, dict[int, tuple[int, int]]]:
    """{partition: {offset: (sequence, batch leader epoch)}} for the whole topic."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-failover-check",
                         "enable.auto.commit": False, "fetch.queue.backoff.ms": 1})  # fmt: skip
    out: dict[int, dict[int, tuple[int, int]]] = {}
    try:
        for p in range(PARTITIONS):
            tp = TopicPartition(TOPIC, p, 0)
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            out[p] = {}
            if high <= low:
                continue
            consumer.assign([TopicPartition(TOPIC, p, low)])
            last, deadline = low - 1, time.monotonic() + 60
            while last < high - 1 and time.monotonic() < deadline:
                for message in consumer.consume(max(1, min(10000, high - 1 - last)), 1.0):
                    if message.error():
                        continue
                    value = message.value()
                    out[p][message.offset()] = (
                        SEQ.unpack_from(value)[0],
                        message.leader_epoch() or -1,
                    )
                    last = message.offset()
            consumer.unassign()
    finally:
        consumer.close()
    return out


def analyse(kills: list[dict], rows: list[list], stored: dict) -> tuple[list[dict], dict]:
    """Per kill: the first acknowledged record appended by a leader of a later epoch; and the
    loss check over every acknowledged record."""
    acked = [r for r in rows if r[3] >= 0]
    lost, mismatched = [], 0
    for sequence, partition, _, _, offset in acked:
        found = stored.get(partition, {}).get(offset)
        if found is None:
            lost.append((sequence, partition, offset))
        elif found[0] != sequence:
            mismatched += 1
            lost.append((sequence, partition, offset))
    for kill in kills:
        p, epoch, t0 = kill["partition"], kill["epoch_before"], kill["killed_at"]
        first = None
        for sequence, partition, sent, ack, offset in acked:
            if partition != p or ack < t0:
                continue
            found = stored.get(p, {}).get(offset)
            if found is None or found[1] <= epoch:
                continue
            if first is None or ack < first[3]:
                first = (sequence, sent, offset, ack)
        kill["unavailable_s"] = None if first is None else first[3] - t0
        kill["first_ack_offset"] = None if first is None else first[2]
        kill["first_ack_sent_after_kill_s"] = None if first is None else first[1] - t0
        # The victim also followed the other partitions: acks=all waits for it there until the
        # controller takes it out of their ISRs (Kafka does the same). The stall of the others:
        # the kill to the first acknowledgement of a record sent after it, the slowest of them.
        firsts = {}
        for _, partition, sent, ack, _ in acked:
            if partition != p and sent >= t0 and ack < firsts.get(partition, float("inf")):
                firsts[partition] = ack
        kill["others_stalled_s"] = max(firsts.values()) - t0 if firsts else None
    sequences = [s for part in stored.values() for s, _ in part.values()]
    check = {"acknowledged": len(acked), "sent": len(rows), "stored": len(sequences),
             "duplicates_stored": len(sequences) - len(set(sequences)), "lost": len(lost),
             "mismatched": mismatched, "lost_examples": lost[:20]}  # fmt: skip
    return kills, check


def timeline(rows: list[list], kills: list[dict], bin_s: float = 0.025) -> dict:
    """Acknowledged records per second of each partition over the run, in `bin_s` bins (by
    acknowledgement time), and each kill's time from the first send: the suite plots
    throughput with the kills marked (a killed leader's partition drops to 0 until the new
    leader acknowledges)."""
    import numpy as np

    if not rows:
        return {"bin_s": bin_s, "acked_per_s": {}, "kills": []}
    start = min(r[2] for r in rows)
    end = max(max(r[3] for r in rows), max((k["killed_at"] for k in kills), default=start)) - start
    bins = int(np.ceil(end / bin_s)) + 1
    per_partition = {}
    for partition in range(PARTITIONS):
        acks = np.asarray(
            [r[3] - start for r in rows if r[3] >= 0 and r[1] == partition], dtype=float
        )
        counts = np.bincount((acks / bin_s).astype(int), minlength=bins)
        per_partition[str(partition)] = (counts / bin_s).round(1).tolist()
    return {"bin_s": bin_s, "acked_per_s": per_partition,
            "kills": [{"at_s": round(k["killed_at"] - start, 4), "series": k["series"], "victim": k["victim"],
                       "partition": k["partition"], "unavailable_s": k.get("unavailable_s")} for k in kills]}  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); with 20 samples p99 is the largest."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def plot(kills: list[dict], path: Path) -> Path | None:
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for series, marker in (("leader", "o"), ("controller", "s")):
        values = sorted(
            k["unavailable_s"] * 1000 for k in kills if k["series"] == series and k["unavailable_s"]
        )
        if values:
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], marker=marker,
                    drawstyle="steps-post", label=f"kill the {series}'s broker (n={len(values)})")  # fmt: skip
    ax.axvline(GOAL_P99_S * 1000, color="grey", linestyle=":", label="goal p99 < 1 s")
    ax.set_xscale("log")
    ax.set_xlabel("unavailability: SIGKILL to first acks=all ack from the new leader (ms)")
    ax.set_ylabel("fraction of kills")
    return finish(fig, ax, path, "failover, 3 brokers, RF 3, min.insync.replicas 2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.failover", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="3 kills per series")
    parser.add_argument("--json", action="store_true", help="also print the JSON to stdout")
    parser.add_argument("--kills", type=int, help="kills per series (default 20)")
    parser.add_argument(
        "--interval-ms", type=float, default=2.0, help="probe: ms between records per partition"
    )
    parser.add_argument("--retry-backoff-ms", type=int, default=10,
                        help="probe client's retry.backoff.ms and reconnect.backoff.ms (Kafka: 100, 50)")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra broker setting, e.g. replica.fetch.wait.max.ms=100 (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.set)
    kills_per_series = args.kills or (QUICK if args.quick else FULL).kills
    if args.json:
        from bench.common import console

        console(stderr=True)
    install_sigterm()
    settings = {"retry_backoff_ms": args.retry_backoff_ms, "reconnect_backoff_ms": args.retry_backoff_ms,
                "request_timeout_ms": 10_000}  # fmt: skip
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    cluster = Cluster({"auto.create.topics.enable": "false", "auto.leader.rebalance.enable": "true",
                       "leader.imbalance.check.interval.seconds": "1", **extra})  # fmt: skip
    probe = None
    kills: list[dict] = []
    try:
        cluster.start(BROKERS)
        create_topic(cluster.bootstrap, TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
        probe = Probe(cluster.bootstrap, args.interval_ms, settings)
        for series in ("leader", "controller"):
            for i in range(kills_per_series):
                kill = one_kill(cluster, probe, series)
                kills.append(kill)
                print_note(f"  {series} kill {i + 1}/{kills_per_series}: broker {kill['victim']} "
                           f"(partition {kill['partition']}), new leader {kill['new_leader']} in ZooKeeper "
                           f"after {kill['elected_s'] * 1000:.0f} ms")  # fmt: skip
        wait_steady(cluster, probe)
        outcome = probe.finish()
        probe = None
        stored = read_back(cluster.bootstrap)
    finally:
        if probe is not None:
            probe.kill()
        cluster.close()
    elapsed = time.perf_counter() - t0
    kills, check = analyse(kills, outcome["rows"], stored)

    rows, summary = [], {}
    for series in ("leader", "controller"):
        mine = [k for k in kills if k["series"] == series]
        values = [k["unavailable_s"] for k in mine if k["unavailable_s"] is not None]
        elected = [k["elected_s"] for k in mine]
        others = [k["others_stalled_s"] for k in mine if k["others_stalled_s"] is not None]
        summary[series] = {
            "kills": len(mine), "measured": len(values),
            "unavailable_p50_s": percentile(values, 50) if values else None,
            "unavailable_p99_s": percentile(values, 99) if values else None,
            "unavailable_max_s": max(values) if values else None,
            "elected_p50_s": percentile(elected, 50), "elected_p99_s": percentile(elected, 99),
            "others_stalled_p50_s": percentile(others, 50) if others else None,
            "others_stalled_p99_s": percentile(others, 99) if others else None,
        }  # fmt: skip
        s = summary[series]

        def ms(v):
            return "-" if v is None else f"{v * 1000:,.0f}"

        rows.append((f"kill the {series}'s broker", f"{len(values)}/{len(mine)}", ms(s["unavailable_p50_s"]),
                     ms(s["unavailable_p99_s"]), ms(s["unavailable_max_s"]), ms(s["elected_p50_s"]),
                     ms(s["elected_p99_s"]), ms(s["others_stalled_p50_s"]), ms(s["others_stalled_p99_s"])))  # fmt: skip
    print_table(
        "Failover under acks=all load: 3 brokers, RF 3, min.insync.replicas=2",
        ["series", "kills", "unavail. p50 ms", "p99 ms", "max ms", "new leader in ZK p50 ms", "p99 ms",
         "others stalled p50 ms", "p99 ms"],
        rows,
        note=(f"Unavailability: SIGKILL to the first acknowledged acks=all produce appended by the new leader "
              f"(its batch's leader epoch above the one at the kill). p99 is nearest-rank (with 20 kills: the "
              f"largest). Others stalled: the victim also followed the other partitions, whose acks=all "
              f"writes wait for it until the controller removes it from their ISRs; per kill, the slowest other "
              f"partition's first acknowledgement of a record sent after the kill. Probe: our client in its own process, one record per partition every "
              f"{args.interval_ms:g} ms, retry.backoff.ms = reconnect.backoff.ms = {args.retry_backoff_ms} "
              f"(Kafka's defaults: 100 and 50 ms, which would add up to that much). 3 brokers, the probe and "
              f"this process (polling ZooKeeper's state every 2 ms after a kill, restarting brokers) share "
              f"{os.cpu_count()} cores; load average before: {load_before[0]:.2f}."),
    )  # fmt: skip
    print_table(
        "No acknowledged record lost",
        ["sent", "acknowledged", "stored", "duplicates stored", "lost", "producer errors"],
        [(f"{check['sent']:,}", f"{check['acknowledged']:,}", f"{check['stored']:,}",
          f"{check['duplicates_stored']:,}", f"{check['lost']:,}", str(outcome["errors"] or 0))],
        text_columns=0,
    )  # fmt: skip
    goals = [goal(f"p99 unavailability < {GOAL_P99_S:g} s ({series})", s["unavailable_p99_s"],
                  "-" if s["unavailable_p99_s"] is None else f"{s['unavailable_p99_s'] * 1000:,.0f} ms",
                  s["unavailable_p99_s"] is not None and s["unavailable_p99_s"] < GOAL_P99_S)
             for series, s in summary.items()]  # fmt: skip
    goals.append(
        goal(
            "no acknowledged record lost",
            check["lost"],
            f"{check['lost']:,} lost",
            check["lost"] == 0,
        )
    )
    print_goals("Goals (issue 6)", goals)
    path = write_results("failover", {
        "config": {"kills_per_series": kills_per_series, "partitions": PARTITIONS, "brokers": len(BROKERS),
                   "interval_ms": args.interval_ms, "probe_settings": settings, "broker_settings": extra, "elapsed_s": elapsed,
                   "load_average_before": load_before},
        "summary": summary, "kills": kills, "check": check, "producer_errors": outcome["errors"], "goals": goals,
        "timeline": timeline(outcome["rows"], kills),
    }, to_stdout=args.json)  # fmt: skip
    png = plot(kills, path.with_suffix(".png"))
    print_note(f"results: {path}" + (f", plot: {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
