"""DataWatch and ChildrenWatch (kazoo's recipes) built on the one-shot watches of any backend.

A recipe calls its function once at once and then after every change, re-arming the one-shot
watch each time, until the function returns False or the session ends. DataWatch calls
`func(data, stat)` (or `func(data, stat, event)` if it takes three arguments) with
(None, None) while the znode does not exist; ChildrenWatch calls `func(children)` (or
`func(children, event)` with send_event=True) and stops when the znode is deleted.
Rules: the function runs on the client's callback thread after the first call, never
concurrently with itself; re-reading after each event means it always sees the latest state
(several quick changes may be seen as one, as with kazoo).
"""

from __future__ import annotations

import inspect
import logging
import threading

from localcluster.coord.interface import CoordinationClient, NoNodeError, SessionExpiredError

log = logging.getLogger(__name__)


def _takes_event(func, plain_arity: int) -> bool:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) > plain_arity or any(p.kind == p.VAR_POSITIONAL for p in parameters)


class _Recipe:
    def __init__(self, client: CoordinationClient, path: str, func=None):
        self._client = client
        self._path = path
        self._func = None
        self._lock = threading.Lock()
        self._stopped = False
        if func is not None:
            self(func)

    def __call__(self, func):
        """Use as a decorator: @DataWatch(client, path)."""
        self._func = func
        self._pass_event = self._takes_event(func)
        self._refresh(None)
        return func

    def stop(self) -> None:
        self._stopped = True

    def _watcher(self, event) -> None:
        self._refresh(event)

    def _refresh(self, event) -> None:
        with self._lock:
            if self._stopped or self._func is None:
                return
            try:
                result = self._fetch_and_call(event)
            except SessionExpiredError:
                self._stopped = True
                return
            if result is False:
                self._stopped = True


class DataWatch(_Recipe):
    def _takes_event(self, func) -> bool:
        return _takes_event(func, 2)

    def _fetch_and_call(self, event):
        while True:
            try:
                data, stat = self._client.get(self._path, watch=self._watcher)
                break
            except NoNodeError:
                # Absent: watch for its creation. If it appeared meanwhile, read it again.
                if self._client.exists(self._path, watch=self._watcher) is None:
                    data, stat = None, None
                    break
        arguments = (data, stat, event) if self._pass_event else (data, stat)
        return self._func(*arguments)


class ChildrenWatch(_Recipe):
    def __init__(self, client: CoordinationClient, path: str, func=None, send_event: bool = False):
        self._send_event = send_event
        super().__init__(client, path, func)

    def _takes_event(self, func) -> bool:
        return self._send_event

    def _fetch_and_call(self, event):
        try:
            children = self._client.get_children(self._path, watch=self._watcher)
        except NoNodeError:
            log.info("ChildrenWatch on %s stops: the znode does not exist (any more)", self._path)
            return False
        return self._func(children, event) if self._pass_event else self._func(children)
