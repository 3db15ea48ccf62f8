"""Watch delivery for the file backend: the changelog feed, wake-ups, and the watch table.

Every mutation appends one line `[zxid, [[kind, path], ...]]` to the store's changelog and
closes the file; each client tails it. Wake-ups come from watchdog (inotify: the close of the
changelog after a write, or of a session file when its owner dies) or, where inotify is not
available or `watch_mode="polling"`, from checking the changelog's size every poll interval.
The watch table turns changelog lines into ZooKeeper events: a data watch (from get or exists)
fires on the znode's create, set or delete; a child watch (from get_children) on a child's
create or delete and on the znode's own delete. Watches are one-shot, one per (path, callback).
A watch remembers the zxid its read saw, and only lines with a larger zxid fire it, so a change
between the read and the registration is never lost and never delivered twice (a callback may
hold registrations of one path from reads on either side of a change: WatchTable).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable

from localcluster.coord.file_store import FileStore
from localcluster.coord.interface import EventType, WatchCallback, WatchedEvent

log = logging.getLogger(__name__)
_EVENT_OF = {
    "created": EventType.CREATED,
    "deleted": EventType.DELETED,
    "changed": EventType.CHANGED,
}


class ChangeFeed:
    """Tails the changelog from where this client started; survives rotation.

    Created under the store lock with from_end=True, it starts at the changelog's end, which
    is then exactly after_zxid (no line of the past is parsed, however long the file)."""

    def __init__(self, store: FileStore, after_zxid: int, from_end: bool = False):
        self.store = store
        self.last_zxid = after_zxid
        self._fd = os.open(store.path("changes"), os.O_RDONLY)
        self._offset = os.fstat(self._fd).st_size if from_end else 0
        self.gap = False  # set when lines were lost to rotation: the caller must resync

    def close(self) -> None:
        os.close(self._fd)

    def read(self) -> list[tuple[int, list]]:
        lines = self._read_complete_lines()
        if not lines and os.stat(self.store.path("changes")).st_ino != os.fstat(self._fd).st_ino:
            os.close(self._fd)  # rotated; our fd had everything of the old file
            self._fd, self._offset = os.open(self.store.path("changes"), os.O_RDONLY), 0
            lines = self._read_complete_lines()
        entries = []
        for zxid, changes in map(json.loads, lines):
            if changes is None:  # a header: the last zxid before this file
                self.gap = self.gap or zxid > self.last_zxid
            elif zxid > self.last_zxid:  # a replayed journal may repeat a line: skip it
                entries.append((zxid, changes))
                self.last_zxid = zxid
        return entries

    def _read_complete_lines(self) -> list[bytes]:
        lines, chunk_bytes = [], 1 << 20
        while True:
            chunk = os.pread(self._fd, chunk_bytes, self._offset)
            end = chunk.rfind(b"\n")
            if end < 0:  # nothing new, or a line still being written (or torn: recovery cuts it)
                if len(chunk) == chunk_bytes:
                    chunk_bytes *= 2
                    continue
                return lines
            lines.extend(chunk[: end + 1].splitlines())
            self._offset += end + 1
            if len(chunk) < chunk_bytes:
                return lines


class WatchTable:
    """Registered one-shot watches: path -> {callback: the zxids its registrations' reads saw}.

    A callback may hold two registrations of one path: one whose change this client has not
    read from the changelog yet, and one made after that change (a get, the znode deleted, an
    exists). ZooKeeper's server fired the first at the change, so the second stands on its own:
    the change fires the first only, and the next change the second. Kept as one zxid (the
    older), the second was spent with the first and its event never came."""

    def __init__(self):
        self.data: dict[str, dict[WatchCallback, list[int]]] = {}
        self.child: dict[str, dict[WatchCallback, list[int]]] = {}

    def add(self, table: dict, path: str, callback: WatchCallback, zxid: int) -> None:
        seen = table.setdefault(path, {}).setdefault(callback, [])
        if zxid not in seen:
            seen.append(zxid)

    def match(self, zxid: int, changes: list) -> list[tuple[WatchCallback, WatchedEvent]]:
        fired = []
        for kind, path in changes:
            fired += self._fire(self.data, path, zxid, _EVENT_OF[kind])
            if kind == "deleted":
                fired += self._fire(self.child, path, zxid, EventType.DELETED)
            if kind != "changed" and path != "/":
                fired += self._fire(
                    self.child, path.rsplit("/", 1)[0] or "/", zxid, EventType.CHILD
                )
        return fired

    def _fire(self, table: dict, path: str, zxid: int, kind: EventType) -> list:
        """Each callback with a registration older than `zxid` gets one event; its
        registrations that saw `zxid` or later stay."""
        watchers = table.get(path)
        if not watchers:
            return []
        due = []
        for callback, seen in list(watchers.items()):
            later = [z for z in seen if z >= zxid]
            if len(later) < len(seen):
                due.append(callback)
                if later:
                    watchers[callback] = later
                else:
                    del watchers[callback]
        if not watchers:
            del table[path]
        return [(callback, WatchedEvent(kind, "CONNECTED", path)) for callback in due]

    def resync(self, store: FileStore) -> list[tuple[WatchCallback, WatchedEvent]]:
        """Changelog lines were lost to rotation (this client stalled for a whole changelog):
        fire every watch whose znode moved past its zxid, judged from the znodes themselves.
        Conservative: a watch on a znode that is still absent fires DELETED. Caller holds the
        shared store lock."""
        fired, everything = [], 1 << 62
        for path in list(self.data):
            node, oldest = store.read_znode(path), _oldest(self.data[path])
            if node is None:
                fired += self._fire(self.data, path, everything, EventType.DELETED)
            elif max(node.czxid, node.mzxid) > oldest:
                kind = EventType.CREATED if node.czxid > oldest else EventType.CHANGED
                fired += self._fire(self.data, path, everything, kind)
        for path in list(self.child):
            node, oldest = store.read_znode(path), _oldest(self.child[path])
            if node is None or node.pzxid > oldest:
                kind = EventType.DELETED if node is None else EventType.CHILD
                fired += self._fire(self.child, path, everything, kind)
        return fired


def _oldest(watchers: dict[WatchCallback, list[int]]) -> int:
    return min(min(seen) for seen in watchers.values())


class Wakeup:
    """Tells the client when the changelog grew or a session file was closed (its owner may
    have died), through watchdog's inotify observer; in polling mode it does nothing and the
    client's dispatcher polls. on_changelog runs on the observer's thread, so watch events skip
    a thread hop on their way to the callbacks."""

    def __init__(
        self,
        store: FileStore,
        mode: str,
        on_changelog: Callable[[], None],
        on_session: Callable[[], None],
    ):
        assert mode in ("auto", "inotify", "polling"), mode
        self.store = store
        self._on_changelog = on_changelog
        self._on_session = on_session
        self._observer = None
        self.mode = "polling"
        if mode != "polling":
            try:
                self._start_inotify()
                self.mode = "inotify"
            except Exception as error:  # no inotify (limits, exotic filesystem): poll instead
                if mode == "inotify":
                    raise
                log.warning(
                    "watching %s with inotify failed (%s); falling back to polling the changelog",
                    store.root, error,
                )  # fmt: skip

    def _start_inotify(self) -> None:
        from watchdog.events import (
            FileClosedEvent,
            FileDeletedEvent,
            FileMovedEvent,
            FileSystemEventHandler,
        )
        from watchdog.observers.inotify import InotifyObserver

        on_changelog, on_session = self._on_changelog, self._on_session
        changelog = self.store.path("changes")

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if changelog in (event.src_path, getattr(event, "dest_path", None)):
                    on_changelog()
                else:
                    on_session()

        observer = InotifyObserver()
        event_filter = [FileClosedEvent, FileDeletedEvent, FileMovedEvent]
        observer.schedule(Handler(), self.store.root, event_filter=event_filter)
        observer.schedule(Handler(), self.store.path("sessions"), event_filter=event_filter)
        observer.daemon = True
        observer.start()
        self._observer = observer

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.unschedule_all()  # first, so no event reaches a stopping emitter
            self._observer.stop()
            self._observer.join(timeout=2)
