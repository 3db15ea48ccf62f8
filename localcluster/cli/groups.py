"""`localcluster groups`: list, describe, delete, reset-offsets (kafka-consumer-groups.sh's jobs).

The engines are in tools/group_admin.py; here the options and the tables (rich, through
cluster_view's console, so a pipe gets them at natural width).
"""

from __future__ import annotations

import click

from localcluster.cli.options import cluster_spec, dir_option, friendly, json_option, print_json


def _cell(value) -> str:
    return "-" if value is None or value == "" else str(value)


def _partitions(parts) -> str:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in parts:
        by_topic.setdefault(topic, []).append(partition)
    return " ".join(f"{t}:{','.join(map(str, sorted(ps)))}" for t, ps in sorted(by_topic.items()))


@click.group()
def groups() -> None:
    """List, describe, delete consumer groups and reset their offsets."""


@groups.command("list")
@dir_option
@json_option
@friendly
def groups_list(cluster_dir, as_json):
    """Every group, from each broker's ListGroups."""
    from rich.table import Table

    from localcluster.tools import cluster_view, group_admin

    _, spec = cluster_spec(cluster_dir)
    listed = group_admin.list_groups(spec)
    if as_json:
        print_json(listed)
        return
    if not listed:
        click.echo("no consumer groups yet (`localcluster consume TOPIC --group G` makes one)")
        return
    table = Table(title="groups", title_justify="left")
    for name in ("group", "state", "protocol type", "coordinator"):
        table.add_column(name, no_wrap=True)
    for g in listed:
        table.add_row(g["group"], _cell(g["state"]), _cell(g["protocol_type"]),
                      str(g["coordinator"]))  # fmt: skip
    cluster_view.console().print(table)


@groups.command("describe")
@click.argument("group")
@dir_option
@json_option
@friendly
def groups_describe(group, cluster_dir, as_json):
    """State, members and, per partition, committed offset, log end offset and lag."""
    from rich.table import Table

    from localcluster.tools import cluster_view, group_admin

    _, spec = cluster_spec(cluster_dir)
    described = group_admin.describe_group(spec, group)
    if as_json:
        print_json(described)
        return
    c = cluster_view.console()
    protocol = described["protocol_type"] or "-"
    if described["protocol"]:
        protocol += f" ({described['protocol']})"
    c.print(f"group {described['group']}: state {described['state']}, protocol {protocol}, "
            f"coordinator broker {described['coordinator']}, "
            f"{len(described['members'])} member(s)", soft_wrap=True)  # fmt: skip
    if described["members"]:
        members = Table(title="members", title_justify="left")
        for name in ("member id", "instance id", "client id", "host", "assignment"):
            members.add_column(name, no_wrap=True)
        for m in described["members"]:
            members.add_row(m["member_id"], _cell(m["group_instance_id"]), _cell(m["client_id"]),
                            _cell(m["host"]), _partitions(m["assignment"]) or "-")  # fmt: skip
        c.print(members)
    table = Table(title="offsets", title_justify="left")
    for name in ("topic", "partition", "current-offset", "log-end-offset", "lag", "consumer-id",
                 "host", "client-id"):  # fmt: skip
        right = name in ("partition", "current-offset", "log-end-offset", "lag")
        table.add_column(name, no_wrap=True, justify="right" if right else "left")
    for p in described["partitions"]:
        table.add_row(p["topic"], str(p["partition"]), _cell(p["current_offset"]),
                      _cell(p["log_end_offset"]), _cell(p["lag"]), _cell(p["member_id"]),
                      _cell(p["host"]), _cell(p["client_id"]))  # fmt: skip
    if described["partitions"]:
        c.print(table)
    else:
        c.print("no committed offsets and no assigned partitions")


@groups.command("delete")
@click.argument("group")
@dir_option
@json_option
@friendly
def groups_delete(group, cluster_dir, as_json):
    """Delete GROUP and its committed offsets (only when it has no members)."""
    from localcluster.tools import group_admin

    _, spec = cluster_spec(cluster_dir)
    result = group_admin.delete_group(spec, group)
    if as_json:
        print_json(result)
    else:
        click.echo(f"deleted group {group}")


@groups.command("reset-offsets")
@click.argument("group")
@click.option("--topic", "topic", required=True, metavar="TOPIC[:P,P]",
              help="The topic, or some of its partitions (orders:0,2).")  # fmt: skip
@click.option("--to-earliest", "to", flag_value="earliest", help="Each partition's log start.")
@click.option("--to-latest", "to", flag_value="latest", help="Each partition's log end.")
@click.option("--to-offset", "offset", type=click.IntRange(0), default=None, metavar="N",
              help="Offset N (kept within each partition's log start and end).")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Show the new offsets; commit nothing.")
@click.option("--execute", is_flag=True, hidden=True,
              help="Accepted for kafka-consumer-groups.sh's habit (here the default).")  # fmt: skip
@dir_option
@json_option
@friendly
def groups_reset_offsets(group, topic, to, offset, dry_run, execute, cluster_dir, as_json):
    """Commit new offsets for GROUP on a topic; the group must have no members.

    Unlike kafka-consumer-groups.sh (which plans unless given --execute), this commits unless
    given --dry-run."""
    from rich.table import Table

    from localcluster.tools import cluster_view, group_admin

    chosen = [name for name, given in (("--to-earliest", to == "earliest"),
                                       ("--to-latest", to == "latest"),
                                       ("--to-offset", offset is not None)) if given]  # fmt: skip
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-offset N")
    _, spec = cluster_spec(cluster_dir)
    result = group_admin.reset_offsets(spec, group, topic, "offset" if offset is not None else to,
                                       offset, dry_run)  # fmt: skip
    if as_json:
        print_json(result)
        return
    table = Table(title=f"group {group}" + (" (dry run: nothing committed)" if dry_run else ""),
                  title_justify="left")  # fmt: skip
    for name in ("topic", "partition", "previous-offset", "new-offset"):
        table.add_column(name, no_wrap=True, justify="left" if name == "topic" else "right")
    for p in result["partitions"]:
        previous = p["previous_offset"]
        table.add_row(p["topic"], str(p["partition"]), _cell(previous if previous >= 0 else None),
                      str(p["new_offset"]))  # fmt: skip
    cluster_view.console().print(table)
