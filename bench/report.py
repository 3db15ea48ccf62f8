"""report.md and its plots from one suite run's JSON documents (bench/results/<timestamp>/).

`python -m bench.report DIR` renders DIR/report.md again from the JSON files in DIR (the suite
calls `render(DIR, steps)` at its end). Missing documents (a step that failed or was skipped)
leave their section saying so; nothing here measures anything.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.plots import finish, percentile_spectrum, pyplot

GOAL_RECORDS_PER_S = 1_000_000
GOAL_PRODUCE_P99_MS = 5.0
GOAL_E2E_P99_MS = 10.0
HEADLINE = {"acks": "all", "replication_factor": 3, "record_size": 100}


def load(directory: Path) -> dict[str, dict]:
    docs = {}
    for path in sorted(directory.glob("*.json")):
        try:
            docs[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            docs[path.stem] = {"unreadable": f"{path.name}: {e}"}
    return docs


# -- formatting ---------------------------------------------------------------------------------


def num(value, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def ms(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def pct(value) -> str:
    return "-" if value is None else f"{value:.0%}" if value >= 0.1 else f"{value:.1%}"


def table(header: list[str], rows: list[list], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    marks = {"l": ":--", "r": "--:"}
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def mark(met: bool | None) -> str:
    return "-" if met is None else ("**met**" if met else "**missed**")


# -- figures taken from the documents -----------------------------------------------------------


def limits(docs: dict) -> dict[str, dict]:
    """The physical limits measured in this run: name -> {mb_per_s, what, source}."""
    out: dict[str, dict] = {}
    storage = docs.get("storage", {})
    for row in storage.get("append", []):
        if row.get("batch") != "16 KiB":
            continue
        variant, fs = row.get("variant"), row.get("filesystem")
        if variant == "raw copy, pages resident" and fs == "shm":
            out["memcpy"] = {"mb_per_s": row.get("mb_per_s"), "source": "bench.storage",
                             "what": "memcpy of 16 KiB batches into resident mmap pages (tmpfs)"}  # fmt: skip
        if variant == "raw write, fresh pages":
            out[f"append {fs}"] = {"mb_per_s": row.get("mb_per_s"), "source": "bench.storage",
                                   "what": f"pwrite of 16 KiB batches into fresh pages ({fs})"}  # fmt: skip
    for row in storage.get("read", []):
        if row.get("variant") == "raw sendfile" and row.get("max_bytes") == "1 MiB":
            out["sendfile"] = {"mb_per_s": row.get("mb_per_s"), "source": "bench.storage",
                               "what": "Unix-socket sendfile from a segment, 1 MiB chunks"}  # fmt: skip
    raw = docs.get("commit", {}).get("raw_three_copy")
    if raw:
        out["three-copy pipe"] = {"mb_per_s": raw["bytes"] / raw["seconds"] / 1e6, "source": "bench.commit",
                                  "what": "producer -> leader -> two followers over Unix sockets into "
                                          "prefaulted mmaps, cumulative acks back (no broker code)"}  # fmt: skip
    return out


def limit_for(cell: dict, lim: dict) -> tuple[str, float | None]:
    """Which limit a matrix cell is held to: the three-copy pipe for RF 3, the raw append
    (pwrite into fresh pages) on the cell's filesystem for RF 1."""
    if int(cell.get("replication_factor", 1)) >= 3:
        name = "three-copy pipe"
    else:
        name = f"append {cell.get('filesystem', 'shm')}"
    return name, (lim.get(name) or {}).get("mb_per_s")


def matrix_runs(docs: dict) -> list[dict]:
    return docs.get("matrix", {}).get("runs", [])


def headline_cells(docs: dict) -> list[dict]:
    """acks=all, RF 3, 100 B, our client, tmpfs: the goal's configuration."""
    out = []
    for run in matrix_runs(docs):
        for cell in run.get("cells", []):
            if (cell.get("filesystem") == "shm" and cell.get("client") == "own"
                    and all(str(cell.get(k)) == str(v) for k, v in HEADLINE.items())):  # fmt: skip
                out.append(cell)
    return out


def curve_of(docs: dict, client: str) -> dict | None:
    for run in matrix_runs(docs):
        for curve in run.get("curves", []):
            if curve.get("client") == client:
                return curve
    return None


def half_point(curve: dict | None) -> dict | None:
    if not curve:
        return None
    return next((p for p in curve["points"] if abs(p.get("fraction", 0) - 0.5) < 1e-9), None)


def e2e_of(docs: dict) -> dict | None:
    for run in matrix_runs(docs):
        if run.get("e2e"):
            return run["e2e"]
    return docs.get("e2e")


def peers_of(docs: dict) -> list[dict]:
    return docs.get("peers", {}).get("peers", [])


def suite_goals(docs: dict) -> list[dict]:
    """Issue 8's goals, then issue 19's commit-path ones and the others' goals, from this run's
    documents."""
    goals = []
    best = max(headline_cells(docs), key=lambda c: c["records_per_s"], default=None)
    ours = best["records_per_s"] if best else None
    goals.append({"goal": f"acks=all, RF 3, 100 B records: >= {GOAL_RECORDS_PER_S:,} records/s",
                  "shown": "-" if best is None else f"{ours:,.0f} records/s ({best['partitions']} partitions)",
                  "met": None if best is None else ours >= GOAL_RECORDS_PER_S})  # fmt: skip
    half = half_point(curve_of(docs, "own"))
    p99 = half["latency_ms"]["p99"] if half else None
    goals.append({"goal": f"produce p99 <= {GOAL_PRODUCE_P99_MS:g} ms at half the maximum rate",
                  "shown": "-" if half is None else f"{ms(p99)} ms at {half['records_per_s']:,.0f}/s",
                  "met": None if p99 is None else p99 <= GOAL_PRODUCE_P99_MS})  # fmt: skip
    e2e = e2e_of(docs)
    e2e_p99 = e2e["e2e_latency_ms"]["p99"] if e2e else None
    goals.append({"goal": f"end-to-end p99 <= {GOAL_E2E_P99_MS:g} ms at that rate (Kafka 2014: 2 ms p50, 3 ms p99)",
                  "shown": "-" if e2e is None else f"{ms(e2e_p99)} ms (p50 {ms(e2e['e2e_latency_ms']['p50'])}) at "
                           f"{e2e['records_per_s']:,.0f}/s",
                  "met": None if e2e_p99 is None else e2e_p99 <= GOAL_E2E_P99_MS})  # fmt: skip
    for g in docs.get("commit", {}).get("goals", []):
        if g.get("issue") == 19:
            goals.append({**g, "goal": "commit path: " + g["goal"]})
    for g in docs.get("failover", {}).get("goals", []):
        goals.append({**g, "goal": "failover: " + g["goal"]})
    for peer in peers_of(docs):
        if peer.get("skipped"):
            goals.append({"goal": f"ahead of {peer['name']} on acknowledged-replicated records/s",
                          "shown": f"not measured: {peer['skipped']}", "met": None})  # fmt: skip
            continue
        theirs = peer.get("records_per_s")
        goals.append({"goal": f"ahead of {peer['system']} on acknowledged-replicated records/s",
                      "shown": f"{num(ours)} vs {num(theirs)} ({ours / theirs:.1f}x)" if ours and theirs else "-",
                      "met": None if not (ours and theirs) else ours > theirs})  # fmt: skip
    return goals


# -- plots --------------------------------------------------------------------------------------


def plot_latency_vs_throughput(docs: dict, path: Path) -> Path | None:
    plt = pyplot()
    curves = [c for c in (curve_of(docs, "own"), curve_of(docs, "confluent")) if c]
    if plt is None or not curves:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for curve, color in zip(curves, ("tab:blue", "tab:orange"), strict=False):
        points = sorted(curve["points"], key=lambda p: p["records_per_s"])
        xs = [p["records_per_s"] for p in points]
        name = "localcluster client" if curve["client"] == "own" else "confluent-kafka"
        for key, style in (("p50", "--"), ("p99", "-")):
            ax.plot(xs, [p["latency_ms"][key] for p in points], style, marker="o", color=color,
                    label=f"{name} {key}")  # fmt: skip
    for peer, color in zip([p for p in peers_of(docs) if not p.get("skipped")], ("tab:green", "tab:red"),
                           strict=False):  # fmt: skip
        ax.scatter([peer["records_per_s"]], [peer["latency_ms"]["p99"]], marker="s", color=color,
                   label=f"{peer['system']} p99 (full speed)", zorder=3)  # fmt: skip
    ax.axhline(
        GOAL_PRODUCE_P99_MS,
        color="grey",
        linestyle=":",
        label=f"goal p99 {GOAL_PRODUCE_P99_MS:g} ms at half rate",
    )
    ax.set_yscale("log")
    ax.set_xlabel("acknowledged records/s (acks=all, RF 3, 100 B, 6 partitions)")
    ax.set_ylabel("produce latency from due time (ms)")
    return finish(fig, ax, path, "latency vs throughput, open loop (target rates 10% .. 100% of each "
                  "client's maximum)", legend_fontsize=7)  # fmt: skip


def plot_percentiles(docs: dict, path: Path) -> Path | None:
    series = []
    for client, name in (
        ("own", "produce, localcluster client"),
        ("confluent", "produce, confluent-kafka"),
    ):
        half = half_point(curve_of(docs, client))
        if half and half.get("curve_ms"):
            series.append((f"{name} at {half['records_per_s']:,.0f}/s", half["curve_ms"]))
    e2e = e2e_of(docs)
    if e2e and e2e.get("e2e_curve_ms"):
        series.append(
            (
                f"end-to-end, localcluster client at {e2e['records_per_s']:,.0f}/s",
                e2e["e2e_curve_ms"],
            )
        )
    for peer in peers_of(docs):
        half = peer.get("half_rate")
        if half and half.get("curve_ms"):
            series.append((f"{peer['system']} at {half['records_per_s']:,.0f}/s", half["curve_ms"]))
    return percentile_spectrum(series, path, "latency percentile spectrum at half the maximum rate "
                               "(acks=all, RF 3, 100 B)", "latency (ms)", GOAL_E2E_P99_MS,
                               f"goal: end-to-end p99 {GOAL_E2E_P99_MS:g} ms")  # fmt: skip


def plot_failover_timeline(docs: dict, path: Path) -> Path | None:
    plt = pyplot()
    line = docs.get("failover", {}).get("timeline")
    if plt is None or not line or not line.get("acked_per_s"):
        return None
    partitions = line["acked_per_s"]
    fig, axes = plt.subplots(
        len(partitions), 1, figsize=(9, 1.6 + 1.3 * len(partitions)), sharex=True
    )
    axes = list(axes) if len(partitions) > 1 else [axes]
    colors = {"leader": "tab:red", "controller": "tab:purple"}
    for ax, (partition, rates) in zip(axes, sorted(partitions.items()), strict=True):
        xs = [i * line["bin_s"] for i in range(len(rates))]
        ax.plot(xs, rates, linewidth=0.7, color="tab:blue")
        for kill in line["kills"]:
            if str(kill["partition"]) != partition:
                continue
            ax.axvline(
                kill["at_s"],
                color=colors.get(kill["series"], "black"),
                linestyle="--",
                linewidth=0.8,
            )
            if kill.get("unavailable_s"):
                ax.axvspan(kill["at_s"], kill["at_s"] + kill["unavailable_s"], color=colors.get(kill["series"]),
                           alpha=0.15)  # fmt: skip
        ax.set_ylabel(f"partition {partition}\nrecords/s", fontsize=8)
        ax.grid(True, alpha=0.3)
    handles = [plt.Line2D([], [], color=c, linestyle="--", label=f"SIGKILL of the partition leader, the {s}'s broker "
                          "(shaded: until the new leader's first acknowledgement)") for s, c in colors.items()]  # fmt: skip
    axes[0].legend(handles=handles, fontsize=7, loc="lower left")
    axes[-1].set_xlabel(
        f"seconds since the probe's first send ({line['bin_s'] * 1000:.0f} ms bins)"
    )
    axes[0].set_title("acknowledged records/s per partition under kill -9 (acks=all, RF 3, min.insync.replicas 2)",
                      fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- the report ---------------------------------------------------------------------------------


def section_matrix(docs: dict, lim: dict) -> list[str]:
    out = []
    for run in matrix_runs(docs):
        fs = run["filesystem"]
        out.append(f"### Logs on {fs['label']} ({fs.get('type')} at {fs.get('mount')})\n")
        rows = []
        for c in run["cells"]:
            name, limit = limit_for(c, lim)
            rows.append([c["acks"], c["replication_factor"], c["record_size"], c["partitions"],
                         client_label(c),
                         num(c["records_per_s"]), num(c["mb_per_s"], 1),
                         pct(c["mb_per_s"] / limit) + f" of {name}" if limit else "-",
                         ms(c["latency_ms"]["p50"]), ms(c["latency_ms"]["p99"]), num(c["records"]), num(c.get("stored")),
                         c["errors"]])  # fmt: skip
        out.append(table(["acks", "RF", "bytes", "partitions", "client", "records/s", "MB/s", "of limit",
                          "p50 ms", "p99 ms", "acknowledged", "stored", "errors"], rows, "rrrrlrrlrrrrr"))  # fmt: skip
        out.append("")
    return out


def client_label(cell: dict) -> str:
    name = "localcluster" if cell["client"] == "own" else "confluent-kafka"
    return name + {True: ", idempotent", False: ", not idempotent"}.get(cell.get("idempotence"), "")


def section_idempotence(docs: dict) -> list[str]:
    """bench.commit's acks=all runs with and without enable.idempotence, and the ratio (issue 14)."""
    rows = docs.get("commit", {}).get("idempotence")
    if not rows:
        return []
    out = [table(["run", "records/s", "vs not idempotent", "p50 ms", "p99 ms", "broker CPU µs/record"],
                 [[r["label"], num(r["records_per_s"]), pct(r["ratio"]), ms(r["p50_ms"]), ms(r["p99_ms"]),
                   num(r["broker_cpu_us_per_record"], 2)] for r in rows]), ""]  # fmt: skip
    out.append("Our client at full speed, acks=all RF 3, on the same brokers and topic; each side two runs, in "
               "the order with, without, without, with; goal (issue 14): the idempotent figure >= 95% of the other.\n")  # fmt: skip
    return out


def section_batch_sizes(docs: dict) -> list[str]:
    """bench.commit's batch.size sweep (issue 19): records/s, CPU per record and latency at half rate."""
    commit = docs.get("commit", {})
    rows = commit.get("batch_sizes")
    if not rows:
        return []
    out = [table(["batch.size", "records/batch", "records/s", "vs raw 3-copy", "p99 ms", "broker CPU µs/record",
                  "half rate", "p50 ms", "p99 ms", "p99.9 ms"],
                 [[num(r["batch_bytes"]), num(r["batch_records"]), num(r["records_per_s"]), pct(r["pipe_fraction"]),
                   ms(r["latency_ms"]["p99"]), num(r["broker_cpu_us_per_record"], 2), num(r["half"]["records_per_s"]),
                   ms(r["half"]["latency_ms"]["p50"]), ms(r["half"]["latency_ms"]["p99"]),
                   ms(r["half"]["latency_ms"]["p99.9"])] for r in rows]), ""]  # fmt: skip
    text = "Our client, acks=all RF 3, each batch.size at full speed and then at half that rate. "
    split = commit.get("cost_split")
    if split:
        text += (f"The brokers' CPU per record fits {split['per_record_us']:.2f} µs per record + "
                 f"{num(split['per_batch_us'])} µs per batch (three brokers together). ")  # fmt: skip
    floor = commit.get("floor")
    if floor:
        text += (f"Floor: {num(floor['batch_bytes'])}-byte batches at {floor['batches_per_s']} batches/s took p50 "
                 f"{ms(floor['latency_ms']['p50'])}, p99 {ms(floor['latency_ms']['p99'])} ms.")  # fmt: skip
    return [*out, text + "\n"]


def section_failover_clients(fo: dict) -> list[str]:
    """bench.failover's stall and duplicates per client, every client probing the same kills."""
    clients = fo.get("clients")
    if not clients:
        return []
    rows = [[c["label"], c["all"]["measured"], num((c["all"]["p50_s"] or 0) * 1000), num((c["all"]["p99_s"] or 0) * 1000),
             num((c["all"]["max_s"] or 0) * 1000), c["check"]["duplicates_stored"],
             "-" if c["check"]["duplicates_per_kill"] is None else f"{c['check']['duplicates_per_kill']:.2f}",
             c["check"]["lost"]] for c in clients.values()]  # fmt: skip
    return [table(["client", "kills", "stall p50 ms", "p99 ms", "max ms", "duplicates", "per kill", "lost"], rows,
                  "lrrrrrrr"), "",
            "Per client, both series together; all clients probe at once, so each kill is seen by each. Stall: "
            "the kill to the client's first acknowledgement of a record the new leader appended. Duplicates: "
            "the client's records stored twice, read back from the log.\n"]  # fmt: skip


def section_commit(docs: dict) -> list[str]:
    """bench.commit's acks=all runs beside the transports of issue 13: replication over TCP+SASL
    and SASL_PLAINTEXT clients, each as a fraction of the Unix-socket/PLAINTEXT run."""
    commit = docs.get("commit", {})
    transports = commit.get("transports")
    if not transports:
        return []
    routes = commit.get("routes", {}).get("tcp", {})
    rows = [[t["label"], num(t["records_per_s"]), pct(t["ratio"]), ms(t["p50_ms"]), ms(t["p99_ms"]),
             num(t["brokers_cores"], 2), num(t["broker_cpu_us_per_record"], 2)] for t in transports]  # fmt: skip
    out = [table(["run", "records/s", "vs Unix/PLAINTEXT", "p50 ms", "p99 ms", "brokers CPU (cores)",
                  "broker CPU µs/record"], rows), ""]  # fmt: skip
    out.append(f"3 brokers, {commit.get('config', {}).get('partitions', '?')} partitions, RF 3, "
               "min.insync.replicas 2, our client at full speed, "
               f"{num(commit.get('config', {}).get('run_s'), 1)} s per run, all in one run of bench.commit. "
               "TCP+SASL: a second cluster whose brokers replicate over TCP loopback (SASL PLAIN at "
               "connection setup, plain TCP after), "
               + ("every route over TCP (from the brokers' logs)" if routes.get("ok")
                  else "**not every route went over TCP**: the row is not the TCP path's")
               + "; SASL_PLAINTEXT: the same brokers as the first row, the load on their SASL listener.\n")  # fmt: skip
    return out


def section_groups(docs: dict) -> list[str]:
    """bench.groups: OffsetCommit beside Produce, rebalance times, coordinator failover."""
    groups = docs.get("groups")
    if not groups or "config" not in groups:
        return ["_bench.groups did not run._", ""]
    out = []
    commits = groups.get("commit") or []
    if commits:
        rows = []
        for r in commits:
            c, p = r["offset_commit_ms"], r["produce_ms"]
            rows.append([r["label"], c["samples"], ms(c["p50"]), ms(c["p99"]), ms(c["p99.9"]), ms(p["p50"]),
                         ms(p["p99"]), ms(p["p99.9"]), num(r["ratio_p50"], 2), num(r["ratio_p99"], 2),
                         sum(r["errors"].values())])  # fmt: skip
        out.append(table(["client", "samples", "commit p50 ms", "p99 ms", "p99.9 ms", "produce p50 ms", "p99 ms",
                          "p99.9 ms", "commit/produce p50", "p99", "errors"], rows))  # fmt: skip
        out.append(f"\nSynchronous OffsetCommits of one partition alternating with synchronous acks=all Produces of a "
                   f"record of the commit record's key and value sizes ({commits[0]['key_bytes']} + "
                   f"{commits[0]['value_bytes']} bytes), {num(groups['config'].get('commit_rate_per_s'))} calls/s, to "
                   "a partition with the same leader and followers as the group's offsets partition: the ratio is "
                   "what the coordinator adds to an acks=all append.\n")  # fmt: skip
    rebalance = (groups.get("rebalance") or {}).get("summary") or []
    if rebalance:
        out.append(table(["members", "runs", "join p50 ms", "join max ms", "leave p50 ms", "leave max ms"],
                         [[s["members"], s["runs"], num(_s_to_ms(s["join_p50_s"])), num(_s_to_ms(s["join_max_s"])),
                           num(_s_to_ms(s["leave_p50_s"])), num(_s_to_ms(s["leave_max_s"]))] for s in rebalance]))  # fmt: skip
        out.append("\nconfluent-kafka members with their defaults (range assignor, heartbeat.interval.ms 3000); "
                   "join: the last subscribe() to every member holding its final assignment; leave: one member's "
                   "close() to the others' new assignments. group.initial.rebalance.delay.ms "
                   f"{groups['config'].get('group_initial_rebalance_delay_ms', '?')}.\n")  # fmt: skip
    failover = groups.get("failover")
    if failover:
        s, c = failover["summary"], failover["check"]
        out.append(table(["from the SIGKILL of the coordinator's broker to", "kills", "p50 ms", "p99 ms", "max ms"],
                         [[what, f"{s[key]['measured']}/{s[key]['of']}", num(_s_to_ms(s[key]["p50"])),
                           num(_s_to_ms(s[key]["p99"])), num(_s_to_ms(s[key]["max"]))]
                          for what, key in (("FindCoordinator naming a new coordinator", "coordinator_named_s"),
                                            ("a commit succeeding again", "commit_ok_s"),
                                            ("the member receiving new records", "records_again_s"))]))  # fmt: skip
        kills = failover["kills"]
        at_kill = [k["uncommitted_at_kill"] for k in kills]
        at_recovery = [k["uncommitted_at_recovery"] for k in kills]
        out.append(f"\nAt-least-once: per kill the member had {', '.join(map(str, at_kill))} records beyond its last "
                   f"acknowledged commit at the kill and {', '.join(map(str, at_recovery))} when its first commit "
                   f"after it started (what a restart then would receive again); {c['redelivered']:,} records "
                   f"were received twice and {c['lost']:,} of {c['acknowledged']:,} acknowledged were lost; the "
                   f"offset committed for a second group before each kill read back the same from the new "
                   f"coordinator in {sum(1 for k in kills if k['sentinel_ok'])} of {len(kills)} kills.\n")  # fmt: skip
    return out


def section_scaling(docs: dict, directory: Path) -> list[str]:
    """bench.scaling: the curves against partitions and brokers, up and controller failover."""
    sc = docs.get("scaling")
    if not sc or "config" not in sc:
        return ["_bench.scaling did not run._", ""]
    out = ["![scaling](scaling.png)\n"] if (directory / "scaling.png").exists() else []
    produce = sc.get("partitions", []) + sc.get("brokers", [])
    if produce:
        out.append(table(["partitions", "brokers", "records/s", "p50 ms", "p99 ms", "p99.9 ms", "errors"],
                         [[c["partitions"], c["brokers"], num(c["records_per_s"]), ms(c["latency_ms"]["p50"]),
                           ms(c["latency_ms"]["p99"]), ms(c["latency_ms"]["p99.9"]), c["errors"]] for c in produce]))  # fmt: skip
        out.append(f"\nacks=all, RF 3, 100-byte records from our client (2 load processes); the broker rows have a "
                   f"fixed {sc['config']['broker_curve_partitions']} partitions.\n")  # fmt: skip
    controller = sc.get("controller", [])
    if controller:
        out.append(table(["partitions", "brokers", "create s", "up s", "kills", "failover p50 ms", "failover p99 ms"],
                         [[num(c["partitions"]), c["brokers"], num(c["create_s"], 2), num(c["up_s"], 2), len(c["kills"]),
                           num(_s_to_ms(c["failover_p50_s"])), num(_s_to_ms(c["failover_p99_s"]))]
                          for c in controller]))  # fmt: skip
        out.append("\nup: every broker killed -9 and started again at once, until a Metadata response shows every "
                   "partition with a live leader and a full ISR. Controller failover: from the SIGKILL of the "
                   "controller's broker until a survivor's Metadata names a live leader for every partition the "
                   "dead broker led.\n")  # fmt: skip
    skipped = [s for s in sc.get("skipped", []) if s.get("skipped")]
    out += [
        f"- {s['partitions']:,} partitions on {s['brokers']} brokers: {s['skipped']}"
        for s in skipped
    ]
    return out


def section_cleaner(docs: dict) -> list[str]:
    """bench.cleaner: cleaning throughput, acks=all latency without and while cleaning."""
    doc = docs.get("cleaner")
    if not doc or "storage" not in doc:
        return ["_bench.cleaner did not run._", ""]
    out = [table(["codec", "dirty MB", "after MB", "records removed", "seconds", "MB/s"],
                 [[r["codec"], num(r["dirty_bytes"] / 1e6, 1), num(r["bytes_after"] / 1e6, 2), num(r["records_removed"]),
                   num(r["seconds"], 2), num(r["mb_per_s"], 1)] for r in doc["storage"]]),
           "\n`clean_log` in one process on a wholly dirty log (100-byte values over 10,000 keys, 16 records a "
           "batch, 1 MiB segments, tmpfs).\n"]  # fmt: skip
    broker = doc.get("broker")
    if broker:
        rows = [[label, num(d["acknowledged"]), d["errors"], ms(d["latency_ms"]["p50"]), ms(d["latency_ms"]["p99"]),
                 ms(d["latency_ms"]["max"])]
                for label, d in (("without the cleaner", broker["without_cleaner"]),
                                 ("while every replica cleans", broker["with_cleaner"]))]  # fmt: skip
        out.append(
            table(
                ["acks=all produce", "acknowledged", "errors", "p50 ms", "p99 ms", "max ms"], rows
            )
        )
        out.append(f"\n3 brokers, {num(broker['rate_per_s'])} records/s of 100 bytes; the brokers' cleaners cleaned "
                   f"{num(broker['cleaned_mb'], 1)} MB in {num(broker['cleaner_busy_s'], 2)} cleaner-seconds "
                   f"({num(broker['broker_mb_per_s'], 1)} MB/s each), {num(broker['cleaner_s_in_window'], 2)} s of it "
                   "inside the second window.\n")  # fmt: skip
    return out


def _s_to_ms(seconds):
    return None if seconds is None else seconds * 1000


def render(directory: Path, steps: list[dict] | None = None) -> Path:
    directory = Path(directory)
    docs = load(directory)
    suite = docs.get("suite", {})
    steps = steps if steps is not None else suite.get("steps", [])
    lim = limits(docs)
    machine = suite.get("machine") or next(
        (d["machine"] for d in docs.values() if "machine" in d), {}
    )
    plots = {
        "latency-vs-throughput.png": plot_latency_vs_throughput(
            docs, directory / "latency-vs-throughput.png"
        ),
        "percentiles.png": plot_percentiles(docs, directory / "percentiles.png"),
        "failover-timeline.png": plot_failover_timeline(docs, directory / "failover-timeline.png"),
    }
    md: list[str] = [
        f"# localcluster benchmark report, {suite.get('timestamp', directory.name)}",
        "",
    ]
    md.append(f"Mode: **{suite.get('mode', '?')}** (`{suite.get('command', 'python -m bench.suite')}`), "
              f"{num(suite.get('elapsed_s'))} s, commit `{suite.get('commit', '?')}`. Machine: "
              f"{machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores, "
              f"{num((machine.get('memory_bytes') or 0) / 2**30)} GiB, Linux {machine.get('kernel', '?')}, "
              f"Python {machine.get('python', '?')}; load average at the start "
              f"{', '.join(f'{x:.2f}' for x in machine.get('load_average', []))}. Every process of the run "
              f"(brokers, load generators, peers) shares these cores; figures are comparable within this "
              f"report, not across machines.")  # fmt: skip
    md.append("")
    md.append("## Goals (issue 8)\n")
    md.append(table(["goal", "measured", ""], [[g["goal"], g["shown"], mark(g["met"])] for g in suite_goals(docs)],
                    "llr"))  # fmt: skip
    md.append("")
    other = [(name, g) for name, d in docs.items() if name not in ("failover", "suite")
             for g in d.get("goals", []) if isinstance(g, dict)]  # fmt: skip
    if other:
        md.append("Goals of the single benchmarks in this run:\n")
        md.append(table(["benchmark", "goal", "measured", ""],
                        [[f"bench.{name}", g["goal"] + (f" ({g['filesystem']}, {g['variant']})" if "variant" in g else ""),
                          g.get("shown", num(g.get("value"), 2)), mark(g.get("met"))] for name, g in other], "lllr"))  # fmt: skip
        md.append("")

    md.append("## Limits measured in this run\n")
    md.append("Each produce figure below is also shown as a fraction of the limit it is held to: the "
              "three-copy pipe for replication factor 3, the raw append (pwrite into fresh pages) on the same filesystem for "
              "replication factor 1. Limits are in MB/s of batch bytes, produce figures in MB/s of record "
              "values, so a fraction understates by the batch framing (about 10% at 100-byte records).\n")  # fmt: skip
    md.append(table(["limit", "MB/s", "records/s at 100 B", "what", "from"],
                    [[name, num(v["mb_per_s"], 1), num((v["mb_per_s"] or 0) * 1e6 / 110), v["what"], v["source"]]
                     for name, v in lim.items()], "lrrll") if lim else "_No limit was measured (bench.storage and bench.commit did not run)._")  # fmt: skip
    md.append("")

    md.append("## Commit path: replication and client transports (bench.commit)\n")
    md += section_commit(docs) or ["_bench.commit did not run._", ""]
    idempotence = section_idempotence(docs)
    if idempotence:
        md.append("## Idempotent producer: acks=all with and without (bench.commit)\n")
        md += idempotence
    batch_sizes = section_batch_sizes(docs)
    if batch_sizes:
        md.append(
            "## Batch size: records/s, cost per record and latency (bench.commit, issue 19)\n"
        )
        md += batch_sizes

    md.append("## Produce matrix\n")
    cfg = docs.get("matrix", {}).get("config", {})
    md.append(f"3 brokers; each cell a fresh topic (min.insync.replicas 2 with RF 3), full speed for "
              f"{cfg.get('cell_s', '?')} s from {cfg.get('load_processes', '?')} load processes. "
              "Our client sends prebuilt ~64 KiB batches (latency per batch); confluent-kafka calls "
              "produce() per record with linger.ms 5 (latency per record). At full speed latency is mostly "
              "the client's own queue (ours: 16 batches outstanding per process; librdkafka: up to 256 MiB "
              "buffered, so its p50 reaches seconds at 1 KiB); the open-loop curves below show latency "
              "short of saturation. `acknowledged` counts "
              "the records acknowledged (with acks=0: written to the socket), `stored` the sum of the "
              "partitions' end offsets after the cell; stored below acknowledged is a loss (with acks=0, "
              "one Kafka allows).\n")  # fmt: skip
    md += section_matrix(docs, lim) or ["_The matrix did not run._", ""]

    md.append("## Latency vs throughput (open loop)\n")
    if plots["latency-vs-throughput.png"]:
        md.append("![latency vs throughput](latency-vs-throughput.png)\n")
    for client in ("own", "confluent"):
        curve = curve_of(docs, client)
        if not curve:
            continue
        md.append(f"**{'localcluster client' if client == 'own' else 'confluent-kafka'}**, maximum "
                  f"{num(curve['max_records_per_s'])} records/s:\n")  # fmt: skip
        md.append(table(["target", "target records/s", "achieved records/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"],
                        [[pct(p["fraction"]), num(p["target_records_per_s"]), num(p["records_per_s"]),
                          ms(p["latency_ms"]["p50"]), ms(p["latency_ms"]["p99"]), ms(p["latency_ms"]["p99.9"]),
                          ms(p["latency_ms"]["max"])] for p in curve["points"]]))  # fmt: skip
        md.append("")

    md.append("## Latency percentile spectrum and end-to-end latency\n")
    if plots["percentiles.png"]:
        md.append("![percentiles](percentiles.png)\n")
    e2e = e2e_of(docs)
    if e2e:
        md.append(table(["at records/s", "", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms", "max ms", "missing", "duplicates"],
                        [[num(e2e["records_per_s"]), kind, ms(e2e[key]["p50"]), ms(e2e[key]["p95"]), ms(e2e[key]["p99"]),
                          ms(e2e[key]["p99.9"]), ms(e2e[key]["max"]), e2e.get("missing_batches"), e2e.get("duplicate_batches")]
                         for kind, key in (("produce (ack)", "produce_latency_ms"), ("end to end (consumed)", "e2e_latency_ms"))],
                        "rlrrrrrrr"))  # fmt: skip
        md.append("\nEnd to end: from when a batch was due to when a consumer fetching every partition "
                  "received it; a consumer only sees records below the high watermark, so this includes "
                  "replication to the ISR. Per batch, joined by (partition, base offset).\n")  # fmt: skip

    md.append("## Failover\n")
    fo = docs.get("failover")
    if fo and "summary" in fo:
        if plots["failover-timeline.png"]:
            md.append("![throughput over time with kills](failover-timeline.png)\n")
        md.append(table(["series", "kills", "unavailable p50 ms", "p99 ms", "max ms", "other partitions stalled p50 ms",
                         "p99 ms", "lost"],
                        [[f"kill -9 the {s}'s broker", v["kills"], num((v["unavailable_p50_s"] or 0) * 1000),
                          num((v["unavailable_p99_s"] or 0) * 1000), num((v["unavailable_max_s"] or 0) * 1000),
                          num((v.get("others_stalled_p50_s") or 0) * 1000), num((v.get("others_stalled_p99_s") or 0) * 1000),
                          fo["check"]["lost"]] for s, v in fo["summary"].items()]))  # fmt: skip
        md.append("\nUnavailability: from the SIGKILL to the first acks=all acknowledgement of a record the new "
                  "leader appended; every acknowledged record is read back at the end. Other partitions stalled: "
                  "the victim also followed them, and acks=all waits for it there until the controller removes "
                  "it from their ISRs (as in Kafka); per kill, the slowest of them to acknowledge a record sent "
                  "after the kill.\n")  # fmt: skip
        md += section_failover_clients(fo)
    else:
        md.append("_bench.failover did not run._\n")

    md.append("## Consumer groups (bench.groups)\n")
    md += section_groups(docs)

    md.append("## Scaling: partitions, brokers, controller (bench.scaling)\n")
    md += section_scaling(docs, directory)

    md.append("## Log cleaner (bench.cleaner)\n")
    md += section_cleaner(docs)

    md.append("## Peers\n")
    peers = peers_of(docs)
    if peers:
        rows = []
        for p in peers:
            if p.get("skipped"):
                rows.append(
                    [p["name"], "-", "-", "-", "-", "-", "-", f"not measured: {p['skipped']}"]
                )
            else:
                half = p.get("half_rate") or {"latency_ms": {}}
                rows.append([p["system"], num(p["records_per_s"]), num(p["mb_per_s"], 1), ms(p["latency_ms"]["p50"]),
                             ms(p["latency_ms"]["p99"]), ms(half["latency_ms"].get("p50")),
                             ms(half["latency_ms"].get("p99")), p.get("setup", "")])  # fmt: skip
        best = max(headline_cells(docs), key=lambda c: c["records_per_s"], default=None)
        if best:
            half = half_point(curve_of(docs, "own")) or {"latency_ms": {}}
            rows.insert(0, ["localcluster (acks=all, RF 3)", num(best["records_per_s"]), num(best["mb_per_s"], 1),
                            ms(best["latency_ms"]["p50"]), ms(best["latency_ms"]["p99"]),
                            ms(half["latency_ms"].get("p50")), ms(half["latency_ms"].get("p99")),
                            f"3 brokers, {best['partitions']} partitions, tmpfs, our client"])  # fmt: skip
        md.append(table(["system", "acknowledged records/s", "MB/s", "p50 ms (max rate)", "p99 ms (max rate)",
                         "p50 ms (half rate)", "p99 ms (half rate)", "setup"], rows, "lrrrrrrl"))  # fmt: skip
        md.append("\nHow the acknowledgements differ:\n")
        md.append("- **localcluster, acks=all**: a record is acknowledged when every replica in the ISR "
                  "(here 3; at least min.insync.replicas 2) has appended it to its log (page cache, no "
                  "fsync, as Kafka). A failover elects a replica from the ISR, so no acknowledged record is lost.")  # fmt: skip
        for p in peers:
            if p.get("semantics"):
                md.append(f"- **{p.get('system', p.get('name'))}**: {p['semantics']}")
        md.append("")
    else:
        md.append("_No peer was measured in this run._\n")

    md.append("## Steps\n")
    if steps:
        md.append(table(["step", "status", "seconds", "log"],
                        [[s["name"], s["status"], num(s.get("seconds"), 1), s.get("log", "")] for s in steps], "llrl"))  # fmt: skip
    md.append("")
    path = directory / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python -m bench.report bench/results/<timestamp>", file=sys.stderr)
        return 2
    print(render(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
