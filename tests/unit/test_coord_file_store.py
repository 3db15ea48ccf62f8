"""The file store's encoding, journal recovery and changelog, including crashes at every step.

Crash tests fork a child that runs a multi-znode mutation and dies (os._exit) at the k-th
file-system step, for every k; the parent then opens the store like the next client would
and checks the mutation is entirely there or entirely absent.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
import zlib

import pytest

from localcluster.coord import file_operations as operations
from localcluster.coord import file_store
from localcluster.coord.file_store import FileStore, StoreCorruptError, Znode
from localcluster.coord.file_watch import ChangeFeed, WatchTable

STEPS = ("rename", "unlink", "rmdir", "pwrite", "write", "ftruncate")


def test_znode_roundtrip_and_corruption_detected():
    node = Znode(
        b"\x00data",
        1,
        2,
        3,
        4,
        5,
        ephemeral_owner=9,
        version=6,
        cversion=7,
        child_creates=8,
        children=["a", "b c"],
    )
    raw = node.encode()
    assert Znode.decode(raw, "x") == node
    assert node.stat().numChildren == 2 and node.stat().dataLength == 5
    for broken in (raw[:-1], raw[:10], b"XXXX" + raw[4:]):
        with pytest.raises(StoreCorruptError, match="znode file x"):
            Znode.decode(broken, "x")


def _seed(store_dir: str) -> None:
    store = FileStore(store_dir)
    with store.exclusive():
        mutation = operations.Mutation(store)
        operations.create(mutation, "/t", b"0", 0, False, False)
        operations.create(mutation, "/t/old", b"", 0, False, False)
        operations.create(mutation, "/t/old/leaf", b"", 0, False, False)
        mutation.commit()
    store.close()


def _die_at_file_step(crash_step: int) -> None:
    """In a forked child: from now on, exit (code 17) at the crash_step-th file step."""
    counter = [0]

    def counted(name):
        real = getattr(os, name)

        def step(*arguments, **keywords):
            if counter[0] == crash_step:
                os._exit(17)
            counter[0] += 1
            return real(*arguments, **keywords)

        return step

    for name in STEPS:
        setattr(os, name, counted(name))


def _mutate_and_die_at(store_dir: str, crash_step: int) -> None:
    """In a forked child: run one transaction, exiting at the crash_step-th file step."""
    _die_at_file_step(crash_step)
    store = FileStore(store_dir)
    with store.exclusive():
        mutation = operations.Mutation(store)
        operations.create(mutation, "/t/a", b"a", 0, False, False)
        operations.create(mutation, "/t/a/b", b"b", 0, False, False)
        operations.set_data(mutation, "/t", b"1", -1)
        operations.delete_recursive(mutation, "/t/old", -1)
        mutation.commit()
    os._exit(0)


def _run_forked(target, *arguments) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            target(*arguments)
        finally:
            os._exit(3)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.001)  # polling a child's exit
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"forked writer {pid} hung")


def _state(store_dir: str) -> str:
    store = FileStore(store_dir)  # opening recovers, as the next client would
    try:
        with store.shared():
            assert store.journal_pending() is None
            parent = store.read_znode("/t")
            a, b, old = (store.read_znode(p) for p in ("/t/a", "/t/a/b", "/t/old"))
            zxid = store.read_zxid()
        if parent.data == b"0":
            assert (
                a is None
                and b is None
                and old is not None
                and store.read_znode("/t/old/leaf") is not None
            )
            assert sorted(parent.children) == ["old"] and zxid == 1
            return "before"
        assert parent.data == b"1" and parent.version == 1 and parent.mzxid == zxid == 2
        assert a.data == b"a" and b.data == b"b" and a.children == ["b"] and old is None
        assert (
            sorted(parent.children) == ["a"] and parent.cversion == 3
        )  # 1 + create a + delete old
        assert not os.path.exists(os.path.dirname(store.znode_file("/t/old")))
        return "after"
    finally:
        store.close()


def test_crash_at_every_step_of_a_mutation_is_all_or_nothing(tmp_path):
    outcomes = []
    for crash_step in range(200):
        store_dir = str(tmp_path / f"store-{crash_step}")
        _seed(store_dir)
        code = _run_forked(_mutate_and_die_at, store_dir, crash_step)
        outcomes.append(_state(store_dir))
        store = FileStore(store_dir)
        with store.exclusive():
            store.recover()
            assert os.listdir(store.path("tmp")) == [], "staged files of the dead writer were swept"
        store.close()
        if code == 0:
            break
        assert code == 17
    else:
        pytest.fail("the mutation never completed: the crash injection is broken")
    assert outcomes[0] == "before" and outcomes[-1] == "after"
    assert "after" in outcomes[:-1], "some crashes must land after the journal (roll forward)"


def _journal_left_behind(store_dir: str) -> bytes | None:
    with open(os.path.join(store_dir, "journal"), "rb") as journal:
        raw = journal.read()
    return raw if raw[:4] in (b"JRN1", b"JRN2") else None


def test_journal_replay_is_idempotent_and_cuts_a_torn_changelog_line(tmp_path):
    store_dir = str(tmp_path / "store")
    _seed(store_dir)
    for crash_step in range(1, 40):  # find a crash that leaves the journal pending
        run_dir = str(tmp_path / f"run-{crash_step}")
        shutil.copytree(store_dir, run_dir)
        if _run_forked(_mutate_and_die_at, run_dir, crash_step) == 17 and _journal_left_behind(
            run_dir
        ):
            break
    else:
        pytest.fail("no crash left a journal behind")
    journal = _journal_left_behind(run_dir)
    with open(f"{run_dir}/changes", "ab") as changes:
        changes.write(b'[2,[["chan')  # a line torn mid-write
    store = FileStore(run_dir)  # opening replays the journal
    with store.exclusive():
        assert store.journal_pending() is None
        with open(store.path("journal"), "r+b") as replay_again:
            replay_again.write(journal)
        assert store.journal_pending() is not None
        store.recover()  # twice: the second replay must change nothing
    store.close()
    assert _state(run_dir) == "after"
    feed = ChangeFeed(FileStore(run_dir), 0)
    entries = feed.read()
    assert [zxid for zxid, _ in entries] == [1, 2], (
        "one line per zxid, the torn one cut, the repeat skipped"
    )


def test_a_set_rewrites_the_znode_file_in_place_and_a_torn_rewrite_is_replayed(tmp_path):
    store_dir = str(tmp_path / "store")
    _seed(store_dir)
    store = FileStore(store_dir)
    inode = os.stat(store.znode_file("/t")).st_ino
    with store.exclusive():
        mutation = operations.Mutation(store)
        operations.set_data(mutation, "/t", b"a longer value", -1)
        mutation.commit()
    # the same file, not a new one renamed in
    assert os.stat(store.znode_file("/t")).st_ino == inode
    assert os.listdir(store.path("tmp")) == []  # nothing staged for an existing znode
    # A writer killed after its journal record, inside the rewrite: /t's file holds the start
    # of the new bytes over the old ones. The next lock holder replays the record first.
    with store.exclusive():
        mutation = operations.Mutation(store)
        operations.set_data(mutation, "/t", b"2", -1)
        journal = _journal_pending_record(store, mutation)
    with open(store.path("journal"), "r+b") as pending:
        pending.write(journal)
    (write,) = store.journal_pending()["writes"]
    assert write[0] == "tree/t/%znode"
    with open(store.znode_file("/t"), "r+b") as torn:  # written over, not yet cut to length
        torn.write(store.journal_pending()["data"])
    with open(store.znode_file("/t"), "rb") as torn, pytest.raises(StoreCorruptError):
        Znode.decode(torn.read(), "/t")
    store.close()
    reader = FileStore(store_dir)
    with reader.shared():
        node = reader.read_znode("/t")
        assert node.data == b"2" and node.version == 2
        assert reader.journal_pending() is None
    reader.close()


def _journal_pending_record(store: FileStore, mutation) -> bytes:
    """The journal record mutation's commit writes, taken before anything is applied."""
    real_apply = store._apply
    store._apply = lambda journal: None
    try:
        mutation.commit()
    finally:
        store._apply = real_apply
    with open(store.path("journal"), "rb") as record:
        return record.read()


def test_a_journal_record_of_the_earlier_format_is_still_replayed(tmp_path):
    store_dir = str(tmp_path / "store")
    _seed(store_dir)
    store = FileStore(store_dir)
    with store.exclusive():
        node = store.read_znode("/t")
    node.data, node.version, node.mzxid = b"old format", 1, 2
    staged = "tmp/replayed"
    with open(store.path(staged), "wb") as f:
        f.write(node.encode())
    payload = json.dumps({"zxid": 2, "puts": [["tree/t/%znode", staged]], "deletes": [],
                          "changes": [["changed", "/t"]]}).encode()  # fmt: skip
    with open(store.path("journal"), "r+b") as pending:
        pending.write(struct.pack("<4sII", b"JRN1", len(payload), zlib.crc32(payload)) + payload)
    store.close()
    reader = FileStore(store_dir)
    with reader.shared():
        assert reader.read_znode("/t").data == b"old format" and reader.read_zxid() == 2
    reader.close()


def test_a_torn_journal_record_means_nothing_was_applied(tmp_path):
    store_dir = str(tmp_path / "store")
    _seed(store_dir)
    for crash_step in range(1, 40):
        run_dir = str(tmp_path / f"run-{crash_step}")
        shutil.copytree(store_dir, run_dir)
        if _run_forked(_mutate_and_die_at, run_dir, crash_step) == 17 and _journal_left_behind(
            run_dir
        ):
            break
    journal = bytearray(_journal_left_behind(run_dir))
    journal[-3] ^= 0xFF  # as if the writer died inside the pwrite of its journal record
    with open(f"{run_dir}/journal", "r+b") as torn:
        torn.write(journal)
    # Undo what the crashed writer had applied after its journal, so the store is as it was
    # when the record was being written: only the seed's state, plus staged files.
    shutil.rmtree(f"{run_dir}/tree")
    shutil.copytree(f"{store_dir}/tree", f"{run_dir}/tree")
    shutil.copy(f"{store_dir}/zxid", f"{run_dir}/zxid")
    assert _state(run_dir) == "before"


def test_changelog_rotation_and_a_reader_that_missed_a_whole_file(tmp_path, monkeypatch):
    monkeypatch.setattr(file_store, "CHANGELOG_ROTATE_BYTES", 200)
    store = FileStore(str(tmp_path / "store"))
    steady = ChangeFeed(store, 0)
    stalled = ChangeFeed(store, 0)
    table = WatchTable()
    table.add(table.data, "/n", "data-callback", 0)
    table.add(table.child, "/", "child-callback", 0)
    table.add(table.data, "/never", "absent-callback", 0)
    seen = []
    for step in range(40):
        with store.exclusive():
            mutation = operations.Mutation(store)
            if step == 0:
                operations.create(mutation, "/n", b"", 0, False, False)
            else:
                operations.set_data(mutation, "/n", b"x" * step, -1)
            mutation.commit()
        seen += [zxid for zxid, _ in steady.read()]
    assert seen == list(range(1, 41)), "a reader keeping up follows every rotation"
    assert os.path.getsize(store.path("changes")) < 400
    late = []
    for _ in range(3):
        late += [zxid for zxid, _ in stalled.read()]
    assert stalled.gap, "a reader that skipped a rotated file must know it"
    assert late != list(range(1, 41)) and late == sorted(late)
    with store.shared():
        fired = sorted(
            (callback, event.type.value, event.path) for callback, event in table.resync(store)
        )
    assert fired == [
        ("absent-callback", "DELETED", "/never"),
        ("child-callback", "CHILD", "/"),
        ("data-callback", "CREATED", "/n"),
    ]
    store.close()


def test_a_watch_registered_after_a_change_not_yet_read_waits_for_the_next_one():
    # get /b (zxid 4), delete /b (zxid 5, not yet read from the changelog), exists /b (zxid 5),
    # create /b (zxid 6): ZooKeeper fires DELETED to the get's watch and CREATED to the
    # exists' one, the same callback both times (coord differential seed 3263538190).
    table = WatchTable()
    table.add(table.data, "/b", "watch-b", 4)
    table.add(table.data, "/b", "watch-b", 5)
    fired = [(c, e.type.value) for c, e in table.match(5, [["deleted", "/b"]])]
    assert fired == [("watch-b", "DELETED")], "one event for the older registration"
    fired = [(c, e.type.value) for c, e in table.match(6, [["created", "/b"]])]
    assert fired == [("watch-b", "CREATED")], "the newer registration fires at the next change"
    assert table.match(7, [["changed", "/b"]]) == [], "then both are spent"


def test_watch_table_matches_zookeeper_event_rules():
    table = WatchTable()
    table.add(table.data, "/a", "data-a", 5)
    table.add(table.child, "/", "children-root", 5)
    table.add(table.child, "/a", "children-a", 5)
    table.add(table.data, "/a/b", "data-b", 7)
    assert table.match(5, [["changed", "/a"]]) == [], "a change the read saw does not fire"
    fired = table.match(6, [["created", "/a/b"], ["changed", "/a"]])
    assert [(callback, event.type.value, event.path) for callback, event in fired] == [
        ("children-a", "CHILD", "/a"),
        ("data-a", "CHANGED", "/a"),
    ]
    assert table.match(8, [["changed", "/a"]]) == [], "one-shot: spent"
    fired = table.match(9, [["deleted", "/a/b"], ["deleted", "/a"]])
    assert [(callback, event.type.value, event.path) for callback, event in fired] == [
        ("data-b", "DELETED", "/a/b"),
        ("children-root", "CHILD", "/"),
    ]
    table.add(table.data, "/a", "same", 10)
    table.add(table.data, "/a", "same", 12)  # one watch per (path, callback), from the first read
    assert len(table.match(11, [["changed", "/a"]])) == 1


def test_a_torn_changelog_line_longer_than_a_read_chunk_is_cut_whole(tmp_path):
    store = FileStore(str(tmp_path / "store"))
    with store.exclusive():
        mutation = operations.Mutation(store)
        operations.create(mutation, "/kept", b"", 0, False, False)
        mutation.commit()
        with open(store.path("changes"), "ab") as changes:
            changes.write(b'[2,[["deleted","/' + b"x" * 200_000)  # a huge transaction, torn
        store._truncate_torn_changelog()
    with open(store.path("changes"), "rb") as changes:
        assert changes.read().splitlines() == [b"[0, null]", b'[1,[["created","/kept"]]]']
    store.close()


def test_lock_held_waits_for_the_store_lock_and_times_out_when_it_stays_taken(tmp_path):
    import fcntl
    import os

    import pytest

    from localcluster.coord.file_store import FileStore, lock_held

    store = FileStore(str(tmp_path))
    holder = os.open(tmp_path / "lock", os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with (
            pytest.raises(TimeoutError, match="stayed taken"),
            lock_held(str(tmp_path), timeout_s=0.05),
        ):
            pass
        fcntl.flock(holder, fcntl.LOCK_UN)
        with lock_held(str(tmp_path), timeout_s=1.0):  # while held, nobody else gets it
            with pytest.raises(BlockingIOError):
                fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # and it is released after
    finally:
        os.close(holder)
        store.close()
