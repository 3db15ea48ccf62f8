"""`localcluster perf`: the click face of tools/perf.py (parse, run with a progress bar, render).

`perf produce` (kafka-producer-perf-test's load and figures), `perf e2e` (produce-to-consume
latency) and `perf failover` (kill -9 the leader or controller under acks=all load; the
unavailability windows; no acknowledged record lost). Each prints one summary (or `--json`:
the result document of tools/perf.py on stdout, nothing else there). Exit codes: 0 ok,
1 failure (records failed, lost or missing; no cluster; a wait that ran out), 2 usage.
`python -c "from localcluster.cli.perf import perf; perf()"` runs it standalone.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from localcluster.cli.options import assignments
from localcluster.tools.cluster_view import console as shared_console
from localcluster.tools.perf import CLIENTS, TARGETS, e2e, failover, produce

ACKS = ("all", "-1", "1", "0")


def _common(command):
    """The options produce and e2e share (applied bottom-up, so listed in reverse)."""
    options = [
        click.option("--json", "as_json", is_flag=True, help="Print only the JSON result on stdout."),
        click.option("--dir", "cluster_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
                     help="The cluster dir (default: $LOCALCLUSTER_DIR or ./.localcluster)."),
        click.option("--replication-factor", type=click.IntRange(1, 64), default=None,
                     help="Replication factor if the topic is created (default: min(3, brokers))."),
        click.option("--partitions", type=click.IntRange(1, 10_000), default=None,
                     help="Partitions if the topic is created (default 1)."),
        click.option("--client", type=click.Choice(CLIENTS), default="own", show_default=True,
                     help="own: localcluster's client (Unix sockets); confluent: confluent-kafka over TCP."),
        click.option("--producer-config", "config", multiple=True, metavar="KEY=VALUE", callback=assignments("linger.ms=10"),
                     help="A producer setting by Kafka's name, e.g. linger.ms=0 (repeatable; wins over --acks)."),
        click.option("--acks", type=click.Choice(ACKS), default="all", show_default=True),
    ]  # fmt: skip
    for option in options:
        command = option(command)
    return command


def _load_options(default_throughput: float):
    def apply(command):
        options = [
            click.option("--throughput", type=float, default=default_throughput, show_default=True,
                         help="Records/s to offer at most (-1: no cap)."),
            click.option("--record-size", type=click.IntRange(0, 1_000_000), required=True,
                         help="Bytes of each record's value."),
            click.option("--num-records", type=click.IntRange(1, 1_000_000_000), required=True),
            click.option("--topic", required=True, help="Created when missing (see --partitions)."),
        ]  # fmt: skip
        for option in options:
            command = option(command)
        return command

    return apply


@click.group()
def perf() -> None:
    """Measure the cluster: produce load, end-to-end latency, failover under kill -9."""


@contextlib.contextmanager
def _progress(description: str, total: int, enabled: bool):
    """A rich progress bar on stderr (only on a terminal); yields the update callable."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task) -> Text:
            return Text(f"{task.speed or 0:>9,.0f} records/s")

    console = shared_console(stderr=True)
    if not enabled or not console.is_terminal:
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:  # fmt: skip
        task = bar.add_task(description, total=total)
        yield lambda done: bar.update(task, completed=done)


def _run(description: str, total: int, work, bar: bool = True):
    """Run work(progress) and map its faults to one line and exit 1 (Ctrl-C: 130)."""
    from localcluster.client import KafkaError
    from localcluster.cluster import ClusterError

    try:
        with _progress(description, total, enabled=bar) as progress:
            return work(progress)
    except (ClusterError, KafkaError, ValueError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


def _check_record_size(record_size: int, least: int) -> None:
    if record_size < least:
        raise click.BadParameter(f"{record_size} is below {least} bytes (the send time and sequence "
                                 f"number travel in the value); use --record-size {least} or more",
                                 param_hint="--record-size")  # fmt: skip


def _check_config(client: str, acks: str, config: dict[str, str]) -> None:
    """Unknown producer settings are usage errors, found before anything runs."""
    from localcluster.tools.perf import producer_config

    try:
        settings = producer_config(client, acks, config)
        if client == "confluent":
            from confluent_kafka import KafkaException
            from confluent_kafka import Producer as ConfluentProducer

            try:  # no bootstrap servers: it connects nowhere; dropped at once
                probe = ConfluentProducer({**settings, "log_level": 0})
            except KafkaException as e:
                raise ValueError(e.args[0].str() if e.args else str(e)) from None
            del probe
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--producer-config") from None


def _latency_line(name: str, latency: dict) -> str:
    if not latency["count"]:
        return f"{name}: no samples"
    parts = ", ".join(f"{k} {latency[k]:.2f}" for k in ("p50", "p95", "p99", "p99.9", "max"))
    return f"{name} ms: {parts} (mean {latency['mean']:.2f}, {latency['count']} samples)"


def _finish(result: dict, as_json: bool, lines: list[str]) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        for line in lines:
            click.echo(line)
    if not result["ok"]:
        why = result.get("first_error") or "see the figures above"
        click.echo(f"error: the run failed ({why})", err=True)
    sys.exit(0 if result["ok"] else 1)


@perf.command("produce")
@_load_options(-1)
@_common
def produce_command(topic, num_records, record_size, throughput, acks, config, client, partitions,
                    replication_factor, cluster_dir, as_json):  # fmt: skip
    """Produce N records of B bytes and report records/s, MB/s and per-record latency.

    Runs the benchmarks' load engine (our client: prebuilt batches of about 64 KiB, or of
    --producer-config batch.size=BYTES). Latency is from when a record's batch was due (at full
    speed: sent) to its acknowledgement.
    """
    _check_config(client, acks, config)
    result = _run(f"produce {topic}", num_records, lambda progress: produce(
        cluster_dir, topic, num_records, record_size, throughput=throughput, acks=acks, config=config,
        client=client, partitions=partitions, replication_factor=replication_factor, progress=progress))  # fmt: skip
    _finish(result, as_json, [
        f"{result['records_sent']} records sent, {result['records_acked']} acknowledged, {result['errors']} failed; "
        f"{result['records_per_s']:.1f} records/s ({result['mb_per_s']:.2f} MB/s) over {result['elapsed_s']:.2f} s "
        f"({client} client, acks={result['acks']}, {result['partitions']} partitions, RF {result['replication_factor']})",
        _latency_line("latency", result["latency_ms"]),
        *([f"the client is the bottleneck: a load process used {result['client_cpu_cores']:.2f} cores"]
          if result["client_bound"] else []),
    ])  # fmt: skip


@perf.command("e2e")
@click.option(
    "--assignor",
    default=None,
    type=click.Choice(["range", "roundrobin", "cooperative-sticky"]),
    help="With --group: the group's partition assignor (partition.assignment.strategy).",
)
@click.option(
    "--group",
    default=None,
    metavar="GROUP",
    help="Consume as a member of consumer group GROUP (localcluster's group consumer) "
    "instead of assigning every partition; the load starts once the group is stable.",
)
@_load_options(1000)
@_common
def e2e_command(topic, num_records, record_size, throughput, acks, config, client, partitions,
                replication_factor, cluster_dir, as_json, group, assignor):  # fmt: skip
    """Produce-to-consume latency: each value carries its send time; a consumer assigned to
    every partition (--group: given them by its group) measures receive time - send time.
    Every acknowledged record must arrive."""
    from localcluster.tools.perf import E2E_HEADER

    _check_record_size(record_size, E2E_HEADER.size)
    _check_config(client, acks, config)
    if assignor is not None and group is None:
        raise click.UsageError("--assignor needs --group")
    result = _run(f"e2e {topic}", num_records, lambda progress: e2e(
        cluster_dir, topic, num_records, record_size, throughput=throughput, acks=acks, config=config,
        client=client, partitions=partitions, replication_factor=replication_factor, progress=progress,
        group=group, assignor=assignor))  # fmt: skip
    _finish(result, as_json, [
        f"{result['records_sent']} records sent, {result['records_acked']} acknowledged, "
        f"{result['records_received']} received ({result['missing']} missing, {result['duplicates']} duplicates); "
        f"{result['records_per_s']:.1f} records/s ({client} client, acks={result['acks']})"
        + (f"; consumed in group {group}" if group else ""),
        _latency_line("end-to-end latency", result["e2e_latency_ms"]),
        _latency_line("produce latency", result["produce_latency_ms"]),
    ])  # fmt: skip


@perf.command("failover")
@click.option(
    "--topic",
    required=True,
    help="Created when missing (replication factor 3, min.insync.replicas 2).",
)
@click.option("--kills", type=click.IntRange(1, 1000), default=3, show_default=True)
@click.option("--target", "aim", type=click.Choice(TARGETS), default="leader", show_default=True,
              help="Whose broker is killed: the partition's leader or the controller.")  # fmt: skip
@click.option(
    "--partition",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="The partition loaded.",
)
@click.option("--throughput", type=click.FloatRange(1, 1_000_000), default=1000, show_default=True,
              help="Records/s the acks=all producer offers.")  # fmt: skip
@click.option("--record-size", type=click.IntRange(0, 1_000_000), default=100, show_default=True)
@click.option("--producer-config", "config", multiple=True, metavar="KEY=VALUE", callback=assignments("linger.ms=10"),
              help="A setting of localcluster's producer (acks stays all; repeatable).")  # fmt: skip
@click.option("--partitions", type=click.IntRange(1, 10_000), default=None,
              help="Partitions if the topic is created (default 1).")  # fmt: skip
@click.option("--replication-factor", type=click.IntRange(2, 64), default=None,
              help="Replication factor if the topic is created (default: min(3, brokers)).")  # fmt: skip
@click.option("--dir", "cluster_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="The cluster dir (default: $LOCALCLUSTER_DIR or ./.localcluster).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result on stdout.")
def failover_command(topic, kills, aim, partition, throughput, record_size, config, partitions,
                     replication_factor, cluster_dir, as_json):  # fmt: skip
    """SIGKILL the partition leader's (or the controller's) broker under acks=all load, K times.

    Each window runs from the kill to the first acknowledgement of a record sent after it; the
    broker is restarted (same id, same data) and the ISR waited full before the next kill. At
    the end the partition is read back: an acknowledged record that is missing fails the run.
    """

    _check_config("own", "all", config)

    def say(line: str) -> None:
        click.echo(line, err=as_json)

    result = _run(f"failover {topic}", kills, lambda progress: failover(
        cluster_dir, topic, kills=kills, aim=aim, partition=partition, throughput=throughput,
        record_size=record_size, config=config, partitions=partitions,
        replication_factor=replication_factor, progress=progress, say=say), bar=False)  # fmt: skip
    w = result["window_ms"]
    windows = (f"unavailability ms: p50 {w['p50']:.1f}, p99 {w['p99']:.1f}, max {w['max']:.1f} over {w['count']} kills"
               if w["count"] else "unavailability: no window closed")  # fmt: skip
    _finish(result, as_json, [
        windows + (f" ({result['unclosed_windows']} without an acknowledgement within 60 s)"
                   if result["unclosed_windows"] else ""),
        f"{result['records_sent']} records sent, {result['records_acked']} acknowledged, {result['errors']} failed; "
        f"read back {result['records_consumed']}: {result['lost']} lost, {result['duplicates']} duplicates, "
        f"{result['unacknowledged_present']} present but never acknowledged",
        "verdict: " + ("OK, no acknowledged record was lost" if result["lost"] == 0 else
                       f"LOST {result['lost']} acknowledged records (sequences {result['lost_sequences'][:10]})"),
    ])  # fmt: skip
