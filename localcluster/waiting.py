"""Waiting on a condition with a deadline: the one polling loop of the package and the tests.

For the faces (cluster.py, tools/) and the tests, which watch other processes through
files, pid files and the store, where nothing can notify them. Never for the cores (they
read no clock) nor the broker runtime (it waits on its event loop). The predicate is
checked once more at the deadline, so a condition that comes true while the last sleep
runs is not missed; the caller decides what a timeout means (an error, or a default).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.02) -> T:
    """predicate()'s first truthy value, or its last (falsy) value once timeout_s passed."""
    assert interval_s >= 0, interval_s  # 0: a busy poll, still bounded by the deadline
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)
