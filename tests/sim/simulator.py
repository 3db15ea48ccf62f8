"""One seed -> one run: brokers, a controller and a producing client over the simulated network.

The seed picks the cluster's shape (2 to 5 brokers, RF 2 or 3, min.insync.replicas 1 or 2,
size-based retention on or off). A run has two phases. The safety phase injects faults from
the seed (kill -9 crashes and restarts from disk, SIGSTOP-like pauses, isolated brokers and cut
links, random message loss, controller crashes and deposed controllers that act until their
watch fires, controlled shutdowns with clean restarts, preferred elections) while a client
produces acks=all and acks=1 batches (producer.py: acks=all ones retried, idempotent unless
--no-idempotence). The heal phase stops the faults, restarts and resumes
everything, and requires every partition to converge (ISR full, replicas identical to the
leader, HW = log end) within a bounded number of steps. Invariants (invariants.py) are checked
after every step; the first violation ends the run, and `SimResult.report()` prints the seed,
the command that replays it and the event trace.

Everything comes from one `random.Random(seed)`: no wall clock, threads or asyncio.

Scenario files (scenarios/*.txt) are scripts played by `ScenarioRunner` in both protocols,
followed by each protocol's golden output.

    python -m tests.sim.simulator --seeds 0:500 [--protocol hw-truncation] [--unclean]
                                  [--lossy-zk] [--no-idempotence] [--groups] [--trace]
    python -m tests.sim.simulator --scenarios         # check the scenario files
    python -m tests.sim.simulator --update-golden     # rewrite their golden output
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from localcluster.broker.group_host import OFFSETS_TOPIC
from localcluster.controller.assignment import assign_replicas_to_brokers
from localcluster.group import partition_for
from localcluster.metadata_types import LeaderAndIsr
from localcluster.protocol.controller_requests import PartitionState
from tests.sim import network as m
from tests.sim.broker import SimConfig
from tests.sim.clock import ManualClock, Scheduler
from tests.sim.controller import SimController
from tests.sim.group_member import GroupMember
from tests.sim.invariants import (
    InvariantChecker,
    InvariantViolation,
    Violation,
    batches_below,
    describe,
    log_view,
)
from tests.sim.node import BrokerHost
from tests.sim.producer import Client
from tests.sim.store import SimZk

TOPIC = "t"
SHM = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
TRACE_TAIL = 250


@dataclass
class SimResult:
    seed: int | None
    protocol: str
    steps: int
    sim_time_ms: int
    violation: Violation | None
    trace: list[str]
    acked: int = 0
    produced: int = 0
    faults: int = 0
    converged_after: int | None = None
    stats: dict = field(default_factory=dict)
    flags: str = ""  # the command-line flags beyond the protocol (--unclean, --lossy-zk)
    commits_acknowledged: int = 0  # the group member's (--groups)
    known_issues: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.violation is None

    def report(self, tail: int = TRACE_TAIL, always: bool = False) -> str:
        head = (f"seed {self.seed} ({self.protocol}): "
                f"{'ok' if self.ok else 'VIOLATION ' + str(self.violation)}; {self.steps} steps, "
                f"{self.sim_time_ms} ms simulated, {self.acked} acked of {self.produced} produced, "
                f"{self.faults} faults")  # fmt: skip
        if self.ok and not always:
            return head
        lines = self.trace[-tail:]
        return "\n".join([head, f"reproduce: python -m tests.sim.simulator --seeds {self.seed} "
                          f"--protocol {self.protocol}{self.flags} --trace",
                          f"last {len(lines)} of {len(self.trace)} trace lines:", *lines])  # fmt: skip


class ControllerHost:
    """The network node "controller": the active controller, if any (its epoch fences it)."""

    def __init__(self):
        self.controller: SimController | None = None
        self.zombies: list[SimController] = []  # deposed, and not aware of it yet

    def receive(self, src, msg) -> bool:
        for controller in [self.controller, *self.zombies]:
            if controller is not None and controller.active and controller.owns(msg.corr):
                return controller.receive(src, msg)
        return False


class Simulator:
    def __init__(self, seed: int | None = 0, protocol: str = "leader-epoch", broker_ids=(1, 2, 3),
                 partitions: int = 2, replication_factor: int = 3, config: SimConfig | None = None,
                 directory: Path | None = None, deterministic_network: bool = False,
                 echo: bool = False, lossy_zk: bool = False,
                 rng: random.Random | None = None, retries: bool = False,
                 idempotent: bool = False, groups: bool = False):  # fmt: skip
        self.seed = seed
        self.groups = groups  # a group member commits offsets during the run
        self.rng = rng or random.Random(seed)
        self.config = config or SimConfig()
        self.config.replication_protocol = protocol
        self.protocol = protocol
        self.clock = ManualClock()
        self.scheduler = Scheduler(self.clock)
        self.network = m.Network(self.rng, self.scheduler)
        if lossy_zk:  # the store's answers can be lost too (kazoo's ConnectionLoss)
            self.network.reliable_senders = set()
        if deterministic_network:
            self.network.min_delay_ms = self.network.max_delay_ms = 1
        self.trace_lines: list[str] = []
        self.echo = echo
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="localcluster-sim-", dir=SHM))
        self.zk = SimZk(self)
        self.network.attach("zk", self.zk)
        self.hosts = {b: BrokerHost(b, self.config, self.directory / f"broker-{b}", self)
                      for b in broker_ids}  # fmt: skip
        for b, host in self.hosts.items():
            self.network.attach(b, host)
        self.controller_host = ControllerHost()
        self.network.attach("controller", self.controller_host)
        self.client = Client(self, retries, idempotent)
        self.network.attach("client", self.client)
        self.acked: dict[tuple[str, int], dict[int, bytes]] = {}
        self.checker = InvariantChecker(self)
        self.observer = self.checker
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.steps = 0
        self.faults = 0
        self.faulting = False
        self._seq = 0
        self._uuids = 0
        self.member: GroupMember | None = None
        self._commit_seq = 0

    # -- plumbing -------------------------------------------------------------------------------

    def trace(self, line: str) -> None:
        text = f"{self.clock.now_ms():>6} {line}"
        self.trace_lines.append(text)
        if self.echo:
            print(text)

    def new_uuid(self) -> str:
        """The group coordinators' member ids: deterministic, unique across brokers."""
        self._uuids += 1
        return f"u{self._uuids}"

    def close(self) -> None:
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def step(self) -> bool:
        """Run one action, then check every invariant (raises InvariantViolation)."""
        if not self.scheduler.run_one():
            return False
        self.steps += 1
        self.checker.check()
        return True

    def run_until(self, at_ms: int) -> None:
        while (t := self.scheduler.next_time_ms()) is not None and t <= at_ms:
            self.step()
        self.clock.advance_to(max(at_ms, self.clock.now_ms()))

    def every(self, interval_ms: int, action) -> None:
        def fire():
            action()
            self.scheduler.after(interval_ms, fire)

        self.scheduler.after(interval_ms, fire)

    # -- cluster ----------------------------------------------------------------------------------

    def start_zk(self) -> None:
        self.every(10, self.zk.expire_sessions)

    def start_controller(self) -> None:
        self.controller_host.controller = SimController(self)
        controller = self.controller_host.controller

        def tick():
            host = self.controller_host
            if controller.active and (host.controller is controller or controller in host.zombies):
                controller.tick()
                self.scheduler.after(10, tick)
            elif controller in host.zombies:
                host.zombies.remove(controller)

        self.scheduler.after(10, tick)

    def crash_controller(self) -> None:
        if self.controller_host.controller is not None:
            self.trace(f"FAULT controller epoch {self.controller_host.controller.epoch} crashes")
        self.controller_host.controller = None

    def create_topic(self) -> None:
        brokers = sorted(self.hosts)
        start = self.rng.randrange(len(brokers))
        assignment = assign_replicas_to_brokers(brokers, self.partitions, self.replication_factor,
                                                fixed_start_index=start)  # fmt: skip
        self.zk.create_topic(TOPIC, assignment)
        self.trace(f"topic {TOPIC}: {dict(sorted(assignment.items()))}, min.insync.replicas "
                   f"{self.config.min_insync_replicas}")  # fmt: skip

    def start_group_member(self) -> None:
        """The offsets topic (RF 3 at most) and a member of group g committing t-0 offsets."""
        brokers = sorted(self.hosts)
        partitions = self.config.offsets_partitions
        assignment = assign_replicas_to_brokers(brokers, partitions, min(3, len(brokers)),
                                                fixed_start_index=self.rng.randrange(len(brokers)))  # fmt: skip
        self.zk.create_topic(OFFSETS_TOPIC, assignment)
        self.trace(f"topic {OFFSETS_TOPIC}: {dict(sorted(assignment.items()))}")
        self.member = GroupMember(self, "g")
        self.network.attach("member", self.member)
        self.member.join()
        self._schedule_commit()

    def _schedule_commit(self) -> None:
        if not self.faulting:
            return
        member = self.member
        if len(member.ops) < 3:  # a consumer commits as it goes, not faster than answers come
            if self.rng.random() < 0.2:
                member.fetch()
            else:
                self._commit_seq += 1
                member.commit((TOPIC, 0), self._commit_seq)
        self.scheduler.after(self.rng.randint(10, 60), self._schedule_commit)

    # -- the random run ----------------------------------------------------------------------------

    def run(self, safety_ms: int = 3000, heal_steps: int = 30_000) -> SimResult:
        violation = None
        converged_after = None
        try:
            self.start_zk()
            for host in self.hosts.values():
                host.start()
            self.start_controller()
            self.create_topic()
            self.faulting = True
            self._schedule_produce()
            self._schedule_fault()
            if self.groups:
                self.start_group_member()
            self.run_until(safety_ms)
            self.faulting = False
            self.heal()
            converged_after = self.converge(heal_steps)
            self.final_check()
        except InvariantViolation as e:
            violation = e.violation
        except Exception as e:  # an assertion inside a core, or a crash of the glue
            violation = Violation("exception", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        if violation is not None:
            self.trace(f"VIOLATION {violation}")
        return SimResult(self.seed, self.protocol, self.steps, self.clock.now_ms(), violation,
                         self.trace_lines, sum(len(a) for a in self.acked.values()),
                         self.client.produced, self.faults, converged_after,
                         vars(self.network.stats).copy(),
                         commits_acknowledged=self.member.commits_acknowledged if self.member else 0)  # fmt: skip

    def _tps(self):
        return [(TOPIC, p) for p in range(self.partitions)]

    def _schedule_produce(self) -> None:
        if not self.faulting:
            return
        self._seq += 1
        tp = self.rng.choice(self._tps())
        count = self.rng.randint(1, 3)
        values = tuple(f"{tp[1]}:{self._seq}.{i}".encode() for i in range(count))
        acks = -1 if self.rng.random() < 0.8 else 1
        self.client.produce(tp, values, acks)
        self.scheduler.after(self.rng.randint(2, 25), self._schedule_produce)

    def _schedule_fault(self) -> None:
        self.scheduler.after(self.rng.randint(20, 250), self._fault)

    def _fault(self) -> None:
        if not self.faulting:
            return
        self._schedule_fault()
        rng = self.rng
        ids = sorted(self.hosts)
        troubled = [b for b, h in self.hosts.items() if not h.alive or h.paused]
        healthy = [b for b in ids if b not in troubled]
        kind = rng.choice(["crash", "crash", "pause", "pause", "isolate", "cut", "drop",
                           "controller", "zombie", "preferred", "shutdown", "none"])  # fmt: skip
        if kind in ("crash", "pause", "isolate", "shutdown") and (
            len(troubled) >= 2 or not healthy
        ):
            kind = "none"
        self.faults += kind != "none"
        if kind == "crash":
            b = rng.choice(healthy)
            self.trace(f"FAULT crash b{b}")
            self.hosts[b].crash()
            self.scheduler.after(rng.randint(20, 400), self._restart, b)
        elif kind == "pause":
            b = rng.choice(healthy)
            duration = rng.randint(20, 500)
            self.trace(f"FAULT pause b{b} for {duration} ms")
            self.hosts[b].pause()
            self.scheduler.after(duration, self._resume, b)
        elif kind == "isolate":
            b = rng.choice(healthy)
            duration = rng.randint(20, 400)
            self.trace(f"FAULT isolate b{b} for {duration} ms")
            self.network.isolate(b)
            self.scheduler.after(duration, self._heal_node, b)
        elif kind == "cut":
            nodes = [*ids, "zk", "controller"]
            a, b = rng.sample(nodes, 2)
            duration = rng.randint(20, 400)
            self.trace(f"FAULT cut {a}<->{b} for {duration} ms")
            self.network.cut(a, b)
            self.scheduler.after(duration, self._heal_link, a, b)
        elif kind == "drop":
            rate = rng.choice([0.02, 0.05, 0.2])
            duration = rng.randint(20, 300)
            self.trace(f"FAULT drop {rate:.0%} of messages for {duration} ms")
            self.network.drop_rate = rate
            self.scheduler.after(duration, self._stop_drops)
        elif kind == "controller":
            self.crash_controller()
            self.scheduler.after(rng.randint(10, 100), self._restart_controller)
        elif kind == "zombie" and self.controller_host.controller is not None:
            # The controller loses its seat (a session expiry) and a successor starts; the old
            # one goes on acting on what it knows until its /controller watch fires.
            old = self.controller_host.controller
            old.notices_moved_at_ms = self.clock.now_ms() + rng.randint(10, 200)
            self.trace(f"FAULT controller epoch {old.epoch} is deposed and does not know it "
                       f"until {old.notices_moved_at_ms} ms")  # fmt: skip
            self.controller_host.zombies.append(old)
            self.start_controller()
        elif kind == "shutdown":
            b = rng.choice(healthy)
            controller = self.controller_host.controller
            self.trace(f"FAULT controlled shutdown of b{b}")
            if controller is not None:
                controller.controlled_shutdown(b)
            self.scheduler.after(rng.randint(5, 60), self._shutdown, b)
        elif kind == "preferred":
            controller = self.controller_host.controller
            tp = rng.choice(self._tps())
            if controller is not None:
                self.trace(f"FAULT preferred election {tp[0]}-{tp[1]}")
                controller.preferred_election(tp)

    def _restart(self, b) -> None:
        if not self.hosts[b].alive:
            self.trace(f"restart b{b}")
            self.hosts[b].start()

    def _shutdown(self, b) -> None:
        if self.hosts[b].paused:
            # A stopped process goes on with its shutdown once resumed. (Dropping it would
            # leave a broker the controller counts as shutting down, which hears no
            # LeaderAndIsr until it dies, as in Kafka, running for ever.)
            self.scheduler.after(10, self._shutdown, b)
        elif self.hosts[b].alive:
            self.trace(f"b{b} shuts down cleanly")
            self.hosts[b].shutdown()
            self.scheduler.after(self.rng.randint(20, 400), self._restart, b)

    def _resume(self, b) -> None:
        if self.hosts[b].paused:
            self.trace(f"resume b{b}")
            self.hosts[b].resume()

    def _heal_node(self, b) -> None:
        self.network.cut_links = {link for link in self.network.cut_links if b not in link}

    def _heal_link(self, a, b) -> None:
        self.network.cut_links.discard(frozenset((a, b)))

    def _stop_drops(self) -> None:
        self.network.drop_rate = 0.0

    def _restart_controller(self) -> None:
        if self.controller_host.controller is None:
            self.start_controller()

    # -- heal and converge --------------------------------------------------------------------------

    def heal(self) -> None:
        self.trace("HEAL: faults stop; everything restarts, resumes and reconnects")
        self.network.heal()
        self.network.drop_rate = 0.0
        for _, host in sorted(self.hosts.items()):
            if not host.alive:
                host.start()
            elif host.paused:
                host.resume()
        if self.controller_host.controller is None or not self.controller_host.controller.active:
            self.start_controller()

    def converged(self) -> bool:
        if self.client.busy or (self.member is not None and self.member.busy):
            return False
        for tp in self._tps():
            found = self.zk.states.get(tp)
            if found is None:
                return False
            state = found[0]
            if set(state.isr) != set(self.zk.assignments[tp]):
                return False
            leader = self.checker.acting_leader(tp)
            if leader is None:
                return False
            _, lhosted = leader
            if lhosted.state.high_watermark != lhosted.log.log_end_offset:
                return False
            lview = log_view(lhosted.log)
            for r in self.zk.assignments[tp]:
                broker = self.hosts[r].incarnation
                hosted = broker.partitions.get(tp) if broker else None
                if hosted is None or hosted.state.leader_epoch != state.leader_epoch:
                    return False
                if hosted.state.high_watermark != lhosted.state.high_watermark:
                    return False
                view = log_view(hosted.log)
                start = max(view.start, lview.start)
                if batches_below(view, view.end, start) != batches_below(lview, lview.end, start):
                    return False
                if view.end != lview.end:
                    return False
        return True

    def converge(self, max_steps: int) -> int:
        start = self.steps
        while not self.converged():
            if self.steps - start >= max_steps or not self.step():
                self.checker.fail("no-convergence", f"not converged {self.steps - start} steps "
                                  f"after the heal: {self.status()}")  # fmt: skip
        self.trace(f"converged {self.steps - start} steps after the heal")
        return self.steps - start

    def final_check(self) -> None:
        for tp in self._tps():
            leader = self.checker.acting_leader(tp)
            if leader is None:
                self.checker.fail("no-convergence", f"{tp[0]}-{tp[1]} has no leader at the end")
            view = log_view(leader[1].log)
            for offset, value in self.acked.get(tp, {}).items():
                if offset >= view.start and view.values.get(offset) != value:
                    self.checker.fail("acked-lost", f"{tp[0]}-{tp[1]}: acknowledged {value!r} at "
                                      f"{offset} is not in the final leader's log")  # fmt: skip

    def status(self) -> str:
        parts = []
        for tp in self._tps():
            found = self.zk.states.get(tp)
            parts.append(f"{tp[0]}-{tp[1]} zk={found}")
            for b, host in sorted(self.hosts.items()):
                broker = host.incarnation
                hosted = broker.partitions.get(tp) if broker else None
                if hosted is None:
                    parts.append(f"  b{b}: {'not hosted' if broker else 'down'}")
                    continue
                p = hosted.state
                parts.append(f"  b{b}: leader b{p.leader_id} epoch {p.leader_epoch} isr "
                             f"{sorted(p.isr)} pending {p.pending_isr} hw {p.high_watermark} "
                             f"leo {p.log_end_offset}")  # fmt: skip
        return "\n".join(parts)


# -- scripted scenarios ---------------------------------------------------------------------------

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
PROTOCOLS = ("leader-epoch", "hw-truncation")
OUTPUT_MARK = "== output "


@dataclass
class ScenarioRun:
    name: str
    protocol: str
    output: list[str]
    violations: list[Violation]
    expected_kinds: set[str]

    @property
    def kinds(self) -> set[str]:
        return {v.kind for v in self.violations}


def _tp(text: str) -> tuple[str, int]:
    topic, _, partition = text.rpartition("-")
    return topic, int(partition)


def _node(text: str):
    return int(text) if text.isdigit() else text


def _ids(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


class ScenarioRunner:
    """Plays a script: the test is the controller (`elect`), the faults are explicit, the
    network delivers every message after exactly 1 ms. Invariant violations are recorded
    (once per kind) and the script goes on, so the golden output shows what followed.

    Commands, one a line (# starts a comment):
        expect PROTOCOL KIND...        the violations PROTOCOL must show (others: none)
        config NAME=VALUE...           SimConfig settings, before `brokers`
        brokers ID...                  start the brokers
        topic T-P ID,ID                a partition and its replicas
        elect T-P leader=ID epoch=E isr=ID,ID [to=ID,ID]
                                       write the state znode, send LeaderAndIsr
        produce T-P V[,V] [acks=1]     a batch, acks=all unless told (sent once, unless:)
        producer idempotent|plain      from now on acks=all batches are retried, with or
                                       without idempotence (producer id, epoch, sequence)
        cut A B | heal A B             cut or heal the link between two nodes (ids, client)
        run MS                         let MS milliseconds pass
        crash ID | restart ID | pause ID | resume ID
        lose-unflushed ID T-P OFFSET   a crashed broker loses its records from OFFSET on
        lose-zk-answers on|off         the store's answers are lost (after it applied them)
        show T-P                       each replica's role, epoch, ISR, HW, LEO and records
        group G join                   a consumer group member (group_member.py) joins G
        group G commit T-P OFFSET      ... commits an offset (retried until acknowledged)
        group G fetch                  ... fetches G's committed offsets
        show-group G                   each broker's shard of G: state, epoch, generation, offsets
    """

    def __init__(self, protocol: str):
        self.protocol = protocol
        self.config = SimConfig(
            replica_lag_time_max_ms=100_000, zookeeper_session_timeout_ms=100_000
        )
        self.sim: Simulator | None = None
        self.output: list[str] = []
        self.expected: dict[str, set[str]] = {}
        self.members: dict[str, GroupMember] = {}
        self._corr = 0

    def run(self, script: str) -> list[Violation]:
        for number, raw in enumerate(script.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            words = line.split()
            try:
                getattr(self, "do_" + words[0].replace("-", "_"))(*words[1:])
            except InvariantViolation:
                raise AssertionError("unreachable: scenarios collect violations") from None
            except Exception as e:
                raise ValueError(f"scenario line {number}: {raw!r}: {type(e).__name__}: {e}") from e
        self.do_check_acked()
        if self.sim is not None:
            self.sim.close()
        return self.sim.checker.collect if self.sim else []

    def _trace(self, line: str) -> None:
        self.output.append(line)

    # -- commands ------------------------------------------------------------------------------

    def do_expect(self, protocol: str, *kinds: str) -> None:
        self.expected[protocol] = set(kinds)

    def do_config(self, *pairs: str) -> None:
        for pair in pairs:
            key, _, value = pair.partition("=")
            if not hasattr(self.config, key):
                raise ValueError(f"unknown setting {key}")
            setattr(self.config, key, int(value))

    def do_brokers(self, *ids: str) -> None:
        sim = Simulator(None, self.protocol, tuple(int(b) for b in ids), partitions=0,
                        config=self.config, deterministic_network=True)  # fmt: skip
        sim.trace = lambda line, sim=sim: self._trace(f"{sim.clock.now_ms():>6} {line}")
        sim.checker.collect = []
        self.sim = sim
        sim.start_zk()
        for host in sim.hosts.values():
            host.start()

    def do_topic(self, tp: str, replicas: str) -> None:
        self.sim.zk.assignments[_tp(tp)] = _ids(replicas)
        self.sim.partitions = max(self.sim.partitions, _tp(tp)[1] + 1)

    def do_elect(self, tp: str, *args: str) -> None:
        """The test as controller: write the state znode, send LeaderAndIsr."""
        tp_ = _tp(tp)
        opts = dict(a.split("=", 1) for a in args)
        zk = self.sim.zk
        replicas = zk.assignments[tp_]
        leader, epoch, isr = int(opts["leader"]), int(opts["epoch"]), _ids(opts["isr"])
        found = zk.states.get(tp_)
        state = LeaderAndIsr(leader, epoch, isr, 1)
        if found is None:
            version = zk.create_partition_state(tp_, state, zk.controller_epoch)
        elif (found[0].leader, found[0].leader_epoch, found[0].isr) != (leader, epoch, isr):
            version = zk.update_partition_state(tp_, state, found[1], zk.controller_epoch)
        else:
            version = found[1]
        to = _ids(opts["to"]) if "to" in opts else replicas
        self._corr += 1
        partition = PartitionState(tp_[0], tp_[1], 1, leader, epoch, isr, version, replicas)
        self.sim.trace(f"elect {tp}: leader b{leader} epoch {epoch} isr {list(isr)} (v{version}), "
                       f"sent to {[f'b{b}' for b in to]}")  # fmt: skip
        for b in to:
            self.sim.network.send(
                "controller", b, m.LeaderAndIsr(self._corr, zk.controller_epoch, (partition,))
            )

    def do_produce(self, tp: str, values: str, *args: str) -> None:
        opts = dict(a.split("=", 1) for a in args)
        acks = -1 if opts.get("acks", "all") == "all" else int(opts["acks"])
        self.sim.client.produce(_tp(tp), tuple(v.encode() for v in values.split(",")), acks, 10_000)

    def do_producer(self, mode: str) -> None:
        assert mode in ("idempotent", "plain"), mode
        self.sim.client.configure(retries=True, idempotent=mode == "idempotent")
        self.sim.trace(f"the producer retries, {'' if mode == 'idempotent' else 'not '}idempotent")

    def do_cut(self, a: str, b: str) -> None:
        self.sim.trace(f"cut {a}<->{b}")
        self.sim.network.cut(*(_node(x) for x in (a, b)))

    def do_heal(self, a: str, b: str) -> None:
        self.sim.trace(f"heal {a}<->{b}")
        self.sim.network.cut_links.discard(frozenset(_node(x) for x in (a, b)))

    def do_run(self, ms: str) -> None:
        self.sim.run_until(self.sim.clock.now_ms() + int(ms))

    def do_crash(self, b: str) -> None:
        self.sim.trace(f"crash b{b}")
        self.sim.hosts[int(b)].crash()

    def do_restart(self, b: str) -> None:
        self.sim.trace(f"restart b{b}")
        self.sim.hosts[int(b)].start()

    def do_pause(self, b: str) -> None:
        self.sim.trace(f"pause b{b}")
        self.sim.hosts[int(b)].pause()

    def do_resume(self, b: str) -> None:
        self.sim.trace(f"resume b{b}")
        self.sim.hosts[int(b)].resume()

    def do_lose_unflushed(self, b: str, tp: str, offset: str) -> None:
        """Power loss on a crashed broker: records from `offset` on were never flushed."""
        host = self.sim.hosts[int(b)]
        assert not host.alive, "lose-unflushed needs a crashed broker"
        directory = host.directory / tp
        cut_segment_files(directory, int(offset))
        (host.directory / "recovery-point-offset-checkpoint").unlink(missing_ok=True)
        self.sim.trace(f"b{b} lost the unflushed records of {tp} from offset {offset} (power loss)")

    def do_lose_zk_answers(self, switch: str) -> None:
        """While on, every answer of the store is lost (after the store applied the request),
        as a kazoo ConnectionLoss would lose it."""
        network = self.sim.network
        network.lost_senders = {"zk"} if switch == "on" else set()
        self.sim.trace(f"answers of zk are {'lost' if switch == 'on' else 'delivered'} from now on")

    def do_show(self, tp: str) -> None:
        tp_ = _tp(tp)
        found = self.sim.zk.states.get(tp_)
        if found:
            self._trace(f"  zk {tp}: leader b{found[0].leader} epoch {found[0].leader_epoch} "
                        f"isr {list(found[0].isr)}")  # fmt: skip
        for b, host in sorted(self.sim.hosts.items()):
            broker = host.incarnation
            if broker is None:
                self._trace(f"  b{b}: down")
                continue
            hosted = broker.partitions.get(tp_)
            lg = hosted.log if hosted else broker.logs.get(tp_)
            records = describe(log_view(lg)) if lg is not None else "(no log)"
            if hosted is None:
                self._trace(f"  b{b}: not hosted; {records}")
                continue
            p = hosted.state
            role = "leader" if p.is_leader else f"follower of b{p.leader_id}"
            self._trace(f"  b{b}: {role} epoch {p.leader_epoch} isr {sorted(p.isr)} hw "
                        f"{p.high_watermark} leo {p.log_end_offset}: {records}")  # fmt: skip

    def do_group(self, group_id: str, action: str, *args: str) -> None:
        member = self.members.get(group_id)
        if member is None:
            assert not self.members, "one member per scenario (the network node 'member')"
            member = self.members[group_id] = GroupMember(self.sim, group_id)
            self.sim.network.attach("member", member)
        if action == "join":
            member.join()
        elif action == "commit":
            member.commit(_tp(args[0]), int(args[1]))
        else:
            assert action == "fetch", action
            member.fetch()

    def do_show_group(self, group_id: str) -> None:
        partition = partition_for(group_id, self.sim.config.offsets_partitions)
        for b, host in sorted(self.sim.hosts.items()):
            broker = host.incarnation
            shard = broker.groups.shards.get(partition) if broker else None
            if shard is None:
                self._trace(f"  b{b}: {'down' if broker is None else 'not its coordinator'}")
                continue
            group = shard.groups.get(group_id)
            held = ("no group" if group is None else
                    f"{group.state.value} generation {group.generation_id} offsets " + (" ".join(
                        f"{t}-{p}@{o.committed_offset}" for (t, p), o in sorted(group.offsets.items()))
                        or "none"))  # fmt: skip
            self._trace(f"  b{b}: {OFFSETS_TOPIC}-{partition} {shard.state.value} epoch "
                        f"{shard.coordinator_epoch}: {held}")  # fmt: skip

    def do_check_acked(self) -> None:
        """Every acknowledged record must be in the recorded leader's log (on disk if down)."""
        sim = self.sim
        if sim is None:
            return
        for tp, acked in sorted(sim.acked.items()):
            found = sim.zk.states.get(tp)
            host = sim.hosts.get(found[0].leader) if found else None
            if host is None or host.incarnation is None:
                continue
            lg = host.incarnation.logs.get(tp)
            view = log_view(lg)
            for offset, value in sorted(acked.items()):
                if view.values.get(offset) != value:
                    sim.checker.fail("acked-lost", f"{tp[0]}-{tp[1]}: acknowledged {value.decode()} "
                                     f"at {offset} is not in leader b{host.broker_id}'s log")  # fmt: skip


def cut_segment_files(directory: Path, offset: int) -> None:
    """Cut a log's segment files before the first batch at or past `offset`, and drop their
    indexes (rebuilt on open), as a power loss of unflushed page cache would."""
    import struct

    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        position = 0
        while position + 12 <= len(data):
            base_offset, length = struct.unpack_from(">qi", data, position)
            if length <= 0 or base_offset >= offset:
                break
            position += 12 + length
        if position < len(data):
            with open(segment, "r+b") as f:
                f.truncate(position)
        for suffix in (".index", ".timeindex"):
            segment.with_suffix(suffix).unlink(missing_ok=True)
        (directory / "clean-shutdown").unlink(missing_ok=True)


def parse_scenario(text: str) -> tuple[str, dict[str, str]]:
    """(script, {protocol: golden output})."""
    script, golden, current = [], {}, None
    for line in text.splitlines():
        if line.startswith(OUTPUT_MARK):
            current = line[len(OUTPUT_MARK) :].strip(" =")
            golden[current] = []
        elif current is None:
            script.append(line)
        else:
            golden[current].append(line)
    return "\n".join(script).rstrip() + "\n", {
        k: "\n".join(v).strip("\n") for k, v in golden.items()
    }


def run_scenario(path: Path, protocol: str) -> ScenarioRun:
    script, _ = parse_scenario(path.read_text())
    runner = ScenarioRunner(protocol)
    violations = runner.run(script)
    return ScenarioRun(path.stem, protocol, runner.output, violations,
                       runner.expected.get(protocol, set()))  # fmt: skip


def render_scenario(path: Path) -> tuple[str, dict[str, ScenarioRun]]:
    """The file as it should read: the script, then each protocol's output."""
    script, _ = parse_scenario(path.read_text())
    runs = {protocol: run_scenario(path, protocol) for protocol in PROTOCOLS}
    parts = [script.rstrip("\n")]
    for protocol, run in runs.items():
        parts.append(f"\n{OUTPUT_MARK}{protocol} ==")
        parts.extend(run.output)
    return "\n".join(parts) + "\n", runs


def check_all(update: bool = False) -> int:
    failed = 0
    for path in sorted(SCENARIOS.glob("*.txt")):
        text, runs = render_scenario(path)
        for run in runs.values():
            status = "ok" if run.kinds == run.expected_kinds else "UNEXPECTED"
            failed += status != "ok"
            print(f"{path.name} [{run.protocol}]: violations {sorted(run.kinds) or 'none'}, "
                  f"expected {sorted(run.expected_kinds) or 'none'}: {status}")  # fmt: skip
        if text != path.read_text():
            if update:
                path.write_text(text)
                print(f"{path.name}: golden output rewritten")
            else:
                failed += 1
                print(f"{path.name}: output differs from the golden output (--update-golden)")
    return 1 if failed else 0


# (brokers, partitions, replication factor, min.insync.replicas); the first is the common case.
SHAPES = [(3, 2, 3, 2)] * 3 + [(3, 2, 3, 1), (4, 3, 3, 2), (2, 1, 2, 1), (5, 2, 3, 2)]


# Known issues a random run traces instead of failing on; each has a scenario file (xfail).
TOLERATED = {"hw-backwards-after-restart", "acked-duplicated-after-epoch-bump"}


def simulator_for_seed(seed: int, protocol: str = "leader-epoch", lossy_zk: bool = False,
                       unclean: bool = False, idempotent: bool = True,
                       groups: bool = False) -> Simulator:  # fmt: skip
    """The cluster's shape comes from the seed too. The producer retries; it is idempotent
    unless told (then a retry may write a batch twice: the acked-duplicated invariant). With
    `groups`, a group member commits offsets too (the commit-lost/backwards invariants)."""
    rng = random.Random(seed)
    brokers, partitions, rf, min_isr = rng.choice(SHAPES)
    retention_bytes = rng.choice([-1, 2048])  # with 1 KiB segments: about two kept
    config = SimConfig(min_insync_replicas=min_isr, unclean_leader_election_enable=unclean,
                       log_retention_bytes=retention_bytes)  # fmt: skip
    sim = Simulator(seed, protocol, tuple(range(1, brokers + 1)), partitions, rf, config,
                    lossy_zk=lossy_zk, rng=rng, retries=True, idempotent=idempotent,
                    groups=groups)  # fmt: skip
    sim.checker.tolerated = set(TOLERATED)
    return sim


def run_seed(seed: int, protocol: str = "leader-epoch", lossy_zk: bool = False,
             unclean: bool = False, idempotent: bool = True, groups: bool = False,
             **kwargs) -> SimResult:  # fmt: skip
    sim = simulator_for_seed(seed, protocol, lossy_zk, unclean, idempotent, groups)
    try:
        result = sim.run(**kwargs)
        result.flags = (" --unclean" * unclean + " --lossy-zk" * lossy_zk
                        + " --no-idempotence" * (not idempotent) + " --groups" * groups)  # fmt: skip
        result.known_issues = list(sim.checker.tolerated_seen)
        return result
    finally:
        sim.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0:100", help="N, or A:B for the range [A, B)")
    parser.add_argument(
        "--protocol", default="leader-epoch", choices=["leader-epoch", "hw-truncation"]
    )
    parser.add_argument("--trace", action="store_true", help="print the whole trace of each seed")
    parser.add_argument("--lossy-zk", action="store_true", help="the store's answers can be lost")
    parser.add_argument(
        "--unclean", action="store_true", help="unclean.leader.election.enable=true"
    )
    parser.add_argument("--no-idempotence", action="store_true",
                        help="the producer retries without idempotence (duplicates)")  # fmt: skip
    parser.add_argument("--groups", action="store_true",
                        help="a consumer group member commits offsets during the run")  # fmt: skip
    parser.add_argument("--update-golden", action="store_true", help="rewrite the scenario files")
    parser.add_argument("--scenarios", action="store_true", help="run the scenario files")
    args = parser.parse_args(argv)
    logging.getLogger("localcluster").setLevel(logging.ERROR)  # the cores' warnings: expected here
    if args.update_golden or args.scenarios:
        return check_all(update=args.update_golden)
    if ":" in args.seeds:
        a, b = (int(x) for x in args.seeds.split(":"))
        seeds = range(a, b)
    else:
        seeds = [int(args.seeds)]
    failed = known = 0
    started = time.perf_counter()
    for seed in seeds:
        result = run_seed(seed, args.protocol, lossy_zk=args.lossy_zk, unclean=args.unclean,
                          idempotent=not args.no_idempotence, groups=args.groups)  # fmt: skip
        for issue in result.known_issues[:1]:
            known += 1
            print(f"seed {seed}: known issue {issue}")
        if not result.ok or args.trace:
            print(result.report(tail=10**9 if args.trace else TRACE_TAIL, always=args.trace))
        failed += not result.ok
    elapsed = time.perf_counter() - started
    print(f"{len(seeds)} seeds ({args.protocol}), {failed} failed, {known} with known issues, "
          f"{elapsed:.1f} s")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
