"""Cancelling asyncio tasks so that they really end.

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
