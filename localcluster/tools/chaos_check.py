"""The durability checker of `localcluster chaos`: was every acknowledged record kept?

Given the records a producer saw acknowledged (key, sequence number, value, partition,
offset, wall-clock time of the acknowledgement) and a cluster dir whose brokers are all back
with full ISRs, it consumes every partition from its start to the high watermark and checks:

- every acknowledged record is present exactly once, at the offset it was acknowledged at
  (a record present twice is a duplicate from a producer retry: counted, never hidden;
  a record absent is lost, unless its offset lies below the partition's log start offset,
  where retention or DeleteRecords deleted it; a record at another offset moved);
- the consumed offsets are contiguous and increasing, from the log start to the HW;
- every replica's log is byte-identical to the leader's below the HW (segment files read
  read-only with plain mmaps, never through Log.open, which would recover a live log);
- no two brokers led a partition in the same leader epoch (the "leading" events of the
  brokers' state-change logs, JSON lines: broker/state_change_log.py), and the batches' partitionLeaderEpoch never decreases along a log.

For each lost record it looks for the reason in the brokers' state-change logs: the leader it was
acknowledged by, the first later leader whose log ended at or below its offset when elected,
whether that election was unclean, and the truncations that cut it.

Rules: read-only. Nothing here writes to a broker's files or to the store.
"""

from __future__ import annotations

import mmap
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from localcluster import cluster
from localcluster.broker import state_change_log
from localcluster.storage import record_batch as rb

LOSS_EXAMPLES = 50  # lost records listed in full in a report; the count is always complete
CONSUME_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Ack:
    """One record the producer saw acknowledged (acks=all)."""

    key: str
    sequence: int
    partition: int
    offset: int
    acked_ms: int  # wall clock, to match the brokers' log lines

    @property
    def value(self) -> str:
        return record_value(self.key, self.sequence)


def record_value(key: str, sequence: int) -> str:
    return f"{key}:{sequence:09d}"


def parse_value(value: bytes | None) -> tuple[str, int] | None:
    try:
        key, _, sequence = value.decode().rpartition(":")
        return (key, int(sequence)) if key else None
    except (AttributeError, UnicodeDecodeError, ValueError):
        return None


# -- reading logs -------------------------------------------------------------------------------


def log_batches(partition_dir: Path) -> list[tuple[rb.BatchHeader, bytes]]:
    """Every valid batch in a partition directory's segments, in order, read-only."""
    out = []
    for segment in sorted(partition_dir.glob("*.log")):
        try:
            size = segment.stat().st_size
        except FileNotFoundError:
            continue  # rolled or deleted meanwhile
        if not size:
            continue
        with open(segment, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            position = 0
            while position + rb.HEADER_SIZE <= size:
                try:
                    header = rb.validate_batch(mm, position)
                except rb.CorruptRecordError:
                    break  # preallocated zeros (or a torn tail) end the data
                out.append((header, bytes(mm[position : position + header.size])))
                position += header.size
    return out


def log_end_offset(partition_dir: Path) -> int:
    batches = log_batches(partition_dir)
    return batches[-1][0].next_offset if batches else 0


def partition_dir(cluster_dir: Path, spec, broker_id: int, topic: str, partition: int) -> Path:
    return cluster.data_dir_of(cluster_dir, spec, broker_id) / f"{topic}-{partition}"


# -- the brokers' state-change logs ----------------------------------------------------------------

EVENT_KINDS = ("leading", "elected", "truncated", "following")


@dataclass(frozen=True, slots=True)
class LogEvent:
    kind: str  # leading | elected | truncated | following
    ms: int
    broker: int
    topic: str
    partition: int
    fields: dict  # the JSON line (broker/state_change_log.py): leader_epoch, log_end_offset, ...


def broker_log_events(
    cluster_dir: Path, broker_ids, topic: str, since_ms: int = 0
) -> list[LogEvent]:
    """The leadership, election and truncation events of every broker's state-change log
    (JSON lines; an elected line comes from the controller the broker ran), by time."""
    events = []
    for broker_id in broker_ids:
        path = cluster.broker_dir(cluster_dir, broker_id) / state_change_log.FILE_NAME
        for record in state_change_log.read_events(path):
            if (record["event"] in EVENT_KINDS and record.get("topic") == topic
                    and record.get("time_ms", 0) >= since_ms):  # fmt: skip
                events.append(LogEvent(record["event"], record["time_ms"], record["broker"],
                                       topic, int(record["partition"]), record))  # fmt: skip
    events.sort(key=lambda e: (e.ms, e.kind != "elected"))
    return events


# -- the checks ---------------------------------------------------------------------------------


def consume_all(cluster_dir: Path, topic: str, partitions: list[int],
                timeout_s: float = CONSUME_TIMEOUT_S) -> tuple[dict, dict, dict]:  # fmt: skip
    """{partition: [(offset, value bytes)]} from the log start to the HW, {partition: HW} and
    {partition: log start offset}, taken last (retention may move it while this reads)."""
    from localcluster.client import Consumer

    tps = [(topic, p) for p in partitions]
    out = {p: [] for p in partitions}
    with Consumer(
        cluster_dir=cluster_dir, auto_offset_reset="earliest", request_timeout_ms=10_000
    ) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                short = {tp[1]: (consumer.position(tp), ends[tp]) for tp in tps}
                raise TimeoutError(f"could not consume to the HW within {timeout_s:.0f} s: {short}")
            for record in consumer.poll(500):
                if record.offset < ends[(record.topic, record.partition)]:
                    out[record.partition].append((record.offset, record.value))
        starts = consumer.beginning_offsets(tps)
    return out, {tp[1]: ends[tp] for tp in tps}, {tp[1]: starts[tp] for tp in tps}


def check_offsets(
    consumed: list[tuple[int, bytes]], log_start: int, high_watermark: int
) -> list[str]:
    problems = []
    expected = log_start
    for offset, _ in consumed:
        if offset != expected:
            problems.append(f"offset {offset} follows {expected - 1} (expected {expected})")
            if len(problems) > 10:
                break
        expected = offset + 1
    if expected != high_watermark and len(problems) <= 10:
        problems.append(f"records end at offset {expected}, the HW is {high_watermark}")
    return problems


def check_replicas(cluster_dir: Path, spec, topic: str, partition: int, leader: int, replicas,
                   high_watermark: int) -> list[str]:  # fmt: skip
    """Every replica's batches below the HW are byte-identical to the leader's."""

    def below(broker_id):
        return [(h, data) for h, data in log_batches(partition_dir(cluster_dir, spec, broker_id, topic, partition))
                if h.base_offset < high_watermark]  # fmt: skip

    problems = []
    reference = below(leader)
    if reference and reference[-1][0].next_offset != high_watermark:
        problems.append(f"the leader {leader}'s batches below the HW end at "
                        f"{reference[-1][0].next_offset}, not at the HW {high_watermark}")  # fmt: skip
    epochs = [h.partition_leader_epoch for h, _ in reference]
    if any(b < a for a, b in zip(epochs, epochs[1:], strict=False)):
        problems.append(f"the leader {leader}'s batches' leader epochs decrease along the log")
    for broker_id in replicas:
        if broker_id == leader:
            continue
        other = below(broker_id)
        if [d for _, d in other] == [d for _, d in reference]:
            continue
        for (ha, da), (hb, db) in zip(reference, other, strict=False):
            if da != db:
                problems.append(f"replica {broker_id} differs from the leader {leader} at offset "
                                f"{min(ha.base_offset, hb.base_offset)} (epochs {ha.partition_leader_epoch} "
                                f"vs {hb.partition_leader_epoch})")  # fmt: skip
                break
        else:
            problems.append(f"replica {broker_id} holds {len(other)} batches below the HW, the leader "
                            f"{leader} {len(reference)}")  # fmt: skip
    return problems


def check_sequences(headers: list[rb.BatchHeader]) -> list[str]:
    """An idempotent producer's batches in a log: per producer id, sequences contiguous within
    an epoch (Int.MaxValue wraps to 0), a new epoch starting at 0, and no batch twice."""
    problems: list[str] = []
    last: dict[int, tuple[int, int]] = {}  # producer id -> (epoch, last sequence)
    seen: set[tuple[int, int, int]] = set()
    for h in headers:
        if h.producer_id == rb.NO_PRODUCER_ID:
            continue
        key = (h.producer_id, h.producer_epoch, h.base_sequence)
        if key in seen:
            problems.append(f"offset {h.base_offset}: producer {h.producer_id} epoch "
                            f"{h.producer_epoch} sequence {h.base_sequence} is in the log twice")  # fmt: skip
        seen.add(key)
        previous = last.get(h.producer_id)
        if previous is not None:
            epoch, sequence = previous
            expected = 0 if h.producer_epoch != epoch else (sequence + 1) % (2**31)
            if h.base_sequence != expected:
                problems.append(f"offset {h.base_offset}: producer {h.producer_id} epoch "
                                f"{h.producer_epoch} sequence {h.base_sequence} follows "
                                f"{sequence} (epoch {epoch}); expected {expected}")  # fmt: skip
        last[h.producer_id] = (h.producer_epoch,
                               (h.base_sequence + h.last_offset_delta) % (2**31))  # fmt: skip
    return problems


def check_epochs(events: list[LogEvent]) -> list[str]:
    """No two brokers led one partition in one leader epoch."""
    leaders = defaultdict(set)
    for e in events:
        if e.kind == "leading":
            leaders[(e.partition, e.fields["leader_epoch"])].add(e.broker)
    return [f"{p}: brokers {sorted(b)} both led in epoch {epoch}"
            for (p, epoch), b in sorted(leaders.items()) if len(b) > 1]  # fmt: skip


def explain_loss(ack: Ack, topic: str, events: list[LogEvent], protocol: str) -> str:
    """Why `ack` is gone, from the leadership, election and truncation lines."""
    mine = [e for e in events if e.partition == ack.partition]
    leading = [e for e in mine if e.kind == "leading"]
    before = [e for e in leading if e.ms <= ack.acked_ms]
    where = f"acknowledged at offset {ack.offset} of {topic}-{ack.partition}"
    epoch = before[-1].fields["leader_epoch"] if before else None
    if before:
        where += f" in epoch {epoch} (leader {before[-1].broker})"
    for e in leading:
        if epoch is None or e.fields["leader_epoch"] <= epoch or e.ms < ack.acked_ms:
            continue
        end = e.fields["log_end_offset"]
        if end > ack.offset:
            continue
        new_epoch = e.fields["leader_epoch"]
        reason = (f"{where}; the replica elected in epoch {new_epoch} (broker {e.broker}) did not "
                  f"have it: its log ended at {end}")  # fmt: skip
        elected = [x for x in mine if x.kind == "elected" and x.fields["leader_epoch"] == new_epoch]
        if elected and elected[0].fields.get("unclean"):
            reason += " (an unclean election: it was not in the ISR)"
        cuts = [x for x in mine if x.kind == "truncated" and x.broker == e.broker
                and x.fields["log_end_offset"] <= ack.offset and ack.acked_ms <= x.ms <= e.ms]  # fmt: skip
        if cuts:
            reason += f"; it had truncated to {cuts[-1].fields['log_end_offset']}" + (
                " (hw-truncation: a follower cuts to its own HW)"
                if protocol == "hw-truncation"
                else ""
            )
        return reason
    later = [
        e
        for e in leading
        if e.ms >= ack.acked_ms and (epoch is None or e.fields["leader_epoch"] > epoch)
    ]
    for e in later:  # a leader whose log reached past the offset, but with other records there
        new_epoch = e.fields["leader_epoch"]
        elected = [x for x in mine if x.kind == "elected" and x.fields["leader_epoch"] == new_epoch]
        if elected and elected[0].fields.get("unclean"):
            return (f"{where}; the replica elected in epoch {new_epoch} (broker {e.broker}) in an unclean "
                    f"election (not in the ISR) held other records at that offset (its log ended at "
                    f"{e.fields['log_end_offset']}); the others truncated to its log")  # fmt: skip
        cuts = [x for x in mine if x.kind == "truncated" and x.broker == e.broker
                and x.fields["log_end_offset"] <= ack.offset and ack.acked_ms <= x.ms <= e.ms]  # fmt: skip
        if cuts:
            return (f"{where}; broker {e.broker} truncated to {cuts[-1].fields['log_end_offset']} and then led in "
                    f"epoch {new_epoch} with other records at that offset")  # fmt: skip
    return f"{where}; no later leader's log ended below it (no election in the brokers' logs explains it)"


def check(cluster_dir: Path, topic: str, acks: list[Ack], *, since_ms: int = 0,
          consumed: dict | None = None, high_watermarks: dict | None = None,
          log_starts: dict | None = None) -> dict:  # fmt: skip
    """Consume, compare, and report. `since_ms` limits the log lines read to this run."""
    from localcluster.coord import connect
    from localcluster.coord.kafka_zk import KafkaZkClient

    spec = cluster.load_spec(cluster_dir)
    protocol = spec.settings.get("replication.protocol", "leader-epoch")
    zk = KafkaZkClient(connect(spec.coordination))
    try:
        assignment = zk.assignment(topic)
        partitions = sorted(assignment.partitions)
        states = {p: zk.partition_state(topic, p) for p in partitions}
    finally:
        zk.coord.stop()
    if consumed is None:
        consumed, high_watermarks, log_starts = consume_all(cluster_dir, topic, partitions)
    events = broker_log_events(cluster_dir, spec.brokers, topic, since_ms)
    report = {"topic": topic, "acknowledged": len(acks), "lost": 0, "lost_records": [], "moved": 0,
              "moved_records": [], "duplicated": 0, "unacknowledged_present": 0, "partitions": {},
              "problems": []}  # fmt: skip
    acked_by_value = {(a.key, a.sequence): a for a in acks}
    found: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for p in partitions:
        records = consumed.get(p, [])
        hw = high_watermarks[p]
        log_start = log_starts[p]
        state, _ = states[p] or (None, None)
        row = {"high_watermark": hw, "records": len(records), "leader": state.leader if state else -1,
               "leader_epoch": state.leader_epoch if state else -1,
               "isr": list(state.isr) if state else [], "duplicated": 0}  # fmt: skip
        kept = [r for r in records if r[0] >= log_start]  # read before retention moved on
        problems = [f"{topic}-{p}: {x}" for x in check_offsets(kept, log_start, hw)]
        if state is not None and state.leader >= 0:
            problems += [f"{topic}-{p}: {x}" for x in check_replicas(
                cluster_dir, spec, topic, p, state.leader, assignment.partitions[p], hw)]  # fmt: skip
            leader_log = partition_dir(cluster_dir, spec, state.leader, topic, p)
            committed = [h for h, _ in log_batches(leader_log) if h.base_offset < hw]
            problems += [f"{topic}-{p}: {x}" for x in check_sequences(committed)]
        for offset, value in records:
            parsed = parse_value(value)
            if parsed is None:
                problems.append(f"{topic}-{p}: offset {offset} holds a record chaos did not write")
                continue
            found[parsed].append((p, offset))
        seen = defaultdict(int)
        for _, value in records:
            parsed = parse_value(value)
            if parsed:
                seen[parsed] += 1
        row["duplicated"] = sum(n - 1 for n in seen.values() if n > 1)
        row["log_start_offset"] = log_start
        report["partitions"][str(p)] = row
        report["problems"] += problems
    report["duplicated"] = sum(r["duplicated"] for r in report["partitions"].values())
    report["problems"] += [f"{topic}-{x}" for x in check_epochs(events)]
    lost = []
    below_start = 0  # deleted with the log's start (retention, DeleteRecords): not lost
    for a in acks:
        places = found.get((a.key, a.sequence), [])
        if not places and a.offset < log_starts.get(a.partition, 0):
            below_start += 1
        elif not places:
            lost.append(a)
        elif (a.partition, a.offset) not in places:
            report["moved"] += 1
            if len(report["moved_records"]) < LOSS_EXAMPLES:
                report["moved_records"].append({"value": a.value, "partition": a.partition,
                                                "acked_offset": a.offset, "found_at": places})  # fmt: skip
    report["unacknowledged_present"] = sum(1 for k in found if k not in acked_by_value)
    report["lost"] = len(lost)
    report["below_log_start"] = below_start
    per_partition = max(1, -(-LOSS_EXAMPLES // max(1, len(partitions))))
    examples = [
        a for p in partitions for a in [x for x in lost if x.partition == p][:per_partition]
    ]
    for a in examples[:LOSS_EXAMPLES]:
        report["lost_records"].append({"value": a.value, "partition": a.partition, "offset": a.offset,
                                       "acked_ms": a.acked_ms,
                                       "reason": explain_loss(a, topic, events, protocol)})  # fmt: skip
    report["lost_by_partition"] = {
        str(p): sum(1 for a in lost if a.partition == p) for p in partitions
    }
    report["verdict"] = (
        "LOSS" if lost else ("VIOLATION" if report["problems"] or report["moved"] else "OK")
    )
    return report


# -- the consumer group (chaos --consumers N) ------------------------------------------------------

CONSUMED_CHECK = "every acknowledged record was consumed at least once"
COMMITS_CHECK = "committed offsets never went backwards"


def group_commits(logs: dict[str, list[dict]]) -> tuple[dict, list[dict]]:
    """{partition: [(answered_us, offset, consumer)]} of the successful commits, by answer
    time, and every commit attempt that failed (whole or for a partition)."""
    succeeded, failed = defaultdict(list), []
    for name, events in logs.items():
        for e in events:
            if e["e"] != "c":
                continue
            partition_errors = e.get("partition_errors") or {}
            for p, offset in e["offsets"].items():
                error = e["error"] or partition_errors.get(p)
                if error is None:
                    succeeded[int(p)].append((e["t"], offset, name))
                else:
                    failed.append({"consumer": name, "partition": int(p), "offset": offset,
                                   "t": e["t"], "error": error})  # fmt: skip
    for commits in succeeded.values():
        commits.sort()
    return succeeded, failed


def check_commits(succeeded: dict, failed: list[dict], committed: dict[int, int] | None,
                  partitions, since_ms: int, fetch_error: str = "") -> tuple[list[dict], list[str]]:  # fmt: skip
    """Backward steps of each partition's successful commits (against the highest before it),
    and how the final OffsetFetch differs from the last successful commit of each partition."""
    backwards = []
    for p, commits in sorted(succeeded.items()):
        high = None
        for t, offset, name in commits:
            if high is not None and offset < high[1]:
                backwards.append({"partition": p, "from": high[1], "from_consumer": high[2],
                                  "from_ms": high[0] // 1000 - since_ms, "to": offset, "to_consumer": name,
                                  "to_ms": t // 1000 - since_ms})  # fmt: skip
            if high is None or offset >= high[1]:
                high = (t, offset, name)
    if committed is None:
        return backwards, [f"the group's committed offsets could not be fetched: {fetch_error}"]
    mismatches = []
    for p in partitions:
        last = succeeded[p][-1] if succeeded.get(p) else None
        fetched = committed.get(p)
        if (last[1] if last else None) == fetched:
            continue
        text = (f"p{p}: OffsetFetch answers {fetched if fetched is not None else 'no offset'}, the last "
                f"successful commit was " + (f"{last[1]} by {last[2]}" if last else "none"))  # fmt: skip
        later = [f for f in failed if f["partition"] == p and f["offset"] == fetched
                 and (last is None or f["t"] > last[0])]  # fmt: skip
        if later:
            text += f" (a later commit of {fetched} by {later[-1]['consumer']} was answered {later[-1]['error']})"
        mismatches.append(text)
    return backwards, mismatches


def ownership(logs: dict[str, list[dict]], since_ms: int) -> dict[str, list]:
    """{partition: [[consumer, from_ms, to_ms or None (owned until it ended)]]} from the members'
    assignment, revocation, loss and close lines."""
    out = defaultdict(list)
    for name, events in logs.items():
        open_at: dict[int, int] = {}
        for e in events:
            ms = e["t"] // 1000 - since_ms
            if e["e"] == "a":
                for p in e["partitions"]:
                    open_at.setdefault(p, ms)
            elif e["e"] == "s":  # a new life: the last one was killed, it owned until now at most
                for p, start in open_at.items():
                    out[p].append([name, start, ms])
                open_at.clear()
            elif e["e"] in ("v", "l", "x"):
                for p in e.get("partitions", list(open_at)):
                    if p in open_at:
                        out[p].append([name, open_at.pop(p), ms])
        for p, start in open_at.items():
            out[p].append([name, start, None])
    return {str(p): sorted(spans, key=lambda s: s[1]) for p, spans in sorted(out.items())}


def check_group(acks: list[Ack], logs: dict[str, list[dict]], partitions, committed: dict[int, int] | None,
                *, log_records: dict | None = None, log_starts: dict | None = None,
                fetch_error: str = "", since_ms: int = 0) -> dict:  # fmt: skip
    """The consumer group's two checks, from the acknowledgements, the members' event lines
    (tools/chaos_consumer.py) and the final OffsetFetch: every acknowledged record consumed at
    least once (at its offset, with its value), and per partition the successful commits never
    going backwards and the final committed offset equal to the last of them. Re-consumed
    records (at-least-once after a rebalance) are counted, not a failure.

    With log_starts (per partition, taken after the log was read), an acknowledged record below
    its partition's log start that no member read was deleted (retention, DeleteRecords) before
    the group reached it: counted as `deleted_before_read`, not missed. A record read below the
    log start is checked against what was acknowledged at that offset, since the log no longer
    holds it."""
    log_starts = log_starts or {}
    reads = defaultdict(list)  # (partition, offset) -> [value, ...] over every member
    errors = {}
    for name, events in logs.items():
        errors[name] = sum(1 for e in events if e["e"] == "e")
        for e in events:
            if e["e"] == "r":
                reads[(e["p"], e["o"])].append(e["v"])
    consumed = {(p, o, v) for (p, o), values in reads.items() for v in values}
    unread = [a for a in acks if (a.partition, a.offset, a.value) not in consumed]
    missed = [a for a in unread if a.offset >= log_starts.get(a.partition, 0)]
    reconsumed = defaultdict(int)
    for (p, _), values in reads.items():
        reconsumed[str(p)] += len(values) - 1
    foreign = []  # read at an offset that holds something else in the log
    if log_records is not None:
        logged = {(p, o): v.decode("utf-8", "replace") if isinstance(v, bytes) else v
                  for p, records in log_records.items() for o, v in records}  # fmt: skip
        acked = {(a.partition, a.offset): a.value for a in acks}

        def held(p: int, o: int, read: str) -> str | None:
            """What the offset holds: the log's record, or below the log start the acknowledged
            one (what was read, when nothing was acknowledged there)."""
            return logged.get((p, o)) if o >= log_starts.get(p, 0) else acked.get((p, o), read)

        foreign = [(p, o, v) for (p, o, v) in sorted(consumed) if held(p, o, v) != v]
    succeeded, failed = group_commits(logs)
    backwards, mismatches = check_commits(
        succeeded, failed, committed, partitions, since_ms, fetch_error
    )
    failures = defaultdict(int)
    for f in failed:
        failures[f["error"].split(":")[0]] += 1
    waits = sorted(
        (e["t"] - e["sent"]) / 1000 for events in logs.values() for e in events if e["e"] == "c"
    )
    return {
        "consumers": len(logs), "consumed": sum(len(v) for v in reads.values()),
        "consumed_distinct": len(reads), "missed": len(missed),
        "deleted_before_read": len(unread) - len(missed),
        "missed_records": [{"value": a.value, "partition": a.partition, "offset": a.offset}
                           for a in missed[:LOSS_EXAMPLES]],
        "reconsumed": sum(reconsumed.values()), "reconsumed_by_partition": dict(reconsumed),
        "not_in_log": len(foreign), "not_in_log_records": [list(x) for x in foreign[:LOSS_EXAMPLES]],
        "commits": sum(len(c) for c in succeeded.values()), "commits_failed": len(failed),
        "commit_failures": dict(failures), "backwards": len(backwards),
        "commit_wait_ms": {"p50": round(waits[len(waits) // 2], 1), "max": round(waits[-1], 1)} if waits else {},
        "backwards_steps": backwards[:LOSS_EXAMPLES], "final_offsets": committed,
        "last_commits": {str(p): c[-1][1] for p, c in sorted(succeeded.items())},
        "final_mismatches": mismatches, "consumer_errors": errors,
        "ownership": ownership(logs, since_ms),
        "at_least_once": not missed and not foreign, "commits_never_backwards": not backwards and not mismatches,
    }  # fmt: skip
