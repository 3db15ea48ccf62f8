"""The cluster commands of `localcluster`: up, status, topic, produce, consume, kill, start,
shutdown, elect, reassign, logs, down. Registered on cli.main by `register`.

Each command parses, calls cluster.py / supervisor.py / tools/cluster_admin.py, and renders
with tools/cluster_view.py. A ClusterError becomes one line on stderr and exit code 1; click's
usage errors exit 2. `--json` prints data for scripts on stdout.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import click

from localcluster import cluster
from localcluster.cluster import ClusterError


def _dir_option(f):
    return click.option("--dir", "cluster_dir", envvar="LOCALCLUSTER_DIR", default=cluster.DEFAULT_DIR,
                        show_default=True, type=click.Path(file_okay=False),
                        help="The cluster directory (env LOCALCLUSTER_DIR).")(f)  # fmt: skip


def _json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")(f)


def _friendly(f):
    """ClusterError (and client errors) -> one line on stderr, exit 1; no traceback."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        # Before the client imports kio (and so hypothesis, where installed): see child_env.
        os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", cluster.hypothesis_cache())
        try:
            return f(*args, **kwargs)
        except ClusterError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            sys.exit(130)
        except Exception as e:
            # Client errors, without importing the client for commands that never use it.
            client = sys.modules.get("localcluster.client")
            if client is not None and isinstance(e, client.KafkaError):
                click.echo(f"error: {e}", err=True)
                sys.exit(1)
            raise

    return wrapper


def _print_json(value) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def _spec(cluster_dir: str):
    directory = cluster.resolve_dir(cluster_dir)
    return directory, cluster.load_spec(directory)


def _broker_arg(target: str, directory: Path, spec) -> int:
    return cluster.resolve_broker(target, directory, spec)


def register(main: click.Group) -> None:
    for command in (
        up,
        status,
        produce,
        consume,
        kill,
        start,
        shutdown,
        elect,
        reassign,
        logs,
        down,
    ):
        main.add_command(command)
    main.add_command(topic)


# -- up -----------------------------------------------------------------------------------------


def _parse_up(count: int, racks: str | None, settings: tuple[str, ...]):
    from localcluster.broker.config import BrokerConfig, ConfigError, parse_assignments

    try:
        properties = parse_assignments(settings)
        BrokerConfig.from_properties(properties, broker_id=0)
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--set") from None
    for reserved, instead in (("broker.id", "--brokers"), ("broker.rack", "--racks"),
                              ("listeners", "--port-base and --listener-protocol"),
                              ("advertised.listeners", "--port-base"), ("port", "--port-base")):  # fmt: skip
        if reserved in properties:
            raise click.BadParameter(f"{reserved} is set per broker by `up` (use {instead})",
                                     param_hint="--set")  # fmt: skip
    rack_list: list[str | None] = [None] * count
    if racks:
        rack_list = [r.strip() or None for r in racks.split(",")]
        if len(rack_list) != count:
            raise click.BadParameter(f"{len(rack_list)} racks for {count} brokers; give one rack "
                                     "per broker, e.g. --racks a,a,b", param_hint="--racks")  # fmt: skip
    return properties, rack_list


@click.command()
@click.option("-n", "--brokers", "count", default=3, show_default=True, type=click.IntRange(1, 128),
              help="How many brokers (ids 0..N-1).")  # fmt: skip
@click.option("--racks", metavar="R0,R1,...", help="broker.rack of each broker, e.g. a,a,b,b,c.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="A broker property for every broker (repeatable), Kafka's names.")  # fmt: skip
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where partition logs live (default: /dev/shm).")  # fmt: skip
@click.option("--detach", is_flag=True, help="Run the supervisor in the background and return.")
@click.option("--zookeeper", metavar="HOST:PORT[/CHROOT]",
              help="Use a real ZooKeeper instead of the store in --dir (a chroot keeps clusters apart).")  # fmt: skip
@click.option("--port-base", type=click.IntRange(1, 65535), default=None,
              help="Broker N listens on PORT+N (default: free ports chosen now); either way "
                   "the ports are kept for the cluster's lifetime.")  # fmt: skip
@click.option("--listener-protocol", type=click.Choice(["PLAINTEXT", "SASL_PLAINTEXT"],
                                                       case_sensitive=False),
              default="PLAINTEXT", show_default=True,
              help="What clients speak on the TCP ports; SASL_PLAINTEXT creates users and "
                   "prints the client settings.")  # fmt: skip
@click.option("--timeout", "timeout_s", default=cluster.READY_TIMEOUT_S, show_default=True,
              type=click.FloatRange(1), help="Seconds to wait for the brokers.")  # fmt: skip
@_dir_option
@_json_option
@_friendly
def up(count, racks, settings, data_dir, detach, zookeeper, port_base, listener_protocol,
       timeout_s, cluster_dir, as_json):  # fmt: skip
    """Start a cluster of N brokers and wait until it is ready.

    In the foreground it streams events (brokers dying, controller moves, leader elections,
    ISR changes) until Ctrl-C, which stops the cluster; --detach returns once it is ready.
    """
    import time

    from localcluster.supervisor import CONTROLLER_GRACE_S, Supervisor
    from localcluster.tools import cluster_admin, cluster_view

    properties, rack_list = _parse_up(count, racks, settings)
    directory = cluster.resolve_dir(cluster_dir)
    if cluster.spec_path(directory).exists():
        old = cluster.load_spec(directory)
        if cluster.is_running(directory, old):
            live = sorted(cluster.live_brokers(directory, old))
            supervisor = cluster.supervisor_pid(directory)
            raise ClusterError(
                f"a cluster is already running in {directory} (brokers alive: "
                f"{', '.join(map(str, live)) or 'none'}"
                + (f", supervisor pid {supervisor}" if supervisor else "")
                + "); nothing changed. `localcluster status` shows it, `localcluster down` stops it"
            )
    if port_base is not None and port_base + count - 1 > 65535:
        raise click.BadParameter(f"{port_base} + {count} brokers passes port 65535",
                                 param_hint="--port-base")  # fmt: skip
    ports = (list(range(port_base, port_base + count)) if port_base is not None
             else cluster.free_ports(count))  # fmt: skip
    spec = cluster.ClusterSpec(
        brokers=list(range(count)), racks=dict(enumerate(rack_list)), settings=properties,
        coordination=cluster_admin.coordination_spec(directory, zookeeper),
        data_dir=str(data_dir.resolve()) if data_dir else None, created_ms=int(time.time() * 1000),
        ports=dict(enumerate(ports)), listener_protocol=listener_protocol.upper())  # fmt: skip
    if spec.listener_protocol == "SASL_PLAINTEXT":
        from localcluster.tools.sasl_setup import client_properties_path

        spec.client_properties = str(client_properties_path(directory))
    cluster_admin.prepare_coordination(spec)
    cluster.save_spec(directory, spec)
    if spec.listener_protocol == "SASL_PLAINTEXT":
        cluster_admin.prepare_sasl(directory, spec)
    if detach:
        controller = cluster_admin.launch_detached(directory, spec, timeout_s, CONTROLLER_GRACE_S)
        state = cluster.status(directory, spec)
        if as_json:
            _print_json(state)
        else:
            cluster_view.ready(state, controller, detached=True)
        return
    supervisor = Supervisor(directory, spec, emit=lambda line: click.echo(line))
    supervisor.install_signals()
    try:
        supervisor.start()
        controller = supervisor.wait_ready(timeout_s)
    except BaseException:
        supervisor.shutdown(10.0)
        raise
    cluster_view.ready(cluster.status(directory, spec), controller, detached=False)
    try:
        supervisor.run()
    finally:
        click.echo("stopping the cluster ...")
        result = supervisor.shutdown()
    killed = result["killed"]
    click.echo("cluster stopped" + (f" (SIGKILLed after the deadline: {killed})" if killed else ""))


# -- status -------------------------------------------------------------------------------------


@click.command()
@click.option("--watch", is_flag=True, help="A live view with rates from the metrics board.")
@click.option("--interval", "interval_s", default=1.0, show_default=True, type=click.FloatRange(0.1),
              help="Seconds between refreshes with --watch.")  # fmt: skip
@click.option("--count", "refreshes", default=None, type=click.IntRange(1), hidden=True,
              help="Stop --watch after this many refreshes (for scripts and tests).")  # fmt: skip
@_dir_option
@_json_option
@_friendly
def status(watch, interval_s, refreshes, cluster_dir, as_json):
    """Brokers, controller, partitions (leader, epoch, AR, ISR, CUR, RAR, LEO/HW)."""
    from localcluster.tools import cluster_view

    directory, spec = _spec(cluster_dir)
    if watch:
        cluster_view.watch(directory, spec, interval_s, refreshes, as_json)
        return
    state = cluster.status(directory, spec)
    if as_json:
        _print_json(state)
    else:
        cluster_view.status(state)


# -- topics -------------------------------------------------------------------------------------


@click.group()
def topic() -> None:
    """Create, list, describe and delete topics."""


def _configs(items: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: expected key=value, e.g. min.insync.replicas=2",
                                     param_hint="--config")  # fmt: skip
        out[key.strip()] = value.strip()
    return out


@topic.command("create")
@click.argument("name")
@click.option("-p", "--partitions", default=1, show_default=True, type=click.IntRange(1))
@click.option("-r", "--replication-factor", default=1, show_default=True, type=click.IntRange(1))
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE",
              help="A topic config (repeatable), e.g. min.insync.replicas=2.")  # fmt: skip
@_dir_option
@_json_option
@_friendly
def topic_create(name, partitions, replication_factor, configs, cluster_dir, as_json):
    """Create topic NAME and wait until every partition has a leader."""
    from localcluster.tools import cluster_admin, cluster_view

    config = _configs(configs)
    directory, spec = _spec(cluster_dir)
    described = cluster_admin.create_topic(spec, name, partitions, replication_factor, config)
    if as_json:
        _print_json(described)
    else:
        click.echo(f"created topic {name}: {partitions} partitions, replication factor "
                   f"{replication_factor}")  # fmt: skip
        cluster_view.topic(described)


@topic.command("list")
@_dir_option
@_json_option
@_friendly
def topic_list(cluster_dir, as_json):
    """List the topics."""
    from localcluster.tools import cluster_admin

    directory, spec = _spec(cluster_dir)
    names = cluster_admin.list_topics(spec)
    if as_json:
        _print_json(names)
    else:
        for name in names:
            click.echo(name)


@topic.command("describe")
@click.argument("name")
@_dir_option
@_json_option
@_friendly
def topic_describe(name, cluster_dir, as_json):
    """Leader, leader epoch, replicas and ISR of each partition of NAME."""
    from localcluster.tools import cluster_admin, cluster_view

    directory, spec = _spec(cluster_dir)
    described = cluster_admin.describe_topic(spec, name)
    if as_json:
        _print_json(described)
    else:
        cluster_view.topic(described)


@topic.command("producers")
@click.argument("name")
@_dir_option
@_json_option
@_friendly
def topic_producers(name, cluster_dir, as_json):
    """The idempotent producers each partition's leader knows: id, epoch, last sequence
    (Kafka's DescribeProducers)."""
    from localcluster.tools import cluster_admin, cluster_view

    _, spec = _spec(cluster_dir)
    described = cluster_admin.describe_producers(spec, name)
    if as_json:
        _print_json(described)
    else:
        cluster_view.producers(described)


@topic.command("delete")
@click.argument("name")
@_dir_option
@_json_option
@_friendly
def topic_delete(name, cluster_dir, as_json):
    """Ask the controller to delete NAME (writes /admin/delete_topics/NAME)."""
    from localcluster.tools import cluster_admin

    directory, spec = _spec(cluster_dir)
    result = cluster_admin.delete_topic(spec, name)
    if as_json:
        _print_json(result)
        return
    if result["already_pending"]:
        click.echo(f"deletion of topic {name} is already pending")
    else:
        click.echo(f"deletion of topic {name} requested; the controller deletes it")
    if result["controller"] is None:
        click.echo(
            "note: no controller is running, so nothing happens until one is elected", err=True
        )


# -- produce and consume ------------------------------------------------------------------------


@click.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--key", default=None, help="The key of every record.")
@click.option("--key-separator", default=None, metavar="SEP",
              help="Split each line at SEP into key and value.")  # fmt: skip
@click.option("--partition", default=None, type=click.IntRange(0), help="Send to this partition.")
@click.option(
    "--acks", default="all", show_default=True, type=click.Choice(["all", "-1", "0", "1"])
)
@click.option("--timeout", "timeout_s", default=30.0, show_default=True, type=click.FloatRange(0.1),
              help="delivery.timeout.ms, in seconds.")  # fmt: skip
@_dir_option
@_json_option
@_friendly
def produce(topic_name, key, key_separator, partition, acks, timeout_s, cluster_dir, as_json):
    """Send each line of stdin to TOPIC as one record."""
    from localcluster.tools import cluster_admin

    directory, spec = _spec(cluster_dir)
    result = cluster_admin.produce(
        spec, topic_name, sys.stdin, key=key, key_separator=key_separator, partition=partition,
        acks=cluster_admin.parse_acks(acks), timeout_ms=int(timeout_s * 1000))  # fmt: skip
    if as_json:
        _print_json(result)
    else:
        spans = ", ".join(
            f"partition {p}: offsets {a}..{b}" for p, (a, b) in result["partitions"].items()
        )
        click.echo(f"produced {result['records']} records to {topic_name}"
                   + (f" ({spans})" if spans else ""), err=True)  # fmt: skip
    if result["errors"]:
        click.echo(f"error: {result['errors']} records failed: {result['first_error']}", err=True)
        sys.exit(1)


@click.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--from-beginning", is_flag=True, help="Start at each partition's first offset.")
@click.option("--partition", "partitions", multiple=True, type=click.IntRange(0),
              help="Read only this partition (repeatable).")  # fmt: skip
@click.option("--max-messages", default=None, type=click.IntRange(1), help="Stop after this many.")
@click.option("--timeout-ms", "idle_timeout_ms", default=None, type=click.IntRange(1),
              help="Stop after this long without a record.")  # fmt: skip
@click.option("--print-key", is_flag=True, help="Print KEY<TAB>VALUE.")
@click.option("--print-offset", is_flag=True, help="Prefix PARTITION:OFFSET<TAB>.")
@_dir_option
@_json_option
@_friendly
def consume(topic_name, from_beginning, partitions, max_messages, idle_timeout_ms, print_key,
            print_offset, cluster_dir, as_json):  # fmt: skip
    """Print TOPIC's records, one per line (--json: one JSON object per line)."""
    from localcluster.tools import cluster_admin

    directory, spec = _spec(cluster_dir)

    def text(data: bytes | None) -> str | None:
        return None if data is None else data.decode(errors="replace")

    def write(record) -> None:
        if as_json:
            click.echo(json.dumps({"partition": record.partition, "offset": record.offset,
                                   "key": text(record.key), "value": text(record.value),
                                   "timestamp": record.timestamp}))  # fmt: skip
            return
        line = text(record.value) or ""
        if print_key:
            line = f"{text(record.key) or ''}\t{line}"
        if print_offset:
            line = f"{record.partition}:{record.offset}\t{line}"
        click.echo(line)

    count = cluster_admin.consume(spec, topic_name, write, from_beginning=from_beginning,
                                  partitions=list(partitions) or None, max_messages=max_messages,
                                  idle_timeout_ms=idle_timeout_ms)  # fmt: skip
    click.echo(f"processed a total of {count} messages", err=True)


# -- breaking and mending -----------------------------------------------------------------------

_SIGNALS = ["KILL", "TERM", "STOP", "CONT", "INT", "HUP"]


@click.command()
@click.argument("broker")
@click.option("-s", "--signal", "signal_name", default="KILL", show_default=True,
              type=click.Choice(_SIGNALS, case_sensitive=False))  # fmt: skip
@click.option("--timeout", "timeout_s", default=20.0, show_default=True, type=click.FloatRange(0.1))
@_dir_option
@_json_option
@_friendly
def kill(broker, signal_name, timeout_s, cluster_dir, as_json):
    """Send a signal to BROKER: an id, `controller` or `leader:TOPIC:PARTITION`."""
    from localcluster.tools import cluster_admin

    directory, spec = _spec(cluster_dir)
    broker_id = _broker_arg(broker, directory, spec)
    result = cluster_admin.stop_broker(
        directory, broker_id, cluster.parse_signal(signal_name), timeout_s
    )
    if as_json:
        _print_json(result)
        return
    what = {"SIGKILL": "killed", "SIGTERM": "stopped", "SIGSTOP": "paused", "SIGCONT": "resumed"}
    click.echo(f"broker {broker_id} (pid {result['pid']}) {what.get(result['signal'], 'signalled')} "
               f"with {result['signal']}")  # fmt: skip
    if result["signal"] == "SIGSTOP":
        click.echo(f"`localcluster kill {broker_id} --signal CONT` resumes it")
    if result["exited"] is False:
        click.echo(
            f"error: broker {broker_id} still runs {timeout_s:g} s after {result['signal']}",
            err=True,
        )
        sys.exit(1)


@click.command()
@click.argument("broker")
@click.option("--timeout", "timeout_s", default=cluster.READY_TIMEOUT_S, show_default=True,
              type=click.FloatRange(1))  # fmt: skip
@_dir_option
@_json_option
@_friendly
def start(broker, timeout_s, cluster_dir, as_json):
    """Start BROKER again (same id, same data) and wait until it registered."""
    from localcluster.tools import cluster_admin

    directory, spec = _spec(cluster_dir)
    broker_id = _broker_arg(broker, directory, spec)
    result = cluster_admin.start_broker(directory, spec, broker_id, timeout_s)
    if as_json:
        _print_json(result)
    else:
        click.echo(
            f"broker {broker_id} started (pid {result['pid']}) on {result['host']}:{result['port']}"
        )


@click.command()
@click.argument("broker")
@click.option("--timeout", "timeout_s", default=cluster.STOP_TIMEOUT_S, show_default=True,
              type=click.FloatRange(0.1))  # fmt: skip
@_dir_option
@_json_option
@_friendly
def shutdown(broker, timeout_s, cluster_dir, as_json):
    """Stop BROKER cleanly (SIGTERM: with controlled.shutdown.enable, leaders move first)."""
    import signal

    from localcluster.tools import cluster_admin

    directory, spec = _spec(cluster_dir)
    broker_id = _broker_arg(broker, directory, spec)
    result = cluster_admin.stop_broker(directory, broker_id, signal.SIGTERM, timeout_s)
    if as_json:
        _print_json(result)
    elif result["exited"]:
        click.echo(f"broker {broker_id} (pid {result['pid']}) shut down")
    if not result["exited"]:
        click.echo(f"error: broker {broker_id} still runs {timeout_s:g} s after SIGTERM; "
                   f"`localcluster kill {broker_id}` ends it", err=True)  # fmt: skip
        sys.exit(1)


@click.command()
@click.argument("target", required=False, metavar="[TOPIC[:PARTITION]]")
@click.option("--preferred", "kind", flag_value="preferred", help="Move leadership to AR's head.")
@click.option("--unclean", "kind", flag_value="unclean", help="Elect an out-of-sync replica.")
@_dir_option
@_json_option
@_friendly
def elect(target, kind, cluster_dir, as_json):
    """Ask the controller for leader elections (all partitions, a topic or one partition)."""
    from localcluster.tools import cluster_admin

    if kind is None:
        raise click.UsageError("say which election: --preferred or --unclean")
    directory, spec = _spec(cluster_dir)
    result = cluster_admin.elect(spec, target, unclean=kind == "unclean")
    if as_json:
        _print_json(result)
        return
    what = ("unclean election (partitions without a live leader only; records may be lost)"
            if kind == "unclean" else "preferred replica election")  # fmt: skip
    click.echo(f"{what} requested for {len(result['partitions'])} partitions")
    if result["controller"] is None:
        click.echo(
            "note: no controller is running, so nothing happens until one is elected", err=True
        )


@click.command()
@click.argument("target", metavar="TOPIC:PARTITION")
@click.option(
    "--replicas", required=True, metavar="A,B,C", help="The new replica list, leader first."
)
@_dir_option
@_json_option
@_friendly
def reassign(target, replicas, cluster_dir, as_json):
    """Move a partition's replicas (writes /admin/reassign_partitions)."""
    from localcluster.tools import cluster_admin

    try:
        topic_name, partition = cluster.parse_topic_partition(target)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="TOPIC:PARTITION") from None
    try:
        replica_list = [int(r) for r in replicas.split(",")]
    except ValueError:
        raise click.BadParameter(f"{replicas!r}: expected broker ids like 3,4,0",
                                 param_hint="--replicas") from None  # fmt: skip
    directory, spec = _spec(cluster_dir)
    result = cluster_admin.reassign(spec, topic_name, partition, replica_list)
    if as_json:
        _print_json(result)
        return
    click.echo(f"reassignment of {topic_name}:{partition} to replicas {replicas} requested")
    if result["controller"] is None:
        click.echo(
            "note: no controller is running, so nothing happens until one is elected", err=True
        )


@click.command()
@click.argument("broker")
@click.option("-f", "--follow", "keep_following", is_flag=True, help="Keep printing new lines.")
@click.option("-n", "--lines", default=50, show_default=True, type=click.IntRange(0))
@_dir_option
@_friendly
def logs(broker, keep_following, lines, cluster_dir):
    """Print BROKER's log (its stdout and stderr)."""
    from localcluster.tools import cluster_admin

    directory, spec = _spec(cluster_dir)
    broker_id = _broker_arg(broker, directory, spec)
    path = cluster.log_file(directory, broker_id)
    if not path.exists() and not keep_following:
        raise ClusterError(f"broker {broker_id} has no log yet ({path}); has it ever started?")
    try:
        cluster_admin.follow(path, lambda text: click.echo(text, nl=False), lines, keep_following)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how -f ends


@click.command()
@click.option("--purge", is_flag=True, help="Also remove the cluster dir and the brokers' data.")
@click.option("--timeout", "timeout_s", default=cluster.STOP_TIMEOUT_S, show_default=True,
              type=click.FloatRange(0.1), help="Seconds before stragglers get SIGKILL.")  # fmt: skip
@_dir_option
@_json_option
@_friendly
def down(purge, timeout_s, cluster_dir, as_json):
    """Stop every broker (SIGTERM, then SIGKILL after --timeout); --purge removes all data."""
    from localcluster.tools import cluster_admin

    directory = cluster.resolve_dir(cluster_dir)
    try:
        spec = cluster.load_spec(directory)
    except ClusterError:
        if purge and directory.exists():
            removed = cluster.purge(directory, None)
            _report_down({"stopped": [], "killed": [], "purged": removed}, as_json)
            return
        raise
    result = cluster_admin.stop_cluster(directory, spec, timeout_s)
    if purge:
        chroot = cluster_admin.purge_coordination(spec)
        result["purged"] = cluster.purge(directory, spec) + ([chroot] if chroot else [])
    _report_down(result, as_json)


def _report_down(result: dict, as_json: bool) -> None:
    if as_json:
        _print_json(result)
        return
    stopped, killed = result["stopped"], result["killed"]
    if not stopped and not killed:
        click.echo("no broker was running")
    if stopped:
        click.echo(f"stopped brokers {', '.join(map(str, stopped))}")
    if killed:
        click.echo(f"SIGKILLed brokers {', '.join(map(str, killed))} (they ignored SIGTERM)")
    if result.get("stale_pid_files"):
        click.echo(f"removed {len(result['stale_pid_files'])} stale pid files")
    if result.get("purged"):
        click.echo(f"removed {', '.join(result['purged'])}")
