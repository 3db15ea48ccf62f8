"""`localcluster broker describe | alter`: broker properties and their dynamic layers.

`describe ID` shows a broker's properties with their source (DescribeConfigs asked of that
broker), `describe --default` the cluster-wide dynamic layer; `alter ID|--default --config k=v
--delete-config k` changes a layer live (IncrementalAlterConfigs on a BROKER resource), as
`kafka-configs.sh --entity-type brokers` does. Only the log defaults topics inherit are dynamic;
the broker refuses the rest and a bad value with one line, changing nothing.
"""

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
def broker() -> None:
    """Describe a broker's properties and change the dynamic ones live."""


def _target(broker_id: int | None, default: bool) -> int | None:
    if (broker_id is None) == (not default):
        raise click.UsageError("name one broker ID or --default (the cluster-wide layer)")
    return broker_id


def _rows(configs: dict) -> list[dict]:
    return [{"name": k, "value": v.value, "source": v.source, "dynamic": not v.read_only}
            for k, v in sorted(configs.items())]  # fmt: skip


@broker.command("describe")
@click.argument("broker_id", metavar="[ID]", required=False, type=int)
@click.option("--default", "default", is_flag=True,
              help="The cluster-wide dynamic layer (/config/brokers/<default>) alone.")  # fmt: skip
@click.option("--all", "every", is_flag=True,
              help="Every property, not only the dynamic ones and those set.")  # fmt: skip
@dir_option
@json_option
@friendly
def broker_describe(broker_id, default, every, cluster_dir, as_json):
    """Broker ID's properties, each with its value and source (DYNAMIC_BROKER_CONFIG,
    DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG or DEFAULT_CONFIG)."""
    from localcluster.tools import cluster_admin

    target = _target(broker_id, default)
    _, spec = cluster_spec(cluster_dir)
    what = "the cluster-wide default" if target is None else f"broker {target}"
    with cluster_admin.admin_calls(spec, f"cannot describe {what}") as admin:
        rows = _rows(admin.describe_broker_configs(target))
    if not every:
        rows = [r for r in rows if r["dynamic"] or r["source"] != "DEFAULT_CONFIG"]
    if as_json:
        print_json({"broker": target, "configs": rows})
    else:
        _print(rows, what)


def _print(rows: list[dict], what: str) -> None:
    from rich.table import Table

    from localcluster.tools.cluster_view import console

    if not rows:
        console().print(f"{what}: nothing set")
        return
    table = Table(title=f"configs of {what}", title_justify="left")
    for name in ("name", "value", "source", "dynamic"):
        table.add_column(name, no_wrap=True)
    for r in rows:
        table.add_row(r["name"], "-" if r["value"] is None else r["value"], r["source"],
                      "yes" if r["dynamic"] else "no")  # fmt: skip
    console().print(table)


@broker.command("alter")
@click.argument("broker_id", metavar="[ID]", required=False, type=int)
@click.option("--default", "default", is_flag=True,
              help="Change the cluster-wide layer, which every broker falls back to.")  # fmt: skip
@click.option("--config", "config", multiple=True, metavar="KEY=VALUE",
              callback=assignments("log.retention.ms=60000"),
              help="Set a dynamic property (repeatable), e.g. log.retention.ms=60000.")  # fmt: skip
@click.option("--delete-config", multiple=True, metavar="KEY",
              help="Remove a property from the layer (repeatable).")  # fmt: skip
@dir_option
@json_option
@friendly
def broker_alter(broker_id, default, config, delete_config, cluster_dir, as_json):
    """Change broker ID's dynamic properties, or the cluster-wide ones (--default), live:
    every topic without an override of its own takes the new value on every broker."""
    from localcluster.tools import cluster_admin

    target = _target(broker_id, default)
    if not config and not delete_config:
        raise click.UsageError("nothing to change: give --config KEY=VALUE or --delete-config KEY")
    _, spec = cluster_spec(cluster_dir)
    what = "the cluster-wide default" if target is None else f"broker {target}"
    with cluster_admin.admin_calls(spec, f"cannot alter {what}") as admin:
        admin.alter_broker_configs(target, config, list(delete_config))
        layer = admin.describe_broker_configs(None) if target is None else {
            k: v for k, v in admin.describe_broker_configs(target).items()
            if v.source == "DYNAMIC_BROKER_CONFIG"}  # fmt: skip
    now = {k: v.value for k, v in sorted(layer.items())}
    if as_json:
        print_json({"broker": target, "set": config, "deleted": list(delete_config),
                    "layer": now})  # fmt: skip
    else:
        shown = ", ".join(f"{k}={v}" for k, v in now.items()) or "none"
        click.echo(f"altered {what}; its dynamic configs now: {shown}")
