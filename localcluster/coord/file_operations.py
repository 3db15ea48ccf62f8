"""ZooKeeper's operation semantics for the file backend, applied to a staged `Mutation`.

What lives here: `Mutation` (an overlay of the store: reads see this mutation's own earlier
writes, so a transaction's later operations see its earlier ones, as in ZooKeeper's multi)
and the operations create / set_data / delete / check / reap_session, which validate exactly
as ZooKeeper does and record the stat changes (one zxid per mutation; parent cversion and
pzxid bumped on every child create and delete; the sequence suffix is the parent's cversion).
`Batch` stacks many independent mutations (a batch commit of transactions): each reads the
store as the ones absorbed before it left it, gets the next zxid, and is absorbed only if it
succeeded; the batch lands as ONE store commit (one journal record, one changelog append).
Rules: nothing here touches the disk except through the store's read methods; the caller
holds the exclusive store lock and commits the mutation only if every operation succeeded.
"""

from __future__ import annotations

import json
import os
import time

from localcluster.coord import paths
from localcluster.coord.file_store import FileStore, Znode
from localcluster.coord.interface import (
    BadArgumentsError,
    BadVersionError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)

CREATED, DELETED, CHANGED = "created", "deleted", "changed"


def ephemerals_file(session_id: int) -> str:
    return f"ephemerals/{session_id:016x}"


class Mutation:
    def __init__(self, store: FileStore, base: Batch | None = None):
        self.store = store
        self.base = base or store  # what reads fall through to: the store, or a batch so far
        self.zxid = base.next_zxid if base else store.read_zxid() + 1
        self.now_ms = int(time.time() * 1000)
        self.nodes: dict[str, Znode | None] = {}
        self.files: dict[str, bytes | None] = {}
        self.changes: list[list[str]] = []

    def node(self, path: str) -> Znode | None:
        if path not in self.nodes:
            return self.base.read_znode(path)
        return self.nodes[path]

    def writable(self, path: str) -> Znode | None:
        """The znode to modify in place (copied into the overlay on first touch)."""
        if path not in self.nodes:
            self.nodes[path] = self.base.read_znode(path)
        return self.nodes[path]

    def ephemerals(self, session_id: int) -> list[str]:
        relative = ephemerals_file(session_id)
        raw = self.files[relative] if relative in self.files else self.base.read_file(relative)
        return json.loads(raw) if raw else []

    def set_ephemerals(self, session_id: int, owned: list[str]) -> None:
        self.files[ephemerals_file(session_id)] = json.dumps(owned).encode() if owned else None

    def commit(self) -> None:
        if self.nodes or self.files:
            self.store.commit(self.zxid, self.nodes, self.files, self.changes)


class Batch:
    """Independent mutations committed together (caller holds the exclusive store lock).

    A mutation made by `mutation()` reads through the ones absorbed before it; `absorb` it
    when all its operations succeeded, drop it otherwise (nothing of it is kept). Each
    absorbed mutation keeps its own zxid and changelog line, as its own commit would."""

    def __init__(self, store: FileStore):
        self.store = store
        self.next_zxid = store.read_zxid() + 1
        self.nodes: dict[str, Znode | None] = {}
        self.files: dict[str, bytes | None] = {}
        self.lines: list[list] = []  # [zxid, changes] per absorbed mutation
        # znodes read from the store: nothing else writes it while the batch holds the lock,
        # and a batch of partition-state writes checks /controller_epoch in each transaction
        self._read: dict[str, Znode | None] = {}

    def read_znode(self, path: str) -> Znode | None:
        if path in self.nodes:
            node = self.nodes[path]
        elif path in self._read:
            node = self._read[path]
        else:
            node = self._read[path] = self.store.read_znode(path)
        # a copy: the mutation reading it may modify it in place
        return None if node is None else node.copy()

    def read_file(self, relative: str) -> bytes | None:
        return self.files[relative] if relative in self.files else self.store.read_file(relative)

    def mutation(self) -> Mutation:
        return Mutation(self.store, base=self)

    def absorb(self, mutation: Mutation) -> None:
        if not (mutation.nodes or mutation.files):
            return  # wrote nothing: no zxid, as its own commit would not take one
        self.nodes.update(mutation.nodes)
        self.files.update(mutation.files)
        self.lines.append([mutation.zxid, mutation.changes])
        self.next_zxid += 1

    def commit(self) -> None:
        if self.lines:
            self.store.commit_lines(self.nodes, self.files, self.lines)


def _require(mutation: Mutation, path: str) -> Znode:
    node = mutation.writable(path)
    if node is None:
        raise NoNodeError(f"no znode at {path}")
    return node


def _check_version(node: Znode, path: str, version: int) -> None:
    if version != -1 and node.version != version:
        raise BadVersionError(
            f"znode {path} is at version {node.version}, not the expected {version}"
        )


def create(
    mutation: Mutation, path: str, value: bytes, session_id: int, ephemeral: bool, sequence: bool
) -> str:
    parent_path = paths.parent_of(path if not path.endswith("/") else path + "x")
    parent = mutation.writable(parent_path)
    if parent is None:
        raise NoNodeError(f"cannot create {path}: its parent {parent_path} does not exist")
    if parent.ephemeral_owner:
        raise NoChildrenForEphemeralsError(
            f"cannot create {path}: its parent {parent_path} is ephemeral and ZooKeeper forbids children of ephemerals"
        )
    if sequence:
        path = path + paths.sequence_suffix(parent.child_creates)
    name = paths.name_of(path)
    if mutation.node(path) is not None:
        raise NodeExistsError(f"znode {path} already exists")
    if ephemeral:
        if not session_alive(mutation.store, session_id):
            raise SessionExpiredError(
                f"session {session_id:#x} expired; cannot create ephemeral {path}"
            )
        mutation.set_ephemerals(session_id, mutation.ephemerals(session_id) + [path])
    zxid, now = mutation.zxid, mutation.now_ms
    mutation.nodes[path] = Znode(value, zxid, zxid, zxid, now, now, session_id if ephemeral else 0)
    parent.children.append(name)
    parent.cversion += 1
    parent.child_creates += 1
    parent.pzxid = zxid
    mutation.changes.append([CREATED, path])
    return path


def set_data(mutation: Mutation, path: str, value: bytes, version: int) -> Znode:
    node = _require(mutation, path)
    _check_version(node, path, version)
    node.data = value
    node.version += 1
    node.mzxid = mutation.zxid
    node.mtime = mutation.now_ms
    mutation.changes.append([CHANGED, path])
    return node


def delete(mutation: Mutation, path: str, version: int) -> None:
    if path == "/":
        raise BadArgumentsError("the root znode / cannot be deleted")
    node = _require(mutation, path)
    _check_version(node, path, version)
    if node.children:
        raise NotEmptyError(
            f"znode {path} has {len(node.children)} children ({', '.join(node.children[:5])}...); "
            "delete them first or pass recursive=True"
        )
    parent = mutation.writable(paths.parent_of(path))
    parent.children.remove(paths.name_of(path))
    parent.cversion += 1
    parent.pzxid = mutation.zxid
    if node.ephemeral_owner:
        owned = mutation.ephemerals(node.ephemeral_owner)
        mutation.set_ephemerals(node.ephemeral_owner, [p for p in owned if p != path])
    mutation.nodes[path] = None
    mutation.changes.append([DELETED, path])


def delete_recursive(mutation: Mutation, path: str, version: int) -> None:
    node = _require(mutation, path)
    _check_version(node, path, version)
    for name in list(node.children):
        delete_recursive(mutation, paths.join(path, name), -1)
    delete(mutation, path, -1)


def check(mutation: Mutation, path: str, version: int) -> None:
    _check_version(_require(mutation, path), path, version)


def reap_session(mutation: Mutation, session_id: int) -> list[str]:
    """Delete every ephemeral the session owns (its session is dead or expired)."""
    removed = []
    for path in mutation.ephemerals(session_id):
        node = mutation.node(path)
        if node is not None and node.ephemeral_owner == session_id:
            delete(mutation, path, -1)
            removed.append(path)
    mutation.set_ephemerals(session_id, [])
    return removed


def session_file(session_id: int) -> str:
    return f"sessions/{session_id:016x}"


def session_alive(store: FileStore, session_id: int) -> bool:
    return os.path.exists(store.path(session_file(session_id)))
