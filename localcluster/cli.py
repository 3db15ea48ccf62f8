"""The `localcluster` command: parse arguments, call into the package, render the result.

No protocol or storage logic lives here; each command is a thin face over a module
(cluster.py, supervisor.py, tools/cluster_admin.py, tools/cluster_view.py). Every cluster
command takes --dir (or LOCALCLUSTER_DIR; default ./.localcluster). Exit codes: 0 ok,
1 failure (one line saying what is wrong and what to do), 2 usage (click's own).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from localcluster import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="localcluster")
@click.option("-v", "--verbose", count=True, help="More log lines (-v info, -vv debug).")
def main(verbose: int) -> None:
    """localcluster: Apache Kafka's replication protocol as real processes on one host.

    Brokers keep memory-mapped segment logs of Kafka record batches, replicate over Unix
    sockets and coordinate through a ZooKeeper-like store; real Kafka clients talk to them.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--records", default=200_000, show_default=True, type=click.IntRange(1, 50_000_000),
              help="Records to append in the first step.")  # fmt: skip
@click.option("--kills", default=5, show_default=True, type=click.IntRange(0, 100),
              help="How many times a writer process is killed with SIGKILL mid-append.")  # fmt: skip
def demo(records: int, kills: int) -> None:
    """Show the storage engine at work: append, read, kill -9 a writer, recover."""
    from localcluster.tools.storage_demo import run_demo

    sys.exit(run_demo(records=records, kills=kills))


@main.group()
def log() -> None:
    """Inspect partition logs on disk."""


@log.command("dump")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--records", "show_records", is_flag=True, help="Also print each record.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(0),
              help="Batches to print per segment (0: all).")  # fmt: skip
def log_dump(directory: Path, show_records: bool, limit: int) -> None:
    """Print the segments and batches of the log in DIRECTORY, read-only.

    Like kafka-dump-log: offsets, positions, leader epochs, timestamps and CRC checks.
    """
    from localcluster.tools.log_dump import dump

    sys.exit(dump(directory, show_records=show_records, limit=limit))


from localcluster.cli_cluster import register  # noqa: E402  (the cluster commands)
from localcluster.tools.chaos_command import chaos  # noqa: E402
from localcluster.tools.perf_command import perf  # noqa: E402

register(main)
main.add_command(perf)
main.add_command(chaos)

if __name__ == "__main__":
    main()
