"""`localcluster chaos`: the click face of tools/chaos.py (parse, run, render).

Exit codes: 0 no acknowledged record was lost and no other check failed, 1 loss (or another
durability violation: a record at another offset than acknowledged, replicas that differ
below the HW, two leaders in one epoch, holes in the offsets) or the run itself failed,
2 usage.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from localcluster.cli.options import assignments


def _csv(allowed):
    def parse(ctx, param, value):
        items = [v.strip() for v in value.split(",") if v.strip()]
        unknown = [v for v in items if v not in allowed]
        if not items or unknown:
            raise click.BadParameter(
                f"{', '.join(unknown) or 'nothing'}: choose from {','.join(allowed)}"
            )
        return tuple(dict.fromkeys(items))

    return parse


def _settings(ctx, param, values):
    out = assignments("unclean.leader.election.enable=true")(ctx, param, values)
    if out:
        from localcluster.broker.config import BrokerConfig, ConfigError

        try:
            BrokerConfig.from_properties(dict(out), broker_id=0)
        except ConfigError as e:
            raise click.BadParameter(str(e)) from None
    return out


@click.command()
@click.option("--duration", "duration_s", default=60.0, show_default=True, type=click.FloatRange(0.5, 86_400),
              help="Seconds of faults under load.")  # fmt: skip
@click.option("--kill-every", "kill_every_ms", default=500, show_default=True, type=click.IntRange(20, 3_600_000),
              help="Mean ms between faults (exponential gaps).")  # fmt: skip
@click.option("--targets", default="leader,controller,follower,any", show_default=True,
              callback=_csv(("leader", "controller", "follower", "any", "supervisor", "coordinator", "consumer")),
              help="Whom faults hit (comma-separated; coordinator: the consumer group's; consumer: one of its "
                   "members; both need --consumers).")  # fmt: skip
@click.option("--faults", default="kill", show_default=True, callback=_csv(("kill", "stop")),
              help="kill: SIGKILL then restart; stop: SIGSTOP then SIGCONT.")  # fmt: skip
@click.option(
    "--seed",
    type=click.IntRange(0, 2**63),
    default=None,
    help="Seed of the schedule (default: random, printed).",
)
@click.option("--brokers", default=3, show_default=True, type=click.IntRange(2, 16),
              help="Brokers of the cluster chaos starts (ignored with --dir).")  # fmt: skip
@click.option("--partitions", default=3, show_default=True, type=click.IntRange(1, 64))
@click.option("--replication-factor", default=3, show_default=True, type=click.IntRange(1, 16))
@click.option("--min-insync-replicas", default=2, show_default=True, type=click.IntRange(1, 16),
              help="The topic's min.insync.replicas.")  # fmt: skip
@click.option("--rate", default=1000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="Records per second the producer offers.")  # fmt: skip
@click.option("--max-down", default=None, type=click.IntRange(1, 16),
              help="At most this many brokers down (or restarting) at once (default: brokers - 1).")  # fmt: skip
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", callback=_settings,
              help="A broker property for the cluster chaos starts, e.g. unclean.leader.election.enable=true "
                   "or replication.protocol=hw-truncation (repeatable).")  # fmt: skip
@click.option("--dir", "cluster_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Run against this running cluster instead of a fresh one in a temp dir.")  # fmt: skip
@click.option("--keep", is_flag=True,
              help="Keep the temp cluster dir (stopped) for a post-mortem instead of removing it.")  # fmt: skip
@click.option("--no-idempotence", "no_idempotence", is_flag=True,
              help="Produce without idempotence (retries across a failover may then write records "
                   "twice: the report counts them).")  # fmt: skip
@click.option("--consumers", default=0, show_default=True, type=click.IntRange(0, 16),
              help="Consumer processes (confluent-kafka) in one group reading the topic during the faults; "
                   "the checks then include the group's (at least once, commits never backwards).")  # fmt: skip
@click.option("--consumer-drain", "consumer_drain_s", default=60.0, show_default=True,
              type=click.FloatRange(1, 3600),
              help="Seconds the consumers get after the faults to consume and commit everything.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report on stdout.")
def chaos(duration_s, kill_every_ms, targets, faults, seed, brokers, partitions, replication_factor,
          min_insync_replicas, rate, max_down, settings, cluster_dir, keep, no_idempotence,
          consumers, consumer_drain_s, as_json):  # fmt: skip
    """Kill -9 (and SIGSTOP) brokers under acks=all load; prove no acknowledged record was lost.

    Prints the seeded schedule, the faults as they happen, a verdict and a JSON report
    (acknowledged, lost with reasons, duplicated, unavailability per partition).
    """
    from localcluster import cluster
    from localcluster.tools.chaos import run_chaos

    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", cluster.hypothesis_cache())
    if replication_factor > brokers and cluster_dir is None:
        raise click.BadParameter(
            f"{replication_factor} > --brokers {brokers}", param_hint="--replication-factor"
        )
    if min_insync_replicas > replication_factor:
        raise click.BadParameter(f"{min_insync_replicas} > --replication-factor {replication_factor}",
                                 param_hint="--min-insync-replicas")  # fmt: skip
    needs_group = [t for t in targets if t in ("coordinator", "consumer")]
    if needs_group and not consumers:
        raise click.BadParameter(f"{','.join(needs_group)} needs a consumer group: add --consumers N",
                                 param_hint="--targets")  # fmt: skip
    if cluster_dir is not None:
        cluster_dir = cluster.resolve_dir(cluster_dir)
        if not cluster.spec_path(cluster_dir).exists():
            click.echo(
                f"error: no cluster in {cluster_dir}; start one with `localcluster up` or omit --dir",
                err=True,
            )
            sys.exit(1)

    def say(line: str) -> None:
        click.echo(line, err=as_json)

    try:
        report = run_chaos(duration_s=duration_s, kill_every_ms=kill_every_ms, targets=targets, faults=faults,
                           seed=seed, cluster_dir=cluster_dir, settings=settings, brokers=brokers,
                           partitions=partitions, replication_factor=replication_factor,
                           min_insync_replicas=min_insync_replicas, rate=rate, max_down=max_down, keep=keep,
                           idempotence=not no_idempotence, consumers=consumers,
                           consumer_drain_s=consumer_drain_s, say=say)  # fmt: skip
    except cluster.ClusterError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        render(report, say)
    sys.exit(0 if report["verdict"] == "OK" else 1)


def render_group(group: dict, say) -> None:
    """The consumer group's two verdict lines, what failed, and who owned which partition when."""
    from localcluster.tools.chaos_check import COMMITS_CHECK, CONSUMED_CHECK

    def passed(ok):
        return "yes" if ok else "NO"

    def seconds(ms):
        return f"{ms / 1000:.1f}".replace("-0.0", "0.0")

    say(f"  group {group['group_id']}: {group['consumers']} consumers, {group['consumed']} records consumed "
        f"({group['reconsumed']} re-consumed), {group['commits']} commits ({group['commits_failed']} failed), "
        f"drained in {group['drain_s']:.1f} s" + ("" if group["drained"] else " (timed out)"))  # fmt: skip
    if group.get("deleted_before_read"):
        say(f"  {group['deleted_before_read']} acknowledged records were deleted below their partition's "
            "log start before the group read them (retention or DeleteRecords, not missed)")  # fmt: skip
    if group.get("commit_wait_ms"):
        say(f"  a synchronous commit waited {group['commit_wait_ms']['p50']} ms (p50), "
            f"{group['commit_wait_ms']['max']} ms at most")  # fmt: skip
    say(f"  {CONSUMED_CHECK}: {passed(group['at_least_once'])}"
        + (f" ({group['missed']} never consumed)" if group["missed"] else "")
        + (f" ({group['not_in_log']} consumed at an offset holding another record)" if group["not_in_log"] else ""))  # fmt: skip
    say(f"  {COMMITS_CHECK}: {passed(group['commits_never_backwards'])}"
        + (f" ({group['backwards']} steps back)" if group["backwards"] else ""))  # fmt: skip
    for record in group["missed_records"][:10]:
        say(
            f"    NOT CONSUMED {record['value']} (p{record['partition']} offset {record['offset']})"
        )
    for step in group["backwards_steps"][:10]:
        say(f"    BACKWARDS p{step['partition']}: {step['from']} by {step['from_consumer']} at {step['from_ms']} ms, "
            f"then {step['to']} by {step['to_consumer']} at {step['to_ms']} ms")  # fmt: skip
    for mismatch in group["final_mismatches"]:
        say(f"    OFFSETFETCH {mismatch}")
    for p, spans in group["ownership"].items():
        owners = ", ".join(f"{name} {seconds(start)}..{'end' if end is None else seconds(end)}"
                           for name, start, end in spans)  # fmt: skip
        say(f"    p{p} owned by {owners} (s from the start of the faults)")


def render(report: dict, say) -> None:
    say("")
    say(
        f"verdict: {report['verdict']}  (seed {report['seed']}; rerun with --seed {report['seed']})"
    )
    say(f"  {report['cycles']} fault cycles ({report['skipped']} skipped), {report['sent']} records sent, "
        f"{report['acknowledged']} acknowledged, {report['failed']} failed, {report['lost']} lost, "
        f"{report['duplicated']} duplicated, {report['moved']} at another offset")  # fmt: skip
    if report.get("below_log_start"):
        say(f"  {report['below_log_start']} acknowledged records lie below their partition's log "
            "start offset (deleted by retention or DeleteRecords, not lost)")  # fmt: skip
    for p, row in sorted(report["unavailability"].items(), key=lambda kv: int(kv[0])):
        say(f"  p{p}: no serving leader for {row['no_leader_ms']} ms in {len(row['no_leader_windows'])} windows; "
            f"{row['ack_gaps_ms']} ms in acknowledgement gaps over 1 s")  # fmt: skip
    for record in report["lost_records"]:
        say(f"  LOST {record['value']}: {record['reason']}")
    if report["lost"] > len(report["lost_records"]):
        say(f"  ... and {report['lost'] - len(report['lost_records'])} more lost records")
    if "group" in report:
        render_group(report["group"], say)
    for problem in report["problems"]:
        say(f"  PROBLEM {problem}")
    for warning in report.get("warnings", []):
        say(f"  WARNING {warning}")
    say(
        "report: "
        + json.dumps(
            {k: v for k, v in report.items() if k not in ("schedule", "events")}, sort_keys=True
        )
    )
