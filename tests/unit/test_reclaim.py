"""storage/reclaim.py: a deleted segment's map and file are closed on the reclaim thread, once
nothing reads the segment any more; never on the thread that drops it (the event loop)."""

from __future__ import annotations

import gc
import os
import threading

import pytest

from localcluster.storage import FileSlice, Record, encode_batch, validate_batch
from localcluster.storage.reclaim import RECLAIMER
from localcluster.storage.segment import LogSegment

DEADLINE_S = 10.0


def segment_with_data(tmp_path):
    segment = LogSegment.create(tmp_path, 0, 64 * 1024, 128)
    data = encode_batch([Record(b"x" * 100, timestamp=1000 + i) for i in range(5)])
    segment.append_batch(memoryview(data), 0, validate_batch(data), 0, 0)
    return segment, data


@pytest.fixture
def held_reclaimer():
    """The reclaim thread, held on a gate until the test opens it (so whatever was closed
    before that was closed by someone else)."""
    RECLAIMER.release(None, None)  # make sure the thread runs
    assert RECLAIMER.idle(DEADLINE_S)
    gate, entered = threading.Event(), threading.Event()

    class Gate:
        def close(self):
            entered.set()
            assert gate.wait(DEADLINE_S)

    RECLAIMER.release(None, Gate())
    assert entered.wait(DEADLINE_S)
    yield gate
    gate.set()
    assert RECLAIMER.idle(DEADLINE_S)


def test_a_deleted_segment_is_released_on_the_reclaim_thread(tmp_path, held_reclaimer):
    segment, _ = segment_with_data(tmp_path)
    mm, file = segment._mm, segment._file
    segment.delete()
    assert not segment.path.exists()
    del segment
    gc.collect()
    assert not mm.closed and not file.closed  # dropping it closed nothing here
    held_reclaimer.set()
    assert RECLAIMER.idle(DEADLINE_S)
    assert mm.closed and file.closed


def test_a_file_slice_keeps_a_deleted_segment_readable_until_dropped(tmp_path, held_reclaimer):
    segment, data = segment_with_data(tmp_path)
    mm = segment._mm
    piece = FileSlice(segment, 0, len(data))
    segment.delete()
    del segment
    held_reclaimer.set()
    assert RECLAIMER.idle(DEADLINE_S)
    assert not mm.closed  # the slice holds the segment
    assert piece.tobytes()[16:] == data[16:]  # (offset and epoch are the log's own)
    del piece
    assert RECLAIMER.idle(DEADLINE_S)
    assert mm.closed


def test_a_view_still_exported_leaves_the_map_to_the_view(tmp_path):
    segment, data = segment_with_data(tmp_path)
    mm, file = segment._mm, segment._file
    view = segment.view(0, len(data))
    segment.delete()
    del segment
    assert RECLAIMER.idle(DEADLINE_S)
    assert file.closed and not mm.closed  # BufferError on close: left to the view
    assert bytes(view[16:]) == data[16:]
    view.release()
    mm.close()


def test_a_forked_child_gets_its_own_reclaim_thread():
    RECLAIMER.release(None, None)
    assert RECLAIMER.idle(DEADLINE_S)  # the parent's thread runs
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is gone, a submission must start a new one
        RECLAIMER.release(None, None)
        os._exit(0 if RECLAIMER.idle(5) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
