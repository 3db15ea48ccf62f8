"""What the CLI's data commands do: topics, produce, consume, elections, reassignment, up.

Talks to brokers with localcluster's own client (bootstrapped from the registrations in the
store, so it works with either backend): elections and reassignments through the Admin API
(ElectLeaders, AlterPartitionReassignments), and it writes /admin/delete_topics/<t> (Kafka's
znode) for a topic deletion. Faults raise ClusterError with one line;
nothing here prints except `consume`, which streams records to the given writer.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from localcluster import cluster
from localcluster.cluster import ClusterError, ClusterSpec

CLIENT_TIMEOUT_MS = 15_000


def live_bootstrap(spec: ClusterSpec) -> str:
    with cluster.store(spec) as client:
        regs = cluster.registrations(client)
    if not regs:
        raise ClusterError("no broker is running; start the cluster with `localcluster up` "
                           "or a broker with `localcluster start ID`")  # fmt: skip
    return cluster.bootstrap_servers(regs)


def client_config(spec: ClusterSpec) -> dict[str, str]:
    """Our client's settings for the cluster's TCP listeners: its SASL login, if any."""
    from localcluster.tools.sasl_setup import client_settings

    return client_settings(spec)


def _kafka_error(e: Exception, context: str) -> ClusterError:
    from kio.schema.errors import ErrorCode

    code = getattr(e, "code", None)
    hints = {
        ErrorCode.unknown_topic_or_partition: "`localcluster topic list` shows the topics",
        ErrorCode.topic_already_exists: "pick another name or `localcluster topic describe` it",
        ErrorCode.invalid_replication_factor: "use at most as many replicas as live brokers "
                                              "(`localcluster status`)",
        ErrorCode.not_enough_replicas: "fewer live in-sync replicas than min.insync.replicas; "
                                       "start brokers or use --acks 1",
    }  # fmt: skip
    hint = hints.get(code, "")
    return ClusterError(f"{context}: {e}" + (f"; {hint}" if hint else ""))


def _admin(spec: ClusterSpec):
    from localcluster.client import Admin, KafkaError

    try:
        return Admin(client_config(spec), bootstrap_servers=live_bootstrap(spec),
                     request_timeout_ms=CLIENT_TIMEOUT_MS)  # fmt: skip
    except KafkaError as e:
        raise ClusterError(f"cannot reach the brokers: {e}") from None


@contextlib.contextmanager
def admin_calls(spec: ClusterSpec, context: str):
    """Our Admin client on the cluster's live brokers, closed after the block; a KafkaError
    in the block becomes one ClusterError line: `context`, the broker's error, a hint."""
    from localcluster.client import KafkaError

    admin = _admin(spec)
    try:
        yield admin
    except KafkaError as e:
        raise _kafka_error(e, context) from None
    finally:
        admin.close()


# -- topics -------------------------------------------------------------------------------------


def create_topic(spec: ClusterSpec, name: str, partitions: int, replication_factor: int,
                 config: dict[str, str]) -> dict:  # fmt: skip

    with admin_calls(spec, f"cannot create topic {name!r}") as admin:
        admin.create_topic(name, partitions, replication_factor, config)
        description = admin.wait_for_leaders(name, timeout_s=CLIENT_TIMEOUT_MS / 1000)
    return describe_rows(description)


def list_topics(spec: ClusterSpec) -> list[str]:

    with admin_calls(spec, "cannot list topics") as admin:
        return admin.list_topics()


def describe_topic(spec: ClusterSpec, name: str) -> dict:
    """Partitions, and every config with its value and source (kafka-configs --describe --all)."""

    with admin_calls(spec, f"cannot describe topic {name!r}") as admin:
        description = admin.describe_topic(name)
        configs = admin.describe_configs(name)
    described = describe_rows(description)
    described["configs"] = [{"name": k, "value": v.value, "source": v.source,
                             "read_only": v.read_only} for k, v in sorted(configs.items())]  # fmt: skip
    return described


def alter_topic(spec: ClusterSpec, name: str, set_configs: dict[str, str],
                delete: list[str]) -> dict:  # fmt: skip
    """Set and delete a topic's config overrides; the topic's overrides afterwards."""

    with admin_calls(spec, f"cannot alter the config of topic {name!r}") as admin:
        admin.alter_topic_configs(name, set_configs, delete)
        configs = admin.describe_configs(name)
    overrides = {k: v.value for k, v in sorted(configs.items())
                 if v.source == "DYNAMIC_TOPIC_CONFIG"}  # fmt: skip
    return {"topic": name, "set": set_configs, "deleted": delete, "overrides": overrides}


def describe_producers(spec: ClusterSpec, name: str) -> dict:
    """Each partition's active idempotent producers, from its leader (DescribeProducers)."""

    with admin_calls(spec, f"cannot describe the producers of topic {name!r}") as admin:
        producers = admin.describe_producers(name)
    return {"topic": name, "partitions": [{"partition": p, "producers": rows}
                                          for p, rows in sorted(producers.items())]}  # fmt: skip


def describe_rows(description) -> dict:
    return {"topic": description.name, "partitions": [
        {"partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
         "replicas": list(p.replicas), "isr": list(p.isr),
         "offline_replicas": list(p.offline_replicas)}
        for p in sorted(description.partitions, key=lambda p: p.partition)]}  # fmt: skip


def delete_topic(spec: ClusterSpec, name: str) -> dict:
    """Write /admin/delete_topics/<name>; the controller deletes the topic."""
    from localcluster.coord.kafka_zk import KafkaZkClient

    with cluster.store(spec) as client:
        if name not in cluster.topics(client):
            raise ClusterError(
                f"unknown topic {name!r}; `localcluster topic list` shows the topics"
            )
        already = not KafkaZkClient(client).request_topic_deletion(name)
        controller = cluster.controller_id(client)
    return {"topic": name, "already_pending": already, "controller": controller}


# -- produce and consume ------------------------------------------------------------------------


def parse_acks(text: str) -> int:
    value = {"all": -1, "-1": -1, "0": 0, "1": 1}.get(text.strip().lower())
    if value is None:
        raise ValueError(f"--acks {text!r}: use all (-1), 1 or 0")
    return value


def produce(spec: ClusterSpec, topic: str, lines: Iterable[str], *, key: str | None,
            key_separator: str | None, partition: int | None, acks: int,
            timeout_ms: int, compression: str = "none") -> dict:  # fmt: skip
    """Send each line as a record; returns {"records", "partitions": {p: [first, last]},
    "errors", "first_error"}."""
    from localcluster.client import KafkaError, Producer

    try:
        producer = Producer({**client_config(spec), "compression.type": compression},
                            bootstrap_servers=live_bootstrap(spec), acks=acks,
                            delivery_timeout_ms=timeout_ms,
                            request_timeout_ms=min(timeout_ms, CLIENT_TIMEOUT_MS),
                            max_block_ms=timeout_ms)  # fmt: skip
    except KafkaError as e:
        raise ClusterError(f"cannot reach the brokers: {e}") from None
    futures = []
    try:
        for line in lines:
            value = line.rstrip("\n")
            record_key = key
            if key_separator and key_separator in value:
                record_key, value = value.split(key_separator, 1)
            futures.append(producer.send(topic, value.encode(),
                                         key=record_key.encode() if record_key is not None else None,
                                         partition=partition))  # fmt: skip
        try:
            producer.flush(timeout_ms / 1000 + 5)
        except TimeoutError:
            pass
    finally:
        producer.close(5)
    offsets: dict[int, list[int]] = {}
    errors = 0
    first_error = None
    for future in futures:
        try:
            p, offset = future.result(timeout=0)
        except Exception as e:  # KafkaError, TimeoutError, a cancelled future
            errors += 1
            first_error = first_error or (str(e) or type(e).__name__)
            continue
        span = offsets.setdefault(p, [offset, offset])
        span[0], span[1] = min(span[0], offset), max(span[1], offset)
    return {"topic": topic, "records": len(futures) - errors, "errors": errors,
            "first_error": first_error,
            "partitions": {str(p): span for p, span in sorted(offsets.items())}}  # fmt: skip


def consume(spec: ClusterSpec, topic: str, write: Callable[[object], None], *,
            from_beginning: bool, partitions: list[int] | None, max_messages: int | None,
            idle_timeout_ms: int | None) -> int:  # fmt: skip
    """Stream records (ConsumerRecord) to write() until max_messages, an idle timeout or
    Ctrl-C; returns how many were written."""
    from localcluster.client import Consumer, KafkaError

    described = describe_topic(spec, topic)
    known = [p["partition"] for p in described["partitions"]]
    chosen = known if not partitions else partitions
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise ClusterError(f"topic {topic!r} has no partition {unknown[0]}; it has "
                           f"{', '.join(map(str, known))}")  # fmt: skip
    try:
        consumer = Consumer(client_config(spec), bootstrap_servers=live_bootstrap(spec),
                            auto_offset_reset="earliest" if from_beginning else "latest",
                            request_timeout_ms=CLIENT_TIMEOUT_MS)  # fmt: skip
    except KafkaError as e:
        raise ClusterError(f"cannot reach the brokers: {e}") from None
    count = 0
    try:
        consumer.assign([(topic, p) for p in chosen])
        if from_beginning:
            consumer.seek_to_beginning()
        last = time.monotonic()
        while max_messages is None or count < max_messages:
            records = consumer.poll(200)
            if records:
                last = time.monotonic()
            for record in records:
                write(record)
                count += 1
                if max_messages is not None and count >= max_messages:
                    break
            if idle_timeout_ms is not None and (time.monotonic() - last) * 1000 >= idle_timeout_ms:
                break
    except KafkaError as e:
        raise _kafka_error(e, f"consuming {topic!r} failed after {count} records") from None
    except KeyboardInterrupt:
        pass
    finally:
        try:
            consumer.close()
        except Exception:  # closing after Ctrl-C or a broker loss must not hide the count
            pass
    return count


# -- elections and reassignment -----------------------------------------------------------------


def _partitions_for(client, target: str | None) -> list[tuple[str, int]]:
    if target is None:
        rows = cluster.partition_states(client)
    else:
        topic, sep, partition = target.rpartition(":")
        if not sep:
            topic, partition = target, None
        elif not partition.isdigit():
            raise ClusterError(f"{target!r}: write TOPIC or TOPIC:PARTITION (e.g. orders:0)")
        if topic not in cluster.topics(client):
            raise ClusterError(
                f"unknown topic {topic!r}; `localcluster topic list` shows the topics"
            )
        rows = [r for r in cluster.partition_states(client, [topic])
                if partition is None or r["partition"] == int(partition)]  # fmt: skip
        if not rows:
            raise ClusterError(f"topic {topic!r} has no partition {partition}")
    return [(r["topic"], r["partition"]) for r in rows]


def elect(spec: ClusterSpec, target: str | None, unclean: bool = False) -> dict:
    """ElectLeaders through our Admin client (preferred, or unclean); the controller elects and
    the answer says per partition what happened (ELECTION_NOT_NEEDED: it leads already)."""

    with cluster.store(spec) as client:
        chosen = _partitions_for(client, target)
        controller = cluster.controller_id(client)
    if not chosen:
        raise ClusterError("there are no partitions to elect leaders for; create a topic first")
    with admin_calls(spec, "cannot elect leaders") as admin:
        results = admin.elect_leaders(chosen, unclean=unclean, timeout_ms=CLIENT_TIMEOUT_MS)
    return {
        "partitions": [{"topic": t, "partition": p, "error": _error_name(results.get((t, p), -1))}
                       for t, p in chosen],
        "controller": controller,
    }  # fmt: skip


def _error_name(code: int) -> str | None:
    from kio.schema.errors import ErrorCode

    if code == 0:
        return None
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)


def reassign(spec: ClusterSpec, topic: str, partition: int, replicas: list[int]) -> dict:
    """AlterPartitionReassignments through our Admin client: answered once the controller took
    the target up; it moves the replicas (`localcluster status` shows RAR until done)."""

    if len(set(replicas)) != len(replicas):
        raise ClusterError(f"--replicas {','.join(map(str, replicas))} names a broker twice")
    unknown = sorted(set(replicas) - set(spec.brokers))
    if unknown:
        raise ClusterError(f"--replicas names unknown broker {unknown[0]}; this cluster has "
                           f"brokers {', '.join(map(str, spec.brokers))}")  # fmt: skip
    with cluster.store(spec) as client:
        _partitions_for(client, f"{topic}:{partition}")
        controller = cluster.controller_id(client)
    with admin_calls(spec, f"cannot reassign {topic}:{partition}") as admin:
        admin.alter_partition_reassignments({(topic, partition): replicas},
                                            timeout_ms=CLIENT_TIMEOUT_MS)  # fmt: skip
    return {"topic": topic, "partition": partition, "replicas": replicas, "controller": controller}


# -- up --detach, start, stop -------------------------------------------------------------------


def launch_detached(cluster_dir: Path, spec: ClusterSpec, timeout_s: float,
                    controller_grace_s: float) -> int | None:  # fmt: skip
    """Start `python -m localcluster.supervisor` in its own session and wait until the
    cluster is ready. Returns the controller id (None when none appeared)."""
    cluster.remove_pid_files(cluster_dir, spec)
    log_path = cluster_dir / cluster.SUPERVISOR_LOG
    process = cluster.spawn_supervisor(cluster_dir)
    deadline = time.monotonic() + timeout_s

    def supervisor_failed() -> str | None:
        if process.poll() is not None:
            last = cluster.tail(log_path, 1).strip()
            return (f"the supervisor exited (code {process.returncode})"
                    + (f": {last.split('  ', 1)[-1]}" if last else "") + f"; see {log_path}")  # fmt: skip
        return None

    try:
        while True:
            pids = {b: cluster.read_pid(cluster.pid_file(cluster_dir, b)) for b in spec.brokers}
            if all(pids.values()):
                break
            problem = supervisor_failed()
            if problem:
                raise ClusterError(problem)
            if time.monotonic() > deadline:
                raise ClusterError(f"the supervisor did not start the brokers within {timeout_s:.0f} s; "
                                   f"see {log_path}")  # fmt: skip
            time.sleep(0.02)
        cluster.wait_registered(
            spec, pids, max(deadline - time.monotonic(), 1.0), supervisor_failed
        )
    except ClusterError:
        stop_cluster(cluster_dir, spec, 10.0)
        raise
    finally:
        process.returncode = process.returncode if process.returncode is not None else 0
    return cluster.wait_controller(spec, controller_grace_s)


def start_broker(cluster_dir: Path, spec: ClusterSpec, broker_id: int, timeout_s: float) -> dict:
    pid = cluster.broker_pid(cluster_dir, broker_id)
    if pid is not None:
        raise ClusterError(f"broker {broker_id} is already running (pid {pid}); "
                           f"`localcluster kill {broker_id}` first to restart it")  # fmt: skip
    from localcluster.metrics.segment import create_segment

    create_segment(cluster_dir)  # gone if `down` ran; `down` removes it again
    (cluster_dir / cluster.STOPPING_FILE).unlink(missing_ok=True)  # left by a `down` cut short
    process = cluster.spawn_broker(cluster_dir, spec, broker_id)

    def failed() -> str | None:
        if process.poll() is not None:
            last = cluster.tail(cluster.log_file(cluster_dir, broker_id), 1).strip()
            return (f"broker {broker_id} exited while starting (exit code {process.returncode})"
                    + (f": {last}" if last else "")
                    + f"; `localcluster logs {broker_id}` has the rest")  # fmt: skip
        return None

    try:
        regs = cluster.wait_registered(spec, {broker_id: process.pid}, timeout_s, failed)
    except ClusterError:
        if process.poll() is None:
            process.kill()
            process.wait()
        raise
    process.returncode = 0  # it outlives us; nothing to reap here
    reg = regs[broker_id]
    return {"id": broker_id, "pid": process.pid, "host": reg.host, "port": reg.port}


def stop_cluster(cluster_dir: Path, spec: ClusterSpec, timeout_s: float,
                 purging: bool = False) -> dict:  # fmt: skip
    """`down`: SIGTERM the supervisor and every broker, wait, SIGKILL who is left. When
    `purging`, the stopping marker stays until the purge removes the directory with it."""
    from localcluster.metrics.segment import unlink_segment

    # The marker first: a chaos or perf run restarting a broker checks it (ClusterWatch) and
    # gives up instead of starting one behind our back; one it started a moment before is
    # caught by the second look below.
    marker = cluster_dir / cluster.STOPPING_FILE
    marker.touch()
    supervisor = cluster.supervisor_pid(cluster_dir)
    if supervisor is not None:
        cluster.send_signal(supervisor, signal.SIGTERM)
    live = cluster.live_brokers(cluster_dir, spec)
    stale = [str(p) for p in cluster.stale_pid_files(cluster_dir, spec)]
    result = cluster.stop_brokers(cluster_dir, live, timeout_s, cluster.current_controller(spec))
    late = cluster.live_brokers(cluster_dir, spec)  # started while the others stopped
    if late:
        more = cluster.stop_brokers(cluster_dir, late, timeout_s, None)
        for key in ("stopped", "killed"):
            result[key] = sorted(set(result[key]) | set(more[key]))
    if supervisor is not None and cluster.wait_gone([supervisor], timeout_s):
        cluster.send_signal(supervisor, signal.SIGKILL)
        cluster.wait_gone([supervisor], 5.0)
    cluster.remove_pid_files(cluster_dir, spec)
    if (
        cluster.read_pid(cluster_dir / cluster.SUPERVISOR_PID) is not None
        and cluster.supervisor_pid(cluster_dir) is None
    ):
        (cluster_dir / cluster.SUPERVISOR_PID).unlink(missing_ok=True)
    unlink_segment(cluster_dir)
    if not purging:
        marker.unlink(missing_ok=True)
    result.update(supervisor=supervisor, stale_pid_files=stale)
    return result


def stop_broker(cluster_dir: Path, broker_id: int, signum: int, timeout_s: float) -> dict:
    pid = cluster.broker_pid(cluster_dir, broker_id)
    if pid is None:
        raise ClusterError(f"broker {broker_id} is not running; `localcluster start {broker_id}` "
                           "starts it")  # fmt: skip
    if signum == signal.SIGSTOP:
        sent = cluster.pause(cluster.load_spec(cluster_dir), pid)
    else:
        sent = cluster.send_signal(pid, signum)
    if not sent:
        raise ClusterError(f"broker {broker_id} (pid {pid}) exited before the signal")
    gone = None
    if signum in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
        if signum != signal.SIGKILL and cluster.process_state(pid) == "T":
            cluster.send_signal(pid, signal.SIGCONT)
        gone = not cluster.wait_gone([pid], timeout_s)
    return {"id": broker_id, "pid": pid, "signal": cluster.signal_name(signum), "exited": gone}


def follow(path: Path, write: Callable[[str], None], lines: int, keep_following: bool,
           poll_s: float = 0.2) -> None:  # fmt: skip
    """Print the last `lines` lines of path, then (keep_following) what is appended, until
    Ctrl-C. A truncated or replaced file is read again from its start."""
    text = cluster.tail(path, lines)
    if text:
        write(text + "\n")
    if not keep_following:
        return
    try:
        position = path.stat().st_size
        inode = path.stat().st_ino
    except FileNotFoundError:
        position, inode = 0, None
    try:
        while True:
            try:
                stat = path.stat()
            except FileNotFoundError:
                time.sleep(poll_s)
                continue
            if stat.st_ino != inode or stat.st_size < position:
                position, inode = 0, stat.st_ino
            if stat.st_size > position:
                with open(path, "rb") as f:
                    f.seek(position)
                    chunk = f.read(1 << 20)
                position += len(chunk)
                write(chunk.decode(errors="replace"))
            else:
                time.sleep(poll_s)
    except KeyboardInterrupt:
        pass


def split_chroot(spec: str) -> tuple[str, str | None]:
    """zookeeper://hosts/chroot -> (zookeeper://hosts, /chroot); (spec, None) otherwise."""
    if not spec.startswith("zookeeper://"):
        return spec, None
    hosts, sep, chroot = spec[len("zookeeper://") :].partition("/")
    return f"zookeeper://{hosts}", (f"/{chroot.strip('/')}" if sep and chroot.strip("/") else None)


def prepare_sasl(cluster_dir: Path, spec: ClusterSpec) -> dict[str, str]:
    """Credentials for a SASL_PLAINTEXT cluster (tools/sasl_setup.py), before any broker."""
    from localcluster.coord.kafka_zk import KafkaZkClient
    from localcluster.tools.sasl_setup import setup_sasl

    with cluster.store(spec) as client:
        return setup_sasl(cluster_dir, KafkaZkClient(client))


def prepare_coordination(spec: ClusterSpec) -> None:
    """A ZooKeeper chroot must exist before brokers use it; the file store creates itself."""
    from localcluster import coord

    root, chroot = split_chroot(spec.coordination)
    if chroot is None:
        return
    try:
        client = coord.connect(root)
    except Exception as e:
        raise ClusterError(f"cannot reach ZooKeeper at {root}: {e}") from None
    try:
        client.ensure_path(chroot)
    finally:
        client.stop()


def purge_coordination(spec: ClusterSpec) -> str | None:
    """`down --purge` with ZooKeeper: delete the cluster's chroot (never ZooKeeper's root)."""
    from localcluster import coord

    root, chroot = split_chroot(spec.coordination)
    if chroot is None:
        return None
    try:
        client = coord.connect(root)
        try:
            client.delete(chroot, recursive=True)
        finally:
            client.stop()
    except coord.NoNodeError:
        return None
    except Exception as e:
        raise ClusterError(f"could not delete {chroot} in ZooKeeper at {root}: {e}") from None
    return f"{root}{chroot}"


def coordination_spec(cluster_dir: Path, zookeeper: str | None) -> str:
    if not zookeeper:
        return str(cluster_dir / "store")
    hosts = zookeeper.removeprefix("zookeeper://")
    return f"zookeeper://{hosts}"
