"""Session files: liveness by flock, expiry by heartbeat age, sweeping of abandoned staging."""

from __future__ import annotations

import fcntl
import json
import os
import time

from localcluster.coord import file_session
from localcluster.coord.file_store import FileStore


def _session_file(
    store: FileStore, session_id: int, timeout_ms: int, age_s: float = 0.0, locked: bool = True
):
    path = store.path("sessions", f"{session_id:016x}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(
        fd, json.dumps({"session_id": session_id, "pid": 1, "timeout_ms": timeout_ms}).encode()
    )
    if locked:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return fd


def test_dead_and_silent_sessions_are_found_live_ones_are_not(tmp_path):
    store = FileStore(str(tmp_path / "store"))
    own = file_session.Session(store, 1000)
    held = [
        _session_file(store, 0x10, 1000),  # live: locked, fresh heartbeat
        _session_file(store, 0x20, 1000, locked=False),  # owner gone: lock free
        _session_file(store, 0x30, 1000, age_s=5.0),  # hung: locked, heartbeat too old
    ]
    found = dict(file_session.find_dead_sessions(store, own.session_id))
    assert set(found) == {0x20, 0x30}
    assert "exited" in found[0x20] and "no heartbeat" in found[0x30]
    own.heartbeat()
    assert not own.expired
    os.unlink(own.path)  # what a reaper does to an expired session
    own.heartbeat()
    assert own.expired
    own.close()
    for fd in held:
        os.close(fd)
    store.close()


def test_abandoned_staging_files_are_swept_young_or_locked_ones_kept(tmp_path):
    store = FileStore(str(tmp_path / "store"))
    old = time.time() - 60
    paths = {
        name: store.path("sessions", f"{name}{file_session.STAGING_SUFFIX}")
        for name in ("old", "young", "locked")
    }
    for path in paths.values():
        with open(path, "w"):
            pass
    os.utime(paths["old"], (old, old))
    os.utime(paths["locked"], (old, old))
    holder = os.open(paths["locked"], os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    assert file_session.find_dead_sessions(store, 0) == []
    assert not os.path.exists(paths["old"])
    assert os.path.exists(paths["young"]) and os.path.exists(paths["locked"])
    os.close(holder)
    store.close()
