"""Run one broker in the foreground.

    python -m localcluster.broker --id N --cluster-dir DIR [--set key=value ...]
    python -m localcluster.broker --config server.properties [--override key=value ...]

The first is how `localcluster up` runs brokers that share a cluster dir on one host; the second
is how Kafka runs a broker (`kafka-server-start.sh server.properties --override k=v`): the
properties file alone, with a real ZooKeeper at `zookeeper.connect`.
"""
# ruff: noqa: E402  (hypothesis is blocked below before the other imports)

from __future__ import annotations

import sys

# kio registers hypothesis strategies whenever hypothesis is importable (as in a test venv):
# about 0.25 s and, in a fresh directory, a 2 s Unicode table per broker start. A broker never
# needs them, so hypothesis is made unimportable here, before anything imports kio.
sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]

import asyncio
import logging
from pathlib import Path

import click

from localcluster.broker.config import (
    BrokerConfig,
    ConfigError,
    parse_assignments,
    read_properties_file,
)


def _event_loop_runner():
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A Kafka-style server.properties: the broker needs nothing else.")  # fmt: skip
@click.option("--id", "broker_id", type=click.IntRange(0, 2**31 - 1),
              help="broker.id of this broker (or broker.id in --config).")  # fmt: skip
@click.option("--cluster-dir", type=click.Path(file_okay=False, path_type=Path),
              help="The cluster directory shared by brokers on this host (store, checkpoints, "
                   "sockets); not with --config.")  # fmt: skip
@click.option("--set", "--override", "settings", multiple=True, metavar="KEY=VALUE",
              help="A broker property, Kafka's name (repeatable), e.g. min.insync.replicas=2; "
                   "overrides --config.")  # fmt: skip
@click.option("--coordination", default=None, metavar="SPEC",
              help="Store directory or zookeeper://host:port (default: <cluster-dir>/store).")  # fmt: skip
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))  # fmt: skip
def main(config_file: Path | None, broker_id: int | None, cluster_dir: Path | None,
         settings: tuple[str, ...], coordination: str | None, log_level: str) -> None:  # fmt: skip
    """Run one localcluster broker in the foreground until SIGTERM or Ctrl-C."""
    if config_file is None and (broker_id is None or cluster_dir is None):
        raise click.UsageError("give --config server.properties, or --id N and --cluster-dir DIR")
    if config_file is not None and cluster_dir is not None:
        raise click.UsageError("--config runs a broker on its own; drop --cluster-dir")
    try:
        properties = read_properties_file(config_file) if config_file is not None else {}
        properties.update(parse_assignments(settings))
        if broker_id is not None:
            properties["broker.id"] = str(broker_id)
        config = BrokerConfig.from_properties(properties)
    except ConfigError as e:
        _config_error(config_file, e)
    logging.basicConfig(level=log_level.upper(),
                        format=f"%(asctime)s broker-{config.broker_id} %(levelname)s %(name)s: %(message)s")  # fmt: skip
    from localcluster.broker.server import BrokerServer
    from localcluster.heap import keep_freed_memory

    keep_freed_memory()

    try:
        server = BrokerServer(config, cluster_dir.resolve() if cluster_dir else None, coordination)
    except ConfigError as e:
        _config_error(config_file, e)
    try:
        _event_loop_runner()(server.run())
    except (RuntimeError, OSError) as e:
        click.echo(f"broker {config.broker_id}: {e}", err=True)
        sys.exit(1)


def _config_error(config_file: Path | None, error: ConfigError) -> None:
    """On the command line a bad property is a usage error (exit 2, as click's); from a
    server.properties it is one line naming the file, exit 1 (the command line was fine)."""
    if config_file is None:
        raise click.UsageError(str(error))
    click.echo(f"broker configuration error in {config_file}: {error}", err=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
