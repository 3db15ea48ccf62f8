"""Deadlines of one coordinator shard, keyed: the sans-I/O stand-in for Kafka's purgatories.

Kafka parks a DelayedHeartbeat per member, a DelayedJoin/InitialDelayedJoin and a DelayedSync
per group in purgatories driven by a timer wheel. Here each is a key with one deadline; arming
a key again replaces its deadline, cancelling drops it. The shard asks for the keys that are due
at `now_ms` (earliest first, ties in arming order, so runs are deterministic) and tells the
runtime the next deadline to wake it at. Stale heap entries are skipped and compacted away, so
the heap never holds more than about twice the live keys.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Hashable]] = []
        self._live: dict[Hashable, tuple[int, int]] = {}  # key -> (deadline_ms, sequence)
        self._sequence = 0

    def __len__(self) -> int:
        return len(self._live)

    def arm(self, key: Hashable, deadline_ms: int) -> None:
        self._sequence += 1
        self._live[key] = (deadline_ms, self._sequence)
        heapq.heappush(self._heap, (deadline_ms, self._sequence, key))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._compact()

    def cancel(self, key: Hashable) -> None:
        self._live.pop(key, None)

    def deadline(self, key: Hashable) -> int | None:
        entry = self._live.get(key)
        return None if entry is None else entry[0]

    def clear(self) -> None:
        self._heap.clear()
        self._live.clear()

    def next_deadline_ms(self) -> int | None:
        self._drop_stale_head()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> Hashable | None:
        """The earliest key whose deadline is at or before `now_ms`, disarmed; None if none."""
        self._drop_stale_head()
        if not self._heap or self._heap[0][0] > now_ms:
            return None
        _, _, key = heapq.heappop(self._heap)
        del self._live[key]
        return key

    def _drop_stale_head(self) -> None:
        while self._heap:
            deadline_ms, sequence, key = self._heap[0]
            if self._live.get(key) == (deadline_ms, sequence):
                return
            heapq.heappop(self._heap)

    def _compact(self) -> None:
        self._heap = [(d, s, k) for k, (d, s) in self._live.items()]
        heapq.heapify(self._heap)
