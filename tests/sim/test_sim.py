"""The deterministic simulator under pytest: the scenario files (golden output, and which
invariants each protocol must break) and a bounded sweep of random seeds.

    SIM_UPDATE_GOLDEN=1 pytest tests/sim     # rewrite the scenarios' golden output
    SIM_SEEDS=1000 pytest tests/sim          # a longer sweep (make sim SEEDS=N runs the CLI)
"""

from __future__ import annotations

import multiprocessing
import os

import pytest

from tests.sim.invariants import InvariantViolation, truncated_for_test
from tests.sim.simulator import (
    PROTOCOLS,
    SCENARIOS,
    Simulator,
    parse_scenario,
    render_scenario,
    run_scenario,
    run_seed,
)

SEEDS = int(os.environ.get("SIM_SEEDS", "120"))  # `make sim SEEDS=4000` for the long sweep
HW_SEEDS = 20
UNCLEAN_SEEDS = 30
PLAIN_PRODUCER_SEEDS = 10
GROUP_SEEDS = 8
EARLY_COMMIT_SEEDS = 10
UPDATE_GOLDEN = os.environ.get("SIM_UPDATE_GOLDEN") == "1"
KIP_SCENARIOS = [
    "kip101_scenario1",
    "kip101_scenario2",
    "kip279_fast_leader_changes",
    "kip279_two_rounds",
]
KNOWN_BUGS = {
    "leader_bounce_during_controller_failover": (
        "a leader that restarts while no controller runs is sent its old epoch by the next "
        "controller and leads it again from its checkpointed HW: the HW goes back within the "
        "epoch (nothing lost; consumers saw offsets that are above the HW again). Random runs "
        "tolerate it (TOLERATED in simulator.py) and report it as a known issue"
    ),
}
ALL_SCENARIOS = sorted(p.stem for p in SCENARIOS.glob("*.txt"))


def _path(name: str):
    return SCENARIOS / f"{name}.txt"


# -- scenarios ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_SCENARIOS)
def test_scenario_output_matches_its_golden_output(name):
    path = _path(name)
    text, _ = render_scenario(path)
    if UPDATE_GOLDEN:
        path.write_text(text)
    assert text == path.read_text(), (
        f"{path.name}: the run differs from the golden output; review, then rewrite it with "
        "SIM_UPDATE_GOLDEN=1 pytest tests/sim or python -m tests.sim.simulator --update-golden"
    )


def test_the_kip_scenarios_are_there_with_output_for_both_protocols():
    for name in KIP_SCENARIOS:
        script, golden = parse_scenario(_path(name).read_text())
        assert set(golden) == set(PROTOCOLS)
        assert "expect hw-truncation" in script and "expect leader-epoch" not in script


@pytest.mark.parametrize("name", KIP_SCENARIOS)
def test_hw_truncation_fails_the_kip_scenario(name):
    run = run_scenario(_path(name), "hw-truncation")
    assert run.expected_kinds, f"{name}: no violation expected in hw-truncation mode"
    assert run.kinds == run.expected_kinds, "\n".join(run.output)
    assert "strong-isr" in run.kinds  # a committed record differs or is missing on an ISR member


@pytest.mark.parametrize("name", KIP_SCENARIOS)
def test_leader_epoch_passes_the_kip_scenario(name):
    run = run_scenario(_path(name), "leader-epoch")
    assert run.violations == [], "\n".join(run.output)
    assert any(line.startswith("  b") and ":e" in line for line in run.output)  # it ran through


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mode", ["plain", "idempotent"])
def test_a_retry_across_a_leader_change_is_written_twice_unless_idempotent(mode, protocol):
    run = run_scenario(_path(f"retry_across_leader_change_{mode}"), protocol)
    assert run.kinds == ({"acked-duplicated"} if mode == "plain" else set()), "\n".join(run.output)
    assert any("client: acked a1" in line for line in run.output)  # the retry was answered


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=r))
                                  for n, r in sorted(KNOWN_BUGS.items())])  # fmt: skip
def test_known_bug_scenario_keeps_the_invariants(name, protocol):
    run = run_scenario(_path(name), protocol)
    assert run.violations == [], "\n".join(run.output)


def test_coordinator_failover_keeps_every_acknowledged_commit():
    run = run_scenario(_path("group_coordinator_failover"), "leader-epoch")
    assert run.violations == [], "\n".join(run.output)
    out = "\n".join(run.output)
    assert "b2 coordinator of __consumer_offsets-1: 1 group(s) loaded" in out  # replayed
    assert "commit to b1 unanswered" in out  # 12 was in flight when b1 crashed ...
    assert "commit t-0@12 acknowledged by b2" in out  # ... and retried on the new coordinator
    assert "fetched g's offsets from b2: t-0@15" in out
    assert "commit t-0@12 acknowledged by b1" not in out  # never committed on b1


# -- the invariant checker has teeth ------------------------------------------------------------


def test_the_checker_catches_a_follower_log_cut_behind_its_back():
    sim = Simulator(seed=3)
    try:
        sim.start_zk()
        for host in sim.hosts.values():
            host.start()
        sim.start_controller()
        sim.create_topic()
        sim.faulting = True
        sim._schedule_produce()
        sim.run_until(300)
        tp = ("t", 0)
        state = sim.zk.states[tp][0]
        leader = sim.checker.acting_leader(tp)
        assert leader is not None and leader[1].state.high_watermark > 0
        member = next(r for r in state.isr if r != state.leader)
        hosted = sim.hosts[member].incarnation.partitions[tp]
        truncated_for_test(hosted.log, 0)
        hosted.state.on_follower_truncated(0, 0)
        with pytest.raises(InvariantViolation) as caught:
            sim.checker.check()
        assert caught.value.violation.kind == "strong-isr"
    finally:
        sim.close()


def test_the_checker_catches_a_commit_answered_before_the_hw_passes_it(monkeypatch):
    """An injected bug: the group host answers every commit once it is in the leader's log,
    before the followers have it. The commit of 12, on a leader cut from its followers, is
    then acknowledged, and lost when a follower takes over."""
    _answer_commits_at_once(monkeypatch)
    run = run_scenario(_path("group_coordinator_failover"), "leader-epoch")
    assert "commit t-0@12 acknowledged by b1" in "\n".join(run.output)
    assert run.kinds == {"commit-backwards"}, "\n".join(run.output)  # b2 holds 9, not 12


def _answer_commits_at_once(monkeypatch) -> None:
    """The injected bug: commits answered once in the leader's log, not once the HW passes."""
    from localcluster.broker.group_host import GroupHost
    from localcluster.group import errors
    from tests.sim.broker import SimGroupHost

    def commit_key(self, wait):
        self.__dict__.setdefault("premature", []).append(wait)
        return wait

    def append(self, shard, records):
        GroupHost._append(self, shard, records)
        for wait in self.__dict__.pop("premature", []):
            self.on_commit_answered(wait, errors.NONE)  # not waiting for the HW

    monkeypatch.setattr(SimGroupHost, "commit_key", commit_key)
    monkeypatch.setattr(SimGroupHost, "_append", append)


def test_a_run_is_a_function_of_its_seed():
    first, second = run_seed(7), run_seed(7)
    assert first.trace == second.trace and first.steps == second.steps
    assert run_seed(8).trace != first.trace


# -- the random sweep ---------------------------------------------------------------------------


def _run(args):
    seed, protocol, flags = args
    result = run_seed(seed, protocol, **flags)
    return seed, result.ok, result.violation.kind if result.violation else None, (
        None if result.ok else result.report(tail=60)), result.acked  # fmt: skip


def _sweep(seeds, protocol, **flags):
    jobs = [(seed, protocol, flags) for seed in seeds]
    workers = min(2, os.cpu_count() or 1)
    if workers < 2:
        return [_run(job) for job in jobs]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return list(pool.imap(_run, jobs, chunksize=4))


def test_random_sweep_leader_epoch_keeps_every_invariant_and_converges():
    results = _sweep(range(SEEDS), "leader-epoch")
    failed = [(seed, report) for seed, ok, _, report, _ in results if not ok]
    assert not failed, (f"{len(failed)} of {SEEDS} seeds failed: {[s for s, _ in failed]}\n"
                        + "\n\n".join(report for _, report in failed[:3]))  # fmt: skip
    assert sum(acked for *_, acked in results) > 10 * SEEDS  # the runs did commit records


def test_random_sweep_hw_truncation_breaks_the_invariants():
    results = _sweep(range(HW_SEEDS), "hw-truncation")
    kinds = [kind for _, ok, kind, _, _ in results if not ok]
    assert len(kinds) >= HW_SEEDS // 2, f"only {len(kinds)} of {HW_SEEDS} seeds failed"
    assert "strong-isr" in kinds, kinds  # a committed record missing on an ISR member


def test_random_sweep_with_unclean_election_loses_acknowledged_records():
    """Jepsen's Kafka 0.8 finding: an out-of-sync replica elected leader loses acks=all records."""
    results = _sweep(range(UNCLEAN_SEEDS), "leader-epoch", unclean=True)
    kinds = [kind for _, ok, kind, _, _ in results if not ok]
    assert "acked-lost" in kinds, f"no seed of {UNCLEAN_SEEDS} lost an acknowledged record"
    assert set(kinds) == {"acked-lost"}, kinds  # the data is lost; the replicas still agree


def test_random_sweep_with_a_plain_retrying_producer_duplicates_acknowledged_records():
    """What KIP-98 is for: without idempotence, a retry of a batch whose answer was lost
    writes it again; the acked-duplicated invariant sees it."""
    results = _sweep(range(PLAIN_PRODUCER_SEEDS), "leader-epoch", idempotent=False)
    kinds = [kind for _, ok, kind, _, _ in results if not ok]
    assert "acked-duplicated" in kinds, f"no seed of {PLAIN_PRODUCER_SEEDS} duplicated a record"
    assert set(kinds) == {"acked-duplicated"}, kinds


def _run_with_groups(seed):
    result = run_seed(seed, "leader-epoch", groups=True)
    return (
        seed,
        result.ok,
        None if result.ok else result.report(tail=60),
        result.commits_acknowledged,
    )


def test_random_sweep_with_a_group_member_keeps_every_acknowledged_commit():
    """A member commits during the faults; coordinators fail over (crashes, elections) and
    load the group from their replica of the offsets partition."""
    workers = min(2, os.cpu_count() or 1)
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        results = list(pool.imap(_run_with_groups, range(GROUP_SEEDS), chunksize=4))
    failed = [(seed, report) for seed, ok, report, _ in results if not ok]
    assert not failed, (f"{len(failed)} of {GROUP_SEEDS} seeds failed: {[s for s, _ in failed]}\n"
                        + "\n\n".join(report for _, report in failed[:3]))  # fmt: skip
    assert sum(commits for *_, commits in results) > 20 * GROUP_SEEDS  # the member did commit


def test_random_sweep_with_commits_answered_before_the_hw_loses_them(monkeypatch):
    _answer_commits_at_once(monkeypatch)
    kinds = []
    for seed in range(EARLY_COMMIT_SEEDS):
        result = run_seed(seed, "leader-epoch", groups=True)
        kinds.append(result.violation.kind if result.violation else None)
    assert "commit-backwards" in kinds, kinds
    assert set(kinds) <= {None, "commit-lost", "commit-backwards"}, kinds


# -- the network and the clock ------------------------------------------------------------------


class _Sink:
    def __init__(self):
        self.got = []
        self.alive = True

    def receive(self, src, msg):
        if self.alive:
            self.got.append((src, msg))
        return self.alive


def test_the_network_delays_reorders_cuts_heals_and_drops_from_its_seed():
    import random

    from tests.sim.clock import ManualClock, Scheduler
    from tests.sim.network import Network

    def run(seed):
        scheduler = Scheduler(ManualClock())
        net = Network(random.Random(seed), scheduler, min_delay_ms=1, max_delay_ms=9)
        a, b = _Sink(), _Sink()
        net.attach("a", a), net.attach("b", b), net.attach("zk", _Sink())
        for i in range(50):
            net.send("a", "b", i)
        net.cut("a", "b")
        net.send("a", "b", "cut")  # lost at send
        net.send("zk", "b", "store")  # the store's answers are reliable by default
        net.heal()
        net.drop_rate = 1.0
        net.send("b", "a", "dropped")
        while scheduler.run_one():
            pass
        return [msg for _, msg in b.got], a.got, net.stats

    got, to_a, stats = run(1)
    assert sorted(m for m in got if isinstance(m, int)) == list(range(50))  # all delivered
    assert [m for m in got if isinstance(m, int)] != list(range(50))  # ... not in order
    assert "cut" not in got and "store" in got and to_a == []
    assert (stats.cut, stats.dropped) == (1, 1)
    assert run(1)[0] == got and run(2)[0] != got  # a function of the seed
