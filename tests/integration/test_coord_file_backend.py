"""File-backend-only behaviour: crashes mid-mutation, hung-session expiry, polling fallback.

These need what only the file backend has (its store directory, its session timeout measured
in hundreds of milliseconds, its watch delivery modes); the shared semantics are held to
ZooKeeper in test_coord_contract.py.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time

import pytest

from localcluster import cluster
from localcluster.coord import EventType, SessionExpiredError, connect
from localcluster.coord.file_store import ZNODE_FILE, FileStore, encode_name
from tests.helpers import wait_until

# Mutates as fast as it can, keeping invariants a checker can verify after a SIGKILL:
# /pair/a == /pair/b == the number of /log children == /pair/a's version (one transaction).
CHURN_WORKER = """
import sys
from localcluster.coord import connect, NodeExistsError, NoNodeError
client = connect(sys.argv[1])
worker = sys.argv[2]
client.create("/workers/" + worker, b"alive", ephemeral=True)
print("ready", client.session_id, flush=True)
step = 0
while True:
    step += 1
    data, stat = client.get("/pair/a")
    transaction = client.transaction()
    transaction.check("/pair/a", stat.version)
    transaction.set_data("/pair/a", b"%d" % (stat.version + 1))
    transaction.set_data("/pair/b", b"%d" % (stat.version + 1))
    transaction.create("/log/entry-", sequence=True)
    transaction.commit()
    scratch = "/scratch/%s-%d" % (worker, step % 7)
    try:
        client.create(scratch + "/deep/er", b"x" * (step % 300), makepath=True)
    except NodeExistsError:
        client.delete(scratch, recursive=True)
    client.set("/counter", b"%d" % step)
"""

HUNG_WORKER = """
import sys
from localcluster.coord import connect
client = connect(sys.argv[1], session_timeout_ms=int(sys.argv[2]))
client.create(sys.argv[3], b"", ephemeral=True)
print("ready", flush=True)
sys.stdin.readline()
try:
    client.set(sys.argv[3], b"after resume")
    print("no error", flush=True)
except Exception as error:
    print(type(error).__name__, flush=True)
"""


def check_store_consistent(store_dir: str, client) -> int:
    """Walk the tree through the API and on disk; return the number of znodes."""
    with open(os.path.join(store_dir, "journal"), "rb") as journal:
        assert journal.read(4) != b"JRN1", "recovery left the journal pending"
    store = FileStore(store_dir)
    try:
        counter = store.read_zxid()
    finally:
        store.close()
    count, pending = 0, ["/"]
    while pending:
        path = pending.pop()
        data, stat = client.get(path)
        children = client.get_children(path)
        count += 1
        assert stat.numChildren == len(children) == len(set(children))
        assert max(stat.czxid, stat.mzxid, stat.pzxid) <= counter, (
            f"{path} is ahead of the zxid counter"
        )
        assert stat.dataLength == len(data)
        directory = os.path.dirname(store_znode_file(store_dir, path))
        on_disk = {
            entry
            for entry in os.listdir(directory)
            if os.path.exists(os.path.join(directory, entry, ZNODE_FILE))
        }
        assert on_disk == {encode_name(child) for child in children}, (
            f"{path}: children on disk differ"
        )
        for child in children:
            child_path = ("" if path == "/" else path) + "/" + child
            assert client.exists(child_path).czxid <= stat.pzxid
            pending.append(child_path)
    pair_a, stat_a = client.get("/pair/a")
    pair_b, _ = client.get("/pair/b")
    assert int(pair_a) == int(pair_b) == stat_a.version == len(client.get_children("/log")), (
        "a transaction was applied partly"
    )
    return count


def store_znode_file(store_dir: str, path: str) -> str:
    names = [] if path == "/" else [encode_name(name) for name in path[1:].split("/")]
    return os.path.join(store_dir, "tree", *names, ZNODE_FILE)


def test_sigkill_mid_mutation_leaves_the_store_consistent(tmp_path, processes):
    store_dir = str(tmp_path / "store")
    checker = connect(store_dir)
    try:
        for path, value in (("/pair/a", b"0"), ("/pair/b", b"0"), ("/counter", b"0")):
            checker.create(path, value, makepath=True)
        for path in ("/log", "/scratch", "/workers"):
            checker.create(path)
        seed = random.randrange(1 << 30)
        chooser = random.Random(seed)
        transactions_seen = []
        for kill in range(12):
            worker = processes.start(CHURN_WORKER, store_dir, f"w{kill}")
            assert processes.read_line(worker).startswith("ready")
            wait_until(
                lambda: checker.exists("/counter").version > 0 or None,
                10,
                message="the worker's churn",
            )
            time.sleep(chooser.uniform(0.001, 0.05))  # a random moment in the churn, not a sync
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
            wait_until(
                lambda kill=kill: checker.exists(f"/workers/w{kill}") is None,
                5,
                message=f"worker w{kill}'s ephemeral reaped after SIGKILL (seed {seed})",
            )
            check_store_consistent(store_dir, checker)
            transactions_seen.append(checker.exists("/pair/a").version)
        assert transactions_seen == sorted(transactions_seen) and transactions_seen[-1] > 12, (
            f"the workers made too little progress to test anything: {transactions_seen} (seed {seed})"
        )
    finally:
        checker.stop()
    connect(store_dir).stop()  # a new client sweeps what killed writers had staged
    assert [
        name
        for name in os.listdir(os.path.join(store_dir, "tmp"))
        if not name.startswith("session-")
    ] == []


def test_hung_session_expires_after_the_session_timeout(tmp_path, processes):
    store_dir = str(tmp_path / "store")
    observer = connect(store_dir)
    try:
        timeout_ms = 1000
        hung = processes.start(HUNG_WORKER, store_dir, timeout_ms, "/brokers-hung")
        live = processes.start(HUNG_WORKER, store_dir, timeout_ms, "/brokers-live")
        assert processes.read_line(hung) == "ready" and processes.read_line(live) == "ready"
        events = []
        observer.exists("/brokers-hung", watch=events.append)
        assert cluster.pause_client(store_dir, hung.pid)  # not inside the store's lock
        stopped_at = time.monotonic()
        wait_until(lambda: events, 10, message="the hung session's ephemeral to expire")
        waited_s = time.monotonic() - stopped_at
        assert events[0].type == EventType.DELETED and events[0].path == "/brokers-hung"
        # The last heartbeat was at most timeout/3 before the stop.
        assert waited_s >= timeout_ms / 1000 * 2 / 3 - 0.05, f"expired after only {waited_s:.3f} s"
        assert observer.exists("/brokers-live") is not None, "a live session must not expire"
        os.kill(hung.pid, signal.SIGCONT)
        hung.stdin.write("go\n")
        hung.stdin.flush()
        assert processes.read_line(hung) == "SessionExpiredError"
        live.stdin.write("go\n")
        live.stdin.flush()
        assert processes.read_line(live) == "no error"
    finally:
        observer.stop()


def test_polling_fallback_delivers_watches_and_reaps(tmp_path, processes):
    store_dir = str(tmp_path / "store")
    watcher = connect(store_dir, watch_mode="polling")
    writer = connect(store_dir, watch_mode="polling")
    try:
        assert watcher.watch_delivery == "polling"
        path = writer.create("/controller_epoch", b"1")
        changed = []
        watcher.get(path, watch=changed.append)
        writer.set(path, b"2")
        wait_until(lambda: changed, message="a polled CHANGED event")
        assert [(event.type, event.path) for event in changed] == [(EventType.CHANGED, path)]

        owner = processes.start(HUNG_WORKER, store_dir, 5000, "/controller")
        assert processes.read_line(owner) == "ready"
        deleted = []
        watcher.exists("/controller", watch=deleted.append)
        os.kill(owner.pid, signal.SIGKILL)
        wait_until(lambda: deleted, 5, message="a polled DELETED event after SIGKILL")
        assert deleted[0].type == EventType.DELETED
    finally:
        watcher.stop()
        writer.stop()


def test_falls_back_to_polling_when_inotify_fails(tmp_path, monkeypatch, caplog):
    from localcluster.coord import file_watch

    def no_inotify(self):
        raise OSError(28, "inotify watch limit reached")

    monkeypatch.setattr(file_watch.Wakeup, "_start_inotify", no_inotify)
    with caplog.at_level(logging.WARNING, logger="localcluster.coord.file_watch"):
        client = connect(str(tmp_path / "store"))
    try:
        assert client.watch_delivery == "polling"
        assert "falling back to polling" in caplog.text and "inotify watch limit" in caplog.text
        seen = []
        client.exists("/x", watch=seen.append)
        client.create("/x")
        wait_until(lambda: seen, message="CREATED through polling")
    finally:
        client.stop()
    with pytest.raises(OSError):
        connect(str(tmp_path / "store"), watch_mode="inotify")


def test_many_clients_starting_at_once_all_get_sessions(tmp_path, processes):
    """Clients starting together must not disturb each other's session files (each start
    sweeps the store's staging area)."""
    store_dir = str(tmp_path / "store")
    observer = connect(store_dir)
    try:
        owners = [processes.start(HUNG_WORKER, store_dir, 5000, f"/broker-{i}") for i in range(8)]
        for owner in owners:
            assert processes.read_line(owner) == "ready"
        assert sorted(observer.get_children("/")) == sorted(f"broker-{i}" for i in range(8))
        owners_of = {observer.exists(f"/broker-{i}").ephemeralOwner for i in range(8)}
        assert len(owners_of) == 8 and observer.session_id not in owners_of
    finally:
        observer.stop()


def test_stopped_client_refuses_calls(tmp_path):
    client = connect(str(tmp_path / "store"))
    client.stop()
    with pytest.raises(SessionExpiredError, match="stopped"):
        client.get("/")


def test_fsync_mode_and_a_slow_callback_do_not_cost_the_session(tmp_path):
    """fsync=True goes through the same paths; a callback that runs longer than the session
    timeout does not expire the session (heartbeats have their own thread)."""
    store_dir = str(tmp_path / "store")
    client = connect(store_dir, session_timeout_ms=500, fsync=True)
    observer = connect(store_dir)
    try:
        client.create("/brokers/ids/0", b"endpoints", ephemeral=True, makepath=True)
        entered, finished = [], []

        def slow(event):
            entered.append(event)
            time.sleep(1.5)  # a callback doing slow work, longer than the session timeout
            finished.append(event)

        client.exists("/controller", watch=slow)
        observer.create("/controller", b"1")
        wait_until(lambda: finished, 10, message="the slow callback to finish")
        assert observer.exists("/brokers/ids/0") is not None, (
            "the session expired during a slow callback"
        )
        assert client.set("/brokers/ids/0", b"new endpoints").version == 1
        client.delete("/brokers/ids/0")
        assert observer.exists("/brokers/ids/0") is None
    finally:
        client.stop()
        observer.stop()
