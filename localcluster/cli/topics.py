"""`localcluster topic`: create, list, describe, producers, delete."""

from __future__ import annotations

import click

from localcluster.cli.options import (
    assignments,
    cluster_spec,
    dir_option,
    friendly,
    json_option,
    print_json,
)


@click.group()
def topic() -> None:
    """Create, list, describe and delete topics."""


@topic.command("create")
@click.argument("name")
@click.option("-p", "--partitions", default=1, show_default=True, type=click.IntRange(1))
@click.option("-r", "--replication-factor", default=1, show_default=True, type=click.IntRange(1))
@click.option("--config", "config", multiple=True, metavar="KEY=VALUE",
              callback=assignments("min.insync.replicas=2"),
              help="A topic config (repeatable), e.g. min.insync.replicas=2.")  # fmt: skip
@dir_option
@json_option
@friendly
def topic_create(name, partitions, replication_factor, config, cluster_dir, as_json):
    """Create topic NAME and wait until every partition has a leader."""
    from localcluster.tools import cluster_admin, cluster_view

    directory, spec = cluster_spec(cluster_dir)
    described = cluster_admin.create_topic(spec, name, partitions, replication_factor, config)
    if as_json:
        print_json(described)
    else:
        click.echo(f"created topic {name}: {partitions} partitions, replication factor "
                   f"{replication_factor}")  # fmt: skip
        cluster_view.topic(described)


@topic.command("list")
@dir_option
@json_option
@friendly
def topic_list(cluster_dir, as_json):
    """List the topics."""
    from localcluster.tools import cluster_admin

    directory, spec = cluster_spec(cluster_dir)
    names = cluster_admin.list_topics(spec)
    if as_json:
        print_json(names)
    else:
        for name in names:
            click.echo(name)


@topic.command("describe")
@click.argument("name")
@dir_option
@json_option
@friendly
def topic_describe(name, cluster_dir, as_json):
    """Leader, leader epoch, replicas and ISR of each partition of NAME."""
    from localcluster.tools import cluster_admin, cluster_view

    directory, spec = cluster_spec(cluster_dir)
    described = cluster_admin.describe_topic(spec, name)
    if as_json:
        print_json(described)
    else:
        cluster_view.topic(described)


@topic.command("producers")
@click.argument("name")
@dir_option
@json_option
@friendly
def topic_producers(name, cluster_dir, as_json):
    """The idempotent producers each partition's leader knows: id, epoch, last sequence
    (Kafka's DescribeProducers)."""
    from localcluster.tools import cluster_admin, cluster_view

    _, spec = cluster_spec(cluster_dir)
    described = cluster_admin.describe_producers(spec, name)
    if as_json:
        print_json(described)
    else:
        cluster_view.producers(described)


@topic.command("delete")
@click.argument("name")
@dir_option
@json_option
@friendly
def topic_delete(name, cluster_dir, as_json):
    """Ask the controller to delete NAME (writes /admin/delete_topics/NAME)."""
    from localcluster.tools import cluster_admin

    directory, spec = cluster_spec(cluster_dir)
    result = cluster_admin.delete_topic(spec, name)
    if as_json:
        print_json(result)
        return
    if result["already_pending"]:
        click.echo(f"deletion of topic {name} is already pending")
    else:
        click.echo(f"deletion of topic {name} requested; the controller deletes it")
    if result["controller"] is None:
        click.echo(
            "note: no controller is running, so nothing happens until one is elected", err=True
        )
