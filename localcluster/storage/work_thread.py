"""WorkThread: one daemon thread doing queued work in order, off the event loop.

The storage engine's background job (reclaim.py freeing a deleted segment's pages) has this
shape: the thread starts on the first submission, items are done in the order submitted, `idle` waits until everything submitted so
far is done (tests), and a forked child starts without the parent's thread or queue (the items
queued in the parent stay the parent's). A subclass says what one item is in `work`.

Bound: one queue item per submission not yet done; the submitter's own bound (a deleted
segment is released once) keeps it to one item per deleted segment not yet released.
"""

from __future__ import annotations

import os
import queue
import threading


class WorkThread:
    def __init__(self, name: str) -> None:
        self.name = name
        self._after_fork_in_child()
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    def work(self, *item) -> None:
        raise NotImplementedError

    def submit(self, *item) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                    self._thread.start()
        self._items.put(item)

    def idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until every item submitted so far is done (tests)."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._items.put(done)
        return done.wait(timeout_s)

    def _run(self) -> None:
        while True:
            item = self._items.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            self.work(*item)
            del item  # nothing of a done item lives on in this frame while the thread waits

    def _after_fork_in_child(self) -> None:
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
