"""Cancelling asyncio tasks so that they really end; waiting for a wake-up with a deadline.

On Python 3.11, `asyncio.wait_for` can swallow a cancellation that arrives as its inner
future completes (gh-86296, fixed in 3.12): a loop that awaits wait_for then goes on running,
and a plain `task.cancel(); await task` waits forever. `cancel_and_wait` cancels again until
the task is done.
"""

from __future__ import annotations

import asyncio

RECANCEL_INTERVAL_S = 0.05


async def cancel_and_wait(*tasks: asyncio.Task | None) -> None:
    pending = {t for t in tasks if t is not None and not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_INTERVAL_S)


async def wait_woken(waker: asyncio.Future, timeout_s: float) -> None:
    """Until `waker` is done (its owner woke it) or `timeout_s` passed; on the timeout the
    waker is resolved, so a late wake-up finds it done and passes by.

    For one waiter per waker, on a hot path: asyncio.wait_for on 3.11 wraps the wait in a new
    task each call (and has gh-86296, above); this is one timer handle."""
    timer = asyncio.get_running_loop().call_later(timeout_s, wake, waker)
    try:
        await waker
    finally:
        timer.cancel()


def wake(waker: asyncio.Future | None) -> None:
    """Wake the one waiting on `waker`, if anyone still is."""
    if waker is not None and not waker.done():
        waker.set_result(None)
