"""Contract tests for the coordination interface, run against both backends.

Every test runs on the file backend and on a real ZooKeeper (the oracle): what passes on
ZooKeeper and fails on the file backend is a bug in the emulation. Multi-process tests start
real worker processes (fixture `processes`) and synchronise on the lines they print.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from localcluster.coord import (
    BadPathError,
    BadVersionError,
    ChildrenWatch,
    DataWatch,
    EventType,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistencyError,
)
from tests.helpers import wait_until

pytestmark = pytest.mark.zookeeper

# A worker: connects, then obeys the test through its argv; prints "ready" when set up.
CAS_WORKER = """
import sys
from localcluster.coord import connect, BadVersionError
spec, path, increments, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
client = connect(spec, session_timeout_ms=int(timeout) or None)
print("ready", flush=True)
sys.stdin.readline()
retries = 0
for _ in range(increments):
    while True:
        data, stat = client.get(path)
        try:
            client.set(path, str(int(data) + 1).encode(), version=stat.version)
            break
        except BadVersionError:
            retries += 1
print("done", retries, flush=True)
client.stop()
"""

EPHEMERAL_OWNER = """
import sys
from localcluster.coord import connect
spec, path, timeout = sys.argv[1], sys.argv[2], sys.argv[3]
client = connect(spec, session_timeout_ms=int(timeout) or None)
client.create(path, b"owner", ephemeral=True)
print("ready", client.session_id, flush=True)
sys.stdin.readline()
"""

SEQUENCE_WORKER = """
import sys
from localcluster.coord import connect
spec, prefix, count, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
client = connect(spec, session_timeout_ms=int(timeout) or None)
print("ready", flush=True)
sys.stdin.readline()
names = [client.create(prefix, sequence=True) for _ in range(count)]
print(" ".join(names), flush=True)
client.stop()
"""


def timeout_argument(backend) -> str:
    return str(backend.session_timeout_ms or 0)


class Recorder:
    """A watch callback that records events; thread-safe."""

    def __init__(self):
        self.events = []
        self._lock = threading.Lock()

    def __call__(self, event):
        with self._lock:
            self.events.append(event)

    def kinds(self):
        with self._lock:
            return [(event.type, event.path) for event in self.events]


# -- CRUD, versions, stats -----------------------------------------------------------------------


def test_create_get_set_delete_and_stats(coord_backend):
    client = coord_backend.connect()
    path = coord_backend.path("node")
    assert client.create(path, b"v0") == path
    data, stat = client.get(path)
    assert data == b"v0"
    assert (stat.version, stat.cversion, stat.numChildren, stat.dataLength) == (0, 0, 0, 2)
    assert stat.czxid == stat.mzxid == stat.pzxid and stat.ephemeralOwner == 0
    assert stat.ctime == stat.mtime > 0

    stat_after_set = client.set(path, b"value one")
    assert stat_after_set.version == 1 and stat_after_set.mzxid > stat.mzxid
    assert stat_after_set.czxid == stat.czxid and stat_after_set.dataLength == 9
    assert client.get(path) == (b"value one", stat_after_set)

    child = client.create(path + "/child")
    parent_stat = client.exists(path)
    assert parent_stat.cversion == 1 and parent_stat.numChildren == 1
    assert parent_stat.pzxid == client.exists(child).czxid
    assert parent_stat.version == 1, "a child create must not bump the parent's data version"
    assert client.get_children(path) == ["child"]

    assert client.delete(child) is True
    assert client.exists(child) is None
    parent_stat = client.exists(path)
    assert (parent_stat.cversion, parent_stat.numChildren) == (2, 0)
    client.delete(path)
    assert client.exists(path) is None


def test_conditional_set_and_delete(coord_backend):
    client = coord_backend.connect()
    path = client.create(coord_backend.path("versioned"), b"a")
    assert client.set(path, b"b", version=0).version == 1
    with pytest.raises(BadVersionError):
        client.set(path, b"c", version=0)
    with pytest.raises(BadVersionError):
        client.delete(path, version=5)
    assert client.get(path)[0] == b"b"
    client.delete(path, version=1)
    assert client.exists(path) is None


def test_errors_mirror_zookeeper(coord_backend):
    client = coord_backend.connect()
    missing = coord_backend.path("missing")
    for call in (
        lambda: client.get(missing),
        lambda: client.set(missing, b""),
        lambda: client.delete(missing),
        lambda: client.get_children(missing),
        lambda: client.create(missing + "/child"),
    ):
        with pytest.raises(NoNodeError):
            call()
    parent = client.create(coord_backend.path("parent"))
    client.create(parent + "/child")
    with pytest.raises(NodeExistsError):
        client.create(parent)
    with pytest.raises(NotEmptyError):
        client.delete(parent)
    ephemeral = client.create(coord_backend.path("ephemeral"), ephemeral=True)
    with pytest.raises(NoChildrenForEphemeralsError):
        client.create(ephemeral + "/child")
    for bad in (
        "relative",
        coord_backend.path("trailing/"),
        coord_backend.base + "//x",
        coord_backend.path(".."),
        coord_backend.path("a\x00b"),
    ):
        with pytest.raises(BadPathError, match="znode path"):
            client.create(bad)
    with pytest.raises(ValueError):  # BadPathError is also a ValueError
        client.get("no/leading/slash")
    with pytest.raises(TypeError):
        client.create(coord_backend.path("text"), "not bytes")


def test_makepath_ensure_path_and_recursive_delete(coord_backend):
    client = coord_backend.connect()
    deep = coord_backend.path("a", "b", "c")
    assert client.create(deep, b"leaf", makepath=True) == deep
    assert client.get_children(coord_backend.path("a")) == ["b"]
    assert client.ensure_path(coord_backend.path("a", "b", "d", "e")) is True
    assert client.ensure_path(deep) is True  # existing: no error, data untouched
    assert client.get(deep)[0] == b"leaf"
    assert sorted(client.get_children(coord_backend.path("a", "b"))) == ["c", "d"]
    client.delete(coord_backend.path("a"), recursive=True)
    assert client.exists(coord_backend.path("a")) is None
    assert client.get_children(coord_backend.base) == []


# -- sequential and ephemeral znodes ---------------------------------------------------------------


def test_sequential_names_follow_the_parent_cversion(coord_backend):
    client = coord_backend.connect()
    parent = client.create(coord_backend.path("seq"))
    client.create(parent + "/plain")
    client.delete(parent + "/plain")  # cversion is now 2, but the counter counts creates: 1
    first = client.create(parent + "/isr_change_", sequence=True)
    second = client.create(parent + "/isr_change_", sequence=True)
    assert first == parent + "/isr_change_0000000001"
    assert second == parent + "/isr_change_0000000002"
    in_transaction = client.transaction()
    in_transaction.create(parent + "/t-", sequence=True)
    in_transaction.create(parent + "/t-", sequence=True)
    assert in_transaction.commit() == [parent + "/t-0000000003", parent + "/t-0000000004"]


def test_sequential_names_are_unique_and_increasing_across_processes(coord_backend, processes):
    parent = coord_backend.connect().create(coord_backend.path("isr_change_notification"))
    workers = [
        processes.start(
            SEQUENCE_WORKER,
            coord_backend.spec,
            parent + "/isr_change_",
            25,
            timeout_argument(coord_backend),
        )
        for _ in range(3)
    ]
    for worker in workers:
        assert processes.read_line(worker) == "ready"
    for worker in workers:
        worker.stdin.write("go\n")
        worker.stdin.flush()
    per_worker = [processes.read_line(worker).split() for worker in workers]
    everything = [name for names in per_worker for name in names]
    assert len(everything) == len(set(everything)) == 75
    for names in per_worker:
        assert names == sorted(names), "one process's sequence numbers must increase"
    assert all(len(name.rsplit("_", 1)[1]) == 10 for name in everything)


def test_ephemeral_is_owned_by_the_session_and_removed_on_stop(coord_backend):
    owner = coord_backend.connect()
    observer = coord_backend.connect()
    path = owner.create(coord_backend.path("broker-0"), b"endpoints", ephemeral=True)
    assert observer.exists(path).ephemeralOwner == owner.session_id == owner.client_id[0]
    assert owner.session_id != observer.session_id
    deleted = Recorder()
    observer.exists(path, watch=deleted)
    owner.stop()
    wait_until(
        lambda: deleted.kinds(), 10, message="the DELETED event of a closed session's ephemeral"
    )
    assert deleted.kinds() == [(EventType.DELETED, path)]
    assert observer.exists(path) is None


def test_ephemerals_vanish_when_the_owner_is_killed(coord_backend, processes):
    observer = coord_backend.connect()
    path = coord_backend.path("controller")
    owner = processes.start(
        EPHEMERAL_OWNER, coord_backend.spec, path, timeout_argument(coord_backend)
    )
    state, owner_session = processes.read_line(owner).split()
    assert state == "ready"
    assert observer.exists(path).ephemeralOwner == int(owner_session)
    deleted = Recorder()
    assert observer.exists(path, watch=deleted) is not None
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(timeout=10)
    wait_until(lambda: deleted.kinds(), 15, message=f"the DELETED event for {path} after SIGKILL")
    assert deleted.kinds() == [(EventType.DELETED, path)]
    assert observer.exists(path) is None
    # The controller's successor can now win the election.
    observer.create(path, b"successor", ephemeral=True)


# -- transactions ----------------------------------------------------------------------------------


def test_transaction_applies_all_or_nothing(coord_backend):
    client = coord_backend.connect()
    state = client.create(coord_backend.path("state"), b"leader=0")
    failing = client.transaction()
    failing.create(coord_backend.path("new"))
    failing.check(state, 7)
    failing.set_data(state, b"leader=1")
    results = failing.commit()
    assert [type(result) for result in results] == [
        RolledBackError,
        BadVersionError,
        RuntimeInconsistencyError,
    ]
    assert client.exists(coord_backend.path("new")) is None
    assert client.get(state) == (b"leader=0", client.exists(state))
    assert client.exists(state).version == 0

    succeeding = client.transaction()
    succeeding.check(state, 0)
    succeeding.create(coord_backend.path("new"), b"x")
    succeeding.create(coord_backend.path("new", "child"))  # sees the create before it
    succeeding.set_data(state, b"leader=1", version=0)
    succeeding.delete(coord_backend.path("new", "child"))
    results = succeeding.commit()
    assert results[0] is True and results[4] is True
    assert results[1:3] == [coord_backend.path("new"), coord_backend.path("new", "child")]
    assert results[3].version == 1
    stat = client.exists(state)
    assert stat.version == 1
    assert client.exists(coord_backend.path("new")).mzxid == stat.mzxid, "one transaction, one zxid"
    assert client.get_children(coord_backend.path("new")) == []


def test_failed_transaction_reports_the_failing_operation(coord_backend):
    client = coord_backend.connect()
    with client.transaction() as transaction:  # the context manager commits
        transaction.create(coord_backend.path("x"))
    assert client.exists(coord_backend.path("x")) is not None
    transaction = client.transaction()
    transaction.delete(coord_backend.path("absent"))
    assert [type(result) for result in transaction.commit()] == [NoNodeError]
    assert client.transaction().commit() == []


# -- batch commits (commit_transactions) -----------------------------------------------------------


def test_batch_commit_answers_each_transaction_on_its_own(coord_backend):
    client = coord_backend.connect()
    state = client.create(coord_backend.path("state"), b"leader=0")
    first, clashing, later, reading = (client.transaction() for _ in range(4))
    first.set_data(state, b"leader=1", version=0)
    first.create(coord_backend.path("a"), b"a")
    clashing.create(coord_backend.path("b"))
    clashing.set_data(state, b"stale", version=0)  # version 0 is gone: first moved it to 1
    later.set_data(state, b"leader=2", version=1)  # sees first's write, applied in order
    reading.check(state, 2)
    reading.create(coord_backend.path("a", "child"))  # sees first's create
    results = client.commit_transactions([first, clashing, later, reading])
    assert first.committed and reading.committed
    assert len(results) == 4
    assert results[0][0].version == 1 and results[0][1] == coord_backend.path("a")
    assert [type(result) for result in results[1]] == [RolledBackError, BadVersionError]
    assert results[2][0].version == 2
    assert results[3] == [True, coord_backend.path("a", "child")]
    assert client.exists(coord_backend.path("b")) is None, "the failed one is rolled back alone"
    data, stat = client.get(state)
    assert (data, stat.version) == (b"leader=2", 2)
    a_stat = client.exists(coord_backend.path("a"))
    assert a_stat.czxid == results[0][0].mzxid, "one transaction, one zxid"
    assert a_stat.czxid < stat.mzxid < client.exists(coord_backend.path("a", "child")).czxid, (
        "each transaction of a batch has its own zxid, in order"
    )
    assert client.commit_transactions([]) == []


def test_batch_commit_fires_each_watch_once_per_changed_znode(coord_backend):
    client = coord_backend.connect()
    writer = coord_backend.connect()
    parent = client.create(coord_backend.path("notifications"))
    names = [client.create(coord_backend.path(f"partition-{i}"), b"") for i in range(3)]
    data_watch, child_watch = Recorder(), Recorder()
    for path in names:
        client.get(path, watch=data_watch)
    client.get_children(parent, watch=child_watch)
    batch = []
    for path in names[::-1] + names:  # every znode written twice: its one-shot watch fires once
        transaction = writer.transaction()
        transaction.set_data(path, b"changed")
        batch.append(transaction)
    for i in range(2):
        transaction = writer.transaction()
        transaction.create(f"{parent}/child-{i}")
        batch.append(transaction)
    failing = writer.transaction()
    failing.check(names[0], 99)
    batch.insert(0, failing)
    results = writer.commit_transactions(batch)
    assert isinstance(results[0][0], BadVersionError)
    assert [stat.version for (stat,) in results[1:7]] == [1, 1, 1, 2, 2, 2]
    wait_until(lambda: len(data_watch.kinds()) == 3 and child_watch.kinds(), message="events")
    marker = Recorder()  # a later change's event, so a late duplicate would have arrived
    client.exists(names[0], watch=marker)
    writer.set(names[0], b"after")
    wait_until(lambda: marker.kinds(), message="the marker's event")
    assert data_watch.kinds() == [(EventType.CHANGED, path) for path in names[::-1]]
    assert child_watch.kinds() == [(EventType.CHILD, parent)]


def test_get_many_reads_like_one_get_each(coord_backend):
    client = coord_backend.connect()
    present = [client.create(coord_backend.path(f"read-{i}"), f"v{i}".encode()) for i in range(3)]
    client.set(present[1], b"changed")
    wanted = [present[2], coord_backend.path("absent"), present[0], present[1]]
    found = client.get_many(wanted)
    assert found == [client.get(present[2]), None, client.get(present[0]), client.get(present[1])]
    assert found[3][0] == b"changed" and found[3][1].version == 1
    assert client.get_many([]) == []
    with pytest.raises(BadPathError):
        client.get_many([present[0], "no-slash"])


def test_cas_race_counts_every_increment(coord_backend, processes):
    client = coord_backend.connect()
    counter = client.create(coord_backend.path("counter"), b"0")
    workers = [
        processes.start(
            CAS_WORKER, coord_backend.spec, counter, 40, timeout_argument(coord_backend)
        )
        for _ in range(4)
    ]
    for worker in workers:
        assert processes.read_line(worker) == "ready"
    for worker in workers:  # released together so they really race
        worker.stdin.write("go\n")
        worker.stdin.flush()
    retries = [int(processes.read_line(worker, 60).split()[1]) for worker in workers]
    data, stat = client.get(counter)
    assert int(data) == 160
    assert stat.version == 160
    assert sum(retries) >= 0


# -- watches ---------------------------------------------------------------------------------------


def test_data_watch_fires_once_per_registration(coord_backend):
    client = coord_backend.connect()
    writer = coord_backend.connect()
    path = client.create(coord_backend.path("watched"), b"0")
    changed = Recorder()
    client.get(path, watch=changed)
    writer.set(path, b"1")
    writer.set(path, b"2")  # the one-shot watch is spent: no second event
    marker = Recorder()
    client.exists(path, watch=marker)
    writer.set(path, b"3")
    wait_until(lambda: marker.kinds(), message="the second registration's event")
    assert changed.kinds() == [(EventType.CHANGED, path)]
    assert marker.kinds() == [(EventType.CHANGED, path)]


def test_exists_watch_sees_create_and_get_watch_sees_delete(coord_backend):
    client = coord_backend.connect()
    writer = coord_backend.connect()
    path = coord_backend.path("later")
    created = Recorder()
    assert client.exists(path, watch=created) is None
    writer.create(path)
    wait_until(lambda: created.kinds(), message="CREATED")
    deleted = Recorder()
    client.get(path, watch=deleted)
    writer.delete(path)
    wait_until(lambda: deleted.kinds(), message="DELETED")
    assert created.kinds() == [(EventType.CREATED, path)]
    assert deleted.kinds() == [(EventType.DELETED, path)]
    no_watch = Recorder()
    with pytest.raises(NoNodeError):
        client.get(path, watch=no_watch)  # a failed get sets no watch
    writer.create(path)
    client.exists(path, watch=created)
    writer.set(path, b"x")
    wait_until(lambda: len(created.kinds()) == 2, message="CHANGED")
    assert no_watch.kinds() == []


def test_child_watch_fires_on_child_create_and_delete_not_on_child_data(coord_backend):
    client = coord_backend.connect()
    writer = coord_backend.connect()
    parent = client.create(coord_backend.path("ids"))
    writer.create(parent + "/0")
    children = Recorder()
    assert client.get_children(parent, watch=children) == ["0"]
    writer.set(parent + "/0", b"new endpoints")  # data of a child: not a child event
    writer.create(parent + "/1")
    wait_until(lambda: children.kinds(), message="CHILD on create")
    client.get_children(parent, watch=children)
    writer.delete(parent + "/0")
    wait_until(lambda: len(children.kinds()) == 2, message="CHILD on delete")
    client.get_children(parent, watch=children)
    writer.delete(parent + "/1")
    writer.delete(parent)
    wait_until(lambda: len(children.kinds()) == 3, message="CHILD for the last child")
    assert children.kinds() == [(EventType.CHILD, parent)] * 3


def test_watches_fire_in_change_order(coord_backend):
    client = coord_backend.connect()
    writer = coord_backend.connect()
    names = [client.create(coord_backend.path(f"partition-{i}"), b"") for i in range(5)]
    seen = Recorder()
    for path in names:
        client.get(path, watch=seen)
    order = [names[3], names[0], names[4], names[1], names[2]]
    for path in order:
        writer.set(path, b"changed")
    wait_until(lambda: len(seen.kinds()) == 5, message="five CHANGED events")
    assert seen.kinds() == [(EventType.CHANGED, path) for path in order]


def test_no_change_is_lost_between_a_read_and_its_watch(coord_backend):
    """A set racing a get(watch): the watch fires exactly when the get saw the old version."""
    client = coord_backend.connect()
    writer = coord_backend.connect()
    path = client.create(coord_backend.path("raced"), b"0")
    other = client.create(coord_backend.path("other"), b"0")
    outcomes = set()
    for round_number in range(30):
        target_version = client.exists(path).version + 1
        fired = Recorder()
        racer = threading.Thread(target=writer.set, args=(path, b"%d" % round_number))
        racer.start()
        _, stat = client.get(path, watch=fired)
        racer.join()
        if stat.version < target_version:
            outcomes.add("read before the set")
            wait_until(fired.kinds, message=f"the watch of round {round_number}")
        else:
            outcomes.add("read after the set")
            # Events arrive in change order, so once a later change elsewhere has been
            # delivered, a (wrong) event for the change the read already saw would be in.
            marker = Recorder()
            client.exists(other, watch=marker)
            writer.set(other, b"%d" % round_number)
            wait_until(marker.kinds, message="the marker event")
            assert fired.kinds() == [], "the watch fired for a change its read had already seen"
            writer.set(path, b"later")
            wait_until(fired.kinds, message="the still-armed watch")
        assert fired.kinds() == [(EventType.CHANGED, path)]
    assert outcomes, "the race was never run"


def test_data_watch_and_children_watch_recipes(coord_backend):
    client = coord_backend.connect()
    writer = coord_backend.connect()
    path = coord_backend.path("controller_epoch")
    seen_data = []
    DataWatch(
        client,
        path,
        lambda data, stat: seen_data.append(None if stat is None else (data, stat.version)),
    )
    assert seen_data == [None]
    writer.create(path, b"1")
    wait_until(lambda: seen_data[-1] == (b"1", 0), message="DataWatch sees the create")
    writer.set(path, b"2")
    wait_until(lambda: seen_data[-1] == (b"2", 1), message="DataWatch sees the set")

    parent = writer.create(coord_backend.path("brokers"))
    seen_children = []

    def on_children(children):
        seen_children.append(sorted(children))
        return len(children) < 2  # stop after two brokers

    ChildrenWatch(client, parent, on_children)
    writer.create(parent + "/0", ephemeral=True)
    writer.create(parent + "/1", ephemeral=True)
    wait_until(lambda: seen_children[-1] == ["0", "1"], message="ChildrenWatch sees both brokers")
    writer.create(parent + "/2")
    marker = Recorder()
    client.get_children(parent, watch=marker)
    writer.create(parent + "/3")
    wait_until(lambda: marker.kinds(), message="a later child event")
    # Quick changes may coalesce (the recipe re-reads), but it saw the start and the end,
    # and returning False stopped it before /2 and /3.
    assert seen_children[0] == [] and seen_children[-1] == ["0", "1"]
    assert all(len(children) <= 2 for children in seen_children), (
        "returning False stops the ChildrenWatch"
    )


def test_recipes_pass_the_event_when_asked(coord_backend):
    client = coord_backend.connect()
    writer = coord_backend.connect()
    path = writer.create(coord_backend.path("reassign_partitions"), b"{}")
    data_calls, children_calls = [], []

    @DataWatch(client, path)
    def on_data(data, stat, event):
        data_calls.append((data, None if event is None else (event.type, event.path)))

    ChildrenWatch(
        client,
        path,
        lambda children, event: children_calls.append((children, event)),
        send_event=True,
    )
    writer.set(path, b'{"partitions":[]}')
    writer.create(path + "/child")
    wait_until(
        lambda: len(data_calls) == 2 and len(children_calls) == 2,
        message="both recipes called twice",
    )
    assert data_calls == [(b"{}", None), (b'{"partitions":[]}', (EventType.CHANGED, path))]
    assert children_calls[0] == ([], None)
    assert children_calls[1][0] == ["child"] and children_calls[1][1].type == EventType.CHILD
    writer.delete(path, recursive=True)
    wait_until(
        lambda: data_calls[-1][0] is None, message="DataWatch sees the delete as (None, None)"
    )
    assert data_calls[-1][1] == (EventType.DELETED, path)
