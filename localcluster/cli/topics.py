"""`localcluster topic`: create, list, describe, alter, producers, delete."""

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
    """Create, list, describe, alter and delete topics."""


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
@click.option("--all-configs", is_flag=True,
              help="List every config with its source, not only the topic's overrides.")  # fmt: skip
@dir_option
@json_option
@friendly
def topic_describe(name, all_configs, cluster_dir, as_json):
    """Leader, leader epoch, replicas and ISR of each partition of NAME, and its configs with
    their source (DYNAMIC_TOPIC_CONFIG: set on the topic; otherwise the broker's default)."""
    from localcluster.tools import cluster_admin, cluster_view

    directory, spec = cluster_spec(cluster_dir)
    described = cluster_admin.describe_topic(spec, name)
    if as_json:
        print_json(described)
    else:
        cluster_view.topic(described)
        cluster_view.topic_configs(described, all_configs)


@topic.command("alter")
@click.argument("name")
@click.option("--config", "config", multiple=True, metavar="KEY=VALUE",
              callback=assignments("retention.ms=60000"),
              help="Set a config on the topic (repeatable), e.g. retention.ms=60000.")  # fmt: skip
@click.option("--delete-config", multiple=True, metavar="KEY",
              help="Remove the topic's override (repeatable): the broker's default applies.")  # fmt: skip
@dir_option
@json_option
@friendly
def topic_alter(name, config, delete_config, cluster_dir, as_json):
    """Change NAME's configs live (IncrementalAlterConfigs): every replica's broker applies
    them without a restart. A bad value changes nothing."""
    from localcluster.tools import cluster_admin

    if not config and not delete_config:
        raise click.UsageError("nothing to change: give --config KEY=VALUE or --delete-config KEY")
    directory, spec = cluster_spec(cluster_dir)
    result = cluster_admin.alter_topic(spec, name, config, list(delete_config))
    if as_json:
        print_json(result)
    else:
        overrides = ", ".join(f"{k}={v}" for k, v in result["overrides"].items()) or "none"
        click.echo(f"altered topic {name}; its overrides now: {overrides}")


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
