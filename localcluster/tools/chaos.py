"""The engine of `localcluster chaos`: kill -9 brokers under acks=all load, then check.

`run_chaos` starts a cluster in a temp dir (or uses an existing one), creates a topic, runs a
producer thread writing unique, sequential values per key with acks=all, and meanwhile applies
a seeded schedule of faults: SIGKILL (the broker is restarted with the same id and data after
its down time) or SIGSTOP (SIGCONT after its pause) to a partition's leader, a follower, the
controller, any broker, or the supervisor. At the end every broker is brought back, the
producer is flushed, the ISRs are waited full, and chaos_check consumes every partition and
checks that no acknowledged record was lost. With `consumers`, a confluent-kafka consumer
group (tools/chaos_consumer.py) reads the topic during the faults, its coordinator and its
members are targets too, and after a bounded drain the checker adds the group's checks.

The schedule (`make_schedule`) depends only on the seed and the options, so a seed reproduces
it; which broker a target names is resolved when the fault fires (the leader of partition 1 is
whoever leads it then) and printed as it happens. A fault is skipped, and says why, when its
target is already down or when `max_down` brokers are down; a restarted broker counts as down
until it has registered again. Chained kills (the next leader) may take the count to
brokers - 1: they are the deliberate double failure.

Rules: every process started here is ended by pid or process group, never by name; the temp
cluster dir is removed (`down --purge`). Waits have deadlines, and every loop here asks
perf's ClusterWatch whether the cluster is still there: removed (`down --purge`, its dir
deleted) or with no broker running for 5 s, the run gives up within seconds with a
ClusterError (one line, exit 1) and restarts nothing. The schedule's clock is a
monotonic one; the acknowledgements carry wall-clock ms to match the brokers' log lines.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from localcluster import cluster
from localcluster.metadata_types import OFFSETS_TOPIC
from localcluster.tools import chaos_check, chaos_consumer
from localcluster.tools.perf import ClusterWatch
from localcluster.waiting import wait_until

TARGETS = ("leader", "controller", "follower", "any", "supervisor", "coordinator", "consumer")
GROUP_TARGETS = ("coordinator", "consumer")  # need --consumers
FAULTS = ("kill", "stop")
TOPIC_CONFIGS = ("unclean.leader.election.enable", "min.insync.replicas")
START_TIMEOUT_S = 90.0
RECOVER_TIMEOUT_S = 120.0
TICK_S = 0.01
MONITOR_EVERY_S = 0.1
ACK_GAP_MS = 1000  # a partition with no acknowledgement for longer is reported unavailable
GROUP_FORM_TIMEOUT_S = 60.0  # for the consumer group's first assignment (makes __consumer_offsets)


# -- the schedule -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fault:
    at_ms: int  # from the start of the fault phase
    fault: str  # kill | stop
    target: str  # leader | controller | follower | any | supervisor
    partition: int  # whose leader / follower (leader and follower targets)
    pick: float  # [0, 1): which of several candidates (follower, any)
    down_ms: int  # until the restart (kill) or SIGCONT (stop)
    chain_ms: int = (
        -1
    )  # >= 0: then SIGKILL the partition's next leader this long after its election
    chained: bool = False  # this is such a follow-up kill

    def describe(self) -> str:
        what = {"leader": f"leader of p{self.partition}", "follower": f"a follower of p{self.partition}",
                "controller": "the controller", "any": "any broker", "supervisor": "the supervisor",
                "coordinator": "the group's coordinator", "consumer": "a consumer"}  # fmt: skip
        back = "restart" if self.fault == "kill" else "SIGCONT"
        sig = "SIGKILL" if self.fault == "kill" else "SIGSTOP"
        chain = (f"; then SIGKILL the next leader of p{self.partition} {self.chain_ms} ms after its election"
                 if self.chain_ms >= 0 else "")  # fmt: skip
        return (f"t={self.at_ms / 1000:7.3f}s  {sig} {what[self.target]} (pick {self.pick:.2f}), {back} after "
                f"{self.down_ms} ms{chain}")  # fmt: skip


def make_schedule(seed: int, duration_s: float, kill_every_ms: int, targets, faults, partitions: int,
                  session_timeout_ms: int = 6000) -> list[Fault]:  # fmt: skip
    """Faults at exponential gaps averaging kill_every_ms (so some come close together, as two
    failures in a row do). Kills stay down 0.5-3x kill_every_ms; stops pause 0.2-2x, or one in
    five past the session timeout, so the paused broker is declared dead and later wakes up.
    One leader kill in two is a chain: the partition's next leader is killed too, 0-40 ms after
    the store names it (a cascading failure: the window in which a follower that has just cut
    its log, as hw-truncation does, has not fetched it back yet)."""
    rng = random.Random(seed)
    out = []
    t = rng.expovariate(1 / kill_every_ms)
    while t < duration_s * 1000:
        fault = rng.choice(list(faults))
        target = rng.choice(list(targets))
        partition = rng.randrange(partitions)
        pick = rng.random()
        if fault == "kill":
            down = rng.uniform(0.5, 3.0) * kill_every_ms
        elif rng.random() < 0.2:
            down = session_timeout_ms * rng.uniform(1.2, 1.6)
        else:
            down = rng.uniform(0.2, 2.0) * kill_every_ms
        chain = rng.randrange(0, 41) if rng.random() < 0.5 else -1
        if not (fault == "kill" and target == "leader"):
            chain = -1
        out.append(
            Fault(int(t), fault, target, partition, round(pick, 4), max(50, int(down)), chain)
        )
        t += rng.expovariate(1 / kill_every_ms)
    return out


# -- the load -----------------------------------------------------------------------------------


class Load:
    """One producer thread: keys k0..kK-1 round robin, values `key:sequence`, acks=all, at a
    bounded rate with a bounded number of records in flight."""

    def __init__(
        self,
        cluster_dir: Path,
        topic: str,
        keys: int,
        rate: int,
        max_in_flight: int = 2000,
        idempotence: bool = True,
    ):
        self.cluster_dir, self.topic, self.keys, self.rate = cluster_dir, topic, keys, rate
        self.idempotence = idempotence
        self.acks: list[chaos_check.Ack] = []
        self.failed: list[tuple[str, int, str]] = []
        self.sent = 0
        self.in_flight = threading.BoundedSemaphore(max_in_flight)
        self.stop_sending = threading.Event()
        self.producer = None
        self.thread = threading.Thread(target=self._run, name="chaos-load", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        from localcluster.client import Producer

        self.producer = Producer({"enable.idempotence": self.idempotence},
                                 cluster_dir=self.cluster_dir, acks="all", linger_ms=5,
                                 request_timeout_ms=3000, delivery_timeout_ms=300_000,
                                 retry_backoff_ms=50, max_block_ms=600_000)  # fmt: skip
        self.thread.start()

    def _run(self) -> None:
        sequences = [0] * self.keys
        started = time.monotonic()
        try:
            while not self.stop_sending.is_set():
                due = int((time.monotonic() - started) * self.rate) - self.sent
                if due <= 0:
                    time.sleep(0.005)  # pacing the load, not synchronisation
                    continue
                for _ in range(min(due, 200)):
                    k = self.sent % self.keys
                    key, sequence = f"k{k}", sequences[k]
                    sequences[k] += 1
                    while not self.in_flight.acquire(timeout=0.1):
                        if self.stop_sending.is_set():
                            return
                    future = self.producer.send(
                        self.topic, chaos_check.record_value(key, sequence), key=key
                    )
                    self.sent += 1
                    future.add_done_callback(
                        lambda f, key=key, sequence=sequence: self._done(f, key, sequence)
                    )
        except BaseException as e:  # noqa: BLE001 (reported by the engine)
            self.error = e

    def _done(self, future, key: str, sequence: int) -> None:
        self.in_flight.release()
        if future.cancelled():
            self.failed.append((key, sequence, "cancelled"))
        elif future.exception() is not None:
            self.failed.append((key, sequence, str(future.exception())))
        else:
            partition, offset = future.result()
            self.acks.append(
                chaos_check.Ack(key, sequence, partition, offset, int(time.time() * 1000))
            )

    def finish(self, timeout_s: float, check=None) -> None:
        """Stop sending; wait for what is in flight (acknowledged or failed) up to timeout_s,
        calling check() (which may raise to give up) as it waits."""
        self.stop_sending.set()
        self.thread.join(5)
        if self.producer is None:
            return

        # Not producer.flush(short timeout) in a loop: a flush that times out cancels the
        # futures of the records still in flight (their acknowledgements would be lost to the
        # check); the load's own callbacks tell when every record is answered.
        def answered():
            if check is not None:
                check()
            return len(self.acks) + len(self.failed) >= self.sent

        try:
            wait_until(answered, timeout_s, 0.05)
        finally:
            with contextlib.suppress(Exception):
                self.producer.close(min(5.0, timeout_s))


# -- the engine ---------------------------------------------------------------------------------


@dataclass
class Engine:
    cluster_dir: Path
    spec: cluster.ClusterSpec
    topic: str
    partitions: int
    max_down: int
    say: object  # callable(str)
    started: float = field(default_factory=time.monotonic)
    down: dict = field(default_factory=dict)  # broker id -> "killed" | "stopped" | "starting"
    starting: dict = field(default_factory=dict)  # broker id -> the Popen of its restart
    supervisor_down: str | None = None
    children: list = field(default_factory=list)  # Popen of brokers and supervisors we started
    events: list = field(default_factory=list)
    cycles: int = 0
    skipped: int = 0
    unavailable: dict = field(default_factory=lambda: defaultdict(list))  # p -> [[start, end]]
    _spawned: list = field(default_factory=list)  # (broker id, Popen) of our restarts
    warnings: list = field(default_factory=list)
    chains: list = field(default_factory=list)  # [partition, old leader, fault, give up at ms]
    _open_windows: dict = field(default_factory=dict)
    _zk: object = None
    watch: object = None  # perf.ClusterWatch of the cluster; None: never give up
    group: object = None  # chaos_consumer.ConsumerGroup (--consumers): its coordinator, its members
    consumers_down: dict = field(default_factory=dict)  # member name -> "killed" | "stopped"

    def check_cluster(self) -> None:
        """Raise ClusterError when the cluster went away (see the module's rules)."""
        problem = self.watch.problem() if self.watch is not None else None
        if problem is not None:
            raise cluster.ClusterError(problem)

    def now_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    def zk(self):
        if self._zk is None:
            from localcluster.coord import connect
            from localcluster.coord.kafka_zk import KafkaZkClient

            self._zk = KafkaZkClient(connect(self.spec.coordination))
        return self._zk

    def close(self) -> None:
        if self._zk is not None:
            with contextlib.suppress(Exception):
                self._zk.coord.stop()
            self._zk = None

    def record(self, action: str, **details) -> None:
        event = {"t_ms": self.now_ms(), "action": action, **details}
        self.events.append(event)
        text = " ".join(f"{k}={v}" for k, v in details.items())
        self.say(f"  {event['t_ms'] / 1000:7.3f}s  {action} {text}")

    def reap(self) -> None:
        for process in list(self.children):
            if process.poll() is not None:
                self.children.remove(process)

    # -- resolving targets --------------------------------------------------------------------

    def state(self, partition: int):
        found = self.zk().partition_state(self.topic, partition)
        return found[0] if found else None

    def resolve(self, fault: Fault) -> tuple[int | None, str]:
        """The broker a fault names now, or None and why not."""
        if fault.target == "supervisor":
            return None, ""
        if fault.target == "controller":
            broker = self.zk().controller_id()
            return (broker, "") if broker is not None else (None, "no controller")
        if fault.target == "coordinator":
            return self.coordinator()
        up = [b for b in self.spec.brokers if b not in self.down]
        if fault.target == "any":
            return up[int(fault.pick * len(up))] if up else None, "no broker up"
        state = self.state(fault.partition)
        if state is None or state.leader < 0:
            return None, f"p{fault.partition} has no leader"
        if fault.target == "leader":
            return state.leader, ""
        replicas = self.zk().assignment(self.topic).partitions[fault.partition]
        followers = [b for b in replicas if b != state.leader and b not in self.down]
        if not followers:
            return None, f"p{fault.partition} has no follower up"
        return followers[int(fault.pick * len(followers))], ""

    def coordinator(self) -> tuple[int | None, str]:
        """The group's coordinator: the leader of its __consumer_offsets partition."""
        from localcluster.group import partition_for

        if self.group is None:
            return None, "no consumer group (--consumers)"
        offsets = self.zk().assignment(OFFSETS_TOPIC)
        if offsets is None:
            return None, f"no {OFFSETS_TOPIC} yet"
        found = self.zk().partition_state(
            OFFSETS_TOPIC, partition_for(self.group.group, len(offsets.partitions))
        )
        if found is None or found[0].leader < 0:
            return None, "the group's offsets partition has no leader"
        return found[0].leader, ""

    # -- faults and recoveries ----------------------------------------------------------------

    def apply(self, fault: Fault) -> tuple | None:
        """Fire one fault; returns the recovery to schedule (or None when skipped)."""
        if fault.target == "supervisor":
            return self._supervisor_fault(fault)
        if fault.target == "consumer":
            return self._consumer_fault(fault)
        if self.supervisor_down == "restarting":
            return self._skip(fault, "the supervisor is being restarted")
        broker, why = self.resolve(fault)
        if broker is None:
            return self._skip(fault, why)
        if broker in self.down:
            return self._skip(fault, f"broker {broker} is already down")
        limit = len(self.spec.brokers) - 1 if fault.chained else self.max_down
        if len(self.down) >= limit:
            return self._skip(fault, f"{len(self.down)} brokers are down (max {limit})")
        pid = cluster.broker_pid(self.cluster_dir, broker)
        if pid is None:
            return self._skip(fault, f"broker {broker} is not running")
        if fault.fault == "kill":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            cluster.send_signal(pid, signal.SIGKILL)
            cluster.wait_gone([pid], 5.0)
            self.down[broker] = "killed"
        else:
            cluster.pause(self.spec, pid)
            self.down[broker] = "stopped"
        if fault.chain_ms >= 0:
            self.chains.append([fault.partition, broker, fault, self.now_ms() + 5000])
        self.record("SIGKILL" if fault.fault == "kill" else "SIGSTOP", broker=broker, pid=pid,
                    target=fault.target + (f":p{fault.partition}" if fault.target in ("leader", "follower") else ""),
                    back_in_ms=fault.down_ms)  # fmt: skip
        return ("broker", broker, pid)

    def _skip(self, fault: Fault, why: str) -> None:
        self.skipped += 1
        self.record("skip", target=fault.target, why=repr(why))
        return None

    def _supervisor_fault(self, fault: Fault):
        if self.supervisor_down:
            return self._skip(fault, "the supervisor is already down")
        pid = cluster.supervisor_pid(self.cluster_dir)
        if pid is None:
            return self._skip(fault, "no supervisor runs")
        if fault.fault == "kill":
            cluster.send_signal(pid, signal.SIGKILL)
            cluster.wait_gone([pid], 5.0)
            self.supervisor_down = "killed"
        else:
            cluster.pause(self.spec, pid)
            self.supervisor_down = "stopped"
        self.record(
            "SIGKILL" if fault.fault == "kill" else "SIGSTOP",
            supervisor=pid,
            back_in_ms=fault.down_ms,
        )
        return ("supervisor", None, pid)

    def _consumer_fault(self, fault: Fault):
        """SIGKILL (restarted after down_ms: a new member, the same file) or SIGSTOP a member.
        Not counted in max_down, which is about brokers."""
        if self.group is None:
            return self._skip(fault, "no consumer group (--consumers)")
        up = [
            n
            for n, p in self.group.processes.items()
            if p.poll() is None and n not in self.consumers_down
        ]
        if not up:
            return self._skip(fault, "no consumer is up")
        name = up[int(fault.pick * len(up))]
        pid = self.group.processes[name].pid
        if fault.fault == "kill":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.group.processes[name].wait(5)
        else:
            cluster.send_signal(pid, signal.SIGSTOP)
        self.consumers_down[name] = "killed" if fault.fault == "kill" else "stopped"
        self.record("SIGKILL" if fault.fault == "kill" else "SIGSTOP", consumer=name, pid=pid,
                    back_in_ms=fault.down_ms)  # fmt: skip
        return ("consumer", name, pid)

    def _recover_consumer(self, name: str, pid: int) -> None:
        state = self.consumers_down.pop(name, None)
        if state == "stopped":
            cluster.send_signal(pid, signal.SIGCONT)
            self.record("SIGCONT", consumer=name, pid=pid)
        elif state == "killed":
            process = self.group.restart(name)
            self.record("restart", consumer=name, pid=process.pid)
        self.cycles += 1

    def recover(self, kind: str, broker, pid: int) -> bool:
        """Undo one fault; False when it must wait (a supervisor restart waits for every broker
        to be up, so that it spawns none of them while we restart them too)."""
        if kind == "consumer":
            self._recover_consumer(broker, pid)
            return True
        if kind == "supervisor":
            if self.supervisor_down == "stopped":
                cluster.send_signal(pid, signal.SIGCONT)
                self.supervisor_down = None
                self.record("SIGCONT", supervisor=pid)
                self.cycles += 1
                return True
            if self.down:  # incl. brokers still starting
                self.supervisor_down = "restarting"  # no broker faults until it runs
                return False
            self.restart_supervisor()
            return True
        state = self.down.pop(broker, None)
        if state == "stopped":
            cluster.send_signal(pid, signal.SIGCONT)
            self.record("SIGCONT", broker=broker, pid=pid)
        elif state == "killed":
            self.spawn(broker)
        self.cycles += 1
        return True

    def running(self, broker: int) -> bool:
        """A process of this broker runs: its pid file, a child of ours, or its registration says
        so (a pid file being rewritten by the broker can read as nothing for a moment)."""
        if cluster.broker_pid(self.cluster_dir, broker) is not None:
            return True
        if any(p.poll() is None for b, p in self._spawned if b == broker):
            return True
        try:
            reg = self.zk().live_brokers().get(broker)
        except Exception:  # noqa: BLE001
            reg = None
        return reg is not None and cluster.is_broker_process(reg.pid, self.cluster_dir, broker)

    def spawn(self, broker: int, why: str = "") -> None:
        self.check_cluster()  # never start a broker of a cluster that was removed
        if self.running(broker):
            self.down.pop(broker, None)
            self.record("restart", broker=broker, why="'already running'")
            return
        process = cluster.spawn_broker(self.cluster_dir, self.spec, broker)
        self.children.append(process)
        self._spawned.append((broker, process))
        self.down[broker] = "starting"
        self.starting[broker] = process
        self.record(
            "restart", broker=broker, pid=process.pid, **({"why": repr(why)} if why else {})
        )

    def update_starting(self) -> None:
        """Restarted brokers count as down until registered; one that exits is started again."""
        if not self.starting:
            return
        try:
            regs = self.zk().live_brokers()
        except Exception:  # noqa: BLE001 (a torn read: the next tick)
            return
        for broker, process in list(self.starting.items()):
            if broker in regs and regs[broker].pid == process.pid:
                del self.starting[broker]
                self.down.pop(broker, None)
                self.record("registered", broker=broker, pid=process.pid)
            elif process.poll() is not None:
                del self.starting[broker]
                self.record("exited", broker=broker, pid=process.pid, code=process.returncode)
                self.spawn(broker, "it exited while starting")

    def restart_supervisor(self) -> None:
        process = cluster.spawn_supervisor(self.cluster_dir)
        self.children.append(process)
        wait_until(lambda: cluster.supervisor_pid(self.cluster_dir) == process.pid
                   or process.poll() is not None, 30)  # fmt: skip
        self.supervisor_down = None
        self.cycles += 1
        self.record("restart", supervisor=process.pid)

    def due_chains(self) -> list[Fault]:
        """Chained kills whose partition has elected its next leader: due now + chain_ms."""
        out = []
        now = self.now_ms()
        for chain in list(self.chains):
            partition, old_leader, fault, give_up_ms = chain
            state = self.state(partition)
            if state is not None and state.leader >= 0 and state.leader != old_leader:
                self.chains.remove(chain)
                out.append(Fault(now + fault.chain_ms, "kill", "leader", partition, 0.0, fault.down_ms,
                                 chained=True))  # fmt: skip
                self.record("chain", partition=partition, new_leader=state.leader,
                            epoch=state.leader_epoch, kill_in_ms=fault.chain_ms)  # fmt: skip
            elif now > give_up_ms:
                self.chains.remove(chain)
                self.record("chain", partition=partition, why="'no new leader within 5 s'")
        return out

    # -- availability -------------------------------------------------------------------------

    def monitor(self) -> None:
        """Note when a partition has no leader that serves (none, dead, or paused)."""
        try:
            live = set(self.zk().live_brokers())
        except Exception:  # noqa: BLE001 (a torn read of the store: try at the next tick)
            return
        now = self.now_ms()
        for p in range(self.partitions):
            state = self.state(p)
            serving = (state is not None and state.leader in live
                       and self.down.get(state.leader) != "stopped")  # fmt: skip
            if not serving and p not in self._open_windows:
                self._open_windows[p] = now
            elif serving and p in self._open_windows:
                self.unavailable[p].append([self._open_windows.pop(p), now])

    def close_windows(self) -> None:
        for p, start in self._open_windows.items():
            self.unavailable[p].append([start, self.now_ms()])
        self._open_windows.clear()

    # -- the fault phase ----------------------------------------------------------------------

    def run(self, schedule: list[Fault], duration_s: float) -> None:
        queue = [(f.at_ms, i, "fault", f) for i, f in enumerate(schedule)]
        heapq.heapify(queue)
        counter = len(queue)
        next_monitor = 0.0
        end_ms = duration_s * 1000
        while queue and self.now_ms() < end_ms + 60_000:
            self.update_starting()
            if time.monotonic() >= next_monitor:
                self.check_cluster()
                self.monitor()
                self.reap()
                next_monitor = time.monotonic() + MONITOR_EVERY_S
            for chained in self.due_chains() if self.chains else ():
                counter += 1
                heapq.heappush(queue, (chained.at_ms, counter, "fault", chained))
            at, _, kind, item = queue[0]
            now = self.now_ms()
            if at > now:
                time.sleep(min(TICK_S, (at - now) / 1000))  # the schedule's timeline
                continue
            heapq.heappop(queue)
            if kind == "fault":
                if at >= end_ms:
                    continue
                recovery = self.apply(item)
                if recovery is not None:
                    counter += 1
                    heapq.heappush(queue, (now + item.down_ms, counter, "recover", recovery))
            elif not self.recover(*item):
                counter += 1
                heapq.heappush(queue, (now + 50, counter, "recover", item))
            if self.now_ms() >= end_ms and all(k == "fault" for _, _, k, _ in queue):
                break
        self.recover_all()

    def recover_all(self) -> None:
        """Every broker back (and the supervisor, the consumers); called at the end and on errors."""
        for name in list(self.consumers_down):
            self._recover_consumer(name, self.group.processes[name].pid)
        for broker in list(self.down):
            state = self.down[broker]
            pid = cluster.read_pid(cluster.pid_file(self.cluster_dir, broker)) or 0
            if state == "killed":
                self.recover("broker", broker, pid)
            elif state == "stopped":
                self._cont(broker)
        deadline = time.monotonic() + RECOVER_TIMEOUT_S
        while self.starting and time.monotonic() < deadline:
            self.check_cluster()
            self.update_starting()
            time.sleep(0.02)
        if self.supervisor_down == "stopped":
            pid = cluster.read_pid(self.cluster_dir / cluster.SUPERVISOR_PID)
            if pid:
                cluster.send_signal(pid, signal.SIGCONT)
            self.supervisor_down = None
        elif self.supervisor_down:
            self.restart_supervisor()

    def _cont(self, broker: int) -> None:
        self.down.pop(broker, None)
        pid = cluster.broker_pid(self.cluster_dir, broker)
        if pid is not None:
            cluster.send_signal(pid, signal.SIGCONT)
            self.record("SIGCONT", broker=broker, pid=pid)
        self.cycles += 1

    # -- the end ------------------------------------------------------------------------------

    def wait_all_registered(self, timeout_s: float, stuck_after_s: float = 20.0) -> None:
        """Until every broker runs and is registered by that process. A broker that runs but
        stays unregistered for stuck_after_s (one paused past its session timeout does not
        register again) is killed and restarted, and the report says so (a warning: it is
        about availability, not durability)."""
        deadline = time.monotonic() + timeout_s
        stuck_at = time.monotonic() + stuck_after_s
        while True:
            self.check_cluster()
            live = cluster.live_brokers(self.cluster_dir, self.spec)
            try:
                regs = self.zk().live_brokers()
            except Exception:  # noqa: BLE001
                regs = {}
            if len(live) == len(self.spec.brokers) and all(b in regs and regs[b].pid == pid
                                                           for b, pid in live.items()):  # fmt: skip
                return
            if time.monotonic() > deadline:
                raise cluster.ClusterError(f"brokers did not all come back within {timeout_s:.0f} s "
                                           f"(running: {sorted(live)}, registered: {sorted(regs)})")  # fmt: skip
            self.update_starting()
            for broker in self.spec.brokers:  # died on their own (or a restart failed): start again
                if broker not in self.starting and not self.running(broker):
                    self.spawn(broker, "found dead at the end")
            if time.monotonic() > stuck_at:
                stuck_at = float("inf")
                for broker, pid in live.items():
                    if broker not in self.starting and (
                        broker not in regs or regs[broker].pid != pid
                    ):
                        self.warnings.append(
                            f"broker {broker} (pid {pid}) ran but was not registered {stuck_after_s:.0f} s "
                            "after the faults ended (paused past zookeeper.session.timeout.ms, it does "
                            "not register again); chaos killed and restarted it")  # fmt: skip
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(pid, signal.SIGKILL)
                        cluster.wait_gone([pid], 5.0)
                        self.spawn(broker, "running but unregistered")
            self.reap()
            time.sleep(0.05)

    def wait_isr_full(self, timeout_s: float) -> list[str]:
        """Until every partition's ISR is its whole assignment and every replica's log ends
        where the leader's does. Returns what was still short at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_cluster()
            short = []
            assignment = self.zk().assignment(self.topic).partitions
            for p in range(self.partitions):
                state = self.state(p)
                if state is None or state.leader < 0 or set(state.isr) != set(assignment[p]):
                    short.append(f"p{p}: leader {state.leader if state else -1}, ISR "
                                 f"{list(state.isr) if state else []} of {list(assignment[p])}")  # fmt: skip
                    continue
                ends = {b: chaos_check.log_end_offset(chaos_check.partition_dir(
                    self.cluster_dir, self.spec, b, self.topic, p)) for b in assignment[p]}  # fmt: skip
                if len(set(ends.values())) > 1:
                    short.append(f"p{p}: log ends {ends}")
            if not short or time.monotonic() > deadline:
                return short
            time.sleep(0.1)


# -- starting and stopping a cluster ------------------------------------------------------------


def cli(*args: str, timeout_s: float = START_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcluster", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=cluster.child_env())  # fmt: skip


def start_cluster(cluster_dir: Path, brokers: int, settings: dict[str, str]) -> None:
    args = ["up", "-n", str(brokers), "--dir", str(cluster_dir), "--detach"]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    result = cli(*args)
    if result.returncode != 0:
        raise cluster.ClusterError(f"`localcluster up` failed ({result.returncode}): "
                                   f"{(result.stderr or result.stdout).strip()}")  # fmt: skip


def stop_cluster(cluster_dir: Path, children: list, keep: bool = False) -> None:
    """down --purge (keep: plain down, the dir and logs stay for a post-mortem); then SIGKILL by
    process group whatever still runs; reap our children."""
    spec = None
    with contextlib.suppress(cluster.ClusterError):
        spec = cluster.load_spec(cluster_dir)
    with contextlib.suppress(subprocess.TimeoutExpired):
        purge = () if keep else ("--purge",)
        cli("down", *purge, "--timeout", "10", "--dir", str(cluster_dir), timeout_s=60)
    pids = (
        list(cluster.live_brokers(cluster_dir, spec).values())
        if spec and cluster_dir.exists()
        else []
    )
    supervisor = cluster.supervisor_pid(cluster_dir) if cluster_dir.exists() else None
    for pid in (
        pids + [p.pid for p in children if p.poll() is None] + ([supervisor] if supervisor else [])
    ):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGCONT)
            os.killpg(pid, signal.SIGKILL)
    for process in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
    if keep:
        return
    with contextlib.suppress(Exception):
        cluster.purge(cluster_dir, spec)
    shutil.rmtree(cluster_dir, ignore_errors=True)


def create_topic(cluster_dir: Path, topic: str, partitions: int, replication_factor: int,
                 config: dict[str, str]) -> None:  # fmt: skip
    from localcluster.client import Admin

    with Admin(cluster_dir=cluster_dir) as admin:
        admin.create_topic(topic, partitions, replication_factor, config)
        admin.wait_for_leaders(topic, 30)


def unavailability(engine: Engine, acks, started_wall_ms: int, partitions: int) -> dict:
    """Per partition: windows with no serving leader (from the store) and gaps with no
    acknowledgement longer than ACK_GAP_MS (from the producer), in ms from the start."""
    out = {}
    by_partition = defaultdict(list)
    for a in acks:
        by_partition[a.partition].append(a.acked_ms - started_wall_ms)
    for p in range(partitions):
        times = sorted(by_partition[p])
        gaps = [[a, b] for a, b in zip(times, times[1:], strict=False) if b - a > ACK_GAP_MS]
        windows = engine.unavailable.get(p, [])
        out[str(p)] = {"no_leader_ms": sum(b - a for a, b in windows), "no_leader_windows": windows,
                       "ack_gaps_ms": sum(b - a for a, b in gaps), "ack_gaps": gaps}  # fmt: skip
    return out


# -- the consumer group (--consumers N) --------------------------------------------------------


def start_group(engine: Engine, cluster_dir: Path, spec, topic: str, group_id: str, consumers: int,
                say) -> chaos_consumer.ConsumerGroup:  # fmt: skip
    """Start the members and wait for each one's first assignment, before the load and the
    faults (the first FindCoordinator makes __consumer_offsets, which takes seconds here)."""
    run_dir = cluster_dir / "chaos-consumers" / group_id
    group = chaos_consumer.ConsumerGroup(cluster_dir, spec, topic, group_id, consumers, run_dir)
    say(f"chaos: {consumers} consumers (confluent-kafka, one process each) in group {group_id}, "
        f"their events in {run_dir}")  # fmt: skip
    try:
        group.start()
        engine.group = group
        if not group.wait_assigned(GROUP_FORM_TIMEOUT_S, engine.check_cluster):
            exited = "; ".join(group.exited()) or "none exited"
            raise cluster.ClusterError(f"the consumer group {group_id} did not form within "
                                       f"{GROUP_FORM_TIMEOUT_S:.0f} s ({exited}; see {run_dir})")  # fmt: skip
    except BaseException:
        group.stop(5)  # the run's finally does not know this group yet
        raise
    return group


def finish_group(engine: Engine, group, acks, log_records: dict, high_watermarks: dict,
                 log_starts: dict, drain_s: float, started_wall_ms: int, say) -> dict:  # fmt: skip
    """The drain (faults over: until every acknowledged record was consumed and committed up
    to the HW, at most drain_s), the members stopped, the final OffsetFetch, the checks."""
    exited = group.exited()  # before we stop them: these died during the run
    say(f"chaos: draining the consumers (at most {drain_s:g} s)")
    started = time.monotonic()
    drained = group.wait_drained(acks, high_watermarks, log_starts, drain_s, engine.check_cluster)
    drain_took_s = time.monotonic() - started
    group.stop()
    committed, why = group.fetch_committed()
    result = chaos_check.check_group(acks, group.events, sorted(high_watermarks), committed,
                                     log_records=log_records, log_starts=log_starts,
                                     fetch_error=why, since_ms=started_wall_ms)  # fmt: skip
    say(f"chaos: consumers drained in {drain_took_s:.1f} s ({'complete' if drained else 'timed out'}), "
        f"{result['consumed']} records consumed, {result['reconsumed']} re-consumed")  # fmt: skip
    return {"group_id": group.group, "drain_s": round(drain_took_s, 3), "drained": drained,
            "exited_during_run": exited, "high_watermarks": {str(p): hw for p, hw in high_watermarks.items()},
            **result}  # fmt: skip


# -- the run ------------------------------------------------------------------------------------


def run_chaos(duration_s: float = 60.0, kill_every_ms: int = 500, targets=("leader", "controller", "follower", "any"),
              faults=("kill",), seed: int | None = None, cluster_dir: Path | None = None,
              settings: dict[str, str] | None = None, brokers: int = 3, partitions: int = 3,
              replication_factor: int = 3, min_insync_replicas: int = 2, rate: int = 1000,
              max_down: int | None = None, topic: str | None = None, keep: bool = False,
              idempotence: bool = True, consumers: int = 0, consumer_drain_s: float = 60.0,
              say=print) -> dict:  # fmt: skip
    """Run the chaos and return the report (see docs/chaos.md). `say` gets the progress lines."""
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    settings = dict(settings or {})
    own_dir = cluster_dir is None
    if own_dir:
        cluster_dir = Path(tempfile.mkdtemp(prefix="localcluster-chaos-"))
    cluster_dir = Path(cluster_dir).resolve()
    children: list = []
    engine = load = group = None
    try:
        if own_dir:
            say(f"chaos: starting {brokers} brokers in {cluster_dir}"
                + (f" with {', '.join(f'{k}={v}' for k, v in settings.items())}" if settings else ""))  # fmt: skip
            start_cluster(cluster_dir, brokers, settings)
        spec = cluster.load_spec(cluster_dir)
        brokers = len(spec.brokers)
        effective = {**spec.settings, **settings}
        topic = topic or ("chaos" if own_dir else f"chaos-{seed}-{int(time.time())}")
        topic_config = {"min.insync.replicas": str(min_insync_replicas)}
        topic_config.update({k: v for k, v in settings.items() if k in TOPIC_CONFIGS})
        create_topic(cluster_dir, topic, partitions, replication_factor, topic_config)
        session_ms = int(effective.get("zookeeper.session.timeout.ms", 6000))
        schedule = make_schedule(
            seed, duration_s, kill_every_ms, targets, faults, partitions, session_ms
        )
        say(f"chaos: seed {seed}, {len(schedule)} faults over {duration_s:g} s on topic {topic} "
            f"({partitions} partitions, RF {replication_factor}, min.insync.replicas "
            f"{topic_config['min.insync.replicas']}); schedule:")  # fmt: skip
        for fault in schedule:
            say("  " + fault.describe())
        engine = Engine(cluster_dir, spec, topic, partitions,
                        max_down if max_down is not None else max(1, brokers - 1), say)  # fmt: skip
        engine.children = children
        engine.watch = ClusterWatch(cluster_dir, spec)
        if consumers:
            group = start_group(engine, cluster_dir, spec, topic, f"chaos-{seed}" if own_dir else topic,
                                consumers, say)  # fmt: skip
        started_wall_ms = int(time.time() * 1000)
        load = Load(cluster_dir, topic, keys=2 * partitions, rate=rate, idempotence=idempotence)
        load.start()
        say("chaos: faults as they happen:")
        engine.started = time.monotonic()
        engine.run(schedule, duration_s)
        fault_phase_s = engine.now_ms() / 1000
        say(f"chaos: fault phase over after {fault_phase_s:.1f} s ({engine.cycles} cycles, "
            f"{engine.skipped} skipped); waiting for every broker")  # fmt: skip
        engine.wait_all_registered(RECOVER_TIMEOUT_S)
        load.finish(RECOVER_TIMEOUT_S, engine.check_cluster)
        engine.close_windows()
        say(f"chaos: {load.sent} records sent, {len(load.acks)} acknowledged, {len(load.failed)} failed; "
            "waiting for full ISRs")  # fmt: skip
        short = engine.wait_isr_full(RECOVER_TIMEOUT_S)
        if short:
            say(f"chaos: ISRs still short after {RECOVER_TIMEOUT_S:.0f} s: {'; '.join(short)}")
        log_records = high_watermarks = log_starts = None
        if group is not None:
            log_records, high_watermarks, log_starts = chaos_check.consume_all(
                cluster_dir, topic, list(range(partitions))
            )
        result = chaos_check.check(cluster_dir, topic, load.acks, since_ms=started_wall_ms - 1000,
                                   consumed=log_records, high_watermarks=high_watermarks,
                                   log_starts=log_starts)  # fmt: skip
        if short:
            result["problems"].append(f"ISRs not full at the end: {'; '.join(short)}")
        failures = defaultdict(int)
        for _, _, error in load.failed:
            failures[error.split(":")[0][:80]] += 1
        report = {
            "verdict": result["verdict"], "seed": seed, "duration_s": duration_s,
            "kill_every_ms": kill_every_ms, "targets": list(targets), "faults": list(faults),
            "settings": effective, "idempotence": idempotence, "brokers": brokers, "topic": topic,
            "partitions": partitions,
            "replication_factor": replication_factor, "min_insync_replicas": int(topic_config["min.insync.replicas"]),
            "cycles": engine.cycles, "skipped": engine.skipped, "fault_phase_s": round(fault_phase_s, 3),
            "sent": load.sent, "acknowledged": len(load.acks), "failed": len(load.failed),
            "failures": dict(failures), "lost": result["lost"], "lost_records": result["lost_records"],
            "below_log_start": result["below_log_start"],
            "lost_by_partition": result["lost_by_partition"], "duplicated": result["duplicated"],
            "moved": result["moved"], "moved_records": result["moved_records"],
            "unacknowledged_present": result["unacknowledged_present"],
            "warnings": engine.warnings, "problems": result["problems"],
            "partition_states": result["partitions"],
            "unavailability": unavailability(engine, load.acks, started_wall_ms, partitions),
            "schedule": [fault.describe() for fault in schedule], "events": engine.events,
            "cluster_dir": None if own_dir else str(cluster_dir),
        }  # fmt: skip
        if load.error is not None:
            report["problems"].append(f"the producer thread failed: {load.error!r}")
        if group is not None:
            report["group"] = finish_group(engine, group, load.acks, log_records, high_watermarks,
                                           log_starts, consumer_drain_s, started_wall_ms, say)  # fmt: skip
            report["warnings"] += [
                f"consumer {x} during the run" for x in report["group"]["exited_during_run"]
            ]
            if report["verdict"] == "OK" and not (report["group"]["at_least_once"]
                                                  and report["group"]["commits_never_backwards"]):  # fmt: skip
                report["verdict"] = "VIOLATION"
        return report
    finally:
        if group is not None:
            group.stop(5)
        gone = engine is not None and engine.watch is not None and engine.watch.problem()
        if load is not None and not load.stop_sending.is_set():
            load.finish(0.5 if gone else 5)  # a removed cluster acknowledges nothing more
        if engine is not None:
            with contextlib.suppress(Exception):
                if not own_dir:
                    engine.recover_all()
            engine.close()
        if own_dir:
            stop_cluster(cluster_dir, children, keep)
            if keep:
                say(f"chaos: kept the stopped cluster in {cluster_dir} (broker logs, store, checkpoints); "
                    f"`localcluster down --purge --dir {cluster_dir}` removes it")  # fmt: skip
        else:
            for process in children:
                process.returncode = process.returncode if process.returncode is not None else 0
