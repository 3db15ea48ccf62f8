"""The coordination interface every backend implements: a kazoo-like subset of ZooKeeper.

What lives here: the abstract `CoordinationClient`, `ZnodeStat` (same fields and order as
kazoo's, so a kazoo stat converts with `ZnodeStat(*stat)`), the watch event types, the error
hierarchy, the transaction builder and the batch commit of many independent transactions
(`commit_transactions`: one lock and one watcher wake-up on the file backend, one pipelined
burst of requests on ZooKeeper, where a loop of commits pays a commit or a round trip each) and
its reading counterpart `get_many`. Rules: backends raise only the errors defined here
(never kazoo's or OSError for a ZooKeeper-level condition); values are `bytes`; paths are
validated by `paths.validate_path` before they reach a backend; watch callbacks run on one
client thread, in the order the changes happened, and are one-shot like ZooKeeper's.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Sequence
from typing import NamedTuple


class ZnodeStat(NamedTuple):
    """A znode's stat, as ZooKeeper returns it. Times are milliseconds since the epoch."""

    czxid: int  # zxid of the transaction that created the znode
    mzxid: int  # zxid of the last data change
    ctime: int
    mtime: int
    version: int  # data version: the zkVersion Kafka's conditional updates compare
    cversion: int  # child version: bumped on every child create and delete
    aversion: int  # ACL version (always 0 here: no ACLs)
    ephemeralOwner: int  # session id of the owner for an ephemeral znode, else 0
    dataLength: int
    numChildren: int
    pzxid: int  # zxid of the last child create/delete

    @property
    def owner_session_id(self) -> int | None:
        return self.ephemeralOwner or None


class EventType(enum.StrEnum):
    """ZooKeeper's watch event types (kazoo's names and string values)."""

    CREATED = "CREATED"
    DELETED = "DELETED"
    CHANGED = "CHANGED"
    CHILD = "CHILD"
    NONE = "NONE"


class WatchedEvent(NamedTuple):
    type: EventType
    state: str  # "CONNECTED" for every event a backend delivers to a watch
    path: str


WatchCallback = Callable[[WatchedEvent], object]


class CoordinationError(Exception):
    """Base of every error a coordination backend raises."""


class NoNodeError(CoordinationError):
    """The znode (or, for create, its parent) does not exist."""


class NodeExistsError(CoordinationError):
    """create() of a path that already exists."""


class BadVersionError(CoordinationError):
    """A conditional set/delete/check named a version the znode no longer has."""


class NotEmptyError(CoordinationError):
    """delete() of a znode that has children, without recursive=True."""


class NoChildrenForEphemeralsError(CoordinationError):
    """create() under an ephemeral znode: ZooKeeper forbids children of ephemerals."""


class SessionExpiredError(CoordinationError):
    """This client's session expired (its ephemerals are gone); make a new client."""


class ConnectionLossError(CoordinationError):
    """The backend could not be reached (real ZooKeeper only)."""


class RolledBackError(CoordinationError):
    """A transaction operation that was valid but undone because a later one failed."""


class RuntimeInconsistencyError(CoordinationError):
    """A transaction operation never tried because an earlier one failed."""


class BadArgumentsError(CoordinationError):
    """An operation ZooKeeper refuses for its arguments (for example deleting the root)."""


class BadPathError(CoordinationError, ValueError):
    """A path ZooKeeper would reject: says which path, what is wrong and what a valid one is."""


class TransactionRequest:
    """Collects check/create/set_data/delete operations; commit() applies all or nothing.

    commit() returns one result per operation like kazoo: the created path for create, a
    ZnodeStat for set_data, True for check and delete. When an operation fails nothing is
    applied and the list holds exceptions instead: RolledBackError before the failing one,
    its own error (BadVersionError, NoNodeError, ...) at it, RuntimeInconsistencyError after.
    """

    def __init__(self, commit_operations: Callable[[list[tuple]], list]):
        self._commit_operations = commit_operations
        self.operations: list[tuple] = []
        self.committed = False

    def create(
        self, path: str, value: bytes = b"", ephemeral: bool = False, sequence: bool = False
    ):
        self.operations.append(("create", path, value, ephemeral, sequence))

    def set_data(self, path: str, value: bytes, version: int = -1):
        self.operations.append(("set_data", path, value, version))

    def delete(self, path: str, version: int = -1):
        self.operations.append(("delete", path, version))

    def check(self, path: str, version: int):
        self.operations.append(("check", path, version))

    def commit(self) -> list:
        return self._commit_operations(self.take_operations())

    def take_operations(self) -> list[tuple]:
        """Mark this transaction committed and hand over its operations (for a batch commit)."""
        assert not self.committed, "a transaction is committed once; build a new one"
        self.committed = True
        return list(self.operations)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None and not self.committed:
            self.commit()


class CoordinationClient(abc.ABC):
    """A started client with one session. Both backends implement exactly this."""

    @property
    @abc.abstractmethod
    def session_id(self) -> int: ...

    @property
    def client_id(self) -> tuple[int, bytes]:
        """(session id, password) like kazoo's client_id; the file backend has no password."""
        return (self.session_id, b"")

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None:
        """Close the session: its ephemerals are deleted now, like ZooKeeper's close."""

    @abc.abstractmethod
    def create(
        self,
        path: str,
        value: bytes = b"",
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str: ...

    @abc.abstractmethod
    def get(self, path: str, watch: WatchCallback | None = None) -> tuple[bytes, ZnodeStat]: ...

    @abc.abstractmethod
    def set(self, path: str, value: bytes, version: int = -1) -> ZnodeStat: ...

    @abc.abstractmethod
    def delete(self, path: str, version: int = -1, recursive: bool = False) -> bool: ...

    @abc.abstractmethod
    def exists(self, path: str, watch: WatchCallback | None = None) -> ZnodeStat | None: ...

    @abc.abstractmethod
    def get_children(self, path: str, watch: WatchCallback | None = None) -> list[str]: ...

    @abc.abstractmethod
    def transaction(self) -> TransactionRequest: ...

    def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """Read many znodes at once (no watches): each one's (data, stat), or None where
        there is no znode. Backends override this to read them together (one lock hold on
        the file backend, pipelined on ZooKeeper); the default gets one after another."""
        found: list[tuple[bytes, ZnodeStat] | None] = []
        for path in paths:
            try:
                found.append(self.get(path))
            except NoNodeError:
                found.append(None)
        return found

    def commit_transactions(self, transactions: Sequence[TransactionRequest]) -> list[list]:
        """Commit many INDEPENDENT transactions at once; one result list per transaction.

        Each transaction is atomic on its own and its results read exactly as its commit()
        would (a failing one is rolled back alone and reports its error; the others apply).
        They apply in the order given, so a later one sees an earlier one's writes (as
        ZooKeeper applies one session's requests in order); watches fire as for the same
        commits made one by one. Backends override this to commit them together: the default
        commits them one after another."""
        return [transaction.commit() for transaction in transactions]

    def ensure_path(self, path: str) -> bool:
        """Create path and any missing parents as empty persistent znodes."""
        if self.exists(path) is None:
            try:
                self.create(path, makepath=True)
            except NodeExistsError:
                pass  # another client made it between our exists() and create()
        return True

    def close(self) -> None:
        self.stop()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.stop()
