"""The consumer group of `localcluster chaos --consumers N`: the process each member runs, and
the engine's handle on the N processes (start, wait for the group, drain, stop, OffsetFetch).

Each member is its own process (`python -m localcluster.tools.chaos_consumer`), so a fault that
stops one process does not stop them all, running confluent-kafka (librdkafka) with its
defaults except two: auto.offset.reset=earliest (the group starts before the records exist)
and enable.auto.commit=false with a synchronous commit of explicit offsets after each poll
batch, so that every commit and its answer is observable. It writes one JSON line per event to
its file: `r` a record consumed (partition, offset, value), `c` a commit (the offsets asked,
when it was sent and answered, the error of the whole request or of each partition), `a`/`v`/
`l` an assignment, a revocation, a loss of partitions, `e` a client error, `s`/`x` start and
close. Records of a batch are flushed before its commit is sent, so a commit never covers a
record that is not in the file. Times are wall-clock microseconds (one host, one clock), so
the checker can order the commits of different processes.

Rules: bounded: a batch is at most MAX_BATCH records, the run's record lines are bounded by
the producer's rate x duration (plus duplicates), error lines by MAX_ERROR_LINES (the rest
counted in the close line). The engine ends every process it started by pid and process group.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from localcluster import cluster
from localcluster.waiting import wait_until

MAX_BATCH = 500  # records per consume() call, each batch then committed synchronously
POLL_TIMEOUT_S = 0.2
MAX_ERROR_LINES = 200
STOP_TIMEOUT_S = 15.0  # for close() (LeaveGroup) after SIGTERM; then SIGKILL
FETCH_TIMEOUT_S = 30.0


def now_us() -> int:
    return time.time_ns() // 1000


# -- the member process -------------------------------------------------------------------------


class EventFile:
    """One JSON line per event, appended; flush() after a batch and around commits."""

    def __init__(self, path: Path):
        self.out = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self.errors = 0

    def write(self, event: str, **fields) -> None:
        self.out.write(
            json.dumps({"e": event, "t": now_us(), **fields}, separators=(",", ":")) + "\n"
        )

    def error(self, text: str) -> None:
        self.errors += 1
        if self.errors <= MAX_ERROR_LINES:
            self.write("e", error=text[:300])

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        self.out.close()


def error_text(error) -> str:
    """A KafkaError as its name and text (its code alone names it in the checker's counts)."""
    return f"{error.name()}: {error.str()}"


def commit(consumer, topic: str, last: dict[int, int], events: EventFile) -> None:
    """Synchronously commit last consumed offset + 1 of each partition, and write the answer."""
    from confluent_kafka import KafkaException, TopicPartition

    offsets = {p: o + 1 for p, o in last.items()}
    sent = now_us()
    try:
        answer = consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                                 asynchronous=False)  # fmt: skip
    except KafkaException as e:
        events.write("c", sent=sent, offsets=offsets, error=error_text(e.args[0]))
    else:
        errors = {tp.partition: error_text(tp.error) for tp in answer or () if tp.error is not None}
        events.write("c", sent=sent, offsets=offsets, error=None, partition_errors=errors)
    events.flush()


def member(bootstrap: str, topic: str, group: str, name: str, out: Path, settings: dict) -> int:
    """Consume `topic` in `group` until SIGTERM, writing every event to `out`."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    events = EventFile(out)
    events.write("s", pid=os.getpid(), name=name)  # first: it ends the last life's ownership
    events.flush()
    from confluent_kafka import Consumer

    config = {**settings, "bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
              "auto.offset.reset": "earliest", "enable.auto.commit": False,
              "error_cb": lambda error: events.error(error_text(error))}  # fmt: skip
    consumer = Consumer(config)

    def rebalanced(kind):
        def callback(_, partitions):
            events.write(kind, partitions=sorted(tp.partition for tp in partitions))
            events.flush()

        return callback

    consumer.subscribe([topic], on_assign=rebalanced("a"), on_revoke=rebalanced("v"),
                       on_lost=rebalanced("l"))  # fmt: skip
    try:
        while not stop.is_set():
            last: dict[int, int] = {}
            for message in consumer.consume(num_messages=MAX_BATCH, timeout=POLL_TIMEOUT_S):
                if message.error() is not None:
                    events.error(error_text(message.error()))
                    continue
                value = (message.value() or b"").decode("utf-8", "replace")
                events.write("r", p=message.partition(), o=message.offset(), v=value)
                last[message.partition()] = message.offset()
            if last:
                events.flush()
                commit(consumer, topic, last, events)
    finally:
        with contextlib.suppress(Exception):
            consumer.close()  # LeaveGroup; no commit (enable.auto.commit is off)
        events.write("x", errors=events.errors)
        events.close()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--cluster-dir", required=True, type=Path)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    return member(args.bootstrap, args.topic, args.group, args.name, args.out,
                  client_settings(args.cluster_dir))  # fmt: skip


def client_settings(cluster_dir: Path) -> dict[str, str]:
    """SASL settings `up` wrote for clients ({} for a PLAINTEXT cluster)."""
    from localcluster.tools.sasl_setup import client_settings as sasl_settings

    return sasl_settings(cluster.load_spec(cluster_dir))


# -- the engine's handle --------------------------------------------------------------------------


class Tail:
    """The complete lines appended to a file since the last read (a torn last line waits)."""

    def __init__(self, path: Path):
        self.path, self.position, self.partial = path, 0, b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.position)
                data = f.read()
        except FileNotFoundError:
            return []
        self.position += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


def registered_bootstrap(spec) -> str:
    """host:port of the registered brokers (a cluster whose spec has no fixed ports)."""
    with cluster.store(spec) as client:
        return cluster.bootstrap_servers(cluster.registrations(client))


class ConsumerGroup:
    """The N member processes, and what the engine learns from their files while it waits."""

    def __init__(self, cluster_dir: Path, spec, topic: str, group: str, count: int, run_dir: Path):
        self.cluster_dir, self.spec, self.topic, self.group = cluster_dir, spec, topic, group
        self.count, self.run_dir = count, run_dir
        self.bootstrap = spec.bootstrap_servers() or registered_bootstrap(spec)
        self.processes: dict[str, subprocess.Popen] = {}
        self.tails: dict[str, Tail] = {}
        self.events: dict[str, list[dict]] = {}
        self.consumed: set[tuple[int, int, str]] = set()  # (partition, offset, value)
        self.committed: dict[int, int] = {}  # partition -> offset of the last successful commit

    def path(self, name: str) -> Path:
        return self.run_dir / f"{name}.jsonl"

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.count):
            name = f"consumer-{i}"
            self.tails[name] = Tail(self.path(name))
            self.events[name] = []
            self.restart(name)

    def restart(self, name: str) -> subprocess.Popen:
        """(Re)start a member: a new process, and a new member of the group, appending to the
        same file (the checker sees one consumer with several lives)."""
        with open(self.run_dir / f"{name}.stderr", "ab") as err:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "localcluster.tools.chaos_consumer", "--bootstrap", self.bootstrap,
                 "--cluster-dir", str(self.cluster_dir), "--topic", self.topic, "--group", self.group,
                 "--name", name, "--out", str(self.path(name))],
                stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT,
                start_new_session=True, env=cluster.child_env())  # fmt: skip
        return self.processes[name]

    def update(self) -> None:
        """Read what the members wrote since the last call."""
        for name, tail in self.tails.items():
            for event in tail.read():
                self.events[name].append(event)
                if event["e"] == "r":
                    self.consumed.add((event["p"], event["o"], event["v"]))
                elif event["e"] == "c" and event["error"] is None:
                    for p, offset in event["offsets"].items():
                        if p not in event.get("partition_errors", {}):
                            self.committed[int(p)] = offset

    def exited(self) -> list[str]:
        return [f"{name} (pid {p.pid}) exited with code {p.returncode}"
                for name, p in self.processes.items() if p.poll() is not None]  # fmt: skip

    def wait_assigned(self, timeout_s: float, check) -> bool:
        """Until every member was given its assignment (an empty one when N > partitions)."""

        def assigned():
            check()
            self.update()
            return all(any(e["e"] == "a" for e in events) for events in self.events.values())

        return bool(wait_until(assigned, timeout_s, 0.05))

    def wait_drained(self, acks, high_watermarks: dict[int, int], log_starts: dict[int, int],
                     timeout_s: float, check) -> bool:  # fmt: skip
        """Until every acknowledged record at or above its partition's log start offset was
        consumed and every partition committed up to its high watermark, or timeout_s (the
        faults are over; the checker says what is missing). Records below the log start were
        deleted (retention, DeleteRecords) and no consumer can read them any more."""
        wanted = {(a.partition, a.offset, a.value) for a in acks
                  if a.offset >= log_starts.get(a.partition, 0)}  # fmt: skip

        def drained():
            check()
            self.update()
            return wanted <= self.consumed and all(
                self.committed.get(p, 0) >= hw for p, hw in high_watermarks.items() if hw > 0
            )

        return bool(wait_until(drained, timeout_s, 0.1))

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (each member closes: LeaveGroup), then SIGKILL to the process group of any
        member still running at the deadline."""
        for process in self.processes.values():
            if process.poll() is None:
                cluster.send_signal(process.pid, signal.SIGCONT)  # a paused one must see the TERM
                cluster.send_signal(process.pid, signal.SIGTERM)
        wait_until(
            lambda: all(p.poll() is not None for p in self.processes.values()), timeout_s, 0.05
        )
        for process in self.processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        self.update()

    def fetch_committed(
        self, timeout_s: float = FETCH_TIMEOUT_S
    ) -> tuple[dict[int, int] | None, str]:
        """The group's committed offsets of the topic from OffsetFetch (confluent's AdminClient
        list_consumer_group_offsets), or None and why, retried until timeout_s."""
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            {**client_settings(self.cluster_dir), "bootstrap.servers": self.bootstrap}
        )
        deadline = time.monotonic() + timeout_s
        why = ""
        while time.monotonic() < deadline:
            request = [ConsumerGroupTopicPartitions(self.group)]
            try:
                found = admin.list_consumer_group_offsets(request)[self.group].result(10)
            except KafkaException as e:
                why = error_text(e.args[0])
                time.sleep(0.2)  # a coordinator moving: ask again (bounded by the deadline)
                continue
            errors = [error_text(tp.error) for tp in found.topic_partitions if tp.error is not None]
            if errors:
                why = "; ".join(errors)
                time.sleep(0.2)
                continue
            return {tp.partition: tp.offset for tp in found.topic_partitions
                    if tp.topic == self.topic and tp.offset >= 0}, ""  # fmt: skip
        return None, why or f"no answer within {timeout_s:.0f} s"


if __name__ == "__main__":
    sys.exit(main())
