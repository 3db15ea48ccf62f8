"""Requests to the controller about partitions: elect (preferred or unclean) and reassign, sent
as the Admin API's ElectLeaders and AlterPartitionReassignments with our own client."""

from __future__ import annotations

import click

from localcluster import cluster
from localcluster.cli.options import cluster_spec, dir_option, friendly, json_option, print_json


@click.command()
@click.argument("target", required=False, metavar="[TOPIC[:PARTITION]]")
@click.option("--preferred", "kind", flag_value="preferred", help="Move leadership to AR's head.")
@click.option("--unclean", "kind", flag_value="unclean", help="Elect an out-of-sync replica.")
@dir_option
@json_option
@friendly
def elect(target, kind, cluster_dir, as_json):
    """Ask the controller for leader elections (all partitions, a topic or one partition)."""
    from localcluster.tools import cluster_admin

    if kind is None:
        raise click.UsageError("say which election: --preferred or --unclean")
    directory, spec = cluster_spec(cluster_dir)
    result = cluster_admin.elect(spec, target, unclean=kind == "unclean")
    if as_json:
        print_json(result)
        return
    what = ("unclean election (partitions without a live leader only; records may be lost)"
            if kind == "unclean" else "preferred replica election")  # fmt: skip
    click.echo(f"{what} requested for {len(result['partitions'])} partitions")
    outcomes: dict[str, int] = {}
    for p in result["partitions"]:
        outcomes[p["error"] or "elected"] = outcomes.get(p["error"] or "elected", 0) + 1
    click.echo(", ".join(f"{what.lower()}: {n}" for what, n in sorted(outcomes.items())))
    if result["controller"] is None:
        click.echo(
            "note: no controller is running, so nothing happens until one is elected", err=True
        )


@click.command()
@click.argument("target", metavar="TOPIC:PARTITION")
@click.option(
    "--replicas", required=True, metavar="A,B,C", help="The new replica list, leader first."
)
@dir_option
@json_option
@friendly
def reassign(target, replicas, cluster_dir, as_json):
    """Move a partition's replicas (AlterPartitionReassignments; the controller moves them)."""
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
    directory, spec = cluster_spec(cluster_dir)
    result = cluster_admin.reassign(spec, topic_name, partition, replica_list)
    if as_json:
        print_json(result)
        return
    click.echo(f"reassignment of {topic_name}:{partition} to replicas {replicas} requested")
    if result["controller"] is None:
        click.echo(
            "note: no controller is running, so nothing happens until one is elected", err=True
        )
