"""tools/load.py: a paced librdkafka load waits in whole-millisecond polls, never poll(0)."""

from __future__ import annotations

import pytest

from localcluster.tools.load import POLL_MIN_S, Schedule, pacing_wait_s


@pytest.mark.parametrize("left_s", [0.0, 0.000_125, 0.000_999])
def test_a_wait_under_a_millisecond_polls_a_millisecond(left_s):
    assert pacing_wait_s(10.0 + left_s, 10.0) == POLL_MIN_S == 0.001


def test_a_longer_wait_polls_until_due():
    assert pacing_wait_s(10.25, 10.0) == pytest.approx(0.25)


def test_records_due_while_polling_keep_their_due_time():
    schedule = Schedule(seconds=1.0, interval=0.000_125)
    due = schedule.due(3, now=schedule.start)
    assert due == pytest.approx(schedule.start + 0.000_375)
    assert schedule.latency_start(due) == due  # latency counts from the slot, not the send
