"""The real-ZooKeeper backend: a thin adapter over kazoo.

What lives here: `KazooCoordinationClient`, which validates paths with the same rules as the
file backend, forwards each call to kazoo, and translates kazoo's results into ours: its
exceptions to the errors in interface.py (also inside transaction results), its ZnodeStat to
ours, its WatchedEvent to ours. Rules: no ZooKeeper semantics are re-implemented here, so the
contract tests measure the file backend against ZooKeeper itself. Watch callbacks run on
kazoo's single callback thread, in order, like the file backend's.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from kazoo import exceptions as kazoo_errors
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from localcluster.coord import interface, paths
from localcluster.coord.interface import (
    CoordinationClient,
    EventType,
    TransactionRequest,
    WatchedEvent,
    ZnodeStat,
)

log = logging.getLogger(__name__)

# Kafka's zookeeper.session.timeout.ms before 2.5; ZooKeeper clamps it to [2, 20] x tickTime.
DEFAULT_SESSION_TIMEOUT_MS = 6000
# Multis of a batch commit (or gets of a get_many) in flight at once: bounds kazoo's queue and
# the server's backlog (ZooKeeper's globalOutstandingLimit is 1,000).
KAZOO_PIPELINE_MAX = 1000

_ERRORS = {
    kazoo_errors.NoNodeError: interface.NoNodeError,
    kazoo_errors.NodeExistsError: interface.NodeExistsError,
    kazoo_errors.BadVersionError: interface.BadVersionError,
    kazoo_errors.NotEmptyError: interface.NotEmptyError,
    kazoo_errors.NoChildrenForEphemeralsError: interface.NoChildrenForEphemeralsError,
    kazoo_errors.SessionExpiredError: interface.SessionExpiredError,
    kazoo_errors.ConnectionClosedError: interface.SessionExpiredError,
    kazoo_errors.ConnectionLoss: interface.ConnectionLossError,
    kazoo_errors.RolledBackError: interface.RolledBackError,
    kazoo_errors.RuntimeInconsistency: interface.RuntimeInconsistencyError,
    kazoo_errors.BadArgumentsError: interface.BadArgumentsError,
}


def translate(error: BaseException, path: str | None = None) -> BaseException:
    for kazoo_class, ours in _ERRORS.items():
        if isinstance(error, kazoo_class):
            where = f" at {path}" if path else ""
            return ours(f"ZooKeeper: {type(error).__name__}{where}")
    if isinstance(error, kazoo_errors.ZookeeperError | KazooTimeoutError):
        return interface.CoordinationError(
            f"ZooKeeper: {type(error).__name__}{' at ' + path if path else ''}: {error}"
        )
    return error


@contextlib.contextmanager
def _translated(path: str | None = None):
    try:
        yield
    except (kazoo_errors.KazooException, KazooTimeoutError) as error:
        raise translate(error, path) from error


class KazooCoordinationClient(CoordinationClient):
    def __init__(
        self, hosts: str, session_timeout_ms: int | None = None, connect_timeout_s: float = 15.0
    ):
        self.hosts = hosts
        self.session_timeout_ms = session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS
        self.connect_timeout_s = connect_timeout_s
        self._kazoo = KazooClient(hosts=hosts, timeout=self.session_timeout_ms / 1000)
        self._wrappers: dict = {}
        self._wrappers_lock = threading.Lock()

    @property
    def kazoo(self) -> KazooClient:
        return self._kazoo

    def start(self) -> None:
        try:
            self._kazoo.start(timeout=self.connect_timeout_s)
        except KazooTimeoutError:
            self._kazoo.close()
            raise interface.ConnectionLossError(
                f"could not connect to ZooKeeper at {self.hosts} within {self.connect_timeout_s:.0f} s; "
                "is the server running and the port right?"
            ) from None

    def stop(self) -> None:
        self._kazoo.stop()
        self._kazoo.close()

    @property
    def session_id(self) -> int:
        return self._kazoo.client_id[0]

    @property
    def client_id(self) -> tuple[int, bytes]:
        return self._kazoo.client_id

    def _wrap(self, watch):
        """One kazoo-facing function per user callback, so kazoo's per-function dedup holds."""
        if watch is None:
            return None
        with self._wrappers_lock:
            wrapper = self._wrappers.get(watch)
            if wrapper is None:

                def wrapper(event, watch=watch):
                    if event.type == "NONE":
                        # kazoo fires every pending watch with a NONE event when the session
                        # closes or is lost. The file backend has no such event: both report
                        # a lost session by SessionExpiredError on the next call instead.
                        log.debug("dropping kazoo's session event %s for watch %r", event, watch)
                        return None
                    return watch(WatchedEvent(EventType(event.type), event.state, event.path))

                self._wrappers[watch] = wrapper
        return wrapper

    def create(self, path, value=b"", ephemeral=False, sequence=False, makepath=False) -> str:
        paths.validate_path(path, sequential=sequence)
        with _translated(path):
            return self._kazoo.create(
                path, value, ephemeral=ephemeral, sequence=sequence, makepath=makepath
            )

    def get(self, path, watch=None):
        paths.validate_path(path)
        with _translated(path):
            data, stat = self._kazoo.get(path, watch=self._wrap(watch))
        return data, ZnodeStat(*stat)

    def set(self, path, value, version=-1) -> ZnodeStat:
        paths.validate_path(path)
        with _translated(path):
            return ZnodeStat(*self._kazoo.set(path, value, version))

    def delete(self, path, version=-1, recursive=False) -> bool:
        paths.validate_path(path)
        with _translated(path):
            self._kazoo.delete(path, version, recursive=recursive)
        return True  # kazoo answers None for a recursive delete; ours always says True

    def exists(self, path, watch=None):
        paths.validate_path(path)
        with _translated(path):
            stat = self._kazoo.exists(path, watch=self._wrap(watch))
        return None if stat is None else ZnodeStat(*stat)

    def get_children(self, path, watch=None) -> list[str]:
        paths.validate_path(path)
        with _translated(path):
            return self._kazoo.get_children(path, watch=self._wrap(watch))

    def get_many(self, paths_to_read) -> list[tuple[bytes, ZnodeStat] | None]:
        """Pipelined like commit_transactions: every get sent before the first answer."""
        for path in paths_to_read:
            paths.validate_path(path)
        found: list[tuple[bytes, ZnodeStat] | None] = []
        for start in range(0, len(paths_to_read), KAZOO_PIPELINE_MAX):
            chunk = paths_to_read[start : start + KAZOO_PIPELINE_MAX]
            with _translated():
                pending = [self._kazoo.get_async(path) for path in chunk]
            failure = None
            for path, async_result in zip(chunk, pending, strict=True):
                try:
                    data, stat = async_result.get()
                    found.append((data, ZnodeStat(*stat)))
                except kazoo_errors.NoNodeError:
                    found.append(None)
                except (kazoo_errors.KazooException, KazooTimeoutError) as error:
                    failure = failure or translate(error, path)
            if failure is not None:
                raise failure
        return found

    def ensure_path(self, path) -> bool:
        paths.validate_path(path)
        with _translated(path):
            return bool(self._kazoo.ensure_path(path))

    def transaction(self) -> TransactionRequest:
        return TransactionRequest(self._commit_transaction)

    def _commit_transaction(self, requested: list[tuple]) -> list:
        transaction = self._kazoo_transaction(requested)
        with _translated():
            return _translate_results(transaction.commit())

    def commit_transactions(self, transactions) -> list[list]:
        """Pipelined, as Kafka's ZooKeeperClient sends its many requests: every multi is sent
        before the first answer is awaited (at most KAZOO_PIPELINE_MAX outstanding), so the
        batch costs about one round trip, not one per transaction. ZooKeeper applies a
        session's requests in order, so a later transaction sees an earlier one's writes."""
        built = [self._kazoo_transaction(t.take_operations()) for t in transactions]
        results: list[list] = []
        for start in range(0, len(built), KAZOO_PIPELINE_MAX):
            with _translated():
                pending = [t.commit_async() for t in built[start : start + KAZOO_PIPELINE_MAX]]
            answers, failure = [], None
            for async_result in pending:  # wait for all, even past a failed one
                try:
                    answers.append(async_result.get())
                except (kazoo_errors.KazooException, KazooTimeoutError) as error:
                    failure = failure or error
            if failure is not None:  # the connection failed: outcomes unknown, as for commit()
                raise translate(failure) from failure
            results += [_translate_results(answer) for answer in answers]
        return results

    def _kazoo_transaction(self, requested: list[tuple]):
        transaction = self._kazoo.transaction()
        for kind, path, *arguments in requested:
            paths.validate_path(path, sequential=kind == "create" and arguments[2])
            if kind == "create":
                value, ephemeral, sequence = arguments
                transaction.create(path, value, ephemeral=ephemeral, sequence=sequence)
            else:
                getattr(transaction, kind)(path, *arguments)
        return transaction


def _translate_results(results: list) -> list:
    return [
        translate(result) if isinstance(result, Exception)
        else ZnodeStat(*result) if isinstance(result, tuple) and not isinstance(result, str)
        else result
        for result in results
    ]  # fmt: skip
