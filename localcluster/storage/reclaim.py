"""Freeing a deleted segment's pages on a background thread, off the event loop.

A segment file on tmpfs keeps its data in memory pages that the kernel frees only when the
last reference to the file goes: unmapping its mapping drops a page-table entry per page, and
closing its last descriptor (the file is unlinked already) frees each page. Both take time in
proportion to the data: about 0.4 ms per MiB together on this machine when it is quiet, more
when it is not. Done where the last reference used to drop, on the broker's event loop, a topic
deletion that removed 115 MB per broker stalled all three brokers' loops for 150-170 ms at once
(bench/README.md, "Stalls on the commit path"), and retention removing a full 1 GiB segment
would stop a broker for about half a second.

`Reclaimer` does both on one daemon thread. CPython's `mmap.close` and `FileIO.close` release
the GIL around munmap and close, so the loop runs on meanwhile. A segment hands its map and
file over only once nothing can read them any more: `LogSegment.delete` registers a finalizer
that runs when the segment object goes, and every FileSlice in flight holds its segment. A map
still exported to a memoryview cannot be closed (BufferError): it is left to go with the view,
on whichever thread drops it, as before.

Bound: one queue item (a map and a file object) per deleted segment not yet released.
"""

from __future__ import annotations

import logging

from localcluster.storage.work_thread import WorkThread

log = logging.getLogger(__name__)


class Reclaimer(WorkThread):
    """One daemon thread closing the maps and files of deleted segments, in order."""

    def __init__(self) -> None:
        super().__init__("reclaim")

    def release(self, mm, file) -> None:
        """Close `mm` (an mmap or None) and then `file` (a file object or None) on the thread."""
        self.submit(mm, file)

    def work(self, mm, file) -> None:
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # a memoryview still exports it: the map goes when the view does
        if file is not None:
            try:
                file.close()
            except OSError as e:
                log.debug("closing a deleted segment's file: %s", e)


RECLAIMER = Reclaimer()
