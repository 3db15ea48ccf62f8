"""What `localcluster groups` and `consume --group` do: consumer groups through our own client.

list (ListGroups at every broker), describe (state, protocol, members; per partition the
committed offset, the log end offset and the lag, as kafka-consumer-groups.sh --describe shows
them), delete, reset-offsets (only while the group has no members, as Kafka's tool requires),
and consuming in a group. Everything returns the dicts `--json` prints; faults raise
ClusterError with one line saying what to do.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from localcluster.cluster import ClusterError, ClusterSpec
from localcluster.tools.cluster_admin import (
    CLIENT_TIMEOUT_MS,
    _admin,
    _kafka_error,
    admin_calls,
    client_config,
    live_bootstrap,
)

INACTIVE_STATES = ("Empty", "Dead")  # kafka-consumer-groups.sh resets offsets only in these


def _consumer(spec: ClusterSpec, extra: dict | None = None, **settings):
    from localcluster.client import Consumer, KafkaError

    config = {"request.timeout.ms": CLIENT_TIMEOUT_MS, **client_config(spec), **(extra or {})}
    try:
        return Consumer(config, bootstrap_servers=live_bootstrap(spec), **settings)
    except KafkaError as e:
        raise ClusterError(f"cannot reach the brokers: {e}") from None


def _not_found(group: str) -> ClusterError:
    return ClusterError(f"consumer group {group!r} does not exist; `localcluster groups list` "
                        "shows the groups")  # fmt: skip


# -- list / describe ----------------------------------------------------------------------------


def list_groups(spec: ClusterSpec) -> list[dict]:

    with admin_calls(spec, "cannot list the groups") as admin:
        listed = admin.list_groups()
    return [{"group": g.group_id, "protocol_type": g.protocol_type, "state": g.state,
             "coordinator": g.coordinator} for g in listed]  # fmt: skip


def describe_group(spec: ClusterSpec, group: str) -> dict:
    """State, protocol, coordinator, members, and one row per partition the group has a
    committed offset for or a member is assigned: committed offset, log end offset, lag."""

    with admin_calls(spec, f"cannot describe group {group!r}") as admin:
        described = admin.describe_group(group)
        committed = admin.list_group_offsets(group)
    if described.state == "Dead" and not committed:
        raise _not_found(group)
    owners = {tp: m for m in described.members for tp in m.assignment}
    partitions = sorted(set(committed) | set(owners))
    ends = _end_offsets(spec, partitions)
    rows = []
    for tp in partitions:
        offset = committed.get(tp, -1)
        end = ends.get(tp)
        member = owners.get(tp)
        rows.append({"topic": tp[0], "partition": tp[1],
                     "current_offset": offset if offset >= 0 else None,
                     "log_end_offset": end,
                     "lag": end - offset if offset >= 0 and end is not None else None,
                     "member_id": member.member_id if member else None,
                     "host": member.client_host if member else None,
                     "client_id": member.client_id if member else None})  # fmt: skip
    return {"group": described.group_id, "state": described.state,
            "protocol_type": described.protocol_type, "protocol": described.protocol,
            "coordinator": described.coordinator,
            "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                         "client_id": m.client_id, "host": m.client_host,
                         "topics": list(m.topics),
                         "assignment": [[t, p] for t, p in m.assignment]}
                        for m in described.members],
            "partitions": rows}  # fmt: skip


MAX_GROUPS_IN_STATUS = 20  # `status` describes at most this many (each costs a round trip)


def groups_summary(spec: ClusterSpec) -> list[dict]:
    """One row per group for `status`: state, coordinator, members and total lag (the sum
    over its partitions with a committed offset). A group that cannot be described right now
    (its coordinator moves) shows its error instead of failing the status."""
    rows = []
    for listed in list_groups(spec)[:MAX_GROUPS_IN_STATUS]:
        try:
            described = describe_group(spec, listed["group"])
        except ClusterError as e:
            rows.append({"group": listed["group"], "state": listed["state"],
                         "coordinator": listed["coordinator"], "members": None, "lag": None,
                         "error": str(e)})  # fmt: skip
            continue
        lags = [p["lag"] for p in described["partitions"] if p["lag"] is not None]
        rows.append({"group": described["group"], "state": described["state"],
                     "coordinator": described["coordinator"],
                     "members": len(described["members"]),
                     "lag": sum(lags) if lags else None, "error": None})  # fmt: skip
    return rows


def _end_offsets(spec: ClusterSpec, partitions) -> dict:
    """Log end offsets (high watermarks); partitions whose topic is gone are left out."""
    from localcluster.client import KafkaError

    if not partitions:
        return {}
    consumer = _consumer(spec, allow_auto_create_topics=False)
    out = {}
    try:
        for topic in sorted({t for t, _ in partitions}):
            mine = [tp for tp in partitions if tp[0] == topic]
            try:
                out.update(consumer.end_offsets(mine))
            except KafkaError:
                pass  # a deleted topic: its rows show no log end offset
    finally:
        consumer.close()
    return out


# -- delete / reset -----------------------------------------------------------------------------


def delete_group(spec: ClusterSpec, group: str) -> dict:
    from kio.schema.errors import ErrorCode

    from localcluster.client import KafkaError

    admin = _admin(spec)
    try:
        admin.delete_group(group)
    except KafkaError as e:
        if e.code == ErrorCode.group_id_not_found:
            raise _not_found(group) from None
        if e.code == ErrorCode.non_empty_group:
            raise ClusterError(f"group {group!r} has active members; stop them first "
                               f"(`localcluster groups describe {group}`)") from None  # fmt: skip
        raise _kafka_error(e, f"cannot delete group {group!r}") from None
    finally:
        admin.close()
    return {"group": group, "deleted": True}


def parse_topic_partitions(text: str) -> tuple[str, list[int] | None]:
    """`T` (every partition) or `T:0,2` (kafka-consumer-groups.sh's --topic syntax)."""
    topic, sep, rest = text.partition(":")
    if not sep:
        return topic, None
    try:
        return topic, sorted({int(p) for p in rest.split(",") if p.strip()})
    except ValueError:
        raise ClusterError(f"--topic {text!r}: write TOPIC or TOPIC:0,1,2") from None


def reset_offsets(spec: ClusterSpec, group: str, topic_arg: str, to: str,
                  offset: int | None = None, dry_run: bool = False) -> dict:  # fmt: skip
    """Commit new offsets for the group's partitions of a topic: to the earliest or latest
    offset, or to `offset` (kept within [log start, log end], as Kafka's tool does)."""
    from localcluster.client import KafkaError

    topic, chosen = parse_topic_partitions(topic_arg)
    with admin_calls(spec, f"cannot reset the offsets of group {group!r}") as admin:
        described = admin.describe_group(group)
        if described.state not in INACTIVE_STATES:
            raise ClusterError(f"offsets can only be reset while group {group!r} is inactive, but "
                               f"its state is {described.state} with {len(described.members)} "
                               "member(s); stop its consumers first")  # fmt: skip
        try:
            known = [p.partition for p in admin.describe_topic(topic).partitions]
        except KafkaError as e:
            raise _kafka_error(e, f"cannot reset offsets for topic {topic!r}") from None
        partitions = known if chosen is None else chosen
        missing = sorted(set(partitions) - set(known))
        if missing:
            raise ClusterError(f"topic {topic!r} has no partition {missing[0]}")
        tps = [(topic, p) for p in partitions]
        before = admin.list_group_offsets(group, tps)
        targets = _targets(spec, tps, to, offset)
        if not dry_run:
            admin.alter_group_offsets(group, targets)
    return {"group": group, "dry_run": dry_run, "partitions": [
        {"topic": t, "partition": p, "previous_offset": before.get((t, p), -1),
         "new_offset": targets[(t, p)]} for t, p in tps]}  # fmt: skip


def _targets(spec: ClusterSpec, tps, to: str, offset: int | None) -> dict:
    consumer = _consumer(spec, allow_auto_create_topics=False)
    try:
        earliest = consumer.beginning_offsets(tps)
        latest = consumer.end_offsets(tps)
    finally:
        consumer.close()
    if to == "earliest":
        return dict(earliest)
    if to == "latest":
        return dict(latest)
    assert to == "offset" and offset is not None, to
    return {tp: min(max(offset, earliest[tp]), latest[tp]) for tp in tps}


# -- consuming in a group -----------------------------------------------------------------------


def consume(spec: ClusterSpec, topic: str, group: str, write: Callable[[object], None], *,
            from_beginning: bool, max_messages: int | None, idle_timeout_ms: int | None,
            properties: dict[str, str]) -> int:  # fmt: skip
    """Consume TOPIC as a member of GROUP (positions from the group's committed offsets;
    --from-beginning is auto.offset.reset=earliest for partitions without one) until
    max_messages, an idle timeout or Ctrl-C; commits what was written and leaves the group."""
    from localcluster.client import KafkaError
    from localcluster.tools.cluster_admin import describe_topic

    describe_topic(spec, topic)  # an unknown topic is an error here too, not a silent wait
    settings = {"group.id": group,
                "auto.offset.reset": "earliest" if from_beginning else "latest", **properties}  # fmt: skip
    try:
        consumer = _consumer(spec, settings)
    except ValueError as e:
        raise ClusterError(f"--consumer-property: {e}") from None
    count = 0
    previous = _interrupt_on_sigterm()
    try:
        consumer.subscribe([topic])
        last = time.monotonic()
        while max_messages is None or count < max_messages:
            records = consumer.poll(200)
            if records:
                last = time.monotonic()
            for i, record in enumerate(records):
                write(record)
                count += 1
                if max_messages is not None and count >= max_messages:
                    _rewind(consumer, records[i + 1 :])
                    break
            if idle_timeout_ms is not None and (time.monotonic() - last) * 1000 >= idle_timeout_ms:
                break
    except KafkaError as e:
        raise _kafka_error(e, f"consuming {topic!r} in group {group!r} failed after {count} "
                           "records") from None  # fmt: skip
    except KeyboardInterrupt:
        pass
    finally:
        try:
            consumer.close()  # commits (enable.auto.commit) and leaves the group
        except Exception:  # closing after Ctrl-C or a broker loss must not hide the count
            pass
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    return count


def _interrupt_on_sigterm():
    """SIGTERM ends the loop as Ctrl-C does, so the member commits and leaves the group
    (kafka-console-consumer.sh's shutdown hook); the previous handler, or None off the main
    thread."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)


def _rewind(consumer, unwritten) -> None:
    """Move positions back to the first record not written, so the commit on close does not
    skip the rest of a poll that --max-messages cut short."""
    first: dict = {}
    for record in unwritten:
        tp = (record.topic, record.partition)
        first[tp] = min(first.get(tp, record.offset), record.offset)
    for tp, offset in first.items():
        consumer.seek(tp, offset)
