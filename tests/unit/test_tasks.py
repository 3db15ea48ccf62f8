"""tasks.py: wait_woken returns on a wake or at its deadline, and a wake after the deadline
(or with nobody waiting) changes nothing."""

from __future__ import annotations

import asyncio

import pytest

from localcluster.tasks import wait_woken, wake


def test_a_wake_ends_the_wait_before_its_deadline():
    async def main():
        loop = asyncio.get_running_loop()
        waker = loop.create_future()
        loop.call_soon(wake, waker)
        started = loop.time()
        await wait_woken(waker, 30)
        assert loop.time() - started < 5
        wake(waker)  # a second wake finds it done

    asyncio.run(main())


def test_the_deadline_ends_the_wait_and_a_late_wake_passes_by():
    async def main():
        loop = asyncio.get_running_loop()
        waker = loop.create_future()
        await wait_woken(waker, 0.01)
        assert waker.done() and waker.result() is None
        wake(waker)
        wake(None)

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_its_waker_done():
    async def main():
        loop = asyncio.get_running_loop()
        waker = loop.create_future()
        waiting = loop.create_task(wait_woken(waker, 30))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert waker.cancelled()
        wake(waker)  # the owner's wake after that changes nothing

    asyncio.run(main())
