"""Crash tests: a real child process appends to a Log and is SIGKILLed at random moments.

After every kill the parent reopens the log (as a restarted broker would: recovery from the
checkpointed recovery point) and checks that it holds exactly a prefix of what was appended
(same records, same offsets; retention may only have removed whole old segments), that every
batch the child reported complete is there, that the
indexes agree with a plain scan of the data and the epoch cache with the batches' epochs; then
it appends itself (appending continues after recovery) and closes the log, sometimes cleanly.
The random seed is printed and named in any failure; rerun with LOG_CRASH_SEED=<seed>.

Plus deterministic torn-write cases: a partial batch written straight into the segment file is
cut and logged; a preallocated zero tail is cut silently.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from localcluster.storage import (
    Log,
    LogConfig,
    Record,
    encode_batch,
    iter_records,
    read_partition_offsets,
)
from localcluster.storage.log import CLEAN_SHUTDOWN
from localcluster.storage.segment import REUSED_ATTRIBUTE, SUFFIX
from tests.helpers import check_indexes_agree, scan_log, wait_until
from tests.integration.log_appender import PARTITION, batch_checksum, checkpoint_path, config

REPOSITORY = Path(__file__).resolve().parents[2]
APPENDER = Path(__file__).with_name("log_appender.py")
CYCLES = 30
BUDGET_S = 30.0
SEGMENT_BYTES = 4096


@dataclass(frozen=True)
class Batch:
    first: int
    last: int
    checksum: int


def batches_in(log) -> list[Batch]:
    """What the log holds, recomputed from its records (offsets must be contiguous)."""
    out = []
    for *_, data in scan_log(log):
        records = list(iter_records(data))
        offsets = [r.offset for r in records]
        assert offsets == list(range(offsets[0], offsets[0] + len(records))), offsets
        out.append(Batch(offsets[0], offsets[-1], batch_checksum(records)))
    return out


def epochs_in(log) -> list[tuple[int, int]]:
    """The epoch history the batches imply: each epoch starts at its first batch."""
    history: list[tuple[int, int]] = []
    for *_, header, _ in scan_log(log):
        if not history or header.partition_leader_epoch > history[-1][0]:
            history.append((header.partition_leader_epoch, header.base_offset))
    return history


def replay(events: list[str], state: list[Batch]):
    """Apply the child's completed steps to `state`; return (state, the step in flight)."""
    pending = None
    for line in events:
        kind, *fields = line.split()
        numbers = [int(x) for x in fields]
        if kind == "S":
            pending = None
        elif kind == "O":
            if state:
                expected = [state[0].first, state[-1].last + 1]
                assert numbers == expected, ("child opened at", numbers, "expected", expected)
            pending = None
        elif kind == "W":
            pending = ("append", numbers[0], numbers[1])
        elif kind == "A":
            first, last, checksum = numbers
            assert pending == ("append", last - first + 1, checksum), (pending, line)
            if state:
                assert first == state[-1].last + 1, (line, state[-1])
            state = state + [Batch(first, last, checksum)]
            pending = None
        elif kind == "R":
            pending = ("retention",)
        elif kind == "r":
            assert pending == ("retention",), (pending, line)
            assert not state or state[0].first <= numbers[0] <= state[-1].first, (line, state[0])
            state = [b for b in state if b.first >= numbers[0]]
            pending = None
        elif kind == "T":
            pending = ("truncate", numbers[0])
        elif kind == "t":
            assert pending and pending[0] == "truncate", (pending, line)
            state = [b for b in state if b.last < pending[1]]
            assert numbers[0] == (state[-1].last + 1 if state else numbers[0]), (line, state[-1:])
            pending = None
    return state, pending


def active_segment_reused(log_dir: Path) -> bool:
    """The child was killed while its active segment was written in a retired segment's file
    (segment.py, "Reused files"): old bytes lie past its last batch."""
    last = max(log_dir.glob("*" + SUFFIX), default=None)
    try:
        return last is not None and bool(os.getxattr(last, REUSED_ATTRIBUTE))
    except OSError:
        return False


def check_recovered(log, state: list[Batch], pending, seed: int, cycle: int) -> list[Batch]:
    where = f"(seed {seed}, cycle {cycle}, in flight: {pending})"
    actual = batches_in(log)
    if pending is None:
        assert actual == state, where
    elif pending[0] == "append":
        _, count, checksum = pending
        start = state[-1].last + 1 if state else log.log_start_offset
        torn_or_done = [state, state + [Batch(start, start + count - 1, checksum)]]
        assert actual in torn_or_done, where
        if log.cuts:
            assert actual == state, f"a cut but the batch in flight survived {where}"
    elif pending[0] == "retention":  # whole old segments gone from the front, or not yet
        assert actual == state[len(state) - len(actual) :], where
        assert not log.cuts, f"retention left something to cut {where}: {log.cuts}"
    else:  # a truncation in flight: any prefix between its target and the old log
        kept = [b for b in state if b.last < pending[1]]
        assert actual == state[: len(actual)] and len(actual) >= len(kept), where
        assert not log.cuts, f"a truncation left something to cut {where}: {log.cuts}"
    for cut in log.cuts:
        assert cut.bytes_cut > 0 and cut.reason, cut
    check_indexes_agree(log)
    assert log.leader_epoch_cache.entries() == epochs_in(log), where
    assert log.log_end_offset == (actual[-1].last + 1 if actual else log.log_start_offset), where
    if actual:
        assert log.log_start_offset == actual[0].first, where
    return actual


def test_kill_9_at_random_moments_never_loses_a_completed_append():
    seed = int(os.environ.get("LOG_CRASH_SEED") or random.randrange(2**32))
    print(f"log crash test seed: {seed} (rerun with LOG_CRASH_SEED={seed})")
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="log-crash-", dir="/dev/shm"))
    log_dir = root / "crash-0"
    events = root / "events"
    stderr_path = root / "child.stderr"
    state: list[Batch] = []
    epoch = 0
    child = None
    started = time.monotonic()
    cycles = 0
    seen = {
        "append in flight": 0,
        "truncation in flight": 0,
        "between steps": 0,
        "cuts": 0,
        "truncations done": 0,
        "retention runs": 0,
        "retention in flight": 0,
        "in-flight batch kept": 0,
        "killed opening": 0,
        "reused active segment": 0,
    }
    try:
        for cycle in range(CYCLES):
            if cycle >= 8 and time.monotonic() - started > BUDGET_S:
                break
            cycles += 1
            epoch += 1
            events.write_bytes(b"")
            with open(stderr_path, "wb") as stderr:
                child = subprocess.Popen(
                    [sys.executable, str(APPENDER), str(log_dir), str(events), str(rng.randrange(2**32)),
                     str(epoch), str(SEGMENT_BYTES)],
                    cwd=REPOSITORY, env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
                    stdout=subprocess.DEVNULL, stderr=stderr,
                )  # fmt: skip
            # Kill while it opens (recovers) the log, just after, or after 1..60 appends.
            mode = rng.choices(["S", "O", "A"], weights=[1, 1, 8])[0]
            target = rng.randint(1, 60) if mode == "A" else 1

            def reached(child=child, cycle=cycle, mode=mode, target=target):
                if child.poll() is not None:
                    raise AssertionError(f"child exited {child.returncode} (seed {seed}, cycle "
                                         f"{cycle}): {stderr_path.read_text()[-3000:]}")  # fmt: skip
                text = events.read_text()
                return text.count(f"\n{mode}") + text.startswith(mode) >= target

            wait_until(reached, timeout_s=15, message=f"{target} x {mode} (seed {seed})")
            os.kill(child.pid, signal.SIGKILL)
            assert child.wait(timeout=10) == -signal.SIGKILL
            child = None

            lines = events.read_text().splitlines()
            committed, pending = replay(lines, state)
            seen["truncations done"] += sum(line.startswith("t ") for line in lines)
            seen["retention runs"] += sum(line.startswith("r ") for line in lines)
            seen[
                {
                    None: "between steps",
                    "append": "append in flight",
                    "truncate": "truncation in flight",
                    "retention": "retention in flight",
                }[pending and pending[0]]
            ] += 1
            point = read_partition_offsets(checkpoint_path(log_dir)).get(PARTITION, 0)
            seen["reused active segment"] += active_segment_reused(log_dir)
            log = Log.open(log_dir, config(SEGMENT_BYTES), recovery_point=point)
            try:
                state = check_recovered(log, committed, pending, seed, cycle)
                seen["cuts"] += len(log.cuts)
                seen["in-flight batch kept"] += pending is not None and len(state) > len(committed)
                seen["killed opening"] += lines[-1] == "S"
                # Appending continues where recovery left the log.
                epoch += 1
                records = [Record(b"parent %d" % cycle, key=b"p")]
                info = log.append(encode_batch(records), leader_epoch=epoch)
                assert info.first_offset == (state[-1].last + 1 if state else log.log_start_offset)
                state.append(Batch(info.first_offset, info.last_offset, batch_checksum(records)))
                assert batches_in(log) == state
                check_indexes_agree(log)
            finally:
                log.close()
            if rng.random() < 0.5:
                (log_dir / CLEAN_SHUTDOWN).unlink()  # the child must then recover it too
        print(
            f"{cycles} kills in {time.monotonic() - started:.1f} s; {seen}; "
            f"{len(state)} batches, offsets up to {state[-1].last if state else None}"
        )
        assert cycles >= 8
        assert state, f"nothing was ever appended (seed {seed})"
    except BaseException as error:
        error.add_note(f"log crash test seed: {seed}")
        raise
    finally:
        if child is not None and child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


# -- deterministic torn writes ------------------------------------------------------------------

CONFIG = LogConfig(segment_bytes=8192, segment_index_bytes=800)


def crashed_log(directory: Path, n: int = 5) -> tuple[Path, int, list[Batch]]:
    """A log with `n` batches whose process 'died': no close, preallocated tail, no marker."""
    log = Log.open(directory, CONFIG)
    for i in range(n):
        log.append(encode_batch([Record(b"record %d" % i * 20)]), leader_epoch=1)
    expected = batches_in(log)
    segment = log.active_segment
    path, size = segment.path, segment.size
    assert os.path.getsize(path) == CONFIG.segment_bytes  # preallocated
    return path, size, expected


def test_preallocated_zero_tail_is_cut_silently(tmp_path, caplog):
    path, size, expected = crashed_log(tmp_path)
    with caplog.at_level(logging.INFO, logger="localcluster.storage"):
        log = Log.open(tmp_path, CONFIG)
    try:
        assert log.cuts == []
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert batches_in(log) == expected
        assert log.active_segment.size == size
        check_indexes_agree(log)
    finally:
        log.close()
    assert os.path.getsize(path) == size


@pytest.mark.parametrize("part", ["head", "body", "all but the last byte"])
def test_torn_batch_at_the_tail_is_cut_and_logged(tmp_path, caplog, part):
    path, size, expected = crashed_log(tmp_path)
    torn = encode_batch([Record(b"torn" * 50, key=b"t")])
    if part == "head":  # the first 40 bytes landed (length included), the rest did not
        piece, at = torn[:40], size
    elif part == "body":  # everything but the first 12 bytes (what append writes last)
        piece, at = torn[12:], size + 12
    else:
        piece, at = torn[:-1], size
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, piece, at)
    finally:
        os.close(fd)
    with caplog.at_level(logging.WARNING, logger="localcluster.storage"):
        log = Log.open(tmp_path, CONFIG)
    try:
        assert batches_in(log) == expected
        assert len(log.cuts) == 1
        cut = log.cuts[0]
        assert (cut.segment, cut.position, cut.bytes_cut) == (
            path.name,
            size,
            CONFIG.segment_bytes - size,
        )
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1
        assert (
            f"recovery cut {cut.bytes_cut} bytes at position {size} of {path.name}" in warnings[0]
        )
        assert cut.reason in warnings[0]
        check_indexes_agree(log)
        info = log.append(encode_batch([Record(b"after")]), leader_epoch=2)
        assert info.first_offset == expected[-1].last + 1
    finally:
        log.close()
    reopened = Log.open(tmp_path, CONFIG)
    try:
        assert batches_in(reopened)[:-1] == expected and reopened.cuts == []
    finally:
        reopened.close()


def test_torn_batch_past_the_end_of_a_trimmed_segment(tmp_path, caplog):
    log = Log.open(tmp_path, CONFIG)
    for i in range(3):
        log.append(encode_batch([Record(b"x%d" % i * 30)]), leader_epoch=0)
    expected = batches_in(log)
    log.close()
    (tmp_path / CLEAN_SHUTDOWN).unlink()  # died after extending the file, before the marker
    path = log.segments[0].path
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(encode_batch([Record(b"y" * 100)])[:70])
    with caplog.at_level(logging.WARNING, logger="localcluster.storage"):
        again = Log.open(tmp_path, CONFIG)
    try:
        assert batches_in(again) == expected
        assert [(c.position, c.bytes_cut) for c in again.cuts] == [(size, 70)]
        assert "runs past" in again.cuts[0].reason
        assert any("recovery cut 70 bytes" in r.getMessage() for r in caplog.records)
    finally:
        again.close()
