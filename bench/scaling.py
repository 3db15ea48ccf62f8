"""Scaling benchmark (issue 19): the commit path and the controller against partitions and brokers.

What is measured, in one run (100-byte records, our client through the shared load engine,
bench.load's pool of 2 processes, 16 batches outstanding per process):
- partitions: acks=all RF 3 (min.insync.replicas 2) throughput and p99 produce latency on 3
  brokers against the topic's partition count (full: 1, 6, 60, 600, 3,000). Each count is a
  fresh topic on the same cluster, deleted (and waited for) before the next one.
- brokers: the same on 3, 5 and 9 brokers (a fresh cluster each) with a fixed 18 partitions:
  the partition curve already shows what partitions cost, so a fixed count keeps the batching
  per partition the same and leaves the broker count the only change (18 divides over 3 and 9
  brokers; on 5 the leaders split 4/4/4/3/3).
- controller: 5 brokers, one topic of N partitions (full: 100, 1,000, 10,000), RF 3.
  `create`: CreateTopics until a broker's Metadata names a leader for every partition.
  `up`: every broker killed -9, then started again on the same store and logs (a cluster
  coming back, as `localcluster up` on a stopped cluster's dir): from spawning every broker at once
  (as `localcluster up` does) until one broker's Metadata lists every partition with a live leader and a full ISR.
  `controller failover`, as a Kafka user sees it: from the SIGKILL of the controller's broker
  until a surviving broker's Metadata names a live leader for every partition the dead broker
  led (a client can write to all of them again); the new controller's election (its znode) is
  shown beside it. The broker then restarts on its port and the cluster settles (full ISRs)
  before the next kill; p50/p99 over the kills.
`--profile DIR` runs py-spy (record, --nonblocking, raw collapsed stacks) on every broker
during the largest produce cell, the largest `up` and the largest count's failovers, and prints
each profile's top functions (self time, % of the samples): bench/README.md quotes them.

Goals, printed with pass/miss and never asserted: at 600 partitions >= 50% of the 6-partition
throughput; controller failover with 10,000 partitions p99 < 2 s (ZooKeeper-mode Kafka took
minutes). A quick run has no 10,000-partition cell: its failover goal is shown at its largest
count, marked so. Every broker and load process is killed at the end, also on Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from bench.broker import RECORD_VALUE_BYTES, Cluster, install_sigterm
from bench.common import goal, print_goals, print_note, print_table, write_results
from bench.load import LoadPool
from bench.matrix import delete_topic
from bench.plots import finish, pyplot

GOAL_PARTITION_RATIO = 0.5  # 600 partitions vs 6
GOAL_FAILOVER_P99_S = 2.0  # at 10,000 partitions
BROKER_CURVE_PARTITIONS = 18
CONTROLLER_BROKERS = 5
REPLICATION_FACTOR = 3
SETTINGS = {"auto.create.topics.enable": "false", "auto.leader.rebalance.enable": "false"}
TOPIC_CONFIG = {"min.insync.replicas": "2"}
PY_SPY = Path(sys.executable).parent / "py-spy"
PAUSE_ANSWERS = 3  # Metadata answers the poll's pause is taken from
PROFILE_RATE = 50  # samples/s: at 100/s each py-spy took ~17% of a core, five of them most of one
# py-spy without --native sees uvloop's C loop as this frame: waiting in epoll_pwait (checked with
# `py-spy dump --native`) or uvloop's own socket I/O, no Python code of ours.
EVENT_LOOP_FRAME = "Runner.run (runners.py)"
EVENT_LOOP_LABEL = "(uvloop's C loop: epoll wait, socket I/O)"


@dataclass(frozen=True)
class Scale:
    partitions: tuple[int, ...]  # the produce curve over 3 brokers
    brokers: tuple[int, ...]  # the produce curve at BROKER_CURVE_PARTITIONS
    controller_partitions: tuple[int, ...]  # up and failover on CONTROLLER_BROKERS
    kills: int
    run_s: float
    up: bool = True  # measure `up` (every broker killed and restarted) before the kills


# 6,000 gives the failover goal a figure near 10,000 where 10,000 cannot run (with 4 open files
# per replica, before storage/file_map.py, 20,000 per broker held 6,000 but not 10,000).
FULL = Scale((1, 6, 60, 600, 3000), (3, 5, 9), (100, 1000, 6000, 10000), kills=5, run_s=5.0)
# Quick has no 1,000-partition controller cell: it alone took 75 s here (create 17 s, up 42 s,
# two kills with their ISR catch-up), most of the suite's quick budget for this step.
QUICK = Scale((1, 6, 60, 600), (3, 5), (100,), kills=2, run_s=2.0)
SMOKE = Scale((1,), (3,), (10,), kills=1, run_s=0.5)  # the test's: seconds, not figures


# -- metadata as clients see it ----------------------------------------------------------------


class Metadata:
    """One broker's view of a topic through confluent-kafka's AdminClient (a Metadata request)."""

    def __init__(self, bootstrap: str):
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})

    def partitions(self, topic: str) -> dict[int, tuple[int, int]] | None:
        """{partition: (leader, ISR size)}, or None when the topic is not (fully) known yet."""
        try:
            meta = self.admin.list_topics(topic, timeout=10).topics.get(topic)
        except Exception:  # noqa: BLE001 (a broker going away mid-request: ask again)
            return None
        if meta is None or meta.error is not None:
            return None
        return {p: (m.leader, len(m.isrs)) for p, m in meta.partitions.items()}


def ready(view: dict | None, partitions: int, live: set[int], full_isr: bool) -> bool:
    if view is None or len(view) != partitions:
        return False
    return all(
        leader in live and (not full_isr or isr >= REPLICATION_FACTOR)
        for leader, isr in view.values()
    )


def wait_ready(metadata: Metadata, topic: str, partitions: int, live: set[int], timeout_s: float,
               full_isr: bool = True, poll_s: float = 0.02) -> float:  # fmt: skip
    """Seconds until a Metadata response shows every partition led by a live broker (and with
    a full ISR); raises after timeout_s."""
    started, pause = time.monotonic(), Pause(poll_s)
    while time.monotonic() - started < timeout_s:
        asked = time.monotonic()
        if ready(metadata.partitions(topic), partitions, live, full_isr):
            return time.monotonic() - started
        time.sleep(pause.after(asked))
    raise RuntimeError(
        f"{topic}: not every partition led (full ISR {full_isr}) after {timeout_s:g} s"
    )


class Pause:
    """Seconds to wait before the next Metadata request: twice the fastest of the last
    PAUSE_ANSWERS answers (a broker answering for thousands of partitions spends most of that
    in Python), so polling takes at most about a third of the answering broker's time. The
    fastest, not the last: an answer that waited behind a LeaderAndIsr the broker was applying
    (0.45-0.7 s at 1,000 partitions, against 20-60 ms idle) measured the broker's queue, not
    the answer's cost, and twice it put the next look 1.4 s later, after the failover had
    long finished (bench/README.md, "Controller failover: where the time goes")."""

    def __init__(self, poll_s: float):
        self.poll_s = poll_s
        self.answers_s: collections.deque[float] = collections.deque(maxlen=PAUSE_ANSWERS)

    def after(self, asked: float) -> float:
        self.answers_s.append(time.monotonic() - asked)
        return max(self.poll_s, 2 * min(self.answers_s))


def new_topic(cluster: Cluster, name: str, partitions: int, timeout_s: float) -> float:
    """Write the topic (RF 3, Kafka's replica assignment) into the store, as `kafka-topics
    --zookeeper` did, and wait until a Metadata response names a live leader and a full ISR for
    every partition; seconds. Not CreateTopics: librdkafka gives up on a request after its
    socket.timeout.ms (60 s), and 10,000 partitions on 5 brokers took longer than that here."""
    from localcluster.controller.assignment import assign_replicas_to_brokers

    table = assign_replicas_to_brokers(sorted(cluster.brokers), partitions, REPLICATION_FACTOR)
    started = time.monotonic()
    cluster.zk().create_topic(name, {p: tuple(r) for p, r in table.items()}, TOPIC_CONFIG)
    wait_ready(Metadata(cluster.bootstrap), name, partitions, set(cluster.brokers), timeout_s)
    return time.monotonic() - started


def remove_topic(cluster: Cluster, name: str, timeout_s: float = 120.0) -> None:
    """Delete the topic and wait until its znodes are gone, so the next cell runs alone."""
    delete_topic(cluster, name)
    cluster.wait_until(
        lambda: name not in cluster.zk().topics(), timeout_s, f"{name} deleted", 0.05
    )


# -- profiles ------------------------------------------------------------------------------------


class Profiles:
    """py-spy record on a set of pids for one phase: raw collapsed stacks in DIR/<phase>-<name>.txt."""

    def __init__(self, directory: Path | None):
        self.directory = directory
        self.running: list[tuple[str, subprocess.Popen, Path]] = []
        self.summaries: dict[str, dict] = {}

    def start(self, phase: str, pids: dict[str, int]) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            out = self.directory / f"{phase}-{name.replace(' ', '-')}.txt"
            command = [str(PY_SPY), "record", "--nonblocking", "--format", "raw", "--rate", str(PROFILE_RATE),
                       "-o", str(out), "--pid", str(pid)]  # fmt: skip
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True)  # fmt: skip
            self.running.append((f"{phase}: {name}", process, out))
        time.sleep(0.3)  # py-spy attaches before the phase starts (it reads the target's memory)

    def stop(self) -> None:
        for _, process, _ in self.running:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        for label, process, out in self.running:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            if out.exists():
                self.summaries[label] = top_functions(out.read_text())
        self.running = []


def top_functions(collapsed: str, count: int = 8) -> dict:
    """From py-spy's raw output: self time per function (the leaf frame, line numbers dropped)
    and inclusive time of the package's own functions (anywhere on the stack, the broker's
    entry point left out: it holds every sample), as fractions of the samples."""
    leaf, inclusive, total = Counter(), Counter(), 0
    for line in collapsed.splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        n = int(samples)
        total += n
        frames = [
            _function(f)
            for f in stack.split(";")
            if " (" in f and not f.startswith(("process ", "thread "))
        ]
        if frames:
            leaf[EVENT_LOOP_LABEL if frames[-1][0] == EVENT_LOOP_FRAME else frames[-1][0]] += n
            for name in {name for name, ours in frames if ours}:
                inclusive[name] += n
    if not total:
        return {"samples": 0, "self": [], "inclusive": []}
    return {"samples": total, "self": [(name, n / total) for name, n in leaf.most_common(count)],
            "inclusive": [(name, n / total) for name, n in inclusive.most_common(count)]}  # fmt: skip


def _function(frame: str) -> tuple[str, bool]:
    """'handle (/x/localcluster/broker/y.py:12)' -> ('handle (broker/y.py)', True): True for
    the package's own frames other than its entry points."""
    name, _, where = frame.partition(" (")
    parts = where.rstrip(")").rsplit(":", 1)[0].split("/")
    if "localcluster" in parts:
        short = "/".join(parts[len(parts) - parts[::-1].index("localcluster") :])
        return f"{name} ({short})", not short.endswith("__main__.py") and not short.startswith(
            "cli/"
        )
    return f"{name} ({parts[-1]})", False


# -- the produce curves --------------------------------------------------------------------------


def produce(pool: LoadPool, cluster: Cluster, topic: str, partitions: int, seconds: float) -> dict:
    result = pool.measure(client="own", bootstrap=cluster.bootstrap, topic=topic, partitions=list(range(partitions)),
                          acks="all", record_size=RECORD_VALUE_BYTES, seconds=seconds,
                          cpu_of={f"broker {b.broker_id}": b.pid for b in cluster.brokers.values()})  # fmt: skip
    result.pop("workers")
    result.pop("curve_ms")
    return result


def partition_curve(pool: LoadPool, scale: Scale, profiles: Profiles, say) -> list[dict]:
    cluster = Cluster(SETTINGS)
    out = []
    try:
        cluster.start(range(3))
        for count in scale.partitions:
            topic = f"scaling-p{count}"
            create_s = new_topic(cluster, topic, count, timeout_s=120 + count / 5)
            if count == max(scale.partitions):
                profiles.start(
                    f"produce-{count}-partitions",
                    {f"broker {i}": b.pid for i, b in cluster.brokers.items()},
                )
            try:
                result = produce(pool, cluster, topic, count, scale.run_s)
            finally:
                profiles.stop()
            remove_topic(cluster, topic)
            out.append({"partitions": count, "brokers": 3, "create_s": create_s, **result})
            say(f"  {count} partitions on 3 brokers: {result['records_per_s']:,.0f} records/s, "
                f"p99 {result['latency_ms']['p99']:.2f} ms (created in {create_s:.2f} s)")  # fmt: skip
    finally:
        cluster.close()
    return out


def broker_curve(pool: LoadPool, scale: Scale, say) -> list[dict]:
    out = []
    for brokers in scale.brokers:
        cluster = Cluster(SETTINGS)
        try:
            cluster.start(range(brokers))
            topic = "scaling-brokers"
            new_topic(cluster, topic, BROKER_CURVE_PARTITIONS, timeout_s=60)
            result = produce(pool, cluster, topic, BROKER_CURVE_PARTITIONS, scale.run_s)
        finally:
            cluster.close()
        out.append({"partitions": BROKER_CURVE_PARTITIONS, "brokers": brokers, **result})
        say(f"  {brokers} brokers, {BROKER_CURVE_PARTITIONS} partitions: {result['records_per_s']:,.0f} records/s, "
            f"p99 {result['latency_ms']['p99']:.2f} ms")  # fmt: skip
    return out


# -- up and controller failover --------------------------------------------------------------------


def restart_all(
    cluster: Cluster, topic: str, partitions: int, timeout_s: float, profiles: Profiles | None
) -> dict:
    """Kill -9 every broker, start them all again on their ports; seconds from the first spawn
    until every partition has a live leader and a full ISR in a Metadata response."""
    for broker in cluster.brokers.values():
        broker.kill()
    for broker in cluster.brokers.values():
        broker.settings["listeners"] = f"PLAINTEXT://127.0.0.1:{broker.port}"
    started = time.monotonic()
    with ThreadPoolExecutor(len(cluster.brokers)) as starting:  # all at once, as `localcluster up`
        for done in [starting.submit(b.start, timeout_s) for b in cluster.brokers.values()]:
            done.result()
    spawned_s = time.monotonic() - started
    if profiles is not None:
        profiles.start(
            f"up-{partitions}-partitions",
            {f"broker {i}": b.pid for i, b in cluster.brokers.items()},
        )
    try:
        wait_ready(Metadata(cluster.bootstrap), topic, partitions, set(cluster.brokers), timeout_s)
    finally:
        if profiles is not None:
            profiles.stop()
    return {"up_s": time.monotonic() - started, "all_started_s": spawned_s}


def kill_controller(cluster: Cluster, topic: str, partitions: int, timeout_s: float) -> dict:
    """One controller failover (see the module's docstring); the broker restarts afterwards and
    the cluster settles again before this returns."""
    metadata = Metadata(cluster.bootstrap)
    wait_ready(metadata, topic, partitions, set(cluster.brokers), timeout_s)
    controller = cluster.wait_until(lambda: [cluster.controller_id()] if cluster.controller_id() is not None else None,
                                    30, "a controller")[0]  # fmt: skip
    view = metadata.partitions(topic)
    led = {p for p, (leader, _) in view.items() if leader == controller}
    victim = cluster.brokers[controller]
    survivors = {b for b in cluster.brokers if b != controller}
    killed_at = time.monotonic()
    os.killpg(victim.pid, signal.SIGKILL)
    victim.process.wait()
    metadata = Metadata(",".join(cluster.brokers[b].bootstrap for b in survivors))
    elected_s, pause = None, Pause(0.005)
    while True:
        now = time.monotonic() - killed_at
        if now > timeout_s:
            raise RuntimeError(
                f"controller failover: {len(led)} partitions not all led again after {timeout_s:g} s"
            )
        if elected_s is None and cluster.controller_id() not in (None, controller):
            elected_s = time.monotonic() - killed_at
        asked = time.monotonic()
        view = metadata.partitions(topic)
        if view is not None and all(view.get(p, (-1, 0))[0] in survivors for p in led):
            failover_s = time.monotonic() - killed_at
            break
        time.sleep(pause.after(asked))
    if elected_s is None:
        elected_s = failover_s  # seen together
    victim.settings["listeners"] = f"PLAINTEXT://127.0.0.1:{victim.port}"
    victim.start(timeout_s=timeout_s)
    rejoined_s = wait_ready(
        Metadata(cluster.bootstrap), topic, partitions, set(cluster.brokers), timeout_s
    )
    return {"victim": controller, "partitions_led": len(led), "controller_elected_s": elected_s,
            "failover_s": failover_s, "new_controller": cluster.controller_id(),
            "full_isr_again_after_restart_s": rejoined_s}  # fmt: skip


def controller_curve(scale: Scale, profiles: Profiles, say, skipped: list[dict]) -> list[dict]:
    """Up and failover per partition count; counts the open-files limit cannot hold go to
    `skipped` with the reason."""
    out = []
    limit = open_files_limit()
    fitting = [
        n for n in scale.controller_partitions if descriptors_needed(n, CONTROLLER_BROKERS) <= limit
    ]
    for count in scale.controller_partitions:
        if count not in fitting:
            reason = (f"not run: each broker would need about {descriptors_needed(count, CONTROLLER_BROKERS):,} open "
                      f"files and RLIMIT_NOFILE is {limit:,} (at 4 files per replica and a limit of 20,000, "
                      "10,000 partitions stopped every broker at 4,990 replicas: it then closed every new "
                      "connection unanswered)")  # fmt: skip
            say(f"  {count} partitions on {CONTROLLER_BROKERS} brokers: {reason}")
            skipped.append({"partitions": count, "brokers": CONTROLLER_BROKERS, "skipped": reason})
            continue
        largest = count == max(fitting)
        timeout_s = 120 + count / 5  # 1,000 partitions took 17 s to create and 42 s to come up
        cluster = Cluster(SETTINGS)
        topic = f"scaling-controller-p{count}"
        try:
            cluster.start(range(CONTROLLER_BROKERS))
            if largest:
                profiles.start(
                    f"create-{count}-partitions",
                    {f"broker {b}": p.pid for b, p in cluster.brokers.items()},
                )
            try:
                create_s = new_topic(cluster, topic, count, timeout_s)
            finally:
                profiles.stop()
            if scale.up:
                up = restart_all(cluster, topic, count, timeout_s, profiles if largest else None)
                say(f"  {count} partitions on {CONTROLLER_BROKERS} brokers: created in {create_s:.2f} s, "
                    f"up in {up['up_s']:.2f} s (every broker started after {up['all_started_s']:.2f} s)")  # fmt: skip
            else:
                up = {"up_s": None, "all_started_s": None}
                say(
                    f"  {count} partitions on {CONTROLLER_BROKERS} brokers: created in {create_s:.2f} s (no up)"
                )
            kills = []
            for i in range(scale.kills):
                if largest:
                    profiles.start(f"failover-{count}-partitions-kill-{i + 1}",
                                   {f"broker {b}": p.pid for b, p in cluster.brokers.items()})  # fmt: skip
                try:
                    kills.append(kill_controller(cluster, topic, count, timeout_s))
                finally:
                    profiles.stop()
                k = kills[-1]
                say(f"    kill {i + 1}: controller {k['victim']} (led {k['partitions_led']}): new controller in "
                    f"{k['controller_elected_s'] * 1000:.0f} ms, every partition led again in "
                    f"{k['failover_s'] * 1000:.0f} ms")  # fmt: skip
        finally:
            cluster.close()
        failovers = [k["failover_s"] for k in kills]
        out.append({"partitions": count, "brokers": CONTROLLER_BROKERS, "create_s": create_s, **up, "kills": kills,
                    "failover_p50_s": percentile(failovers, 50), "failover_p99_s": percentile(failovers, 99),
                    "controller_elected_p50_s": percentile([k["controller_elected_s"] for k in kills], 50)})  # fmt: skip
    return out


def percentile(values: list[float], p: float) -> float | None:
    """Nearest rank (with few kills p99 is the worst of them)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


# -- output -------------------------------------------------------------------------------------------


def plot(result: dict, path: Path) -> Path | None:
    """Three panels: records/s and p99 against partitions, the same against brokers, and `up`
    and failover seconds against partitions."""
    plt = pyplot()
    if plt is None or not any(result.values()):
        return None
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    panels = ((axes[0], result["partitions"], "partitions", "partitions (3 brokers)"),
              (axes[1], result["brokers"], "brokers", f"brokers ({BROKER_CURVE_PARTITIONS} partitions)"))  # fmt: skip
    for ax, cells, key, label in panels:
        if not cells:  # a part not run (--only)
            ax.set_axis_off()
            continue
        xs = [c[key] for c in cells]
        ax.plot(xs, [c["records_per_s"] for c in cells], marker="o", label="records/s")
        twin = ax.twinx()
        twin.plot(
            xs, [c["latency_ms"]["p99"] for c in cells], marker="s", color="tab:red", label="p99 ms"
        )
        twin.set_ylabel("p99 produce latency (ms)")
        twin.set_ylim(bottom=0)
        twin.legend(fontsize=7, loc="upper right")
        if key == "partitions":
            ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("acknowledged records/s")
        ax.set_ylim(bottom=0)
        ax.set_title(f"acks=all RF 3 against {key}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    ax = axes[2]
    cells = result["controller"]
    if not cells:
        ax.set_axis_off()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    xs = [c["partitions"] for c in cells]
    for label, key in (
        ("up", "up_s"),
        ("failover p50", "failover_p50_s"),
        ("failover p99", "failover_p99_s"),
    ):
        ax.plot(xs, [c[key] if c[key] is not None else float("nan") for c in cells], marker="o",
                label=label)  # fmt: skip
    ax.axhline(
        GOAL_FAILOVER_P99_S,
        color="grey",
        linestyle=":",
        label=f"goal p99 {GOAL_FAILOVER_P99_S:g} s",
    )
    ax.set_xscale("log")
    ax.set_xlabel(f"partitions ({CONTROLLER_BROKERS} brokers, RF 3)")
    ax.set_ylabel("seconds")
    return finish(fig, ax, path, "up and controller failover against partitions", 7)


def scaling_goals(result: dict) -> list[dict]:
    by_count = {c["partitions"]: c for c in result["partitions"]}
    goals = []
    if 6 in by_count and 600 in by_count:
        ratio = (
            by_count[600]["records_per_s"] / by_count[6]["records_per_s"]
            if by_count[6]["records_per_s"]
            else 0.0
        )
        goals.append(goal(f"acks=all at 600 partitions >= {GOAL_PARTITION_RATIO:.0%} of 6 partitions", ratio,
                          f"{ratio:.0%} ({by_count[600]['records_per_s']:,.0f} vs {by_count[6]['records_per_s']:,.0f}/s)",
                          ratio >= GOAL_PARTITION_RATIO))  # fmt: skip
    if result["controller"]:
        cell = max(result["controller"], key=lambda c: c["partitions"])
        p99 = cell["failover_p99_s"]
        note = (
            None
            if cell["partitions"] >= 10000
            else f"measured at {cell['partitions']:,} partitions, not 10,000"
        )
        goals.append(goal(f"controller failover with 10,000 partitions p99 < {GOAL_FAILOVER_P99_S:g} s", p99,
                          f"{p99 * 1000:,.0f} ms ({len(cell['kills'])} kills, {cell['partitions']:,} partitions)",
                          p99 is not None and p99 < GOAL_FAILOVER_P99_S and note is None, note))  # fmt: skip
    return goals


def print_tables(result: dict) -> None:
    def rows(cells):
        return [(c["partitions"], c["brokers"], f"{c['records_per_s']:,.0f}", f"{c['latency_ms']['p50']:.2f}",
                 f"{c['latency_ms']['p99']:.2f}", f"{c['latency_ms']['p99.9']:.2f}", c["errors"],
                 f"{sum(v or 0 for v in c['other_cores'].values()):.2f}", f"{sum(c['load_cores'].values()):.2f}",
                 f"{c['machine_busy_cores']:.2f}") for c in cells]  # fmt: skip

    header = ["partitions", "brokers", "records/s", "p50 ms", "p99 ms", "p99.9 ms", "errors", "brokers CPU",
              "load CPU", "machine CPU"]  # fmt: skip
    note = (f"acks=all, RF 3, min.insync.replicas 2, {RECORD_VALUE_BYTES}-byte records; our client, 2 load "
            "processes x 16 prebuilt ~64 KiB batches outstanding, round robin over the partitions; latency per "
            f"batch. CPU in cores; everything shares {os.cpu_count()} cores with other people's work.")  # fmt: skip
    print_table(
        "acks=all against partitions (3 brokers)",
        header,
        rows(result["partitions"]),
        text_columns=0,
        note=note,
    )
    print_table(f"acks=all against brokers ({BROKER_CURVE_PARTITIONS} partitions)", header, rows(result["brokers"]),
                text_columns=0)  # fmt: skip
    print_table(f"up and controller failover against partitions ({CONTROLLER_BROKERS} brokers, RF 3)",
                ["partitions", "create s", "up s", "kills", "new controller p50 ms", "failover p50 ms",
                 "failover p99 ms", "full ISR again after restart p50 s"],
                [(c["partitions"], f"{c['create_s']:.2f}", "-" if c["up_s"] is None else f"{c['up_s']:.2f}", len(c["kills"]),
                  f"{c['controller_elected_p50_s'] * 1000:,.0f}", f"{c['failover_p50_s'] * 1000:,.0f}",
                  f"{c['failover_p99_s'] * 1000:,.0f}",
                  f"{percentile([k['full_isr_again_after_restart_s'] for k in c['kills']], 50):.2f}")
                 for c in result["controller"]], text_columns=0,
                note="up: every broker killed -9 and started again, from the first spawn until a Metadata response "
                     "shows every partition with a live leader and a full ISR. failover: from the SIGKILL of the "
                     "controller's broker until a survivor's Metadata names a live leader for every partition the "
                     "dead broker led.")  # fmt: skip


def print_profiles(summaries: dict[str, dict]) -> None:
    for label, summary in summaries.items():
        print_table(f"py-spy {label}: {summary['samples']:,} samples ({PROFILE_RATE}/s)", ["function (self)", "%",
                    "function (inclusive)", "%"],
                    [(s[0], f"{s[1]:.1%}", i[0], f"{i[1]:.1%}") for s, i in zip(summary["self"], summary["inclusive"], strict=False)],
                    text_columns=1)  # fmt: skip


def counts(text: str | None) -> tuple[int, ...] | None:
    return tuple(int(n) for n in text.split(",")) if text else None


def descriptors_needed(partitions: int, brokers: int, per_map: int | None = None) -> int:
    """Open files a broker needs for its share of `partitions` RF 3 replicas, and room for the
    rest: per replica its segment file, plus a copy per memory map (the segment's and its two
    indexes') where this Python's maps keep one (storage/file_map.py; 4 in all before it, as
    counted in /proc/<pid>/fd: 10,000 partitions then needed 24,000 per broker)."""
    if per_map is None:
        from localcluster.storage import file_map

        per_map = file_map.FDS_PER_MAP
    return (1 + 3 * per_map) * -(-partitions * REPLICATION_FACTOR // brokers) + 1000


def open_files_limit() -> int:
    """RLIMIT_NOFILE, raised to the hard limit; the brokers inherit it. (Raising the hard limit
    needs CAP_SYS_RESOURCE, which this machine's sessions do not have: it is 20,000 here.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scaling", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="fewer and smaller cells (about 90 s)")
    parser.add_argument(
        "--smoke", action="store_true", help=argparse.SUPPRESS
    )  # the test's tiny run
    parser.add_argument("--only", help="comma-separated parts: partitions, brokers, controller")
    parser.add_argument(
        "--profile", type=Path, help="py-spy record the brokers of the largest cells into DIR"
    )
    parser.add_argument(
        "--partitions", help="comma-separated partition counts of the produce curve"
    )
    parser.add_argument(
        "--controller-partitions", help="comma-separated partition counts for up and failover"
    )
    parser.add_argument("--kills", type=int, help="controller kills per partition count")
    parser.add_argument(
        "--no-up", action="store_true", help="skip `up` (kill and restart all) before the kills"
    )
    parser.add_argument("--json", action="store_true", help="also print the JSON to stdout")
    args = parser.parse_args(argv)
    scale = SMOKE if args.smoke else QUICK if args.quick else FULL
    scale = replace(scale, **{k: v for k, v in (
        ("partitions", counts(args.partitions)), ("controller_partitions", counts(args.controller_partitions)),
        ("kills", args.kills)) if v})  # fmt: skip
    if args.no_up:
        scale = replace(scale, up=False)
    parts = set((args.only or "partitions,brokers,controller").split(","))
    if args.json:
        from bench.common import console

        console(stderr=True)
    install_sigterm()
    open_files = open_files_limit()
    profiles = Profiles(args.profile)
    load_before = os.getloadavg()
    started = time.perf_counter()
    result: dict = {"partitions": [], "brokers": [], "controller": [], "skipped": []}
    pool = LoadPool(2)
    try:
        if parts & {"partitions", "brokers"}:
            pool.start()
        if "partitions" in parts:
            result["partitions"] = partition_curve(pool, scale, profiles, print_note)
        if "brokers" in parts:
            result["brokers"] = broker_curve(pool, scale, print_note)
        if "controller" in parts:
            result["controller"] = controller_curve(scale, profiles, print_note, result["skipped"])
    finally:
        profiles.stop()
        if parts & {"partitions", "brokers"}:
            pool.close()
    print_tables(result)
    print_profiles(profiles.summaries)
    goals = scaling_goals(result)
    print_goals("Goals (issue 19, scaling)", goals)
    path = write_results("scaling", {
        "config": {"scale": scale.__dict__, "broker_curve_partitions": BROKER_CURVE_PARTITIONS,
                   "controller_brokers": CONTROLLER_BROKERS, "record_value_bytes": RECORD_VALUE_BYTES,
                   "load_processes": 2, "outstanding": 16, "load_average_before": list(load_before),
                   "open_files_limit": open_files,
                   "elapsed_s": time.perf_counter() - started},
        **result, "profiles": profiles.summaries, "goals": goals,
    }, to_stdout=args.json)  # fmt: skip
    png = plot(result, path.with_suffix(".png"))
    print_note(f"results: {path}" + (f", plot: {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
