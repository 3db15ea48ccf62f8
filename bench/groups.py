"""Consumer-group benchmark: OffsetCommit latency, rebalance time, coordinator failover.

One cluster of 3 brokers (data on /dev/shm), `__consumer_offsets` made on first use with the
broker's defaults (50 partitions, RF 3), `auto.leader.rebalance.enable` with a 1 s check so
that a restarted broker leads its preferred partitions (and coordinates their groups) again.
Every client runs in this process on its own thread (bench/groups_clients.py). Three parts:

- **OffsetCommit beside Produce**: per client (confluent-kafka, kafka-python), one member of a
  group commits one partition synchronously, alternating with a synchronous acks=all Produce
  of a record with the OffsetCommit record's key and value sizes to a topic whose one
  partition has the same replicas, in the same order, as the group's offsets partition (same
  leader, same followers): the ratio of the two is what the coordinator adds to an acks=all
  append. A fixed schedule of --commit-rate calls per second; each call's blocking time.
- **Rebalance**: N = 1, 3, 10 (issue 15's sizes) confluent-kafka members (their defaults,
  range assignor, auto.offset.reset earliest) subscribe to a topic of 12 partitions one after
  the other; join = from the last subscribe() to every member holding its final assignment
  (each something, every partition once: the group is Stable and every member synced); leave = from one member's close() (LeaveGroup) to the others' new assignments. The
  broker's group.initial.rebalance.delay.ms is 0 (Kafka: 3000), so the first member's
  JoinGroup completes a generation alone and the others' joins start further rebalances,
  which the members already in the group learn of from their next Heartbeat.
- **Coordinator failover**: a producer writes sequence-numbered records (acks=all, RF 3) to a
  topic whose leaders are never the coordinator's broker; a member consumes them and commits
  what it consumed synchronously every 50 ms. Per kill: wait until the coordinator is back on
  its preferred broker with full ISRs and the member committed and consumed since; SIGKILL
  the coordinator's broker; time until (a) FindCoordinator (asked of the survivors every
  2 ms) names another broker, (b) a commit started after the kill succeeds, (c) the member
  receives a record produced after the kill; count the records consumed beyond the committed
  offsets at the kill and at (b) (what a member restarting then would get again:
  at-least-once), the commits that failed and with what; a second, idle group on the same
  offsets partition has a known offset committed before the kill that must read back the same
  from the new coordinator. Then restart the broker on its port (not after the last kill: nothing
  is measured after it). At the end every acknowledged record must have been received (lost =
  0) and records received twice are counted.

Goals, printed with pass/miss and never asserted: failover (c) p99 < 2 s (issue 15), nothing
lost, the committed offsets intact. Every process started is killed by process group at the
end and every temporary directory removed, also on Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass

from bench.broker import Cluster, create_topic, install_sigterm
from bench.common import goal, print_goals, print_note, print_table, write_results
from bench.failover import percentile
from bench.groups_clients import (
    CoordinatorLookup,
    Feed,
    Member,
    Reader,
    commit_samples_confluent,
    commit_samples_kafka_python,
    settled,
)
from localcluster.group import partition_for
from localcluster.group.records import (
    OffsetCommitValue,
    encode_offset_commit_key,
    encode_offset_commit_value,
)
from localcluster.waiting import wait_until

BROKERS = (0, 1, 2)
OFFSETS_TOPIC = "__consumer_offsets"
SETTINGS = {"auto.create.topics.enable": "false", "auto.leader.rebalance.enable": "true",
            "leader.imbalance.check.interval.seconds": "1"}  # fmt: skip
REBALANCE_TOPIC, REBALANCE_PARTITIONS = "bench-groups-rebalance", 12  # 10 members hold 1+
FAILOVER_TOPIC, FAILOVER_PARTITIONS, FAILOVER_GROUP = (
    "bench-groups-failover",
    3,
    "bench-groups-failover",
)
FEED_RATE_PER_S = 600.0
COMMIT_INTERVAL_S = 0.05
LOOKUP_INTERVAL_S = 0.002
RECOVERY_TIMEOUT_S = 60.0
GOAL_FAILOVER_P99_S = 2.0
SAMPLERS = {"confluent": commit_samples_confluent, "kafka-python": commit_samples_kafka_python}
LABELS = {"confluent": "confluent-kafka", "kafka-python": "kafka-python 3"}


@dataclass(frozen=True)
class Scale:
    commits: int  # synchronous commits per client (and as many produces)
    rebalance_repeats: int  # per group size
    kills: int


FULL = Scale(commits=2000, rebalance_repeats=3, kills=5)
QUICK = Scale(commits=150, rebalance_repeats=1, kills=2)


# -- the cluster --------------------------------------------------------------------------------


def make_offsets_topic(cluster: Cluster, lookup: CoordinatorLookup) -> float:
    """The first FindCoordinator creates __consumer_offsets; seconds until every partition has
    its preferred leader and a full ISR."""
    started = time.monotonic()
    address = cluster.brokers[BROKERS[0]].bootstrap
    cluster.wait_until(
        lambda: lookup.ask(address, "bench-groups")[0] == 0, 60, "a coordinator", 0.05
    )
    cluster.wait_until(
        lambda: topic_steady(cluster, OFFSETS_TOPIC), 60, f"{OFFSETS_TOPIC} to settle", 0.1
    )
    return time.monotonic() - started


def topic_steady(cluster: Cluster, topic: str, partitions=None) -> bool:
    """Every (or each of `partitions`) partition of `topic` led by its preferred replica with
    its every replica in the ISR."""
    assignment = cluster.zk().assignment(topic)
    if assignment is None:
        return False
    for partition, replicas in assignment.partitions.items():
        if partitions is not None and partition not in partitions:
            continue
        state = cluster.partition_state(topic, partition)
        if state is None or state.leader != replicas[0] or set(state.isr) != set(replicas):
            return False
    return True


def offsets_partition(cluster: Cluster, group: str) -> tuple[int, tuple[int, ...]]:
    """The group's partition of __consumer_offsets and its replicas (preferred leader first)."""
    partitions = cluster.zk().assignment(OFFSETS_TOPIC).partitions
    partition = partition_for(group, len(partitions))
    return partition, tuple(partitions[partition])


def create_topic_on(cluster: Cluster, topic: str, replicas: list[tuple[int, ...]],
                    config: dict[str, str] | None = None) -> None:  # fmt: skip
    """A topic with this replica assignment (preferred leader first), once every partition is
    led by its first replica with a full ISR."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new = NewTopic(
        topic,
        num_partitions=len(replicas),
        replica_assignment=[list(r) for r in replicas],
        config=config or {},
    )
    admin.create_topics([new], operation_timeout=20)[topic].result(30)
    cluster.wait_until(lambda: topic_steady(cluster, topic), 30, f"{topic}'s leaders", 0.05)


def group_on_partition(partition: int, partitions: int, prefix: str) -> str:
    """A group id whose offsets partition is `partition` (a second group beside another)."""
    for i in range(100 * partitions):  # bounded: about one name in `partitions` fits
        name = f"{prefix}-{i}"
        if partition_for(name, partitions) == partition:
            return name
    raise AssertionError(f"no group name for partition {partition}")


# -- OffsetCommit beside Produce --------------------------------------------------------------


def commit_record_sizes(group: str, topic: str) -> tuple[int, int]:
    """(key bytes, value bytes) of the record a commit of one partition writes."""
    key = encode_offset_commit_key(group, topic, 0)
    value = encode_offset_commit_value(OffsetCommitValue(offset=1, metadata="", commit_timestamp=0))
    return len(key), len(value)


def latency_ms(samples_s: list[float]) -> dict:
    if not samples_s:
        return {"samples": 0, "p50": None, "p99": None, "p99.9": None, "max": None, "mean": None}
    ms = [s * 1000 for s in samples_s]
    return {"samples": len(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99),
            "p99.9": percentile(ms, 99.9), "max": max(ms), "mean": sum(ms) / len(ms)}  # fmt: skip


def measure_commits(
    cluster: Cluster, clients: list[str], commits: int, rate_per_s: float
) -> list[dict]:
    rows = []
    for client in clients:
        group, topic = f"bench-groups-commit-{client}", f"bench-groups-produce-{client}"
        partition, replicas = offsets_partition(cluster, group)
        create_topic_on(cluster, topic, [replicas])
        key_bytes, value_bytes = commit_record_sizes(group, topic)
        print_note(f"  {LABELS[client]}: {commits} commits and {commits} produces at {rate_per_s:g} calls/s, "
                   f"leader {replicas[0]}, followers {', '.join(map(str, replicas[1:]))}")  # fmt: skip
        result = SAMPLERS[client](cluster.bootstrap, group, topic, commits, 1.0 / rate_per_s,
                                  b"k" * key_bytes, b"v" * value_bytes)  # fmt: skip
        commit, produce = latency_ms(result["commit_s"]), latency_ms(result["produce_s"])
        rows.append({"client": client, "label": LABELS[client], "group": group, "topic": topic,
                     "offsets_partition": partition, "replicas": list(replicas),
                     "key_bytes": key_bytes, "value_bytes": value_bytes,
                     "offset_commit_ms": commit, "produce_ms": produce,
                     "ratio_p50": _ratio(commit["p50"], produce["p50"]),
                     "ratio_p99": _ratio(commit["p99"], produce["p99"]),
                     "errors": result["errors"], "missed_slots": result["missed_slots"]})  # fmt: skip
    return rows


def _ratio(a, b):
    return None if a is None or not b else a / b


# -- rebalances -------------------------------------------------------------------------------


def measure_rebalances(cluster: Cluster, sizes: list[int], repeats: int) -> list[dict]:
    create_topic(cluster.bootstrap, REBALANCE_TOPIC, REBALANCE_PARTITIONS, 3)
    rows = []
    for members in sizes:
        for repeat in range(repeats):
            row = one_rebalance(cluster, members, f"bench-groups-rebalance-{members}-{repeat}")
            rows.append(row)
            leave = "" if row["leave_s"] is None else f", leave {row['leave_s'] * 1000:,.0f} ms"
            print_note(f"  {members} member(s): join {row['join_s'] * 1000:,.0f} ms{leave}")
    return rows


def one_rebalance(cluster: Cluster, count: int, group: str) -> dict:
    """`count` members subscribe one after the other; then (with 2 or more) the last leaves."""
    members = [Member(cluster.bootstrap, group, {"partition.assignment.strategy": "range"})
               for _ in range(count)]  # fmt: skip
    try:
        for member in members:
            member.subscribe(REBALANCE_TOPIC)
        cluster.wait_until(
            lambda: all(m.subscribed_at for m in members), 10, "the subscribes", 0.001
        )
        first, last = min(m.subscribed_at for m in members), max(m.subscribed_at for m in members)
        joined = cluster.wait_until(lambda: settled(members, REBALANCE_PARTITIONS, 0.0),
                                    RECOVERY_TIMEOUT_S, f"{count} members' assignments", 0.005)  # fmt: skip
        row = {"members": count, "group": group, "join_s": joined - last,
               "subscribe_spread_s": last - first,
               "assignments_per_member": [m.assignments for m in members],
               "leave_s": None, "close_s": None}  # fmt: skip
        if count > 1:
            leaver = members.pop()
            called = leaver.close()
            row["close_s"] = time.monotonic() - called
            left = cluster.wait_until(lambda: settled(members, REBALANCE_PARTITIONS, called),
                                      RECOVERY_TIMEOUT_S, "the others' new assignments", 0.005)  # fmt: skip
            row["leave_s"] = left - called
        errors = [repr(m.error) for m in members if m.error is not None]
        row["errors"] = errors
        return row
    finally:
        for member in members:
            member.close()


def rebalance_summary(rows: list[dict]) -> list[dict]:
    out = []
    for members in sorted({r["members"] for r in rows}):
        mine = [r for r in rows if r["members"] == members]
        joins = [r["join_s"] for r in mine]
        leaves = [r["leave_s"] for r in mine if r["leave_s"] is not None]
        out.append({"members": members, "runs": len(mine),
                    "join_p50_s": percentile(joins, 50), "join_max_s": max(joins),
                    "leave_p50_s": percentile(leaves, 50) if leaves else None,
                    "leave_max_s": max(leaves) if leaves else None,
                    "assignments_max": max(max(r["assignments_per_member"]) for r in mine)})  # fmt: skip
    return out


# -- coordinator failover -----------------------------------------------------------------------


def measure_failover(cluster: Cluster, lookup: CoordinatorLookup, kills: int) -> dict:
    partition, replicas = offsets_partition(cluster, FAILOVER_GROUP)
    victim = replicas[0]
    others = [b for b in BROKERS if b != victim]
    create_topic_on(cluster, FAILOVER_TOPIC,
                    [(others[p % 2], others[(p + 1) % 2], victim) for p in range(FAILOVER_PARTITIONS)],
                    {"min.insync.replicas": "2"})  # fmt: skip
    sentinel = group_on_partition(partition, len(cluster.zk().assignment(OFFSETS_TOPIC).partitions),
                                  "bench-groups-sentinel")  # fmt: skip
    feed = Feed(cluster.bootstrap, FAILOVER_TOPIC, FAILOVER_PARTITIONS, FEED_RATE_PER_S)
    reader = Reader(cluster.bootstrap, FAILOVER_GROUP, FAILOVER_TOPIC, COMMIT_INTERVAL_S)
    done: list[dict] = []
    try:
        for i in range(kills):
            # the last victim stays down: nothing is measured after it, and a restart costs seconds
            kill = one_kill(
                cluster, lookup, reader, victim, partition, sentinel, 1000 + i, i < kills - 1
            )
            done.append(kill)
            print_note(f"  kill {i + 1}/{kills}: broker {victim}; new coordinator {kill['new_coordinator']} "
                       f"named after {_ms(kill['coordinator_named_s'])} ms, commit after "
                       f"{_ms(kill['commit_ok_s'])} ms, records after {_ms(kill['records_again_s'])} ms")  # fmt: skip
        feed.stop()
        acked = {(p, o) for p, o, *_ in feed.acked}
        wait_until(lambda: acked <= {(p, o) for p, o, *_ in reader.snapshot()[0]}, 30, 0.05)
    finally:
        feed.stop()
        reader.stop()
    received, commits = reader.snapshot()
    for kill in done:
        kill.update(exposure(kill, received, commits))
    return {"victim": victim, "offsets_partition": partition, "sentinel_group": sentinel,
            "kills": done, "summary": failover_summary(done), "check": check(feed, received, len(done)),
            "reader_error": None if reader.error is None else repr(reader.error)}  # fmt: skip


def wait_ready(cluster: Cluster, lookup: CoordinatorLookup, reader: Reader, victim: int,
               partition: int) -> None:  # fmt: skip
    """The coordinator back on `victim` with full ISRs, and a commit and a new record since."""
    cluster.wait_until(lambda: topic_steady(cluster, OFFSETS_TOPIC, {partition})
                       and topic_steady(cluster, FAILOVER_TOPIC), RECOVERY_TIMEOUT_S, "full ISRs", 0.02)  # fmt: skip
    address = cluster.brokers[victim].bootstrap
    cluster.wait_until(lambda: lookup.ask(address, FAILOVER_GROUP) == (0, victim), RECOVERY_TIMEOUT_S,
                       f"broker {victim} to coordinate {FAILOVER_GROUP} again", 0.02)  # fmt: skip
    since, counts = time.monotonic(), reader.counts()
    cluster.wait_until(lambda: first_commit_after(reader, since, counts) and first_record_after(reader, since, counts),
                       RECOVERY_TIMEOUT_S, "a commit and a record after the coordinator came back", 0.01)  # fmt: skip


def one_kill(cluster: Cluster, lookup: CoordinatorLookup, reader: Reader, victim: int, partition: int,
             sentinel: str, sentinel_offset: int, restart: bool) -> dict:  # fmt: skip
    wait_ready(cluster, lookup, reader, victim, partition)
    commit_offsets(cluster.bootstrap, sentinel, {0: sentinel_offset})
    broker = cluster.brokers[victim]
    survivors = [cluster.brokers[b].bootstrap for b in BROKERS if b != victim]
    counts = reader.counts()
    killed_at, killed_at_wall = time.monotonic(), time.time()
    os.killpg(broker.pid, signal.SIGKILL)
    broker.process.wait()
    named_at, new_coordinator = wait_named(lookup, survivors, victim)
    committed_at = wait_until(
        lambda: first_commit_after(reader, killed_at, counts), RECOVERY_TIMEOUT_S, 0.002
    )
    consumed_at = wait_until(
        lambda: first_record_after(reader, killed_at, counts), RECOVERY_TIMEOUT_S, 0.002
    )
    read_back = read_offsets(cluster.bootstrap, sentinel)
    restart_s = None
    if restart:
        started = time.monotonic()
        broker.settings["listeners"] = (
            f"PLAINTEXT://127.0.0.1:{broker.port}"  # back on its own port
        )
        broker.start()
        restart_s = time.monotonic() - started
    return {"restart_s": restart_s, "victim": victim, "killed_at": killed_at, "killed_at_wall": killed_at_wall,
            "new_coordinator": new_coordinator,
            "coordinator_named_s": None if named_at is None else named_at - killed_at,
            "commit_ok_s": None if not committed_at else committed_at - killed_at,
            "records_again_s": None if not consumed_at else consumed_at - killed_at,
            "sentinel_committed": sentinel_offset, "sentinel_read_back": read_back.get(0),
            "sentinel_ok": read_back.get(0) == sentinel_offset}  # fmt: skip


def wait_named(
    lookup: CoordinatorLookup, survivors: list[str], victim: int
) -> tuple[float | None, int | None]:
    """Ask the survivors in turn until one names a coordinator other than `victim`."""
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    turn = 0
    while time.monotonic() < deadline:  # bounded: the deadline
        error, node = lookup.ask(survivors[turn % len(survivors)], FAILOVER_GROUP, timeout_ms=500)
        if error == 0 and node not in (victim, -1):
            return time.monotonic(), node
        turn += 1
        time.sleep(LOOKUP_INTERVAL_S)
    return None, None


def first_commit_after(reader: Reader, since: float, counts: tuple[int, int]) -> float | None:
    """When the first commit started after `since` succeeded (of those after `counts`)."""
    return next((ended for started, ended, _, error in reader.snapshot(*counts)[1]
                 if started > since and error is None), None)  # fmt: skip


def first_record_after(reader: Reader, since: float, counts: tuple[int, int]) -> float | None:
    """When the first record produced after `since` was received (of those after `counts`)."""
    return next((at for _, _, sent, at in reader.snapshot(*counts)[0] if sent > since), None)


def commit_offsets(bootstrap: str, group: str, offsets: dict[int, int]) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(FAILOVER_TOPIC, p, o) for p, o in offsets.items()]
    )
    admin.alter_consumer_group_offsets([request])[group].result(30)


def read_offsets(bootstrap: str, group: str) -> dict[int, int]:
    """The group's committed offsets of FAILOVER_TOPIC, {} if they cannot be read in 30 s."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        found = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[
            group
        ].result(30)
    except KafkaException:
        return {}
    return {
        tp.partition: tp.offset
        for tp in found.topic_partitions
        if tp.error is None and tp.topic == FAILOVER_TOPIC
    }


def exposure(kill: dict, received: list, commits: list) -> dict:
    """At-least-once: the records received beyond the offsets last acknowledged as committed,
    at the kill and when the first commit after it started; and the commits that failed."""
    killed_at = kill["killed_at"]
    before = [c for c in commits if c[1] <= killed_at and c[3] is None]
    committed = before[-1][2] if before else {}
    recovered = next((c for c in commits if c[0] > killed_at and c[3] is None), None)
    recovery_at = recovered[0] if recovered else float("inf")

    def beyond(until: float) -> int:
        return sum(1 for p, o, _, at in received if at <= until and o >= committed.get(p, 0))

    failed: dict[str, int] = {}
    for started, ended, _, error in commits:
        if error is not None and ended > killed_at and started < recovery_at:
            failed[error] = failed.get(error, 0) + 1
    return {"uncommitted_at_kill": beyond(killed_at), "uncommitted_at_recovery": beyond(recovery_at),
            "failed_commits": failed}  # fmt: skip


def check(feed: Feed, received: list, kills: int) -> dict:
    acked = {(p, o) for p, o, *_ in feed.acked}
    seen = [(p, o) for p, o, _, _ in received]
    unique = set(seen)
    redelivered = len(seen) - len(unique)
    return {"sent": feed.sent, "acknowledged": len(acked), "received": len(seen), "unique": len(unique),
            "redelivered": redelivered, "redelivered_per_kill": redelivered / kills if kills else None,
            "lost": len(acked - unique), "lost_examples": sorted(acked - unique)[:20],
            "producer_errors": feed.errors}  # fmt: skip


def failover_summary(kills: list[dict]) -> dict:
    out = {}
    for key in ("coordinator_named_s", "commit_ok_s", "records_again_s"):
        values = [k[key] for k in kills if k[key] is not None]
        out[key] = {"measured": len(values), "of": len(kills),
                    "p50": percentile(values, 50) if values else None,
                    "p99": percentile(values, 99) if values else None,
                    "max": max(values) if values else None}  # fmt: skip
    return out


# -- output -------------------------------------------------------------------------------------


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f}"


def _f(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_commit_rows(rows: list[dict], rate_per_s: float) -> None:
    assert rows
    table = []
    for r in rows:
        for kind, key in (("OffsetCommit", "offset_commit_ms"), ("Produce acks=all", "produce_ms")):
            m = r[key]
            table.append((r["label"], kind, m["samples"], _f(m["p50"]), _f(m["p99"]), _f(m["p99.9"]), _f(m["max"]),
                          ""))  # fmt: skip
        table.append((r["label"], "ratio", "", _f(r["ratio_p50"]), _f(r["ratio_p99"]), "", "",
                      ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "none"))  # fmt: skip
        table.append(None)
    print_table("OffsetCommit (acks=all through __consumer_offsets, RF 3) beside Produce acks=all",
                ["client", "call", "samples", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "errors"], table[:-1],
                text_columns=2,
                note=(f"Synchronous calls, one at a time, alternating, {rate_per_s:g} calls/s on a fixed schedule. "
                      "The produce record has the commit record's key and value sizes "
                      f"({rows[0]['key_bytes']} + {rows[0]['value_bytes']} bytes) and its topic's one partition the "
                      "same replicas in the same order as the group's offsets partition. Ratio: commit / produce. "
                      "p99.9 of fewer than 1,000 samples is the largest or near it."))  # fmt: skip


def print_rebalance_rows(summary: list[dict]) -> None:
    print_table("Rebalance (confluent-kafka, range assignor, their defaults)",
                ["members", "runs", "join p50 ms", "join max ms", "leave p50 ms", "leave max ms",
                 "assignments (max per member)"],
                [(s["members"], s["runs"], _ms(s["join_p50_s"]), _ms(s["join_max_s"]), _ms(s["leave_p50_s"]),
                  _ms(s["leave_max_s"]), s["assignments_max"]) for s in summary],
                note=("Join: the last member's subscribe() to every member holding its final assignment. Leave: one "
                      "member's close() (LeaveGroup) to the others' new assignments. group.initial.rebalance.delay.ms "
                      f"0; librdkafka's heartbeat.interval.ms 3000; {REBALANCE_PARTITIONS} partitions."))  # fmt: skip


def print_failover(failover: dict) -> None:
    s = failover["summary"]
    rows = [(what, f"{s[key]['measured']}/{s[key]['of']}", _ms(s[key]["p50"]), _ms(s[key]["p99"]), _ms(s[key]["max"]))
            for what, key in (("(a) FindCoordinator names a new coordinator", "coordinator_named_s"),
                              ("(b) a commit succeeds again", "commit_ok_s"),
                              ("(c) the member receives new records", "records_again_s"))]  # fmt: skip
    print_table("Coordinator failover: kill -9 of the group's coordinator (from the SIGKILL)",
                ["", "kills", "p50 ms", "p99 ms", "max ms"], rows)  # fmt: skip
    c = failover["check"]
    kills = failover["kills"]
    print_table("At-least-once across the kills",
                ["kill", "uncommitted at the kill", "uncommitted at (b)", "failed commits", "committed offset read back"],
                [(i + 1, k["uncommitted_at_kill"], k["uncommitted_at_recovery"],
                  ", ".join(f"{e} x{n}" for e, n in k["failed_commits"].items()) or "none",
                  "same" if k["sentinel_ok"] else f"{k['sentinel_read_back']} (committed {k['sentinel_committed']})")
                 for i, k in enumerate(kills)],
                note=(f"Uncommitted: records the member had received beyond its last acknowledged commit, which a "
                      f"member restarting then would receive again. Whole run: {c['acknowledged']:,} records "
                      f"acknowledged, {c['received']:,} received, {c['redelivered']:,} received twice, "
                      f"{c['lost']:,} lost."))  # fmt: skip


def goals_of(failover: dict | None) -> list[dict]:
    if failover is None:
        return []
    p99 = failover["summary"]["records_again_s"]["p99"]
    lost, kills = failover["check"]["lost"], failover["kills"]
    intact = sum(1 for k in kills if k["sentinel_ok"])
    return [goal(f"coordinator failover: SIGKILL to new records consumed, p99 < {GOAL_FAILOVER_P99_S:g} s (issue 15)",
                 p99, f"{_ms(p99)} ms", p99 is not None and p99 < GOAL_FAILOVER_P99_S),
            goal("coordinator failover: no acknowledged record lost", lost, f"{lost:,} lost", lost == 0),
            goal("coordinator failover: committed offsets read back from the new coordinator", intact,
                 f"{intact} of {len(kills)}", intact == len(kills))]  # fmt: skip


def broker_group_settings() -> dict:
    """The brokers' group settings this run had (their defaults unless SETTINGS says)."""
    from localcluster.broker.config import BrokerConfig

    config = BrokerConfig.from_properties(SETTINGS)
    return {"group_initial_rebalance_delay_ms": config.group_initial_rebalance_delay_ms,
            "offsets_topic_num_partitions": config.offsets_topic_num_partitions,
            "offsets_topic_replication_factor": config.offsets_topic_replication_factor}  # fmt: skip


# -- main ---------------------------------------------------------------------------------------


def run(args, scale: Scale, sizes: list[int], clients: list[str]) -> dict:
    cluster = Cluster(SETTINGS)
    lookup = CoordinatorLookup()
    out: dict = {}
    try:
        cluster.start(BROKERS)
        out["offsets_topic_ready_s"] = make_offsets_topic(cluster, lookup)
        print_note(f"{OFFSETS_TOPIC} ready after {out['offsets_topic_ready_s']:.1f} s")
        if clients and scale.commits:
            print_note("OffsetCommit beside Produce:")
            out["commit"] = measure_commits(cluster, clients, scale.commits, args.commit_rate)
        if sizes:
            print_note("Rebalances:")
            rows = measure_rebalances(cluster, sizes, scale.rebalance_repeats)
            out["rebalance"] = {"runs": rows, "summary": rebalance_summary(rows)}
        if scale.kills:
            print_note("Coordinator failover:")
            out["failover"] = measure_failover(cluster, lookup, scale.kills)
    finally:
        lookup.close()
        cluster.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.groups", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer commits, one run per group size, 2 kills"
    )
    parser.add_argument("--json", action="store_true", help="also print the JSON to stdout")
    parser.add_argument("--commits", type=int, help="synchronous commits per client (0: none)")
    parser.add_argument(
        "--commit-rate", type=float, default=200.0, help="calls per second, commits and produces"
    )
    parser.add_argument(
        "--clients", default=",".join(SAMPLERS), help="commit clients: confluent,kafka-python"
    )
    parser.add_argument(
        "--members", default="1,3,10", help="group sizes for the rebalance part ('' for none)"
    )
    parser.add_argument("--repeats", type=int, help="rebalance runs per group size")
    parser.add_argument("--kills", type=int, help="coordinator kills (0: none)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    scale = Scale(commits=base.commits if args.commits is None else args.commits,
                  rebalance_repeats=args.repeats or base.rebalance_repeats,
                  kills=base.kills if args.kills is None else args.kills)  # fmt: skip
    sizes = [int(n) for n in args.members.split(",") if n]
    clients = [c for c in args.clients.split(",") if c]
    unknown = [c for c in clients if c not in SAMPLERS]
    if unknown or any(n < 1 or n > REBALANCE_PARTITIONS for n in sizes):
        parser.error(f"clients of {', '.join(SAMPLERS)}; group sizes 1..{REBALANCE_PARTITIONS}")
    if args.json:
        from bench.common import console

        console(stderr=True)
    install_sigterm()
    load_before = os.getloadavg()
    started = time.perf_counter()
    out = run(args, scale, sizes, clients)
    elapsed = time.perf_counter() - started
    if out.get("commit"):
        print_commit_rows(out["commit"], args.commit_rate)
    if out.get("rebalance"):
        print_rebalance_rows(out["rebalance"]["summary"])
    if out.get("failover"):
        print_failover(out["failover"])
    goals = goals_of(out.get("failover"))
    if goals:
        print_goals("Goals (issue 15)", goals)
    path = write_results("groups", {
        "config": {"brokers": len(BROKERS), "broker_settings": SETTINGS, "commits": scale.commits,
                   "commit_rate_per_s": args.commit_rate, "clients": clients, "group_sizes": sizes,
                   "rebalance_repeats": scale.rebalance_repeats, "rebalance_partitions": REBALANCE_PARTITIONS,
                   "kills": scale.kills, "feed_rate_per_s": FEED_RATE_PER_S,
                   "commit_interval_s": COMMIT_INTERVAL_S, **broker_group_settings(), "quick": args.quick, "elapsed_s": elapsed,
                   "load_average_before": list(load_before)},
        **out, "goals": goals,
    }, to_stdout=args.json)  # fmt: skip
    print_note(f"results: {path} ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
