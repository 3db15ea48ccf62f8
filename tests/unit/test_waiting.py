"""localcluster.waiting.wait_until: the first truthy value, or the last falsy one at the deadline."""

from __future__ import annotations

import time

from localcluster.waiting import wait_until


def test_returns_the_first_truthy_value_without_waiting_longer():
    calls = []

    def third_time() -> int:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else 0

    assert wait_until(third_time, timeout_s=5, interval_s=0.001) == 3
    assert len(calls) == 3


def test_returns_the_last_falsy_value_once_the_deadline_passed():
    started = time.monotonic()
    assert wait_until(lambda: [], timeout_s=0.05, interval_s=0.01) == []
    assert time.monotonic() - started >= 0.05


def test_checks_once_more_when_the_last_sleep_passed_the_deadline():
    calls = []

    def second_time() -> bool:
        calls.append(1)
        return len(calls) == 2

    # The one sleep (50 ms) outlasts the timeout (10 ms): the second check comes after the
    # deadline and still counts.
    assert wait_until(second_time, timeout_s=0.01, interval_s=0.05) is True
    assert len(calls) == 2
