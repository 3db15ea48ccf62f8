"""The whole-cluster commands: up, status, down.

Each parses, calls cluster.py / supervisor.py / tools/cluster_admin.py, and renders with
tools/cluster_view.py. `--json` prints data for scripts on stdout.
"""

from __future__ import annotations

from pathlib import Path

import click

from localcluster import cluster
from localcluster.cli.options import (
    cluster_spec,
    dir_option,
    drop_stdout,
    echo_while_read,
    friendly,
    json_option,
    print_json,
)
from localcluster.cluster import ClusterError


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
@dir_option
@json_option
@friendly
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
            print_json(state)
        else:
            cluster_view.ready(state, controller, detached=True)
        return
    supervisor = Supervisor(directory, spec, emit=echo_while_read)
    supervisor.install_signals()
    try:
        supervisor.start()
        controller = supervisor.wait_ready(timeout_s)
    except BaseException:
        supervisor.shutdown(10.0)
        raise
    try:
        cluster_view.ready(cluster.status(directory, spec), controller, detached=False)
    except BrokenPipeError:
        drop_stdout()  # the reader left already: on without output, as echo_while_read
    try:
        supervisor.run()
    finally:
        echo_while_read("stopping the cluster ...")
        result = supervisor.shutdown()
    killed = result["killed"]
    echo_while_read(
        "cluster stopped" + (f" (SIGKILLed after the deadline: {killed})" if killed else "")
    )


@click.command()
@click.option("--watch", is_flag=True, help="A live view with rates from the metrics board.")
@click.option("--interval", "interval_s", default=1.0, show_default=True, type=click.FloatRange(0.1),
              help="Seconds between refreshes with --watch.")  # fmt: skip
@click.option("--count", "refreshes", default=None, type=click.IntRange(1), hidden=True,
              help="Stop --watch after this many refreshes (for scripts and tests).")  # fmt: skip
@dir_option
@json_option
@friendly
def status(watch, interval_s, refreshes, cluster_dir, as_json):
    """Brokers, controller, partitions (leader, epoch, AR, ISR, CUR, RAR, LEO/HW), groups (coordinator, lag)."""
    from localcluster.tools import cluster_view

    directory, spec = cluster_spec(cluster_dir)
    if watch:
        cluster_view.watch(directory, spec, interval_s, refreshes, as_json)
        return
    state = cluster_view.with_groups(cluster.status(directory, spec), spec)
    if as_json:
        print_json(state)
    else:
        cluster_view.status(state)


@click.command()
@click.option("--purge", is_flag=True, help="Also remove the cluster dir and the brokers' data.")
@click.option("--timeout", "timeout_s", default=cluster.STOP_TIMEOUT_S, show_default=True,
              type=click.FloatRange(0.1), help="Seconds before stragglers get SIGKILL.")  # fmt: skip
@dir_option
@json_option
@friendly
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
    result = cluster_admin.stop_cluster(directory, spec, timeout_s, purging=purge)
    if purge:
        chroot = cluster_admin.purge_coordination(spec)
        result["purged"] = cluster.purge(directory, spec) + ([chroot] if chroot else [])
    _report_down(result, as_json)


def _report_down(result: dict, as_json: bool) -> None:
    if as_json:
        print_json(result)
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
