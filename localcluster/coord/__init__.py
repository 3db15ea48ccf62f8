"""Coordination: ZooKeeper's data model for brokers and the controller, two backends.

`connect(spec)` returns a started client: a store directory path selects the file backend
(file_backend.py, the embedded default), `zookeeper://host:port[,host:port][/chroot]` a real
ZooKeeper through kazoo (kazoo_backend.py). Both implement `CoordinationClient`
(interface.py) and raise only the errors defined there.
"""

from __future__ import annotations

import os

from localcluster.coord.interface import (
    BadArgumentsError,
    BadPathError,
    BadVersionError,
    ConnectionLossError,
    CoordinationClient,
    CoordinationError,
    EventType,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistencyError,
    SessionExpiredError,
    TransactionRequest,
    WatchedEvent,
    ZnodeStat,
)
from localcluster.coord.recipes import ChildrenWatch, DataWatch

ZOOKEEPER_SCHEME = "zookeeper://"


def connect(
    spec: str | os.PathLike, session_timeout_ms: int | None = None, **options
) -> CoordinationClient:
    """A started client for spec: a store directory (created when missing) or a
    zookeeper://host:port[,host:port] URL. Extra options go to the backend's constructor
    (file: watch_mode="auto"|"inotify"|"polling", fsync=False)."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec:
        raise ValueError(
            f"coordination spec must be a store directory or zookeeper://host:port, got {spec!r}"
        )
    if spec.startswith(ZOOKEEPER_SCHEME):
        from localcluster.coord.kazoo_backend import KazooCoordinationClient

        hosts = spec[len(ZOOKEEPER_SCHEME) :]
        if not hosts or hosts.startswith("/"):
            raise ValueError(
                f"coordination spec {spec!r} names no ZooKeeper host; use zookeeper://host:port"
            )
        client = KazooCoordinationClient(hosts, session_timeout_ms=session_timeout_ms, **options)
    elif "://" in spec:
        raise ValueError(
            f"coordination spec {spec!r} has an unknown scheme; use a store directory path "
            "(file backend) or zookeeper://host:port[,host:port] (real ZooKeeper)"
        )
    else:
        from localcluster.coord.file_backend import DEFAULT_SESSION_TIMEOUT_MS, FileClient

        if os.path.exists(spec) and not os.path.isdir(spec):
            raise ValueError(f"coordination store {spec!r} exists but is not a directory")
        client = FileClient(spec, session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS, **options)
    client.start()
    return client


__all__ = [
    "connect", "CoordinationClient", "TransactionRequest", "ZnodeStat", "EventType", "WatchedEvent",
    "DataWatch", "ChildrenWatch", "CoordinationError", "NoNodeError", "NodeExistsError",
    "BadVersionError", "NotEmptyError", "NoChildrenForEphemeralsError", "SessionExpiredError",
    "ConnectionLossError", "RolledBackError", "RuntimeInconsistencyError", "BadArgumentsError",
    "BadPathError",
]  # fmt: skip
