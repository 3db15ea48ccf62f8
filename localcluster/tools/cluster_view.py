"""Rendering for the cluster commands: rich tables of brokers, partitions and live rates.

Only presentation lives here: every function takes the dicts cluster.status() and the admin
helpers return (the same ones `--json` prints) and draws them. `watch` is the live view of
`status --watch`: the store for brokers and partitions, the shared-memory metrics board for
rates, latencies and ISR changes, refreshed in place.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from localcluster.metadata_types import OFFSETS_TOPIC

_consoles: dict[bool, Console] = {}
# Without a terminal (a pipe, a log file) tables render at their natural width and lines are
# never wrapped: nothing a user copies (an address, a setting) may be cut or split.
NATURAL_WIDTH = 100_000


def with_groups(state: dict, spec) -> dict:
    """`state` with each consumer group's coordinator, members and lag, once the cluster has
    an offsets topic (asking costs a client's round trips; without groups nothing is asked)."""
    if not any(p["topic"] == OFFSETS_TOPIC for p in state["partitions"]):
        return state
    from localcluster.cluster import ClusterError
    from localcluster.tools.group_admin import groups_summary

    try:
        state["groups"] = groups_summary(spec)
    except ClusterError as e:
        state["groups_error"] = str(e)
    return state


def console(stderr: bool = False) -> Console:
    """The one console of the CLI's output: the terminal's width, or natural width elsewhere
    (COLUMNS, when set, wins, as rich's own rule)."""
    if stderr not in _consoles:
        made = Console(highlight=False, stderr=stderr)
        if not made.is_terminal and "COLUMNS" not in os.environ:
            made = Console(highlight=False, stderr=stderr, width=NATURAL_WIDTH)
        _consoles[stderr] = made
    return _consoles[stderr]


def _ids(values) -> str:
    return ",".join(str(v) for v in values) if values else "-"


def brokers_table(state: dict) -> Table:
    table = Table(title="brokers", title_justify="left")
    for name in ("id", "pid", "state", "rack", "controller", "tcp", "unix socket"):
        table.add_column(name, no_wrap=name != "unix socket")
    for b in state["brokers"]:
        if b["alive"]:
            label = (
                Text("paused (SIGSTOP)", style="yellow")
                if b["stopped"]
                else (
                    Text("alive", style="green")
                    if b["registered"]
                    else Text("starting", style="yellow")
                )
            )
        else:
            label = Text("dead" + (" (stale pid file)" if b["stale_pid_file"] else ""), style="red")
        tcp = f"{b['host']}:{b['port']}" if b["host"] else "-"
        table.add_row(str(b["id"]), str(b["pid"] or "-"), label, b["rack"] or "-",
                      "yes" if b["controller"] else "", tcp, b["unix_socket"] or "-")  # fmt: skip
    return table


def partitions_table(state: dict) -> Table:
    table = Table(title="partitions", title_justify="left")
    for name in ("topic", "partition", "leader", "epoch", "AR", "ISR", "CUR", "RAR",
                 "LEO/HW per replica", "flags"):  # fmt: skip
        table.add_column(name, no_wrap=True)
    for p in state["partitions"]:
        if p["topic"] == OFFSETS_TOPIC:
            continue  # summarised in one line (internal_lines): 50 rows would bury the rest
        offsets = " ".join(f"{b}:{o['log_end_offset']}/{o['high_watermark']}"
                           for b, o in sorted(p["replica_offsets"].items())) or "-"  # fmt: skip
        flags = []
        if p["offline"]:
            flags.append(Text("offline", style="bold red"))
        elif p["under_replicated"]:
            flags.append(Text("under-replicated", style="yellow"))
        if p["deleting"]:
            flags.append(Text("deleting", style="magenta"))
        table.add_row(p["topic"], str(p["partition"]), str(p["leader"]) if p["leader"] >= 0 else "none",
                      str(p["leader_epoch"]), _ids(p["replicas"]), _ids(p["isr"]), _ids(p["cur"]),
                      _ids(p["rar"]), offsets, Text(" ").join(flags) if flags else "")  # fmt: skip
    return table


def summary_lines(state: dict) -> list[str]:
    controller = state["controller"]
    lines = [f"controller: {controller if controller is not None else 'none elected'}",
             f"bootstrap servers: {state['bootstrap_servers'] or '(no broker registered)'}"]  # fmt: skip
    supervisor = state.get("supervisor_pid")
    lines.append(f"supervisor: pid {supervisor}" if supervisor else
                 "supervisor: not running (the brokers run on their own; `down` still stops them)")  # fmt: skip
    stale = [b["id"] for b in state["brokers"] if b["stale_pid_file"]]
    if stale:
        lines.append(f"stale pid files for brokers {_ids(stale)} (those processes are gone; "
                     "`localcluster start ID` or `localcluster down`)")  # fmt: skip
    for topic, why in sorted(state.get("unreadable_topics", {}).items()):
        lines.append(f"topic {topic} left out: {why} (the controller leaves it alone until "
                     "that znode decodes)")  # fmt: skip
    return lines


def internal_lines(state: dict) -> list[str]:
    offsets = [p for p in state["partitions"] if p["topic"] == OFFSETS_TOPIC]
    if not offsets:
        return []
    offline = sum(p["offline"] for p in offsets)
    under = sum(p["under_replicated"] for p in offsets)
    return [
        f"{OFFSETS_TOPIC}: {len(offsets)} partitions, {offline} offline, {under} "
        "under-replicated (`localcluster topic describe __consumer_offsets` lists them)"
    ]


def groups_table(groups: list[dict]) -> Table:
    table = Table(title="consumer groups", title_justify="left")
    for name in ("group", "state", "coordinator", "members", "lag"):
        table.add_column(name, no_wrap=True)
    for g in groups:
        if g.get("error"):
            table.add_row(g["group"], g["state"] or "-", str(g["coordinator"]), "-",
                          Text(g["error"], style="yellow"))  # fmt: skip
            continue
        table.add_row(g["group"], g["state"], str(g["coordinator"]), str(g["members"]),
                      "-" if g["lag"] is None else str(g["lag"]))  # fmt: skip
    return table


def _parts(state: dict) -> list:
    parts: list = []
    if any(p["topic"] != OFFSETS_TOPIC for p in state["partitions"]):
        parts.append(partitions_table(state))
    elif not state["partitions"]:
        parts.append("no topics yet (`localcluster topic create NAME -p 3 -r 3`)")
    parts.extend(internal_lines(state))
    if state.get("groups"):
        parts.append(groups_table(state["groups"]))
    elif state.get("groups_error"):
        parts.append(f"consumer groups: {state['groups_error']}")
    return parts


def status(state: dict) -> None:
    c = console()
    c.print(brokers_table(state))
    for line in summary_lines(state):
        c.print(line)
    for part in _parts(state):
        c.print(part)


def ready(state: dict, controller: int | None, detached: bool) -> None:
    c = console()
    c.print(f"cluster ready in {state['cluster_dir']} (coordination: {state['coordination']})")
    c.print(brokers_table(state))
    if controller is None:
        c.print("controller: no controller (none elected within the grace period)")
    else:
        c.print(f"controller: broker {controller}")
    c.print(f"bootstrap servers: {state['bootstrap_servers']}", soft_wrap=True)
    settings = state.get("client_settings")
    if settings:
        c.print(f"client settings (also in {state['cluster_dir']}/client.properties):",
                soft_wrap=True)  # fmt: skip
        for key, value in settings.items():
            c.print(f"  {key}={value}", soft_wrap=True, highlight=False)
    if detached:
        c.print("running in the background; `localcluster status`, `localcluster down`")
    else:
        c.print("streaming events; Ctrl-C stops the cluster")


def topic(described: dict) -> None:
    table = Table(title=f"topic {described['topic']}", title_justify="left")
    for name in ("partition", "leader", "epoch", "replicas", "ISR", "offline"):
        table.add_column(name, no_wrap=True)
    for p in described["partitions"]:
        table.add_row(str(p["partition"]), str(p["leader"]) if p["leader"] >= 0 else "none",
                      str(p["leader_epoch"]), _ids(p["replicas"]), _ids(p["isr"]),
                      _ids(p["offline_replicas"]))  # fmt: skip
    console().print(table)


def topic_configs(described: dict, every: bool) -> None:
    """The topic's overrides (every: all its configs), each with where its value comes from."""
    rows = [c for c in described.get("configs", [])
            if every or c["source"] == "DYNAMIC_TOPIC_CONFIG"]  # fmt: skip
    if not rows:
        console().print("configs: no overrides, every value is the broker's "
                        "(--all-configs lists them)")  # fmt: skip
        return
    table = Table(title="configs" if every else "configs set on the topic", title_justify="left")
    for name in ("name", "value", "source"):
        table.add_column(name, no_wrap=True)
    for c in rows:
        table.add_row(c["name"], "-" if c["value"] is None else c["value"], c["source"])
    console().print(table)


def producers(described: dict) -> None:
    table = Table(title=f"producers of {described['topic']}", title_justify="left")
    for name in ("partition", "producer id", "epoch", "last sequence", "last timestamp"):
        table.add_column(name, no_wrap=True, justify="right")
    for p in described["partitions"]:
        for row in p["producers"] or [None]:
            cells = (["-"] * 4 if row is None else
                     [str(row["producer_id"]), str(row["producer_epoch"]),
                      str(row["last_sequence"]), str(row["last_timestamp"])])  # fmt: skip
            table.add_row(str(p["partition"]), *cells)
    console().print(table)


# -- status --watch -----------------------------------------------------------------------------


def _rate_rows(directory: Path, previous: dict, elapsed_s: float) -> tuple[list[dict], dict]:
    from localcluster.metrics import MetricsBoard, rates

    reader = MetricsBoard.open_reader(directory)
    if reader is None:
        return [], previous
    try:
        snapshot = reader.snapshot()
    finally:
        reader.close()
    rows = []
    for broker_id, metrics in sorted(snapshot.items()):
        r = rates(previous.get(broker_id), metrics, elapsed_s)
        rows.append({"id": broker_id, "messages_in_per_s": r.messages_in_per_s,
                     "bytes_in_per_s": r.bytes_in_per_s, "bytes_out_per_s": r.bytes_out_per_s,
                     "produce_p50_us": r.produce_p50_us, "produce_p99_us": r.produce_p99_us,
                     "isr_shrinks": r.isr_shrinks, "isr_expands": r.isr_expands,
                     "updated_ms": metrics.updated_ms})  # fmt: skip
    return rows, snapshot


def _human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _latency(us: float | None) -> str:
    if us is None:
        return "-"
    return f"<{us / 1000:.1f} ms" if us >= 1000 else f"<{us:.0f} us"


def rates_table(rows: list[dict]) -> Table:
    table = Table(title="rates (metrics board)", title_justify="left")
    for name in ("broker", "msgs in/s", "bytes in/s", "bytes out/s", "produce p50", "produce p99",
                 "ISR shrinks", "ISR expands"):  # fmt: skip
        table.add_column(name, justify="left" if name == "broker" else "right", no_wrap=True)
    for r in rows:
        table.add_row(str(r["id"]), f"{r['messages_in_per_s']:.0f}", _human_bytes(r["bytes_in_per_s"]),
                      _human_bytes(r["bytes_out_per_s"]), _latency(r["produce_p50_us"]),
                      _latency(r["produce_p99_us"]), str(r["isr_shrinks"]), str(r["isr_expands"]))  # fmt: skip
    return table


def watch(directory: Path, spec, interval_s: float, refreshes: int | None, as_json: bool) -> None:
    """Refresh until Ctrl-C (or `refreshes` times): --json prints one JSON object per line."""
    from rich.live import Live

    from localcluster import cluster

    previous: dict = {}
    last = time.monotonic()
    count = 0

    def frame():
        nonlocal previous, last
        now = time.monotonic()
        state = with_groups(cluster.status(directory, spec), spec)
        rows, previous = _rate_rows(directory, previous, now - last)
        last = now
        return state, rows

    def render(state, rows):
        parts = [brokers_table(state), *summary_lines(state)]
        parts.append(rates_table(rows) if rows else
                     "no metrics yet (brokers write the board once they record traffic)")  # fmt: skip
        parts.extend(_parts(state))
        return Group(*parts)

    try:
        if as_json:
            while refreshes is None or count < refreshes:
                state, rows = frame()
                state["rates"] = rows
                print(json.dumps(state, sort_keys=True, default=str), flush=True)
                count += 1
                if refreshes is None or count < refreshes:
                    time.sleep(interval_s)
            return
        with Live(render(*frame()), console=console(), auto_refresh=False) as live:
            count = 1
            while refreshes is None or count < refreshes:
                time.sleep(interval_s)
                live.update(render(*frame()), refresh=True)
                count += 1
    except KeyboardInterrupt:
        pass
