"""The commit queue (the design's commitQ): acks=all produces parked until the HW passes them.

Pure bookkeeping: the runtime parks a produce with the offset it needs committed and a
deadline, and feeds HW moves, leadership loss and time; each returns the produces to answer
and with which error code. Kafka's completion rule: once the HW reaches the produce, it
succeeds if the ISR still has `min.insync.replicas` members, else it fails with
NOT_ENOUGH_REPLICAS_AFTER_APPEND (an ISR that shrank while waiting lets the HW pass sooner,
so the check happens at completion).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass

from localcluster.replication import errors

MAX_PARKED = 100_000  # bound: each parked produce holds a client connection's request
COMPACT_AFTER = 1024  # answered produces left in the deadline heap before it is rebuilt


@dataclass(slots=True, eq=False)  # identity: two equal produces are still two
class ParkedProduce:
    key: object
    tp: tuple[str, int]
    required_offset: int  # answered once high_watermark >= required_offset
    deadline_ms: int


class ProducePurgatoryFullError(Exception):
    pass


class ProducePurgatory:
    def __init__(self):
        self._by_partition: dict[tuple[str, int], list[ParkedProduce]] = defaultdict(list)
        self._deadlines: list[tuple[int, int, ParkedProduce]] = []
        self._done: set[int] = set()
        self._count = 0
        self._seq = 0

    def __len__(self) -> int:
        return self._count

    def park(self, key, tp, required_offset: int, deadline_ms: int) -> None:
        if self._count >= MAX_PARKED:
            raise ProducePurgatoryFullError(f"{self._count} produces already wait for the HW")
        parked = ParkedProduce(key, tp, required_offset, deadline_ms)
        self._by_partition[tp].append(parked)
        self._seq += 1
        heapq.heappush(self._deadlines, (deadline_ms, self._seq, parked))
        self._count += 1

    def on_high_watermark(self, tp, high_watermark: int, isr_size: int,
                          min_insync_replicas: int) -> list[tuple[object, int]]:  # fmt: skip
        waiting = self._by_partition.get(tp)
        if not waiting:
            return []
        ready = [p for p in waiting if p.required_offset <= high_watermark]
        if not ready:
            return []
        self._by_partition[tp] = [p for p in waiting if p.required_offset > high_watermark]
        error = errors.NONE if isr_size >= min_insync_replicas else (
            errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND)  # fmt: skip
        return self._complete(ready, error)

    def on_leadership_lost(self, tp) -> list[tuple[object, int]]:
        waiting = self._by_partition.pop(tp, [])
        return self._complete(waiting, errors.NOT_LEADER_OR_FOLLOWER)

    def expire(self, now_ms: int) -> list[tuple[object, int]]:
        """Time out what is due, and drop answered produces from the heap's top, so that
        `next_deadline_ms` is a produce still waiting."""
        expired = []
        while self._deadlines and (self._deadlines[0][0] <= now_ms
                                   or id(self._deadlines[0][2]) in self._done):  # fmt: skip
            _, _, parked = heapq.heappop(self._deadlines)
            if id(parked) in self._done:
                self._done.discard(id(parked))
                continue
            waiting = self._by_partition.get(parked.tp, [])
            if parked in waiting:
                waiting.remove(parked)
                expired.append(parked)
        return self._complete(expired, errors.REQUEST_TIMED_OUT, from_heap=True)

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline in the heap (after `expire`: of a produce still waiting)."""
        return self._deadlines[0][0] if self._deadlines else None

    def _complete(self, parked: list[ParkedProduce], error: int, from_heap: bool = False):
        self._count -= len(parked)
        if not from_heap:
            self._done.update(id(p) for p in parked)  # their heap entries are skipped later
            if len(self._done) > max(self._count, COMPACT_AFTER):
                # Answered produces would otherwise stay in the heap until their deadlines
                # (throughput x timeout entries): drop them once they outnumber the parked.
                self._deadlines = [e for e in self._deadlines if id(e[2]) not in self._done]
                heapq.heapify(self._deadlines)
                self._done.clear()
        return [(p.key, error) for p in parked]
