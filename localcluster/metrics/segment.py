"""The metrics board's shared memory segment by name and size, without numpy.

`up` creates the segment before it spawns the brokers and `down` removes it; neither needs
the board's numpy layout, so they import only this (numpy's import would delay every broker).
SIZE is the layout's size, held equal to board.py's by an assert there. A segment created here
is all zeros; the first opener that finds no magic number writes the header (board.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import posix_ipc

SIZE = 761_920  # == board.HEADER_BYTES + board.MAX_BROKERS * board.ROW.itemsize (asserted there)


def cluster_hash(cluster_dir: os.PathLike | str) -> str:
    """The same hash as broker.server.cluster_hash (a unit test holds them together); kept
    here so readers need not import the broker."""
    return hashlib.sha1(str(Path(cluster_dir).resolve()).encode()).hexdigest()[:12]


def segment_name(cluster_dir: os.PathLike | str) -> str:
    return f"/localcluster-{cluster_hash(cluster_dir)}-metrics"


def create_segment(cluster_dir: os.PathLike | str) -> None:
    """Create the zero-filled segment unless it exists (idempotent)."""
    shm = posix_ipc.SharedMemory(segment_name(cluster_dir), posix_ipc.O_CREAT, mode=0o600)
    try:
        if shm.size < SIZE:
            os.ftruncate(shm.fd, SIZE)
    finally:
        shm.close_fd()


def unlink_segment(cluster_dir: os.PathLike | str) -> bool:
    try:
        posix_ipc.unlink_shared_memory(segment_name(cluster_dir))
        return True
    except posix_ipc.ExistentialError:
        return False


def segment_exists(cluster_dir: os.PathLike | str) -> bool:
    return Path("/dev/shm", segment_name(cluster_dir).lstrip("/")).exists()
