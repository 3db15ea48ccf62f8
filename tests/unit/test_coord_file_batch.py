"""The file store's batch of mutations (file_operations.Batch): crash-safe as one mutation.

A forked child commits a batch of three transactions (the second fails and is dropped) and
dies at the k-th file-system step, for every k; the next opener must find every transaction
of the batch applied or none, each with its own zxid and changelog line.
"""

from __future__ import annotations

import os

import pytest

from localcluster.coord import file_operations as operations
from localcluster.coord.file_store import FileStore
from localcluster.coord.file_watch import ChangeFeed
from localcluster.coord.interface import BadVersionError
from tests.unit.test_coord_file_store import _die_at_file_step, _run_forked, _seed


def _batch(store: FileStore) -> None:
    batch = operations.Batch(store)
    first = batch.mutation()
    operations.create(first, "/t/a", b"a", 0, False, False)
    batch.absorb(first)
    failing = batch.mutation()
    operations.set_data(failing, "/t/old/leaf", b"kept?", -1)  # applied, then the check fails
    with pytest.raises(BadVersionError):
        operations.check(failing, "/t", 5)
    third = batch.mutation()  # dropping `failing` left nothing of it behind
    operations.create(third, "/t/a/b", b"b", 0, False, False)  # sees the first's create
    operations.set_data(third, "/t", b"1", 0)
    operations.delete_recursive(third, "/t/old", -1)
    batch.absorb(third)
    batch.commit()


def _batch_and_die_at(store_dir: str, crash_step: int) -> None:
    _die_at_file_step(crash_step)
    store = FileStore(store_dir)
    with store.exclusive():
        _batch(store)
    os._exit(0)


def _state(store_dir: str) -> str:
    store = FileStore(store_dir)  # opening recovers, as the next client would
    try:
        with store.shared():
            assert store.journal_pending() is None
            parent, a, b = (store.read_znode(p) for p in ("/t", "/t/a", "/t/a/b"))
            old, zxid = store.read_znode("/t/old"), store.read_zxid()
        if parent.data == b"0":
            assert a is None and b is None and old is not None and zxid == 1
            assert store.read_znode("/t/old/leaf").data == b""
            return "before"
        assert zxid == 3, "two transactions absorbed: two zxids after the seed's"
        assert a.czxid == 2 and b.czxid == parent.mzxid == 3 and old is None
        assert a.children == ["b"] and sorted(parent.children) == ["a"]
        return "after"
    finally:
        store.close()


def test_crash_at_every_step_of_a_batch_leaves_all_of_it_or_none(tmp_path):
    outcomes = []
    for crash_step in range(200):
        store_dir = str(tmp_path / f"store-{crash_step}")
        _seed(store_dir)
        code = _run_forked(_batch_and_die_at, store_dir, crash_step)
        outcomes.append(_state(store_dir))
        if code == 0:
            break
        assert code == 17
    else:
        pytest.fail("the batch never completed: the crash injection is broken")
    assert outcomes[0] == "before" and outcomes[-1] == "after"
    assert "after" in outcomes[:-1], "some crashes must land after the journal (roll forward)"
    entries = ChangeFeed(FileStore(store_dir), 0).read()
    assert [zxid for zxid, _ in entries] == [1, 2, 3], "one changelog line per transaction"
    assert entries[1][1] == [["created", "/t/a"]]
    assert ["deleted", "/t/old/leaf"] in entries[2][1] and ["changed", "/t"] in entries[2][1]


def test_a_batch_of_nothing_commits_nothing(tmp_path):
    store = FileStore(str(tmp_path / "store"))
    with store.exclusive():
        batch = operations.Batch(store)
        batch.absorb(batch.mutation())
        batch.commit()
        assert store.read_zxid() == 0
    store.close()
