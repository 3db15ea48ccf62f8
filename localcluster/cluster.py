"""A cluster on disk: its description, its broker processes and what its store says.

What lives here is everything the CLI commands and the supervisor share, and none of it needs
the supervisor to be alive: `<cluster-dir>/cluster.json` (ClusterSpec: broker ids, racks,
settings, coordination spec, data dir), per-broker pid files (`broker-N/broker.pid`, written
at spawn and rewritten by the broker itself), `broker-N/broker.log` (the broker's stdout and
stderr), `supervisor.pid`, spawning a broker (through broker/process.py, the one spawner) or
the supervisor in its own session, telling a live broker from a stale pid file (/proc cmdline
check), reading registrations, controller and partition states from the store, resolving
`controller` / `leader:T:P` to a broker id, and stopping brokers.

Rules: operating faults raise ClusterError with one line saying what is wrong and what to do;
no function here prints.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from localcluster.broker import process as broker_process
from localcluster.coord.kafka_zk import KafkaZkClient
from localcluster.waiting import wait_until

DEFAULT_DIR = ".localcluster"
SPEC_FILE = "cluster.json"
STOPPING_FILE = "stopping"  # `down` is under way: nobody may start a broker of this cluster
SUPERVISOR_PID = "supervisor.pid"
SUPERVISOR_LOG = "supervisor.log"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


class ClusterError(Exception):
    """An operating fault with a one-line message for the user."""


@dataclass
class ClusterSpec:
    brokers: list[int]
    racks: dict[int, str | None] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)
    coordination: str = ""
    data_dir: str | None = None  # None: each broker's default (/dev/shm)
    created_ms: int = 0
    version: int = 1
    # Each broker's client port, chosen once by `up` and kept for the cluster's lifetime, so
    # a restarted broker (start, the supervisor, chaos) comes back on the same address.
    ports: dict[int, int] = field(default_factory=dict)
    listener_protocol: str = "PLAINTEXT"  # or SASL_PLAINTEXT (`up --listener-protocol`)
    host: str = "127.0.0.1"
    client_properties: str | None = None  # SASL: the client settings `up` wrote (mode 0600)

    def to_json(self) -> str:
        value = asdict(self)
        value["racks"] = {str(k): v for k, v in self.racks.items()}
        value["ports"] = {str(k): v for k, v in self.ports.items()}
        return json.dumps(value, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterSpec:
        value = json.loads(text)
        return cls(brokers=[int(b) for b in value["brokers"]],
                   racks={int(k): v for k, v in value.get("racks", {}).items()},
                   settings={str(k): str(v) for k, v in value.get("settings", {}).items()},
                   coordination=value.get("coordination", ""), data_dir=value.get("data_dir"),
                   created_ms=int(value.get("created_ms", 0)), version=int(value.get("version", 1)),
                   ports={int(k): int(v) for k, v in value.get("ports", {}).items()},
                   listener_protocol=value.get("listener_protocol", "PLAINTEXT"),
                   host=value.get("host", "127.0.0.1"),
                   client_properties=value.get("client_properties"))  # fmt: skip

    def listeners(self, broker_id: int) -> str:
        """The broker's `listeners`: its fixed client port (0 for a broker added by hand)."""
        return f"{self.listener_protocol}://{self.host}:{self.ports.get(broker_id, 0)}"

    def bootstrap_servers(self) -> str:
        """host:port of every broker: valid across restarts, since the ports are fixed."""
        return ",".join(f"{self.host}:{self.ports[b]}" for b in self.brokers if b in self.ports)


# -- the cluster dir ----------------------------------------------------------------------------


def resolve_dir(option: str | os.PathLike | None) -> Path:
    return Path(option or os.environ.get("LOCALCLUSTER_DIR") or DEFAULT_DIR).resolve()


def spec_path(cluster_dir: Path) -> Path:
    return cluster_dir / SPEC_FILE


def stopping(cluster_dir: Path) -> bool:
    """Whether `down` is stopping this cluster (its marker file exists)."""
    return (cluster_dir / STOPPING_FILE).exists()


def load_spec(cluster_dir: Path) -> ClusterSpec:
    path = spec_path(cluster_dir)
    try:
        return ClusterSpec.from_json(path.read_text())
    except FileNotFoundError:
        raise ClusterError(f"no cluster in {cluster_dir} (no {SPEC_FILE}); start one with "
                           f"`localcluster up -n 3 --dir {cluster_dir}`") from None  # fmt: skip
    except (ValueError, KeyError, TypeError) as e:
        raise ClusterError(f"{path} is not a cluster description ({e}); remove the dir or "
                           "run `localcluster down --purge`") from None  # fmt: skip


def save_spec(cluster_dir: Path, spec: ClusterSpec) -> None:
    cluster_dir.mkdir(parents=True, exist_ok=True)
    path = spec_path(cluster_dir)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(spec.to_json())
    os.replace(tmp, path)


def broker_dir(cluster_dir: Path, broker_id: int) -> Path:
    return cluster_dir / f"broker-{broker_id}"


def pid_file(cluster_dir: Path, broker_id: int) -> Path:
    return broker_dir(cluster_dir, broker_id) / "broker.pid"


def log_file(cluster_dir: Path, broker_id: int) -> Path:
    return broker_dir(cluster_dir, broker_id) / "broker.log"


def data_dir_of(cluster_dir: Path, spec: ClusterSpec, broker_id: int) -> Path:
    if spec.data_dir:
        return Path(spec.data_dir) / f"broker-{broker_id}"
    from localcluster.broker.server import default_data_dir

    return default_data_dir(cluster_dir, broker_id)


# -- processes ----------------------------------------------------------------------------------


def process_state(pid: int, thread: str | None = None) -> str | None:
    """The kernel's one-letter state (R, S, D, T, Z, ...) of pid (or of one of its threads)
    or None when there is no such pid."""
    stat = f"/proc/{pid}/task/{thread}/stat" if thread else f"/proc/{pid}/stat"
    try:
        text = Path(stat).read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split(" ", 1)[0]


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_broker_process(pid: int, cluster_dir: Path, broker_id: int) -> bool:
    """pid is alive (not a zombie) and runs `localcluster.broker --id N --cluster-dir DIR`:
    a recycled pid from a stale pid file is not mistaken for a broker."""
    state = process_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    args = cmdline(pid)
    if "localcluster.broker" not in args:
        return False
    try:
        ok_id = args[args.index("--id") + 1] == str(broker_id)
        ok_dir = Path(args[args.index("--cluster-dir") + 1]).resolve() == cluster_dir
    except (ValueError, IndexError):
        return False
    return ok_id and ok_dir


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def broker_pid(cluster_dir: Path, broker_id: int) -> int | None:
    """The live broker's pid, or None (no pid file, or a stale one)."""
    pid = read_pid(pid_file(cluster_dir, broker_id))
    if pid is not None and is_broker_process(pid, cluster_dir, broker_id):
        return pid
    return None


def live_brokers(cluster_dir: Path, spec: ClusterSpec) -> dict[int, int]:
    """{broker id: pid} of every broker of the spec whose process runs."""
    out = {}
    for broker_id in spec.brokers:
        pid = broker_pid(cluster_dir, broker_id)
        if pid is not None:
            out[broker_id] = pid
    return out


def stale_pid_files(cluster_dir: Path, spec: ClusterSpec) -> list[Path]:
    return [pid_file(cluster_dir, b) for b in spec.brokers
            if pid_file(cluster_dir, b).exists() and broker_pid(cluster_dir, b) is None]  # fmt: skip


def supervisor_pid(cluster_dir: Path) -> int | None:
    pid = read_pid(cluster_dir / SUPERVISOR_PID)
    if pid is None or process_state(pid) in (None, "Z", "X"):
        return None
    args = cmdline(pid)
    if not any(a == "up" or a.endswith("localcluster.supervisor") for a in args):
        return None
    return pid


def broker_settings(cluster_dir: Path, spec: ClusterSpec, broker_id: int) -> dict[str, str]:
    """The properties a broker of this cluster runs with: its listeners, the cluster's
    settings, SASL's, its rack and its log dir."""
    settings = {"listeners": spec.listeners(broker_id), **spec.settings}
    if spec.listener_protocol == "SASL_PLAINTEXT":
        from localcluster.tools.sasl_setup import broker_sasl_settings

        settings.update(broker_sasl_settings(cluster_dir))
    rack = spec.racks.get(broker_id)
    if rack:
        settings["broker.rack"] = rack
    if spec.data_dir and "log.dirs" not in settings:
        settings["log.dirs"] = str(Path(spec.data_dir) / f"broker-{broker_id}")
    return settings


def hypothesis_cache() -> str:
    """Where processes we start keep hypothesis's data. kio imports hypothesis when it is
    installed (test venvs), and hypothesis then builds its unicode table in ./.hypothesis of
    the working dir: 2 s of CPU and ~190 MB peak RSS per process in a fresh dir. One shared
    directory makes that a once-per-machine cost (and keeps .hypothesis out of cluster dirs)."""
    return str(Path(tempfile.gettempdir()) / "localcluster-hypothesis")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", hypothesis_cache())
    return env


def spawn_broker(cluster_dir: Path, spec: ClusterSpec, broker_id: int) -> subprocess.Popen:
    """Start one broker of the cluster (broker/process.py's spawner: its own session),
    output appended to its broker.log, pid file written at once (the broker rewrites it when
    ready). No child_env: the broker blocks hypothesis itself."""
    directory = broker_dir(cluster_dir, broker_id)
    directory.mkdir(parents=True, exist_ok=True)
    with open(log_file(cluster_dir, broker_id), "ab") as out:
        settings = broker_settings(cluster_dir, spec, broker_id)
        process = broker_process.spawn_broker(
            broker_id, cluster_dir, settings, out, coordination=spec.coordination
        )
    pid_file(cluster_dir, broker_id).write_text(f"{process.pid}\n")
    return process


def spawn_supervisor(cluster_dir: Path) -> subprocess.Popen:
    """Start `python -m localcluster.supervisor` for the cluster in its own session, output
    appended to supervisor.log (it writes supervisor.pid itself)."""
    with open(cluster_dir / SUPERVISOR_LOG, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "localcluster.supervisor", "--dir", str(cluster_dir)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=cluster_dir, env=child_env())  # fmt: skip


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def parse_signal(name: str) -> signal.Signals:
    text = name.upper()
    if text.isdigit():
        return signal.Signals(int(text))
    return signal.Signals[text if text.startswith("SIG") else "SIG" + text]


def send_signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


STOP_WAIT_S = 2.0


def stop_and_wait(pid: int, timeout_s: float = STOP_WAIT_S) -> bool:
    """SIGSTOP, then wait until every thread of pid has stopped: the signal is asynchronous,
    and a thread that was waiting for a lock can still take it before it stops (a broker once
    stopped holding the store's shared lock this way). False when the process is gone."""
    if not send_signal(pid, signal.SIGSTOP):
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = [process_state(pid, t) for t in _threads(pid)]
        if not states or all(s in (None, "T", "t", "Z", "X") for s in states):
            return True
        time.sleep(0.001)
    return True  # still stopping: the caller's lock is released either way


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def pause(spec: ClusterSpec, pid: int) -> bool:
    """SIGSTOP a process of the cluster at a moment it holds no lock of the file store."""
    return pause_client(spec.coordination, pid)


def pause_client(coordination: str, pid: int) -> bool:
    """SIGSTOP a client of the store `coordination` at a moment it holds none of its locks.

    A process stopped inside the file store's lock stops every client of the store, the
    controller and whoever means to send the SIGCONT included (docs/coordination.md); holding
    the lock ourselves while the signal lands rules that out. False when the process is gone."""
    from localcluster.coord import ZOOKEEPER_SCHEME
    from localcluster.coord.file_store import lock_held

    if coordination.startswith(ZOOKEEPER_SCHEME):
        return send_signal(pid, signal.SIGSTOP)
    try:
        with lock_held(coordination):
            return stop_and_wait(pid)
    except TimeoutError as e:
        raise ClusterError(f"pid {pid} was not paused: {e}; a stopped process of the cluster holds "
                           "it (`localcluster status` shows paused brokers; SIGCONT resumes them)") from None  # fmt: skip


def wait_gone(pids, timeout_s: float, alive=None) -> set[int]:
    """Wait until none of pids runs (zombies count as gone); returns the ones still running."""
    alive = alive or (lambda pid: process_state(pid) not in (None, "Z", "X"))
    deadline = time.monotonic() + timeout_s
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = {p for p in left if alive(p)}
    return left


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# -- the store ----------------------------------------------------------------------------------


@contextlib.contextmanager
def store(spec: ClusterSpec):
    """A short coordination session on the cluster's store."""
    from localcluster import coord

    try:
        client = coord.connect(spec.coordination)
    except Exception as e:
        raise ClusterError(f"cannot open the coordination store {spec.coordination}: {e}") from None
    try:
        yield client
    finally:
        client.stop()


def registrations(client) -> dict:
    """{broker id: BrokerRegistration} of every registered broker."""
    return KafkaZkClient(client).live_brokers()


def controller_id(client) -> int | None:
    return KafkaZkClient(client).controller_id()


def topics(client) -> list[str]:
    return KafkaZkClient(client).topics()


def partition_states(client, only_topics=None, unreadable: dict | None = None) -> list[dict]:
    """Every partition: topic, partition, replicas (AR), adding/removing, leader, leader
    epoch, isr, and the state's zkVersion, read straight from the store. A topic whose znode
    does not decode is left out, and put in `unreadable` (topic: why) when given."""
    from localcluster.coord import paths
    from localcluster.coord.znode_data import ZnodeDataError

    zk = KafkaZkClient(client)
    out = []
    for topic in only_topics if only_topics is not None else zk.topics():
        try:
            assignment = zk.assignment(topic)
        except ZnodeDataError as e:
            if unreadable is None:
                raise
            unreadable[topic] = str(e)
            continue
        if assignment is None:
            continue
        deleting = client.exists(paths.delete_topic_path(topic)) is not None
        for p, replicas in sorted(assignment.partitions.items()):
            row = {"topic": topic, "partition": p, "replicas": list(replicas),
                   "adding_replicas": list(assignment.adding_replicas.get(p, ())),
                   "removing_replicas": list(assignment.removing_replicas.get(p, ())),
                   "leader": -1, "leader_epoch": -1, "isr": [], "zk_version": -1,
                   "deleting": deleting}  # fmt: skip
            found = zk.partition_state(topic, p)
            if found is not None:
                state, version = found
                row.update(leader=state.leader, leader_epoch=state.leader_epoch,
                           isr=list(state.isr), zk_version=version)  # fmt: skip
            out.append(row)
    return out


def reassignment_in_progress(client) -> dict[tuple[str, int], list[int]]:
    requested = KafkaZkClient(client).reassignments() or {}
    return {tp: list(replicas) for tp, replicas in requested.items()}


def bootstrap_servers(regs: dict) -> str:
    return ",".join(f"{r.host}:{r.port}" for _, r in sorted(regs.items()))


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports nothing listens on now, held open together so they are distinct. (Another
    process may take one before a broker binds it; that broker then fails with a message
    naming the port, and `up --port-base` picks fixed ones.)"""
    import socket

    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def parse_topic_partition(text: str) -> tuple[str, int]:
    topic, sep, partition = text.rpartition(":")
    if not sep or not topic or not partition.isdigit():
        raise ValueError(f"{text!r} is not TOPIC:PARTITION (e.g. orders:0)")
    return topic, int(partition)


def resolve_broker(target: str, cluster_dir: Path, spec: ClusterSpec) -> int:
    """A broker id from `N`, `controller` or `leader:TOPIC:PARTITION`."""
    text = target.strip()
    if text.lstrip("-").isdigit():
        broker_id = int(text)
        if broker_id not in spec.brokers:
            raise ClusterError(f"unknown broker {broker_id}; this cluster has brokers "
                               f"{', '.join(map(str, spec.brokers))}")  # fmt: skip
        return broker_id
    if text == "controller":
        with store(spec) as client:
            found = controller_id(client)
        if found is None:
            raise ClusterError("no controller is elected right now (is the cluster up? does this "
                               "build run a controller?); name a broker id instead")  # fmt: skip
        return found
    if text.startswith("leader:"):
        try:
            topic, partition = parse_topic_partition(text[len("leader:") :])
        except ValueError as e:
            raise ClusterError(f"{e}; write leader:TOPIC:PARTITION") from None
        with store(spec) as client:
            rows = [r for r in partition_states(client, [topic]) if r["partition"] == partition]
            if not rows:
                known = topics(client)
                if topic not in known:
                    raise ClusterError(f"unknown topic {topic!r}; `localcluster topic list` shows "
                                       "the topics")  # fmt: skip
                raise ClusterError(f"topic {topic!r} has no partition {partition}")
        if rows[0]["leader"] < 0:
            raise ClusterError(f"{topic}:{partition} has no leader right now")
        return rows[0]["leader"]
    raise ClusterError(f"{target!r} names no broker; use an id (0), `controller` or "
                       "`leader:TOPIC:PARTITION`")  # fmt: skip


# -- status -------------------------------------------------------------------------------------


def status(cluster_dir: Path, spec: ClusterSpec | None = None) -> dict:
    """What `localcluster status --json` prints."""
    spec = spec or load_spec(cluster_dir)
    pids = {b: read_pid(pid_file(cluster_dir, b)) for b in spec.brokers}
    with store(spec) as client:
        regs = registrations(client)
        controller = controller_id(client)
        unreadable: dict[str, str] = {}
        partitions = partition_states(client, unreadable=unreadable)
        reassigning = reassignment_in_progress(client)
    replicas = replica_offsets(cluster_dir)
    brokers = []
    for b in sorted(set(spec.brokers) | set(regs)):
        reg = regs.get(b)
        alive_pid = broker_pid(cluster_dir, b)
        pid = alive_pid or (reg.pid if reg else None) or pids.get(b)
        state = process_state(alive_pid) if alive_pid else None
        brokers.append({"id": b, "pid": pid, "alive": alive_pid is not None,
                        "stopped": state == "T", "registered": reg is not None,
                        "rack": reg.rack if reg else spec.racks.get(b),
                        "controller": controller == b,
                        "host": reg.host if reg else None, "port": reg.port if reg else None,
                        "unix_socket": reg.unix_socket if reg else None,
                        "stale_pid_file": alive_pid is None and pids.get(b) is not None})  # fmt: skip
    live = {b["id"] for b in brokers if b["registered"]}
    for row in partitions:
        row["cur"] = [r for r in row["replicas"] if r not in row["isr"]]
        row["rar"] = reassigning.get((row["topic"], row["partition"]), [])
        row["offline"] = row["leader"] < 0 or row["leader"] not in live
        row["under_replicated"] = len(row["isr"]) < len(row["replicas"])
        row["replica_offsets"] = {str(b): {"log_end_offset": leo, "high_watermark": hw}
                                  for (t, p, b), (leo, hw) in replicas.items()
                                  if t == row["topic"] and p == row["partition"]}  # fmt: skip
    from localcluster.tools.sasl_setup import client_settings

    return {"cluster_dir": str(cluster_dir), "coordination": spec.coordination,
            "client_settings": client_settings(spec),
            "supervisor_pid": supervisor_pid(cluster_dir), "brokers": brokers,
            "controller": controller,
            "bootstrap_servers": spec.bootstrap_servers() or bootstrap_servers(regs),
            "partitions": partitions, "unreadable_topics": unreadable}  # fmt: skip


def replica_offsets(cluster_dir: Path) -> dict[tuple[str, int, int], tuple[int, int]]:
    """{(topic, partition, broker): (log end offset, high watermark)} from the metrics board
    (empty when no broker writes it)."""
    from localcluster.metrics import MetricsBoard

    reader = MetricsBoard.open_reader(cluster_dir)
    if reader is None:
        return {}
    try:
        out = {}
        for broker_id, metrics in reader.snapshot().items():
            for topic, partition, _, leo, hw in metrics.replicas:
                out[(topic, partition, broker_id)] = (leo, hw)
        return out
    finally:
        reader.close()


def is_running(cluster_dir: Path, spec: ClusterSpec) -> bool:
    return bool(live_brokers(cluster_dir, spec)) or supervisor_pid(cluster_dir) is not None


# -- waiting and stopping -----------------------------------------------------------------------


def wait_registered(spec: ClusterSpec, expected: dict[int, int], timeout_s: float,
                    failed=None) -> dict:  # fmt: skip
    """Wait until each broker id in `expected` is registered by the expected pid; `failed()`
    returning a message aborts the wait (a broker exited early). Returns the registrations."""
    deadline = time.monotonic() + timeout_s
    with store(spec) as client:
        while True:
            regs = registrations(client)
            if all(b in regs and regs[b].pid == pid for b, pid in expected.items()):
                return regs
            problem = failed() if failed else None
            if problem:
                raise ClusterError(problem)
            if time.monotonic() > deadline:
                missing = sorted(b for b, pid in expected.items()
                                 if b not in regs or regs[b].pid != pid)  # fmt: skip
                raise ClusterError(f"brokers {missing} did not register within {timeout_s:.0f} s; "
                                   "see `localcluster logs ID`")  # fmt: skip
            time.sleep(0.02)


def wait_controller(spec: ClusterSpec, grace_s: float) -> int | None:
    """The controller's id, waiting up to grace_s for one; None when none appeared."""
    with store(spec) as client:

        def elected() -> tuple[int] | None:  # a tuple: controller 0 is falsy
            found = controller_id(client)
            return None if found is None else (found,)

        found = wait_until(elected, grace_s)
    return found[0] if found else None


def stop_brokers(cluster_dir: Path, targets: dict[int, int], timeout_s: float = STOP_TIMEOUT_S,
                 last: int | None = None) -> dict:  # fmt: skip
    """SIGTERM each {broker id: pid}, wait, SIGKILL (the whole process group) who is left.
    `last` (the controller) is stopped after the others: their controlled shutdowns need a
    controller that answers. Returns {"stopped": [...], "killed": [...]}."""
    phases = [{b: p for b, p in targets.items() if b != last}]
    if last in targets:
        phases.append({last: targets[last]})
    stopped, killed = [], []
    for phase in phases:
        result = _stop_phase(phase, timeout_s)
        stopped += result["stopped"]
        killed += result["killed"]
    return {"stopped": sorted(stopped), "killed": sorted(killed)}


def _stop_phase(targets: dict[int, int], timeout_s: float) -> dict:
    for pid in targets.values():
        state = process_state(pid)
        send_signal(pid, signal.SIGTERM)
        if state == "T":
            send_signal(pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only when resumed
    left = wait_gone(targets.values(), timeout_s)
    killed = []
    for broker_id, pid in targets.items():
        if pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            send_signal(pid, signal.SIGKILL)
            killed.append(broker_id)
    wait_gone([targets[b] for b in killed], 5.0)
    return {"stopped": sorted(set(targets) - set(killed)), "killed": sorted(killed)}


def current_controller(spec: ClusterSpec) -> int | None:
    """The controller's id, or None (none elected, or the store cannot be read)."""
    try:
        with store(spec) as client:
            return controller_id(client)
    except Exception:
        return None


def remove_pid_files(cluster_dir: Path, spec: ClusterSpec) -> None:
    for b in spec.brokers:
        if broker_pid(cluster_dir, b) is None:
            pid_file(cluster_dir, b).unlink(missing_ok=True)


def purge(cluster_dir: Path, spec: ClusterSpec | None) -> list[str]:
    """Remove the cluster dir, the brokers' data dirs, the socket dir and the metrics board."""
    from localcluster.broker.server import cluster_hash, short_socket_dir
    from localcluster.metrics.segment import unlink_segment

    removed = []
    candidates = [Path("/dev/shm") / f"localcluster-{cluster_hash(cluster_dir)}",
                  short_socket_dir(cluster_dir)]  # fmt: skip
    if spec is not None and spec.data_dir:
        candidates += [Path(spec.data_dir) / f"broker-{b}" for b in spec.brokers]
    candidates.append(cluster_dir)
    for path in candidates:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    if unlink_segment(cluster_dir):
        removed.append("metrics board")
    return removed
