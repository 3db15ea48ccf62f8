"""`python -m localcluster.broker --id N --cluster-dir DIR [--set key=value ...]`."""
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

from localcluster.broker.config import BrokerConfig, ConfigError, parse_assignments


def _event_loop_runner():
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--id", "broker_id", required=True, type=click.IntRange(0, 2**31 - 1),
              help="broker.id of this broker.")  # fmt: skip
@click.option("--cluster-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The cluster directory (store, checkpoints, sockets).")  # fmt: skip
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="A broker property, Kafka's name (repeatable), e.g. min.insync.replicas=2.")  # fmt: skip
@click.option("--coordination", default=None, metavar="SPEC",
              help="Store directory or zookeeper://host:port (default: <cluster-dir>/store).")  # fmt: skip
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))  # fmt: skip
def main(broker_id: int, cluster_dir: Path, settings: tuple[str, ...], coordination: str | None,
         log_level: str) -> None:  # fmt: skip
    """Run one localcluster broker in the foreground until SIGTERM or Ctrl-C."""
    logging.basicConfig(level=log_level.upper(),
                        format=f"%(asctime)s broker-{broker_id} %(levelname)s %(name)s: %(message)s")  # fmt: skip
    try:
        config = BrokerConfig.from_properties(parse_assignments(settings), broker_id=broker_id)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    from localcluster.broker.server import BrokerServer

    server = BrokerServer(config, cluster_dir.resolve(), coordination)
    try:
        _event_loop_runner()(server.run())
    except RuntimeError as e:
        click.echo(f"broker {broker_id}: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
