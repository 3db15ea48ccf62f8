"""The prefault thread: what it populates, in what order, and never after a region closed."""

from __future__ import annotations

import mmap

import pytest

from localcluster.storage import prefault
from localcluster.storage.segment import LogSegment
from tests.helpers import scan_segment
from tests.unit.test_segment import put

pytestmark = pytest.mark.skipif(
    not prefault.AVAILABLE, reason="no MADV_POPULATE_WRITE (Linux < 5.14)"
)


@pytest.fixture
def calls(monkeypatch):
    """The thread's madvise calls, recorded and then made for real."""
    made = []
    real = prefault._madvise

    def recording(address, length, advice):
        made.append((address, length, advice))
        return real(address, length, advice)

    monkeypatch.setattr(prefault, "_madvise", recording)
    return made


def test_populates_requested_ranges_of_open_regions_only(calls):
    mm = mmap.mmap(-1, 16 * mmap.PAGESIZE)
    region = prefault.MappedRegion(mm)
    prefault.PREFAULTER.request(region, 0, 4 * mmap.PAGESIZE)
    prefault.PREFAULTER.request(region, 4 * mmap.PAGESIZE, 32 * mmap.PAGESIZE)  # past the end
    assert prefault.PREFAULTER.idle()
    region.close()
    prefault.PREFAULTER.request(region, 8 * mmap.PAGESIZE, 12 * mmap.PAGESIZE)
    assert prefault.PREFAULTER.idle()
    assert calls == [(region.address, 4 * mmap.PAGESIZE, prefault.MADV_POPULATE_WRITE)]
    mm.close()  # the region took no lasting export of the buffer


def test_a_segment_asks_for_each_next_chunk_ahead_of_its_writer(tmp_path, calls):
    chunk = 4 * mmap.PAGESIZE
    segment = LogSegment.create(tmp_path, 0, 64 * chunk, 4096, chunk)
    offset = 0
    while segment.can_hold(1100, 1):
        put(segment, offset, size=1000)
        offset += 1
    assert prefault.PREFAULTER.idle()
    starts = [address - segment._region.address for address, _, _ in calls]
    # every chunk in the background (the first as the segment was created), in order
    assert starts == [chunk * i for i in range(len(starts))]
    assert len(starts) >= 60
    segment.close()
    reopened = LogSegment.open_existing(tmp_path, 0, 64 * chunk, 4096, chunk)
    assert [h.base_offset for _, h in scan_segment(reopened)] == list(range(offset))
    reopened.close()


def test_a_forked_child_gets_its_own_prefault_thread():
    import os

    parent_map = mmap.mmap(-1, mmap.PAGESIZE)
    prefault.PREFAULTER.request(prefault.MappedRegion(parent_map), 0, mmap.PAGESIZE)
    assert prefault.PREFAULTER.idle()  # the parent's thread runs
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is gone, a request must start a new one
        mm = mmap.mmap(-1, mmap.PAGESIZE)
        prefault.PREFAULTER.request(prefault.MappedRegion(mm), 0, mmap.PAGESIZE)
        os._exit(0 if prefault.PREFAULTER.idle(5) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
