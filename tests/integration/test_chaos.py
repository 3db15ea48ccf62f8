"""`localcluster chaos` end to end: real brokers SIGKILLed and restarted under acks=all load.

The command runs as its own process (as a user runs it), with TMPDIR inside the test's tmp
dir so we can check that it removed its cluster dir and left no process behind. Short runs:
the defaults must find no loss; hw-truncation with chained leader kills must find loss on
one of a few seeds, and name the records and why; with --consumers 2 a confluent-kafka group
consumes every acknowledged record and its commits never go back. Also, fast: the schedule is
a function of the seed, the checker's offset rules, the group targets need a group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster import cluster
from localcluster.tools import chaos, chaos_check

COMMAND = "from localcluster.cli.chaos import chaos; chaos()"


def run_chaos_command(
    tmp_path: Path, *args: str, timeout_s: float = 240
) -> subprocess.CompletedProcess:
    env = dict(os.environ, TMPDIR=str(tmp_path))
    return subprocess.run([sys.executable, "-c", COMMAND, *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env)  # fmt: skip


def assert_cleaned_up(tmp_path: Path) -> None:
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith("localcluster-chaos-")]
    assert not leftovers, leftovers
    mine = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and str(tmp_path) in " ".join(cluster.cmdline(int(proc.name))):
            if cluster.process_state(int(proc.name)) not in (None, "Z", "X"):
                mine.append(int(proc.name))
    assert not mine, mine


# -- fast -----------------------------------------------------------------------------------------


def test_schedule_is_a_function_of_the_seed():
    a = chaos.make_schedule(42, 30, 500, chaos.TARGETS, chaos.FAULTS, 3)
    b = chaos.make_schedule(42, 30, 500, chaos.TARGETS, chaos.FAULTS, 3)
    c = chaos.make_schedule(43, 30, 500, chaos.TARGETS, chaos.FAULTS, 3)
    assert a == b and a != c
    assert 20 < len(a) < 120  # exponential gaps averaging 500 ms over 30 s
    assert all(0 <= f.at_ms < 30_000 and f.down_ms >= 50 for f in a)
    assert [f.at_ms for f in a] == sorted(f.at_ms for f in a)


def test_checker_offsets():
    records = [(0, b"k0:000000000"), (1, b"k1:000000000"), (3, b"k0:000000001")]
    problems = chaos_check.check_offsets(records, 0, 4)
    assert problems == ["offset 3 follows 1 (expected 2)"]
    assert chaos_check.check_offsets(records[:2], 0, 3) == ["records end at offset 2, the HW is 3"]
    assert chaos_check.parse_value(b"k7:000000012") == ("k7", 12)
    assert chaos_check.parse_value(b"garbage") is None


def test_group_targets_need_a_consumer_group(tmp_path):
    result = run_chaos_command(tmp_path, "--targets", "leader,consumer", "--duration", "1")
    assert result.returncode == 2 and "consumer needs a consumer group" in result.stderr, (
        result.stderr
    )


# -- real processes -------------------------------------------------------------------------------


@pytest.mark.slow
def test_defaults_find_no_loss_and_print_the_schedule(tmp_path):
    result = run_chaos_command(tmp_path, "--duration", "8", "--kill-every", "400", "--seed", "11")
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "verdict: OK" in out and "seed 11" in out, out[-2000:]
    schedule = chaos.make_schedule(
        11, 8, 400, ("leader", "controller", "follower", "any"), ("kill",), 3
    )
    assert schedule and all(f.describe() in out for f in schedule)  # the seed reproduces it
    report = json.loads(out.split("report: ", 1)[1].splitlines()[0])
    assert report["seed"] == 11 and report["lost"] == 0 and report["problems"] == []
    # ~20 faults are scheduled; how many kill-restart cycles complete in 8 s depends on how fast
    # brokers restart, which a loaded 2-core machine slows (3 completed beside other tests)
    assert report["acknowledged"] > 1000 and report["cycles"] >= 3, report
    assert set(report["unavailability"]) == {"0", "1", "2"}
    assert_cleaned_up(tmp_path)


@pytest.mark.slow
def test_under_retention_records_below_the_log_start_are_deleted_not_lost(tmp_path):
    """Retention deletes segments while brokers are killed, and new segments reuse the deleted
    ones' files (storage/segment.py, "Reused files"): nothing acknowledged above the log start
    is lost, what lies below it is counted apart, and the replicas still agree."""
    result = run_chaos_command(tmp_path, "--duration", "8", "--kill-every", "400", "--seed", "12",
                               "--rate", "5000", "--set", "log.segment.bytes=16384",
                               "--set", "log.retention.bytes=49152",
                               "--set", "log.retention.check.interval.ms=300")  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    report = json.loads(out.split("report: ", 1)[1].splitlines()[0])
    assert report["verdict"] == "OK" and report["lost"] == 0 and report["problems"] == [], report
    assert 0 < report["below_log_start"] < report["acknowledged"], report
    assert all(row["log_start_offset"] > 0 for row in report["partition_states"].values())
    assert "lie below their partition's log start offset" in out
    assert_cleaned_up(tmp_path)


@pytest.mark.slow
def test_under_retention_a_paused_group_is_not_blamed_for_records_deleted_before_it_read_them(
    tmp_path,
):
    """The group's members are paused (SIGSTOP, one of them for 8.9 s with seed 13) while
    retention deletes: what was deleted before they read it is counted apart, what they read
    before its deletion is checked against what was acknowledged there, and the drain does not
    wait for records no consumer can read any more."""
    result = run_chaos_command(tmp_path, "--duration", "8", "--kill-every", "400", "--seed", "13",
                               "--rate", "5000", "--set", "log.segment.bytes=16384",
                               "--set", "log.retention.bytes=49152",
                               "--set", "log.retention.check.interval.ms=300",
                               "--consumers", "2", "--targets", "consumer", "--faults", "stop")  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    report = json.loads(out.split("report: ", 1)[1].splitlines()[0])
    group = report["group"]
    assert report["verdict"] == "OK" and report["lost"] == 0, report
    assert group["drained"] and group["at_least_once"] and group["commits_never_backwards"], group
    assert group["missed"] == 0 and group["not_in_log"] == 0, group
    assert 0 < group["deleted_before_read"] <= report["below_log_start"], group
    assert group["consumed_distinct"] > 0
    assert "before the group read them (retention or DeleteRecords, not missed)" in out
    assert_cleaned_up(tmp_path)


@pytest.mark.slow
def test_a_consumer_group_consumes_every_acknowledged_record_and_its_commits_never_go_back(
    tmp_path,
):
    # Short: 5 s of faults, the first one (0.1 s in, seed 1) kills the group's coordinator.
    result = run_chaos_command(tmp_path, "--duration", "5", "--kill-every", "700", "--seed", "1",
                               "--targets", "leader,coordinator", "--consumers", "2")  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "verdict: OK" in out, out[-3000:]
    assert (
        f"{chaos_check.CONSUMED_CHECK}: yes" in out and f"{chaos_check.COMMITS_CHECK}: yes" in out
    )
    report = json.loads(out.split("report: ", 1)[1].splitlines()[0])
    group = report["group"]
    assert group["group_id"] == "chaos-1" and group["consumers"] == 2 and group["drained"], group
    assert group["at_least_once"] and group["commits_never_backwards"], group
    assert group["missed"] == 0 and group["consumed"] >= report["acknowledged"] > 1000
    assert group["consumed"] - group["consumed_distinct"] == group["reconsumed"] >= 0
    assert group["commits"] > 0 and group["backwards"] == 0 and group["final_mismatches"] == []
    hws = {p: row["high_watermark"] for p, row in report["partition_states"].items()}
    assert group["final_offsets"] == group["last_commits"] == hws  # committed up to the end
    assert set(group["ownership"]) == {"0", "1", "2"}
    owners = {span[0] for spans in group["ownership"].values() for span in spans}
    assert owners == {"consumer-0", "consumer-1"}, group["ownership"]
    assert "SIGKILL broker=" in out and "target=coordinator back_in_ms" in out  # it was hit
    assert_cleaned_up(tmp_path)  # the consumer processes too (their command lines name the dir)


LOSSY_MODES = {
    # Every ISR member down, a lagging replica back first and elected. Seeds 2 and 4 lost
    # records in our runs with up to all three brokers down.
    "unclean": (("--kill-every", "500", "--max-down", "3", "--set", "unclean.leader.election.enable=true"),
                (2, 4, 3), "an unclean election"),
}  # fmt: skip


@pytest.mark.slow
# hw-truncation's loss (KIP-101) is not run here: real timing rarely opens its window since the
# fetcher ends its long poll on a new LeaderAndIsr, so it took 43 s to xpass or not; it is
# reproduced deterministically by test_replication.py::test_kip_101_scenario_1 and tests/sim's
# KIP scenarios, and `localcluster chaos --set replication.protocol=hw-truncation` still runs it.
@pytest.mark.parametrize("mode", ["unclean"])
def test_lossy_modes_lose_acknowledged_records_and_say_which(tmp_path, mode):
    args, seeds, why = LOSSY_MODES[mode]
    reports = []
    for seed in seeds:  # real timing decides whether a seed loses; one of these did in every run
        result = run_chaos_command(
            tmp_path, "--duration", "12", "--seed", str(seed), *args, "--json"
        )
        assert result.returncode in (0, 1), result.stderr[-3000:]
        report = json.loads(result.stdout)
        reports.append((seed, report["verdict"], report["lost"]))
        assert_cleaned_up(tmp_path)
        if report["lost"]:
            break
    else:
        pytest.fail(f"no loss found with {mode}: {reports}")
    assert result.returncode == 1 and report["verdict"] == "LOSS"
    assert "report: " not in result.stdout  # --json: only the report on stdout
    lost = report["lost_records"]
    assert 0 < len(lost) <= min(report["lost"], chaos_check.LOSS_EXAMPLES)
    assert sum(report["lost_by_partition"].values()) == report["lost"]
    for record in lost:
        assert chaos_check.parse_value(record["value"].encode()) is not None
        assert (
            f"acknowledged at offset {record['offset']} of chaos-{record['partition']}"
            in record["reason"]
        )
    assert any(
        ("did not have it" in r["reason"] or "held other records" in r["reason"])
        and why in r["reason"]
        for r in lost
    ), [r["reason"] for r in lost]
