"""tools/load.py: a paced librdkafka load waits in whole-millisecond polls, never poll(0); our
client's pacer never resumes early and sleeps with 1 ns of timer slack; our client's batches
fill batch.size and never pass it."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from localcluster.tools.load import (
    POLL_MIN_S,
    Job,
    Pacer,
    Schedule,
    batch_records_for,
    build_batch,
    pacing_wait_s,
    split_job,
)


@pytest.mark.parametrize("batch_bytes", [16 << 10, 64 << 10, 1_000_000, 1 << 20, 8 << 20])
@pytest.mark.parametrize("record_size", [0, 100, 1000])
def test_a_batch_holds_as_many_records_as_fit_batch_size_and_no_more(batch_bytes, record_size):
    count = batch_records_for(record_size, batch_bytes)
    assert (
        len(build_batch(count, record_size))
        <= batch_bytes
        < len(build_batch(count + 1, record_size))
    )


def test_a_record_larger_than_batch_size_goes_alone():
    assert batch_records_for(1 << 20, 64 << 10) == 1


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


def test_paced_load_processes_take_turns_so_items_are_due_evenly_spaced():
    whole = Job("own", "", "t", (0,), -1, 100, 10.0, rate=3_000.0, outstanding=16, records=1_000)
    jobs = split_job(whole, 3)
    assert [j.rate for j in jobs] == [1_000.0] * 3 and [j.records for j in jobs] == [334, 333, 333]
    schedules = [Schedule(10.0, interval=0.001, phase=j.phase) for j in jobs]
    base = schedules[0].start
    due = sorted(s.due(sent, now=0.0) - base for s in schedules for sent in range(4))
    assert due == pytest.approx([i / 3_000 for i in range(12)], abs=50e-6)  # one every 1/3 ms


def test_a_process_with_no_records_to_send_sends_nothing():
    jobs = split_job(Job("own", "", "t", (0,), -1, 100, 10.0, 0.0, 16, records=1), 2)
    assert [(j.records, j.seconds) for j in jobs] == [(1, 10.0), (0, 0.0)]


def test_the_pacer_resumes_never_before_its_time_and_sleeps_with_the_least_timer_slack():
    async def scenario():
        pacer = Pacer(asyncio.get_running_loop())
        early = []
        for i in range(20):
            due = time.monotonic() + 0.002 * (i % 3)
            await asyncio.wait_for(pacer.until(due), 5)
            early.append(due - time.monotonic())
        return pacer, early

    pacer, early = asyncio.run(scenario())
    assert max(early) <= 0, "resumed before the due time"
    if sys.platform.startswith("linux"):
        slack = f"/proc/{pacer.thread.native_id}/timerslack_ns"  # a thread id works here too
        with open(slack) as f:
            assert int(f.read()) == 1  # the kernel's default for a thread is 50,000 ns
