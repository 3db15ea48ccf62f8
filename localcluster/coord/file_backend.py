"""The file backend's client: ZooKeeper's API over a store directory shared by processes.

What lives here: `FileClient`, which owns one session, a FileStore handle, and two threads:
the dispatcher (tails the changelog, matches watches, queues their callbacks; reaps sessions
whose owner died or hung), the heartbeat thread (touches the session file every timeout/3 and
nothing else, so slow callbacks or a busy store can never starve it) and the callback thread
(runs watch callbacks one at a time, in changelog order, never under the store lock).
Rules: reads take the shared store lock, mutations the exclusive one; a read that sets a watch
also holds the dispatcher mutex, so no changelog line can be matched between the read and the
registration (see file_watch.py). Every call first checks the session is still alive. A
batch commit (commit_transactions) stacks its transactions in one file_operations.Batch under
one exclusive lock hold, so it costs one journal record and one changelog write.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from localcluster.coord import file_operations as operations
from localcluster.coord import file_session, paths
from localcluster.coord.file_store import FileStore
from localcluster.coord.file_watch import ChangeFeed, Wakeup, WatchTable
from localcluster.coord.interface import (
    CoordinationClient,
    CoordinationError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistencyError,
    SessionExpiredError,
    TransactionRequest,
    WatchCallback,
    ZnodeStat,
)

log = logging.getLogger(__name__)

# zookeeper.session.timeout.ms for the file backend. Kafka defaults to 18 s because a ZooKeeper
# session crosses a network and a JVM's GC pauses; here a dead process is noticed through its
# released flock within ~100 ms whatever this is, and the timeout only fences a process that
# is alive but stuck (SIGSTOP, swap). 3 s outlasts scheduling stalls on a loaded 2-core box.
DEFAULT_SESSION_TIMEOUT_MS = 3000
LIVENESS_CHECK_MS = 100  # how often every client probes the other sessions' locks
POLL_INTERVAL_MS = 5  # changelog polling period when inotify is unavailable
CALLBACK_QUEUE_MAX = 10_000
# Transactions of a batch commit under one hold of the exclusive lock: bounds how long readers
# wait (~0.15 s for 1,000 partition-state updates) and the size of the journal record; also
# the znodes get_many reads under one hold of the shared lock.
FILE_BATCH_TRANSACTIONS_MAX = 1000


def _check_value(value: bytes) -> None:
    if not isinstance(value, bytes):
        raise TypeError(f"znode values are bytes, got {type(value).__name__}; encode it first")


def _validate_operations(requested: list[tuple]) -> None:
    for operation in requested:
        paths.validate_path(operation[1], sequential=operation[0] == "create" and operation[4])
        if operation[0] in ("create", "set_data"):
            _check_value(operation[2])


def _failed_results(operation_count: int, applied: int, error: CoordinationError) -> list:
    """A failed transaction's results, as ZooKeeper reports them (nothing was committed)."""
    rolled_back = [RolledBackError() for _ in range(applied)]
    never_tried = [RuntimeInconsistencyError() for _ in range(operation_count - applied - 1)]
    return rolled_back + [error] + never_tried


class FileClient(CoordinationClient):
    def __init__(
        self,
        store_dir: str,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        watch_mode: str = "auto",
        fsync: bool = False,
    ):
        self.store_dir = store_dir
        self.session_timeout_ms = session_timeout_ms
        self.watch_mode = watch_mode
        self.fsync = fsync
        self._session: file_session.Session | None = None
        self._stopping = threading.Event()

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        assert self._session is None, "start() once per client"
        self.store = FileStore(self.store_dir, fsync=self.fsync)
        with self.store.exclusive():
            self.store.recover()  # also sweeps tmp/ of files staged by writers that died
            self._feed = ChangeFeed(self.store, self.store.read_zxid(), from_end=True)
        self._session = file_session.Session(self.store, self.session_timeout_ms)
        self._watches = WatchTable()
        self._dispatch_mutex = threading.Lock()
        self._delivery_lock = threading.Lock()
        self._callbacks: queue.Queue = queue.Queue(maxsize=CALLBACK_QUEUE_MAX)
        self._wake = threading.Event()
        self._wakeup = Wakeup(self.store, self.watch_mode, self._on_changelog, self._wake.set)
        name = f"coord-{self.session_id:x}"
        self._threads = [
            threading.Thread(target=self._dispatch_loop, name=f"{name}-dispatch", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name=f"{name}-heartbeat", daemon=True),
            threading.Thread(target=self._callback_loop, name=f"{name}-callbacks", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        if self._session is None or self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        self._wakeup.stop()
        self._threads[0].join(timeout=5)
        self._threads[1].join(timeout=5)
        self._callbacks.put((None, None))
        if threading.current_thread() is not self._threads[2]:
            self._threads[2].join(timeout=5)
        self._session.close()
        self._feed.close()
        self.store.close()

    @property
    def session_id(self) -> int:
        assert self._session is not None, "start() the client first"
        return self._session.session_id

    @property
    def watch_delivery(self) -> str:
        """ "inotify" or "polling": how this client learns of changes."""
        return self._wakeup.mode

    # -- reads ---------------------------------------------------------------------------------

    def get(self, path: str, watch: WatchCallback | None = None) -> tuple[bytes, ZnodeStat]:
        node = self._read(path, self._watches.data if watch else None, watch)
        if node is None:
            raise NoNodeError(f"no znode at {path}")
        return node.data, node.stat()

    def exists(self, path: str, watch: WatchCallback | None = None) -> ZnodeStat | None:
        node = self._read(path, self._watches.data if watch else None, watch, watch_absent=True)
        return None if node is None else node.stat()

    def get_children(self, path: str, watch: WatchCallback | None = None) -> list[str]:
        node = self._read(path, self._watches.child if watch else None, watch)
        if node is None:
            raise NoNodeError(f"no znode at {path}")
        return list(node.children)

    def get_many(self, paths_to_read) -> list[tuple[bytes, ZnodeStat] | None]:
        """Under one shared lock hold per FILE_BATCH_TRANSACTIONS_MAX paths."""
        for path in paths_to_read:
            paths.validate_path(path)
        self._ensure_alive()
        found: list[tuple[bytes, ZnodeStat] | None] = []
        for start in range(0, len(paths_to_read), FILE_BATCH_TRANSACTIONS_MAX):
            with self.store.shared():
                nodes = [self.store.read_znode(path)
                         for path in paths_to_read[start : start + FILE_BATCH_TRANSACTIONS_MAX]]  # fmt: skip
            found += [None if node is None else (node.data, node.stat()) for node in nodes]
        return found

    def _read(self, path, table, watch, watch_absent=False):
        paths.validate_path(path)
        self._ensure_alive()
        if watch is None:
            with self.store.shared():
                return self.store.read_znode(path)
        with self._dispatch_mutex:
            with self.store.shared():
                zxid = self.store.read_zxid()
                node = self.store.read_znode(path)
            if node is not None or watch_absent:  # ZooKeeper sets no watch on a failed get
                self._watches.add(table, path, watch, zxid)
        return node

    # -- mutations -----------------------------------------------------------------------------

    def create(self, path, value=b"", ephemeral=False, sequence=False, makepath=False) -> str:
        paths.validate_path(path, sequential=sequence)
        _check_value(value)

        def apply(mutation):
            if makepath:
                for ancestor in paths.ancestors(path):
                    if mutation.node(ancestor) is None:
                        operations.create(mutation, ancestor, b"", self.session_id, False, False)
            return operations.create(mutation, path, value, self.session_id, ephemeral, sequence)

        return self._mutate(apply)

    def set(self, path: str, value: bytes, version: int = -1) -> ZnodeStat:
        paths.validate_path(path)
        _check_value(value)
        return self._mutate(lambda m: operations.set_data(m, path, value, version).stat())

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> bool:
        paths.validate_path(path)
        if recursive:
            try:
                self._mutate(lambda m: operations.delete_recursive(m, path, version))
            except NoNodeError:
                pass  # kazoo's recursive delete of a missing znode succeeds
        else:
            self._mutate(lambda m: operations.delete(m, path, version))
        return True

    def ensure_path(self, path: str) -> bool:
        paths.validate_path(path)
        try:
            self.create(path, makepath=True)
        except NodeExistsError:
            pass
        return True

    def transaction(self) -> TransactionRequest:
        return TransactionRequest(self._commit_transaction)

    def _commit_transaction(self, requested: list[tuple]) -> list:
        _validate_operations(requested)
        return self._commit_batch([requested])[0]

    def commit_transactions(self, transactions) -> list[list]:
        """All under one exclusive lock hold and one journal record, with one changelog write
        (so every watching client wakes once), per FILE_BATCH_TRANSACTIONS_MAX of them."""
        requested = [transaction.take_operations() for transaction in transactions]
        for operations_of_one in requested:  # before any commits: a bad path is a bug
            _validate_operations(operations_of_one)
        results: list[list] = []
        for start in range(0, len(requested), FILE_BATCH_TRANSACTIONS_MAX):
            results += self._commit_batch(requested[start : start + FILE_BATCH_TRANSACTIONS_MAX])
        return results

    def _commit_batch(self, batch: list[list[tuple]]) -> list[list]:
        self._ensure_alive()
        with self.store.exclusive():
            self._ensure_session_file()
            staged = operations.Batch(self.store)
            answers = []
            for requested in batch:
                mutation, results = staged.mutation(), []
                try:
                    self._apply_operations(mutation, requested, results)
                except SessionExpiredError:
                    raise
                except CoordinationError as error:  # this one alone is dropped
                    answers.append(_failed_results(len(requested), len(results), error))
                    continue
                staged.absorb(mutation)
                answers.append(results)
            staged.commit()
        return answers

    def _apply_operations(self, mutation, requested: list[tuple], results: list) -> None:
        for kind, path, *arguments in requested:
            if kind == "create":
                value, ephemeral, sequence = arguments
                results.append(
                    operations.create(mutation, path, value, self.session_id, ephemeral, sequence)
                )
            elif kind == "set_data":
                results.append(operations.set_data(mutation, path, *arguments).stat())
            elif kind == "delete":
                operations.delete(mutation, path, *arguments)
                results.append(True)
            else:
                operations.check(mutation, path, *arguments)
                results.append(True)

    def _mutate(self, apply):
        self._ensure_alive()
        with self.store.exclusive():
            self._ensure_session_file()
            mutation = operations.Mutation(self.store)
            result = apply(mutation)
            mutation.commit()
        return result

    def _ensure_session_file(self) -> None:
        """Under the exclusive lock: a reaper may have removed our session meanwhile."""
        if not operations.session_alive(self.store, self.session_id):
            self._session.expired = True
            self._ensure_alive()

    def _ensure_alive(self) -> None:
        if self._session is None or self._stopping.is_set():
            raise SessionExpiredError(
                f"file coordination client for {self.store_dir} is not started or was stopped; connect a new one"
            )
        self._session.ensure_alive()

    # -- threads -------------------------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        polling = self._wakeup.mode == "polling"
        timeout_s = (POLL_INTERVAL_MS if polling else LIVENESS_CHECK_MS) / 1000
        next_liveness = 0.0
        while not self._stopping.is_set():
            woken = self._wake.wait(timeout_s)
            self._wake.clear()
            try:
                self._deliver_changes()
                now = time.monotonic()
                if (woken and not polling) or now >= next_liveness:
                    next_liveness = now + LIVENESS_CHECK_MS / 1000
                    self._reap_dead_sessions()
            except Exception:  # keep delivering: one bad pass must not stop the session thread
                log.exception(
                    "coordination client %#x: dispatcher pass failed; retrying", self.session_id
                )
                time.sleep(timeout_s)

    def _on_changelog(self) -> None:
        """On watchdog's thread: deliver at once, and have the dispatcher probe sessions."""
        if self._stopping.is_set():
            return
        try:
            self._deliver_changes()
        except Exception:  # the dispatcher's next pass retries
            log.exception(
                "coordination client %#x: delivering watch events failed", self.session_id
            )
        self._wake.set()

    def _deliver_changes(self) -> None:
        # Two threads deliver (watchdog's and the dispatcher); the delivery lock keeps their
        # batches in changelog order through the queue. The queue put happens outside the
        # dispatch mutex, so a callback that sets a watch never waits on a full queue.
        with self._delivery_lock:
            with self._dispatch_mutex:
                fired = []
                for zxid, changes in self._feed.read():
                    fired += self._watches.match(zxid, changes)
                if self._feed.gap:
                    log.warning(
                        "client %#x fell a whole changelog behind; resyncing its watches",
                        self.session_id,
                    )
                    with self.store.shared():
                        fired += self._watches.resync(self.store)
                    self._feed.gap = False
            for item in fired:
                self._callbacks.put(item)

    def _reap_dead_sessions(self) -> None:
        if self._session.expired:
            return
        for session_id, reason in file_session.find_dead_sessions(self.store, self.session_id):
            file_session.reap(self.store, session_id, reason)

    def _heartbeat_loop(self) -> None:
        interval_s = self.session_timeout_ms / 3000
        while not self._stopping.wait(interval_s):
            try:
                self._session.heartbeat()
            except OSError:
                log.exception(
                    "coordination client %#x: heartbeat failed; retrying", self.session_id
                )

    def _callback_loop(self) -> None:
        while True:
            callback, event = self._callbacks.get()
            if callback is None:
                return
            try:
                callback(event)
            except Exception:
                log.exception(
                    "watch callback %r for %s %s raised; other watches still run",
                    callback,
                    event.type.value,
                    event.path,
                )
