"""What every cluster command shares: the --dir and --json options, the error face
(a ClusterError or a client error becomes one line on stderr and exit code 1; click's usage
errors exit 2) and loading the cluster's spec.
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


def dir_option(f):
    return click.option("--dir", "cluster_dir", envvar="LOCALCLUSTER_DIR", default=cluster.DEFAULT_DIR,
                        show_default=True, type=click.Path(file_okay=False),
                        help="The cluster directory (env LOCALCLUSTER_DIR).")(f)  # fmt: skip


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")(f)


def friendly(f):
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


def assignments(example: str):
    """A click callback: repeated KEY=VALUE options to a dict, by broker/config.py's parser
    (the one key=value rule); a bad one is a usage error (exit 2)."""

    def parse(ctx, param, values) -> dict[str, str]:
        from localcluster.broker.config import ConfigError, parse_assignments

        try:
            return parse_assignments(values, option="", example=example)
        except ConfigError as e:
            raise click.BadParameter(str(e)) from None

    return parse


def echo_while_read(line: str) -> None:
    """click.echo for a command that must go on when nobody reads its output any more.

    `localcluster up | tee up.log` and Ctrl-C: the signal stops tee too, and the supervisor's
    next line ("stopping the cluster ...") would raise BrokenPipeError before it stopped a
    single broker. From the first broken pipe on, stdout goes to /dev/null instead (the
    buffered rest with it) and the command carries on."""
    try:
        click.echo(line)
    except BrokenPipeError:
        drop_stdout()


def drop_stdout() -> None:
    """Send the rest of stdout (buffered or to come) to /dev/null: its reader is gone."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def print_json(value) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def cluster_spec(cluster_dir: str):
    directory = cluster.resolve_dir(cluster_dir)
    return directory, cluster.load_spec(directory)


def broker_id_of(target: str, directory: Path, spec) -> int:
    return cluster.resolve_broker(target, directory, spec)
