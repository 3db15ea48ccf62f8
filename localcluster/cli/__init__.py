"""The `localcluster` command: parse arguments, call into the package, render the result.

One module per command group, each a thin face over the engines (cluster.py, supervisor.py,
tools/): cluster (up, status, down), brokers (kill, start, shutdown, logs), broker_configs
(broker describe, alter), partitions
(elect, reassign), topics, groups (consumer groups), records (produce, consume), storage
(demo, log dump), perf and chaos; options holds what the cluster commands share. No protocol or storage logic lives
here. Every cluster command takes --dir (or LOCALCLUSTER_DIR; default ./.localcluster).
Exit codes: 0 ok, 1 failure (one line saying what is wrong and what to do), 2 usage
(click's own).
"""

from __future__ import annotations

import logging

import click

from localcluster import __version__
from localcluster.cli import (
    broker_configs,
    brokers,
    chaos,
    cluster,
    groups,
    partitions,
    perf,
    records,
    storage,
    topics,
)


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


for _command in (
    cluster.up, cluster.status, cluster.down,
    brokers.kill, brokers.start, brokers.shutdown, brokers.logs,
    partitions.elect, partitions.reassign,
    topics.topic, broker_configs.broker, groups.groups,
    records.produce, records.consume,
    storage.demo, storage.log,
    perf.perf, chaos.chaos,
):  # fmt: skip
    main.add_command(_command)
