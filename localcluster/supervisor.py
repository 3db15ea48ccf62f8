"""The supervisor: spawns a cluster's brokers, reaps them, reports what happens, stops them.

`localcluster up` runs it in the foreground (`--detach`: `python -m localcluster.supervisor`
in its own session, output to <cluster-dir>/supervisor.log). Each broker runs in its own
session with its own pid file, so nothing depends on the supervisor: SIGKILL it and the
brokers keep serving; `status`, `down`, `kill` and `start` work from the files.

What it reports, one line per event: a broker process exited (reaped: exit code or signal),
a broker registered or left (/brokers/ids), the controller moved (/controller), a leader was
elected, an ISR shrank or expanded (partition state znodes), topics created or deleted. Store
events come from watches on the coordination thread and pass through a bounded queue; the
main thread prints them. It restarts nothing by itself: `localcluster start N` is the request.
Ctrl-C (SIGINT) or SIGTERM stops the cluster cleanly (SIGTERM to every broker, SIGKILL after
a deadline) and removes the metrics board.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from localcluster import cluster
from localcluster.cluster import ClusterError, ClusterSpec

EVENT_QUEUE_MAX = 10_000
CONTROLLER_GRACE_S = float(os.environ.get("LOCALCLUSTER_CONTROLLER_GRACE_S", "2.0"))


def _stamp() -> str:
    return datetime.now().strftime("%H:%M:%S.%f")[:-3]


class StoreEvents:
    """Watches the store and turns changes into one-line event strings on a bounded queue."""

    def __init__(self, spec: ClusterSpec, events: queue.Queue):
        from localcluster import coord

        self.events = events
        self.client = coord.connect(spec.coordination)
        self._lock = threading.Lock()
        self._quiet = True  # the first reading of each watch is the baseline, not an event
        self._brokers: set[int] | None = None
        self._controller: int | None = None
        self._controller_seen = False
        self._topics: set[str] = set()
        self._partitions: dict[str, set[int]] = {}
        self._states: dict[tuple[str, int], tuple[int, int, tuple[int, ...]]] = {}
        self._watches = []
        from localcluster.coord import ChildrenWatch, DataWatch, paths

        for path in (paths.BROKER_IDS, paths.BROKER_TOPICS):
            self.client.ensure_path(path)
        self._watches.append(ChildrenWatch(self.client, paths.BROKER_IDS, self._on_brokers))
        self._watches.append(DataWatch(self.client, paths.CONTROLLER, self._on_controller))
        self._watches.append(ChildrenWatch(self.client, paths.BROKER_TOPICS, self._on_topics))
        self._quiet = False

    def _emit(self, text: str) -> None:
        if self._quiet:
            return
        try:
            self.events.put_nowait(f"{_stamp()}  {text}")
        except queue.Full:
            pass  # bounded: a storm of events loses lines, never memory

    def _on_brokers(self, children) -> None:
        ids = {int(c) for c in children if c.isdigit()}
        with self._lock:
            before, self._brokers = self._brokers, ids
        if before is None:
            return
        for b in sorted(ids - before):
            self._emit(f"broker {b} registered")
        for b in sorted(before - ids):
            self._emit(f"broker {b} left the cluster (registration gone)")

    def _on_controller(self, data, stat) -> None:
        import json

        try:
            found = int(json.loads(data)["brokerid"]) if data else None
        except (ValueError, KeyError, TypeError):
            found = None
        with self._lock:
            before, self._controller = self._controller, found
            seen, self._controller_seen = self._controller_seen, True
        if not seen and self._quiet:
            return
        if found is None and before is not None:
            self._emit(f"controller {before} is gone; waiting for an election")
        elif found is not None and found != before:
            self._emit(f"controller is now broker {found}"
                       + (f" (was {before})" if before is not None else ""))  # fmt: skip

    def _on_topics(self, children) -> None:
        from localcluster.coord import DataWatch, paths

        names = set(children)
        with self._lock:
            new, gone = names - self._topics, self._topics - names
            self._topics = names
        for topic in sorted(gone):
            with self._lock:  # a topic created again under this name is watched afresh
                self._partitions.pop(topic, None)
                for key in [k for k in self._states if k[0] == topic]:
                    del self._states[key]
            self._emit(f"topic {topic} deleted")
        for topic in sorted(new):
            self._watches.append(DataWatch(self.client, paths.topic_path(topic),
                                           self._topic_watcher(topic)))  # fmt: skip

    # DataWatch passes the event to functions of three parameters: bind topic/partition here.
    def _topic_watcher(self, topic: str):
        def watcher(data, stat):
            return self._on_topic(topic, data)

        return watcher

    def _state_watcher(self, topic: str, partition: int):
        def watcher(data, stat):
            return self._on_state(topic, partition, data)

        return watcher

    def _on_topic(self, topic: str, data) -> bool | None:
        from localcluster.coord import DataWatch, paths
        from localcluster.coord.znode_data import ZnodeDataError, decode_topic_assignment

        if data is None:
            return False  # deleted: the watch ends
        try:
            assignment = decode_topic_assignment(paths.topic_path(topic), data)
        except ZnodeDataError as e:
            self._emit(f"topic {topic}: {e}")
            return None
        with self._lock:
            known = self._partitions.setdefault(topic, set())
            new = set(assignment.partitions) - known
            known |= new
        if new and not self._quiet and len(new) == len(known):
            rf = len(next(iter(assignment.partitions.values())))
            self._emit(f"topic {topic} created: {len(new)} partitions, replication factor {rf}")
        for p in sorted(new):
            self._watches.append(DataWatch(self.client, paths.partition_state_path(topic, p),
                                           self._state_watcher(topic, p)))  # fmt: skip
        return None

    def _on_state(self, topic: str, partition: int, data) -> bool | None:
        from localcluster.coord import paths
        from localcluster.coord.znode_data import ZnodeDataError, decode_leader_and_isr

        name = f"{topic}-{partition}"
        if data is None:
            with self._lock:
                had = self._states.pop((topic, partition), None)
            if had is not None:
                self._emit(f"{name}: partition state removed")
                return False
            return None
        try:
            state = decode_leader_and_isr(paths.partition_state_path(topic, partition), data)
        except ZnodeDataError as e:
            self._emit(f"{name}: {e}")
            return None
        now = (state.leader, state.leader_epoch, tuple(state.isr))
        with self._lock:
            before = self._states.get((topic, partition))
            self._states[(topic, partition)] = now
        isr = ",".join(map(str, state.isr))
        if before is None:
            self._emit(f"{name}: leader {state.leader} (epoch {state.leader_epoch}), ISR [{isr}]")
            return None
        if (before[0], before[1]) != (state.leader, state.leader_epoch):
            who = "no leader (offline)" if state.leader < 0 else f"leader {state.leader} elected"
            self._emit(
                f"{name}: {who}, epoch {state.leader_epoch} (was leader {before[0]}), ISR [{isr}]"
            )
        elif set(before[2]) != set(state.isr):
            shrank = set(state.isr) < set(before[2])
            verb = (
                "ISR shrank"
                if shrank
                else "ISR expanded"
                if set(state.isr) > set(before[2])
                else "ISR changed"
            )
            self._emit(f"{name}: {verb} [{','.join(map(str, before[2]))}] -> [{isr}]")
        return None

    def close(self) -> None:
        for watch in self._watches:
            watch.stop()
        self.client.stop()


class Supervisor:
    def __init__(self, cluster_dir: Path, spec: ClusterSpec, emit=print):
        self.cluster_dir = cluster_dir
        self.spec = spec
        self.emit = emit
        self.children: dict[int, int] = {}  # pid -> broker id, for the processes we spawned
        self.events: queue.Queue[str] = queue.Queue(EVENT_QUEUE_MAX)
        self.stop_requested = threading.Event()
        self._store_events: StoreEvents | None = None
        self._statuses: dict[int, int] = {}  # pid -> waitpid status of reaped children

    # -- start --------------------------------------------------------------------------------

    def start(self) -> None:
        from localcluster.metrics.segment import create_segment

        self.cluster_dir.mkdir(parents=True, exist_ok=True)
        (self.cluster_dir / cluster.SUPERVISOR_PID).write_text(f"{os.getpid()}\n")
        cluster.remove_pid_files(self.cluster_dir, self.spec)
        create_segment(self.cluster_dir)  # before the brokers, which only open it
        for broker_id in self.spec.brokers:
            if cluster.broker_pid(self.cluster_dir, broker_id) is not None:
                continue  # already running (started by hand): leave it be
            process = cluster.spawn_broker(self.cluster_dir, self.spec, broker_id)
            self.children[process.pid] = broker_id
            process.returncode = 0  # we reap by waitpid; keep Popen.__del__ from tracking it

    def wait_ready(self, timeout_s: float = cluster.READY_TIMEOUT_S,
                   controller_grace_s: float = CONTROLLER_GRACE_S) -> int | None:  # fmt: skip
        """Wait until every broker registered; then up to controller_grace_s for a controller.
        Returns the controller id (None: none appeared). Raises ClusterError if a broker
        exits or the deadline passes."""
        expected = {b: pid for pid, b in self.children.items()}
        expected.update({b: pid for b, pid in cluster.live_brokers(self.cluster_dir, self.spec).items()
                         if b not in expected})  # fmt: skip

        def failed() -> str | None:
            if self.stop_requested.is_set():
                return "interrupted while the brokers were starting; stopping them"
            for pid, broker_id in self._reap():
                last = cluster.tail(cluster.log_file(self.cluster_dir, broker_id), 1).strip()
                return (f"broker {broker_id} exited while starting ({self._describe_exit(pid)})"
                        + (f": {last}" if last else "")
                        + f"; `localcluster logs {broker_id}` has the rest")  # fmt: skip
            return None

        cluster.wait_registered(self.spec, expected, timeout_s, failed)
        return cluster.wait_controller(self.spec, controller_grace_s)

    # -- reaping ------------------------------------------------------------------------------

    def _reap(self) -> list[tuple[int, int]]:
        """waitpid our exited children: [(pid, broker id)], statuses kept for the report."""
        out = []
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            broker_id = self.children.pop(pid, None)
            if broker_id is None:
                continue
            self._statuses[pid] = status
            out.append((pid, broker_id))
        return out

    def _describe_exit(self, pid: int) -> str:
        status = self._statuses.get(pid)
        if status is None:
            return f"pid {pid}"
        if os.WIFSIGNALED(status):
            return f"pid {pid}, killed by {cluster.signal_name(os.WTERMSIG(status))}"
        return f"pid {pid}, exit code {os.WEXITSTATUS(status)}"

    # -- run ----------------------------------------------------------------------------------

    def run(self, tick_s: float = 0.05, poll_s: float = 0.25) -> None:
        """Report events until stop_requested (set by SIGINT/SIGTERM through install_signals)."""
        try:
            self._store_events = StoreEvents(self.spec, self.events)
        except Exception as e:
            self.emit(f"{_stamp()}  cannot watch the store ({e}); reporting process exits only")
        others = self._others()
        next_poll = time.monotonic() + poll_s
        while not self.stop_requested.is_set():
            self._drain_events()
            for pid, broker_id in self._reap():
                self.emit(f"{_stamp()}  broker {broker_id} died ({self._describe_exit(pid)}); "
                          f"`localcluster start {broker_id}` restarts it")  # fmt: skip
            if time.monotonic() >= next_poll:
                # Brokers we did not spawn (`localcluster start`): no exit status, only that
                # their process is gone.
                now = self._others()
                for broker_id, pid in sorted(others.items()):
                    if now.get(broker_id) != pid:
                        self.emit(f"{_stamp()}  broker {broker_id} (pid {pid}) exited; "
                                  f"`localcluster start {broker_id}` restarts it")  # fmt: skip
                others, next_poll = now, time.monotonic() + poll_s
            self.stop_requested.wait(tick_s)
        self._drain_events()

    def _others(self) -> dict[int, int]:
        """{broker id: pid} of live brokers of this cluster that are not our children."""
        mine = set(self.children) | set(self._statuses)
        return {b: pid for b, pid in cluster.live_brokers(self.cluster_dir, self.spec).items()
                if pid not in mine}  # fmt: skip

    def _drain_events(self) -> None:
        while True:
            try:
                self.emit(self.events.get_nowait())
            except queue.Empty:
                return

    def install_signals(self) -> None:
        def handler(signum, frame):
            self.stop_requested.set()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, handler)

    # -- stop ---------------------------------------------------------------------------------

    def shutdown(self, timeout_s: float = cluster.STOP_TIMEOUT_S) -> dict:
        """Stop every broker of the cluster (ours and those started by hand), clean up."""
        from localcluster.metrics.segment import unlink_segment

        if self._store_events is not None:
            with contextlib.suppress(Exception):
                self._store_events.close()
            self._store_events = None
        live = cluster.live_brokers(self.cluster_dir, self.spec)
        result = cluster.stop_brokers(self.cluster_dir, live, timeout_s,
                                      cluster.current_controller(self.spec))  # fmt: skip
        self._reap()
        cluster.remove_pid_files(self.cluster_dir, self.spec)
        unlink_segment(self.cluster_dir)
        pid_path = self.cluster_dir / cluster.SUPERVISOR_PID
        if cluster.read_pid(pid_path) == os.getpid():
            pid_path.unlink(missing_ok=True)
        return result


def main(argv: list[str] | None = None) -> int:
    """`python -m localcluster.supervisor --dir DIR`: the detached supervisor of `up --detach`
    (the CLI already wrote cluster.json and waits for readiness through the store)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m localcluster.supervisor")
    parser.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    cluster_dir = Path(args.dir).resolve()

    def emit(line: str) -> None:
        print(line, flush=True)

    try:
        spec = cluster.load_spec(cluster_dir)
    except ClusterError as e:
        emit(f"supervisor: {e}")
        return 1
    supervisor = Supervisor(cluster_dir, spec, emit)
    supervisor.install_signals()
    try:
        supervisor.start()
        controller = supervisor.wait_ready()
        emit(f"{_stamp()}  cluster ready: brokers {spec.brokers}, controller "
             f"{controller if controller is not None else 'none'}")  # fmt: skip
        supervisor.run()
    except ClusterError as e:
        emit(f"{_stamp()}  {e}")
        supervisor.shutdown()
        return 1
    result = supervisor.shutdown()
    emit(f"{_stamp()}  cluster stopped: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
