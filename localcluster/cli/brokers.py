"""One broker at a time: kill (any signal), start, shutdown (SIGTERM) and logs."""

from __future__ import annotations

import sys

import click

from localcluster import cluster
from localcluster.cli.options import (
    broker_id_of,
    cluster_spec,
    dir_option,
    friendly,
    json_option,
    print_json,
)
from localcluster.cluster import ClusterError

_SIGNALS = ["KILL", "TERM", "STOP", "CONT", "INT", "HUP"]


@click.command()
@click.argument("broker")
@click.option("-s", "--signal", "signal_name", default="KILL", show_default=True,
              type=click.Choice(_SIGNALS, case_sensitive=False))  # fmt: skip
@click.option("--timeout", "timeout_s", default=20.0, show_default=True, type=click.FloatRange(0.1))
@dir_option
@json_option
@friendly
def kill(broker, signal_name, timeout_s, cluster_dir, as_json):
    """Send a signal to BROKER: an id, `controller` or `leader:TOPIC:PARTITION`."""
    from localcluster.tools import cluster_admin

    directory, spec = cluster_spec(cluster_dir)
    broker_id = broker_id_of(broker, directory, spec)
    result = cluster_admin.stop_broker(
        directory, broker_id, cluster.parse_signal(signal_name), timeout_s
    )
    if as_json:
        print_json(result)
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
@dir_option
@json_option
@friendly
def start(broker, timeout_s, cluster_dir, as_json):
    """Start BROKER again (same id, same data) and wait until it registered."""
    from localcluster.tools import cluster_admin

    directory, spec = cluster_spec(cluster_dir)
    broker_id = broker_id_of(broker, directory, spec)
    result = cluster_admin.start_broker(directory, spec, broker_id, timeout_s)
    if as_json:
        print_json(result)
    else:
        click.echo(
            f"broker {broker_id} started (pid {result['pid']}) on {result['host']}:{result['port']}"
        )


@click.command()
@click.argument("broker")
@click.option("--timeout", "timeout_s", default=cluster.STOP_TIMEOUT_S, show_default=True,
              type=click.FloatRange(0.1))  # fmt: skip
@dir_option
@json_option
@friendly
def shutdown(broker, timeout_s, cluster_dir, as_json):
    """Stop BROKER cleanly (SIGTERM: with controlled.shutdown.enable, leaders move first)."""
    import signal

    from localcluster.tools import cluster_admin

    directory, spec = cluster_spec(cluster_dir)
    broker_id = broker_id_of(broker, directory, spec)
    result = cluster_admin.stop_broker(directory, broker_id, signal.SIGTERM, timeout_s)
    if as_json:
        print_json(result)
    elif result["exited"]:
        click.echo(f"broker {broker_id} (pid {result['pid']}) shut down")
    if not result["exited"]:
        click.echo(f"error: broker {broker_id} still runs {timeout_s:g} s after SIGTERM; "
                   f"`localcluster kill {broker_id}` ends it", err=True)  # fmt: skip
        sys.exit(1)


@click.command()
@click.argument("broker")
@click.option("-f", "--follow", "keep_following", is_flag=True, help="Keep printing new lines.")
@click.option("-n", "--lines", default=50, show_default=True, type=click.IntRange(0))
@dir_option
@friendly
def logs(broker, keep_following, lines, cluster_dir):
    """Print BROKER's log (its stdout and stderr)."""
    from localcluster.tools import cluster_admin

    directory, spec = cluster_spec(cluster_dir)
    broker_id = broker_id_of(broker, directory, spec)
    path = cluster.log_file(directory, broker_id)
    if not path.exists() and not keep_following:
        raise ClusterError(f"broker {broker_id} has no log yet ({path}); has it ever started?")
    try:
        cluster_admin.follow(path, lambda text: click.echo(text, nl=False), lines, keep_following)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how -f ends
