"""Sessions of the file backend: creation, heartbeats, liveness probes and reaping.

A session is a file sessions/<id> that its owner opens and holds an exclusive flock on for its
whole life. The kernel drops that lock when the owner dies, however it dies, so any other
client that can take the lock knows the owner is gone: it then deletes the session's
ephemerals in one mutation (their watchers fire) and removes the session file. That is
ZooKeeper's session expiry, without waiting for a timeout. A live but hung owner (SIGSTOP, a
stalled disk) keeps the lock, so the owner also touches the file's mtime every
timeout/3 (the heartbeat); a session whose mtime is older than its timeout expires the same
way. An owner that finds its file gone learns its session expired (SessionExpiredError).
Rules: a probe never blocks on a session lock (LOCK_NB), so probes cannot deadlock with the
store lock; the session file is flock'ed before it appears under its final name, so a probe
never mistakes a session being born for a dead one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import time

from localcluster.coord import file_operations
from localcluster.coord.file_store import FileStore
from localcluster.coord.interface import SessionExpiredError

log = logging.getLogger(__name__)


STAGING_SUFFIX = ".new"  # a session file before it is locked and renamed into place


class Session:
    def __init__(self, store: FileStore, timeout_ms: int):
        self.store = store
        self.timeout_ms = timeout_ms
        for _attempt in range(5):  # a prober may sweep our staging file in its first instant
            self.session_id = secrets.randbits(62) | 1  # never 0: 0 means "not ephemeral"
            self.path = store.path(file_operations.session_file(self.session_id))
            staging = self.path + STAGING_SUFFIX
            # Opened for writing so the owner's death closes a written file (IN_CLOSE_WRITE).
            self._fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                info = {"session_id": self.session_id, "pid": os.getpid(), "timeout_ms": timeout_ms}
                os.write(self._fd, json.dumps(info).encode())
                os.rename(staging, self.path)
                break
            except (BlockingIOError, FileNotFoundError):  # swept as abandoned: take a new id
                os.close(self._fd)
        else:
            raise OSError(f"could not create a session file in {store.path('sessions')}")
        self.expired = False
        self.last_heartbeat = time.monotonic()

    def heartbeat(self) -> None:
        """Refresh the mtime other clients judge us by; notice if they expired us."""
        try:
            same_file = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
            if same_file:
                os.utime(self.path)
        except FileNotFoundError:
            same_file = False
        if not same_file and not self.expired:
            self.expired = True
            log.warning(
                "session %#x in %s expired: another client found it silent for more than "
                "%d ms and deleted its ephemerals; create a new client to continue",
                self.session_id, self.store.root, self.timeout_ms,
            )  # fmt: skip
        self.last_heartbeat = time.monotonic()

    def ensure_alive(self) -> None:
        if self.expired:
            raise SessionExpiredError(
                f"session {self.session_id:#x} of store {self.store.root} expired "
                "(its ephemerals were deleted); stop this client and connect a new one"
            )

    def close(self) -> None:
        """Close the session as ZooKeeper does: delete its ephemerals now, then the file."""
        if not self.expired:
            with self.store.exclusive():
                mutation = file_operations.Mutation(self.store)
                file_operations.reap_session(mutation, self.session_id)
                mutation.commit()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        os.close(self._fd)


def find_dead_sessions(store: FileStore, own_session_id: int) -> list[tuple[int, str]]:
    """Sessions whose owner died (lock free) or hung (mtime older than its timeout)."""
    found = []
    now = time.time()
    for name in os.listdir(store.path("sessions")):
        if name.endswith(STAGING_SUFFIX):
            _sweep_abandoned_staging(store.path("sessions", name))
            continue
        try:
            session_id = int(name, 16)
        except ValueError:
            continue
        if session_id == own_session_id:
            continue
        reason = _probe(store.path("sessions", name), now)
        if reason:
            found.append((session_id, reason))
    return found


STAGING_ABANDONED_S = 10.0  # a creator takes microseconds to lock and rename its file


def _sweep_abandoned_staging(path: str) -> None:
    """A staging file nobody holds: its creator died before renaming it into place."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        if time.time() - os.fstat(fd).st_mtime < STAGING_ABANDONED_S:
            return  # young: its creator may not have locked it yet
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    except BlockingIOError:
        pass  # being born right now
    finally:
        os.close(fd)


def _probe(path: str, now: float) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = json.loads(os.pread(fd, 4096, 0) or b"{}")
            silent_s = now - os.fstat(fd).st_mtime
            if silent_s * 1000 > info.get("timeout_ms", 1 << 40):
                return (
                    f"no heartbeat for {silent_s * 1000:.0f} ms (timeout {info['timeout_ms']} ms)"
                )
            return None
        return "its owner process exited (its session lock was released)"
    finally:
        os.close(fd)


def reap(store: FileStore, session_id: int, reason: str) -> list[str]:
    """Expire one session: delete its ephemerals and its file. Re-checks under the store lock,
    since another client may have reaped it, or the owner heartbeated, in the meantime."""
    path = store.path(file_operations.session_file(session_id))
    with store.exclusive():
        if not os.path.exists(path) or _probe(path, time.time()) is None:
            return []
        mutation = file_operations.Mutation(store)
        removed = file_operations.reap_session(mutation, session_id)
        mutation.commit()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    log.info(
        "expired session %#x in %s: %s; deleted its %d ephemeral znodes %s",
        session_id, store.root, reason, len(removed), removed[:5],
    )  # fmt: skip
    return removed
