"""Records in and out from the shell: produce (stdin lines) and consume (one line per record)."""

from __future__ import annotations

import json
import sys

import click

from localcluster.cli.options import (
    assignments,
    cluster_spec,
    dir_option,
    friendly,
    json_option,
    print_json,
)


@click.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--key", default=None, help="The key of every record.")
@click.option("--key-separator", default=None, metavar="SEP",
              help="Split each line at SEP into key and value.")  # fmt: skip
@click.option("--partition", default=None, type=click.IntRange(0), help="Send to this partition.")
@click.option(
    "--acks", default="all", show_default=True, type=click.Choice(["all", "-1", "0", "1"])
)
@click.option("--timeout", "timeout_s", default=30.0, show_default=True, type=click.FloatRange(0.1),
              help="delivery.timeout.ms, in seconds.")  # fmt: skip
@click.option("--compression", default="none", show_default=True,
              type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]),
              help="compression.type of the batches.")  # fmt: skip
@dir_option
@json_option
@friendly
def produce(topic_name, key, key_separator, partition, acks, timeout_s, compression, cluster_dir,
            as_json):  # fmt: skip
    """Send each line of stdin to TOPIC as one record."""
    from localcluster.tools import cluster_admin

    directory, spec = cluster_spec(cluster_dir)
    result = cluster_admin.produce(
        spec, topic_name, sys.stdin, key=key, key_separator=key_separator, partition=partition,
        acks=cluster_admin.parse_acks(acks), timeout_ms=int(timeout_s * 1000),
        compression=compression)  # fmt: skip
    if as_json:
        print_json(result)
    else:
        spans = ", ".join(
            f"partition {p}: offsets {a}..{b}" for p, (a, b) in result["partitions"].items()
        )
        click.echo(f"produced {result['records']} records to {topic_name}"
                   + (f" ({spans})" if spans else ""), err=True)  # fmt: skip
    if result["errors"]:
        click.echo(f"error: {result['errors']} records failed: {result['first_error']}", err=True)
        sys.exit(1)


@click.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--from-beginning", is_flag=True, help="Start at each partition's first offset.")
@click.option("--partition", "partitions", multiple=True, type=click.IntRange(0),
              help="Read only this partition (repeatable).")  # fmt: skip
@click.option("--max-messages", default=None, type=click.IntRange(1), help="Stop after this many.")
@click.option("--timeout-ms", "idle_timeout_ms", default=None, type=click.IntRange(1),
              help="Stop after this long without a record.")  # fmt: skip
@click.option("--print-key", is_flag=True, help="Print KEY<TAB>VALUE.")
@click.option("--print-offset", is_flag=True, help="Prefix PARTITION:OFFSET<TAB>.")
@click.option("--group", default=None, metavar="GROUP",
              help="Consume as a member of consumer group GROUP: partitions from the group, "
                   "start at its committed offsets, commit as it goes.")  # fmt: skip
@click.option("--consumer-property", "properties", multiple=True, metavar="KEY=VALUE",
              callback=assignments("session.timeout.ms=10000"),
              help="A consumer setting, Kafka's name (repeatable; with --group).")  # fmt: skip
@click.option("--assignor", default=None,
              type=click.Choice(["range", "roundrobin", "cooperative-sticky"]),
              help="The group's partition assignor (partition.assignment.strategy; default "
                   "range,cooperative-sticky as Kafka's Java client: eager rebalancing). "
                   "cooperative-sticky rebalances incrementally: members keep consuming the "
                   "partitions they keep.")  # fmt: skip
@dir_option
@json_option
@friendly
def consume(topic_name, from_beginning, partitions, max_messages, idle_timeout_ms, print_key,
            print_offset, group, properties, assignor, cluster_dir, as_json):  # fmt: skip
    """Print TOPIC's records, one per line (--json: one JSON object per line).

    With --group the partitions come from the group and --from-beginning applies only to
    partitions the group has no committed offset for (auto.offset.reset=earliest), as in
    kafka-console-consumer.sh."""
    from localcluster.tools import cluster_admin

    if group is None and (properties or assignor):
        raise click.UsageError("--consumer-property and --assignor need --group")
    if assignor is not None:
        properties = {**properties, "partition.assignment.strategy": assignor}
    if group is not None and partitions:
        raise click.UsageError("--partition and --group are exclusive: the group assigns them")
    directory, spec = cluster_spec(cluster_dir)

    def text(data: bytes | None) -> str | None:
        return None if data is None else data.decode(errors="replace")

    def write(record) -> None:
        if as_json:
            click.echo(json.dumps({"partition": record.partition, "offset": record.offset,
                                   "key": text(record.key), "value": text(record.value),
                                   "timestamp": record.timestamp}))  # fmt: skip
            return
        line = text(record.value) or ""
        if print_key:
            line = f"{text(record.key) or ''}\t{line}"
        if print_offset:
            line = f"{record.partition}:{record.offset}\t{line}"
        click.echo(line)

    if group is not None:
        from localcluster.tools import group_admin

        count = group_admin.consume(spec, topic_name, group, write, from_beginning=from_beginning,
                                    max_messages=max_messages, idle_timeout_ms=idle_timeout_ms,
                                    properties=properties)  # fmt: skip
    else:
        count = cluster_admin.consume(spec, topic_name, write, from_beginning=from_beginning,
                                      partitions=list(partitions) or None,
                                      max_messages=max_messages, idle_timeout_ms=idle_timeout_ms)  # fmt: skip
    click.echo(f"processed a total of {count} messages", err=True)
