"""The storage engine's commands: `demo` (append, read, kill -9 a writer, recover) and
`log dump` (a partition log on disk, read-only, like kafka-dump-log)."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command()
@click.option("--records", default=200_000, show_default=True, type=click.IntRange(1, 50_000_000),
              help="Records to append in the first step.")  # fmt: skip
@click.option("--kills", default=5, show_default=True, type=click.IntRange(0, 100),
              help="How many times a writer process is killed with SIGKILL mid-append.")  # fmt: skip
def demo(records: int, kills: int) -> None:
    """Show the storage engine at work: append, read, kill -9 a writer, recover."""
    from localcluster.tools.storage_demo import run_demo

    sys.exit(run_demo(records=records, kills=kills))


@click.group()
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
