"""Differential test: random operation sequences on the file backend and on ZooKeeper in
lockstep; every answer (values, versions, child counts, errors, transaction results) must match,
and so must the watch events, in their order.

ZooKeeper is the oracle. zxids and times are not compared (ZooKeeper spends zxids on sessions
too); everything else a caller can observe is. The seed is printed on failure; rerun one with
COORD_DIFFERENTIAL_SEED=<seed>.
"""

from __future__ import annotations

import os
import random
import threading
import uuid

import pytest

from localcluster.coord import CoordinationError, ZnodeStat, connect
from tests.helpers import wait_until

pytestmark = pytest.mark.zookeeper
NAMES = ("a", "b", "c")


def normalise(base: str, value):
    if isinstance(value, CoordinationError):
        return type(value).__name__
    if isinstance(value, ZnodeStat):
        return (
            "stat",
            value.version,
            value.cversion,
            value.numChildren,
            value.dataLength,
            value.ephemeralOwner != 0,
        )
    if isinstance(value, str):
        return value.replace(base, "<base>", 1)
    if isinstance(value, list):
        return [normalise(base, item) for item in value]
    if isinstance(value, tuple):
        return tuple(normalise(base, item) for item in value)
    return value


def call(base: str, function, *arguments, **keywords):
    try:
        return normalise(base, function(*arguments, **keywords))
    except CoordinationError as error:
        return type(error).__name__


class Scenario:
    def __init__(self, seed: int):
        self.random = random.Random(seed)

    def path(self, base: str, depth_max: int = 2) -> str:
        depth = self.random.randint(1, depth_max)
        return base + "".join("/" + self.random.choice(NAMES) for _ in range(depth))

    def operation(self):
        """An operation as (name, function of (client, base, watches) -> normalised answer)."""
        kind = self.random.choice(
            [
                "create",
                "create",
                "create",
                "set",
                "delete",
                "get",
                "exists",
                "children",
                "transaction",
                "recursive",
            ]
        )
        relative = self.path("")
        value = self.random.choice([b"", b"x", b"leader=1", bytes(range(20))])
        version = self.random.choice([-1, -1, 0, 1, 2])
        ephemeral = self.random.random() < 0.2
        sequence = self.random.random() < 0.15
        watched = self.random.random() < 0.6
        if kind == "create":
            return f"create {relative} e={ephemeral} s={sequence}", lambda c, b, w: call(
                b, c.create, b + relative, value, ephemeral=ephemeral, sequence=sequence
            )
        if kind == "set":
            return f"set {relative} v={version}", lambda c, b, w: call(
                b, c.set, b + relative, value, version=version
            )
        if kind == "delete":
            return f"delete {relative} v={version}", lambda c, b, w: call(
                b, c.delete, b + relative, version=version
            )
        if kind == "recursive":
            # Deleting child by child in sorted order: kazoo's recursive delete goes in the
            # server's child order and the file backend's is one transaction, so their watch
            # events may legitimately come in different orders (docs/coordination.md).
            return f"delete -r {relative}", lambda c, b, w: call(b, delete_tree, c, b + relative)
        if kind == "get":
            return f"get {relative} w={watched}", lambda c, b, w: call(
                b, c.get, b + relative, watch=w.data if watched else None
            )
        if kind == "exists":
            return f"exists {relative} w={watched}", lambda c, b, w: call(
                b, c.exists, b + relative, watch=w.data if watched else None
            )
        if kind == "children":
            return f"children {relative} w={watched}", lambda c, b, w: call(
                b,
                lambda p: sorted(c.get_children(p, watch=w.child if watched else None)),
                b + relative,
            )
        steps = [self._transaction_step() for _ in range(self.random.randint(1, 4))]

        def transaction(client, base, watches):
            built = client.transaction()
            for step, relative_path, arguments in steps:
                getattr(built, step)(base + relative_path, *arguments)
            return call(base, built.commit)

        return f"transaction {steps}", transaction

    def _transaction_step(self):
        relative = self.path("")
        step = self.random.choice(["create", "set_data", "delete", "check"])
        version = self.random.choice([-1, 0, 1])
        if step == "create":
            return step, relative, (b"t", self.random.random() < 0.2, self.random.random() < 0.2)
        if step == "set_data":
            return step, relative, (b"t", version)
        if step == "check":
            return step, relative, (max(version, 0),)
        return step, relative, (version,)


@pytest.mark.parametrize("round_number", range(3))
def test_random_operations_answer_like_zookeeper(round_number, zookeeper_server, tmp_path):
    seed = int(os.environ.get("COORD_DIFFERENTIAL_SEED", random.randrange(1 << 32)))
    scenario = Scenario(seed)
    file_client = connect(str(tmp_path / "store"))
    zookeeper_client = connect(zookeeper_server.spec, session_timeout_ms=4000)
    zookeeper_base = f"/differential-{uuid.uuid4().hex[:12]}"
    file_base = "/differential"
    try:
        zookeeper_client.create(zookeeper_base)
        file_client.create(file_base)
        zookeeper_watches, file_watches = Watches(zookeeper_base), Watches(file_base)
        history = []
        for _ in range(250):
            description, operation = scenario.operation()
            expected = operation(zookeeper_client, zookeeper_base, zookeeper_watches)
            actual = operation(file_client, file_base, file_watches)
            history.append(f"{description} -> {expected}")
            assert actual == expected, (
                f"seed {seed}: the file backend answered {actual!r}, ZooKeeper {expected!r}\n"
                + "\n".join(history[-15:])
            )
        tree = lambda c, b: call(b, lambda: sorted(walk(c, b)))  # noqa: E731
        assert tree(file_client, file_base) == tree(zookeeper_client, zookeeper_base), (
            f"seed {seed}"
        )
        for client, base, watches in (
            (zookeeper_client, zookeeper_base, zookeeper_watches),
            (file_client, file_base, file_watches),
        ):
            watches.drain(client, base)
        assert file_watches.events == zookeeper_watches.events, (
            f"seed {seed}: watch events differ\nfile backend: {file_watches.events}\n"
            f"zookeeper:    {zookeeper_watches.events}\n" + "\n".join(history)
        )
    finally:
        file_client.stop()
        zookeeper_client.stop()


class Watches:
    """One data-watch and one child-watch callback, recording in one ordered list."""

    def __init__(self, base: str):
        self.base = base
        self.events: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def _record(self, tag, event):
        with self._lock:
            self.events.append((tag, event.type.value, event.path.replace(self.base, "<base>", 1)))

    def data(self, event):
        self._record("data", event)

    def child(self, event):
        self._record("child", event)

    def drain(self, client, base):
        """Events arrive in change order: once a last change's event is in, all are."""
        marker = base + "/marker"
        seen = []
        client.exists(marker, watch=seen.append)
        client.create(marker)
        wait_until(lambda: seen, 10, message="the marker event")


def delete_tree(client, path) -> bool:
    for child in sorted(client.get_children(path)):
        delete_tree(client, path + "/" + child)
    return client.delete(path)


def walk(client, base):
    pending = [base]
    while pending:
        path = pending.pop()
        data, stat = client.get(path)
        yield (
            path.replace(base, "<base>", 1),
            data,
            stat.version,
            stat.cversion,
            stat.ephemeralOwner != 0,
        )
        pending += [path + "/" + child for child in client.get_children(path)]
