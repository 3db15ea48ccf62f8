"""Failover benchmark: SIGKILL a partition leader's broker under acks=all load, as each client sees it.

Setup: 3 brokers, one topic of 3 partitions with replication factor 3 and
min.insync.replicas=2; `auto.leader.rebalance.enable` with a 1 s check, so after each restart
every broker leads exactly one partition again (its preferred one). One probe process per
client (bench/failover_probes.py: our client idempotent and not, confluent-kafka, kafka-python
3) keeps producing to every partition at the same time: one 100-byte record per partition
every --interval-ms, each carrying its probe's tag and sequence number, with every send's and
acknowledgement's time (CLOCK_MONOTONIC, shared by all processes of the host). Every kill is
thus seen by every client at once.

Each kill: wait until every partition's ISR is full and every leader is its preferred
replica, and every probe has had a record acknowledged on every partition since (sent at least
SETTLE_S later); SIGKILL the
victim broker's process group (series 1: the leader of a partition whose broker is not the
controller; series 2: the controller's broker, which also leads one partition); restart it on
the same port (as a real broker comes back; on a new port librdkafka's reconnect backoff to the
old address carried over and once stalled a partition 6 s after the restart).

Unavailability (the acknowledgement stall) of a kill, per client = from the SIGKILL to the
first acknowledgement of an acks=all produce that the new leader appended: the earliest
acknowledged record of the victim's partition whose batch carries a partition leader epoch
above the one in ZooKeeper at the kill (read back at the end with confluent-kafka, whose
messages carry their batch's leader epoch). Also shown: when the new leader appeared in
/brokers/topics/.../state (polled every few ms).

At the end every partition is consumed from offset 0 and every acknowledged record must be
found at the offset its acknowledgement named, with its sequence number: lost = acknowledged
but missing or different. Duplicates = records of a probe stored more than once (a retry the
broker had already written), per client and per kill. Goals, printed with pass/miss and not
asserted: p99 < 1 s for our client (issue 6), p99 < 500 ms for confluent-kafka (issue 18), no
duplicate with idempotence (issue 14), nothing lost. `--librdkafka-debug FILE` and
`--broker-logs DIR` keep librdkafka's debug log (debug=metadata,broker,topic,msg) and the
brokers' logs, both with wall-clock times (`--client-debug FILE` our client's), and each kill's
wall-clock time is in the JSON: what the investigations in bench/README.md were measured with.
`--broker-tree DIR` runs the brokers from another checkout (e.g. a worktree of an older commit)
under this checkout's client and bench: issue 17's same-client comparison. Every process
started is killed by process group at the end and every temporary directory removed, also on
Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.broker import Cluster, create_topic, install_sigterm
from bench.common import goal, print_goals, print_note, print_table, write_results
from bench.failover_probes import PROBES, TAGS, VALUE, Probe
from bench.plots import finish, pyplot

TOPIC = "bench-failover"
PARTITIONS = 3
BROKERS = (0, 1, 2)
GOAL_P99_S = 1.0
GOAL_CONFLUENT_P99_S = 0.5
SETTLE_S = 0.3  # wait_steady: acknowledgements this long after the leaders settled
IDEMPOTENT = {"own": True, "own-no-idempotence": False, "confluent": True, "kafka-python": True}
LABELS = {"own": "localcluster (idempotent)", "own-no-idempotence": "localcluster, enable.idempotence=false",
          "confluent": "confluent-kafka (idempotent)", "kafka-python": "kafka-python 3 (defaults)"}  # fmt: skip


@dataclass(frozen=True)
class Scale:
    kills: int  # per series


FULL = Scale(kills=20)
QUICK = Scale(kills=3)


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


def wait_steady(cluster: Cluster, probes: list[Probe], timeout_s: float = 60.0) -> dict:
    """Full ISRs and preferred leaders, then an acknowledgement on every partition from every
    probe sent SETTLE_S after that: a client still moving a partition back to its restarted
    preferred leader (librdkafka waits out its reconnect backoff) is not caught mid-move."""
    leaders = cluster.wait_until(
        lambda: steady(cluster), timeout_s, "full ISRs and preferred leaders", 0.02
    )
    since = time.monotonic() + SETTLE_S
    for probe in probes:
        cluster.wait_until(lambda p=probe: all(t > since for t in p.last_acks().values()), timeout_s,
                           f"an acknowledged record of {probe.name} on every partition", 0.02)  # fmt: skip
    return steady(cluster) or leaders


def current_controller(cluster: Cluster) -> int:
    found = cluster.wait_until(lambda: [cluster.controller_id()] if cluster.controller_id() is not None else None,
                               60, "a controller", 0.005)  # fmt: skip
    return found[0]


def one_kill(cluster: Cluster, probes: list[Probe], series: str) -> dict:
    leaders = wait_steady(cluster, probes)
    controller = current_controller(cluster)
    if series == "controller":
        victim = controller
        partition = next(p for p, (leader, _) in leaders.items() if leader == victim)
    else:
        partition = next(p for p, (leader, _) in leaders.items() if leader != controller)
        victim = leaders[partition][0]
    epoch_before = leaders[partition][1]
    broker = cluster.brokers[victim]
    killed_at, killed_at_wall = time.monotonic(), time.time()
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
    # Back on its own port, as a real broker restarts: clients that knew it reconnect there.
    broker.settings["listeners"] = f"PLAINTEXT://127.0.0.1:{broker.port}"
    broker.start()
    return {"series": series, "victim": victim, "was_controller": victim == controller,
            "partition": partition, "killed_at": killed_at, "killed_at_wall": killed_at_wall,
            "epoch_before": epoch_before,
            "new_leader": state.leader, "new_epoch": state.leader_epoch, "elected_s": elected_s,
            "controller_after": new_controller}  # fmt: skip


# -- reading everything back -----------------------------------------------------------------


def read_back(bootstrap: str) -> dict[int, dict[int, tuple[int, int, int]]]:
    """{partition: {offset: (probe tag, sequence, batch leader epoch)}} for the whole topic."""
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
                    tag, sequence = VALUE.unpack_from(message.value())
                    out[p][message.offset()] = (tag, sequence, message.leader_epoch() or -1)
                    last = message.offset()
            consumer.unassign()
    finally:
        consumer.close()
    return out


def of_probe(stored: dict, tag: int) -> dict[int, dict[int, tuple[int, int]]]:
    """The read-back's records of one probe: {partition: {offset: (sequence, leader epoch)}}."""
    return {p: {offset: (sequence, epoch) for offset, (t, sequence, epoch) in part.items() if t == tag}
            for p, part in stored.items()}  # fmt: skip


def analyse(kills: list[dict], rows: list[list], stored: dict) -> tuple[list[dict], dict]:
    """One probe's view: per kill, the first acknowledged record appended by a leader of a
    later epoch (new dicts; `kills` is not changed); and the loss and duplicate check over
    every acknowledged record. `stored` holds this probe's records only (of_probe)."""
    acked = [r for r in rows if r[3] >= 0]
    lost, mismatched = [], 0
    for sequence, partition, _, _, offset in acked:
        found = stored.get(partition, {}).get(offset)
        if found is None:
            lost.append((sequence, partition, offset))
        elif found[0] != sequence:
            mismatched += 1
            lost.append((sequence, partition, offset))
    out = []
    for kill in kills:
        kill = dict(kill)
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
        out.append(kill)
    sequences = [s for part in stored.values() for s, _ in part.values()]
    duplicates = len(sequences) - len(set(sequences))
    check = {"acknowledged": len(acked), "sent": len(rows), "stored": len(sequences),
             "duplicates_stored": duplicates,
             "duplicates_per_kill": duplicates / len(kills) if kills else None,
             "lost": len(lost), "mismatched": mismatched, "lost_examples": lost[:20]}  # fmt: skip
    return out, check


def summarise(kills: list[dict]) -> dict:
    """Per series: the kills' stalls (p50/p99/max), the election time and the others' stalls."""
    summary = {}
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
            "elected_p50_s": percentile(elected, 50) if elected else None,
            "elected_p99_s": percentile(elected, 99) if elected else None,
            "others_stalled_p50_s": percentile(others, 50) if others else None,
            "others_stalled_p99_s": percentile(others, 99) if others else None,
        }  # fmt: skip
    return summary


def all_stalls(kills: list[dict]) -> dict:
    """Both series together: p50/p99/max of the stalls a client saw."""
    values = [k["unavailable_s"] for k in kills if k["unavailable_s"] is not None]
    return {"kills": len(kills), "measured": len(values),
            "p50_s": percentile(values, 50) if values else None,
            "p99_s": percentile(values, 99) if values else None,
            "max_s": max(values) if values else None}  # fmt: skip


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


def ms(value) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def client_rows(clients: dict) -> list[tuple]:
    rows = []
    for name, c in clients.items():
        for series, v in c["summary"].items():
            rows.append((LABELS[name], f"{series} kill", f"{v['measured']}/{v['kills']}",
                         ms(v["unavailable_p50_s"]), ms(v["unavailable_p99_s"]), ms(v["unavailable_max_s"]),
                         ms(v["others_stalled_p99_s"])))  # fmt: skip
        a = c["all"]
        rows.append((LABELS[name], "all", f"{a['measured']}/{a['kills']}", ms(a["p50_s"]), ms(a["p99_s"]),
                     ms(a["max_s"]), ""))  # fmt: skip
    return rows


def check_rows(clients: dict) -> list[tuple]:
    return [(LABELS[name], f"{c['check']['sent']:,}", f"{c['check']['acknowledged']:,}",
             f"{c['check']['stored']:,}", f"{c['check']['duplicates_stored']:,}",
             "-" if c["check"]["duplicates_per_kill"] is None else f"{c['check']['duplicates_per_kill']:.2f}",
             f"{c['check']['lost']:,}", str(c["errors"] or 0)) for name, c in clients.items()]  # fmt: skip


def client_goals(clients: dict) -> list[dict]:
    goals = []
    own = clients.get("own")
    if own:
        for series, s in own["summary"].items():
            p99 = s["unavailable_p99_s"]
            goals.append(goal(f"our client: p99 unavailability < {GOAL_P99_S:g} s ({series})", p99, ms(p99) + " ms",
                              p99 is not None and p99 < GOAL_P99_S))  # fmt: skip
    confluent = clients.get("confluent")
    if confluent:
        p99 = confluent["all"]["p99_s"]
        goals.append(goal(f"confluent-kafka: p99 stall < {GOAL_CONFLUENT_P99_S * 1000:g} ms (issue 18)", p99,
                          ms(p99) + " ms", p99 is not None and p99 < GOAL_CONFLUENT_P99_S))  # fmt: skip
    for name, c in clients.items():
        if IDEMPOTENT[name]:
            d = c["check"]["duplicates_stored"]
            goals.append(
                goal(f"{LABELS[name]}: no record stored twice (issue 14)", d, f"{d:,}", d == 0)
            )
    lost = sum(c["check"]["lost"] for c in clients.values())
    goals.append(
        goal("no acknowledged record lost (any client)", lost, f"{lost:,} lost", lost == 0)
    )
    return goals


def run(
    args, settings: dict, extra: dict, kills_per_series: int, names: list[str]
) -> tuple[list, dict, dict]:
    """The cluster, the probes and the kills; (kills, outcomes per probe, read-back)."""
    cluster = Cluster({"auto.create.topics.enable": "false", "auto.leader.rebalance.enable": "true",
                       "leader.imbalance.check.interval.seconds": "1", **extra},
                      broker_tree=args.broker_tree)  # fmt: skip
    probes: list[Probe] = []
    kills: list[dict] = []
    try:
        cluster.start(BROKERS)
        create_topic(cluster.bootstrap, TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
        for name in names:
            probes.append(Probe(name, cluster.bootstrap, TOPIC, PARTITIONS, args.interval_ms, settings,
                                {"confluent": args.librdkafka_debug,
                                 "kafka-python": args.kafka_python_debug,
                                 "own": args.client_debug,
                                 "own-no-idempotence": args.client_debug}.get(name)))  # fmt: skip
        for series in ("leader", "controller"):
            for i in range(kills_per_series):
                kill = one_kill(cluster, probes, series)
                kills.append(kill)
                print_note(f"  {series} kill {i + 1}/{kills_per_series}: broker {kill['victim']} "
                           f"(partition {kill['partition']}), new leader {kill['new_leader']} in ZooKeeper "
                           f"after {kill['elected_s'] * 1000:.0f} ms")  # fmt: skip
        wait_steady(cluster, probes)
        outcomes = {}
        while probes:
            probe = probes.pop(0)
            outcomes[probe.name] = probe.finish()
        stored = read_back(cluster.bootstrap)
    finally:
        for probe in probes:
            probe.kill()
        if args.broker_logs:
            keep_broker_logs(cluster, Path(args.broker_logs))
        cluster.close()
    return kills, outcomes, stored


def keep_broker_logs(cluster: Cluster, directory: Path) -> None:
    """Each broker's output (its last lines, as BrokerProcess keeps them) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for broker_id, broker in cluster.brokers.items():
        (directory / f"broker-{broker_id}.log").write_text(broker.log_text())


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
                        help="our client's retry.backoff.ms and reconnect.backoff.ms (Kafka: 100, 50)")  # fmt: skip
    parser.add_argument("--clients", default=",".join(PROBES),
                        help=f"comma-separated probes (default all: {','.join(PROBES)})")  # fmt: skip
    parser.add_argument("--librdkafka-debug", metavar="FILE",
                        help="write confluent-kafka's debug log (metadata,broker,topic,msg) to FILE")  # fmt: skip
    parser.add_argument("--kafka-python-debug", metavar="FILE",
                        help="write kafka-python's DEBUG log to FILE")  # fmt: skip
    parser.add_argument("--client-debug", metavar="FILE",
                        help="write our client's DEBUG log to FILE (one of the own probes)")  # fmt: skip
    parser.add_argument("--broker-logs", metavar="DIR", help="keep the brokers' logs in DIR")
    parser.add_argument("--broker-tree", metavar="DIR", type=Path,
                        help="run the brokers from this source tree (e.g. a worktree of an older "
                             "commit), the client and this bench from this checkout")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra broker setting, e.g. replica.fetch.wait.max.ms=100 (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.broker_tree is not None and not (args.broker_tree / "localcluster" / "broker").is_dir():
        parser.error(f"--broker-tree {args.broker_tree} is not a localcluster source tree")
    names = [n for n in args.clients.split(",") if n]
    unknown = [n for n in names if n not in PROBES]
    if unknown or not names:
        parser.error(f"unknown client {', '.join(unknown)}; use {', '.join(PROBES)}")
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
    kills, outcomes, stored = run(args, settings, extra, kills_per_series, names)
    elapsed = time.perf_counter() - t0

    clients = {}
    for name in names:
        seen, check = analyse(kills, outcomes[name]["rows"], of_probe(stored, TAGS[name]))
        clients[name] = {"label": LABELS[name], "idempotent": IDEMPOTENT[name], "summary": summarise(seen),
                         "all": all_stalls(seen), "check": check, "errors": outcomes[name]["errors"],
                         "kills": [{k: v for k, v in kill.items() if k in ("unavailable_s", "others_stalled_s",
                                   "first_ack_offset", "first_ack_sent_after_kill_s")} for kill in seen]}  # fmt: skip
    print_table(
        "Failover under acks=all load, per client: 3 brokers, RF 3, min.insync.replicas=2",
        ["client", "kills of", "kills", "stall p50 ms", "p99 ms", "max ms", "others stalled p99 ms"],
        client_rows(clients),
        note=(f"Kills of: the leader's broker (not the controller), the controller's broker (which also leads a "
              f"partition), or all. Stall (unavailability): SIGKILL to the client's first acknowledged acks=all produce appended by the "
              f"new leader (its batch's leader epoch above the one at the kill). p99 is nearest-rank (with 20 kills: "
              f"the largest). Others stalled: the victim also followed the other partitions, whose acks=all writes "
              f"wait for it until the controller removes it from their ISRs; per kill, the slowest other partition's "
              f"first acknowledgement of a record sent after the kill. All clients probe at once, each in its own "
              f"process, one record per partition every {args.interval_ms:g} ms. Our client: retry.backoff.ms = "
              f"reconnect.backoff.ms = {args.retry_backoff_ms} (Kafka's defaults: 100 and 50 ms); confluent-kafka: "
              f"acks=all, linger.ms 1, retry.backoff.ms 20, enable.idempotence=true; kafka-python: its defaults. "
              f"3 brokers, {len(names)} probes and this process (polling ZooKeeper's state every 2 ms after a kill, "
              f"restarting brokers) share {os.cpu_count()} cores; load average before: {load_before[0]:.2f}."),
    )  # fmt: skip
    print_table(
        "Every acknowledged record once",
        ["client", "sent", "acknowledged", "stored", "duplicates stored", "per kill", "lost", "producer errors"],
        check_rows(clients),
        text_columns=1,
        note="Duplicates: records of the client stored more than once (read back from the log).",
    )  # fmt: skip
    goals = client_goals(clients)
    print_goals("Goals (issues 6, 14, 18)", goals)
    main_client = clients.get("own") or next(iter(clients.values()))
    main_name = "own" if "own" in clients else names[0]
    main_kills, _ = analyse(kills, outcomes[main_name]["rows"], of_probe(stored, TAGS[main_name]))
    path = write_results("failover", {
        "config": {"kills_per_series": kills_per_series, "partitions": PARTITIONS, "brokers": len(BROKERS),
                   "interval_ms": args.interval_ms, "probe_settings": settings, "clients": names,
                   "broker_tree": str(args.broker_tree) if args.broker_tree else None,
                   "broker_settings": extra, "elapsed_s": elapsed, "load_average_before": load_before},
        # summary, kills, check, timeline: the first client's (ours), as before the other clients came
        "summary": main_client["summary"], "kills": main_kills, "check": main_client["check"],
        "producer_errors": main_client["errors"], "clients": clients, "goals": goals,
        "timeline": timeline(outcomes[main_name]["rows"], main_kills),
    }, to_stdout=args.json)  # fmt: skip
    png = plot(main_kills, path.with_suffix(".png"))
    print_note(f"results: {path}" + (f", plot: {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
