"""file_map: shared maps that keep no descriptor, and what that saves a broker per replica."""

from __future__ import annotations

import os

import pytest

from localcluster.storage import Log, LogConfig, Record, encode_batch, file_map


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_map_keeps_no_descriptor_and_closes_none(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(8192))
    before = open_fds()
    fd = os.open(path, os.O_RDWR)
    mapping = file_map.map_file(fd, 8192)
    os.close(fd)
    assert open_fds() == before + file_map.FDS_PER_MAP
    mapping[100:105] = b"hello"  # the map outlives the descriptor it was made from
    mapping.flush()
    assert path.read_bytes()[100:105] == b"hello"
    other = os.open(path, os.O_RDONLY)  # may take the number the map's copy had
    try:
        mapping.close()
        os.fstat(other)  # closing the map closed no one else's descriptor
    finally:
        os.close(other)
    assert open_fds() == before


@pytest.mark.skipif(file_map.FDS_PER_MAP, reason="this Python's mmap layout is unknown")
def test_a_log_holds_one_descriptor_per_segment(tmp_path):
    config = LogConfig(segment_bytes=4096)
    batch = encode_batch([Record(b"v" * 1000, timestamp=1000)])
    before = open_fds()
    logs = [Log.open(tmp_path / f"t-{i}", config) for i in range(40)]
    try:
        for log in logs:
            log.append(batch, leader_epoch=0)
        assert open_fds() - before <= len(logs) + 2  # one file per active segment
        for log in logs[:10]:
            log.roll()
            log.append(batch, leader_epoch=0)
        # A sealed segment still holds its file (sendfile reads it), its indexes none.
        assert open_fds() - before <= len(logs) + 10 + 2
        assert [log.read(0, 1 << 20).tobytes()[61:] for log in logs[:10]] == [
            bytes(batch)[61:]
        ] * 10
    finally:
        for log in logs:
            log.close()
    assert open_fds() == before
