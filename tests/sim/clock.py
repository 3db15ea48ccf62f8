"""ManualClock: simulated time in milliseconds. Nothing in the simulator reads a real clock."""

from __future__ import annotations


class ManualClock:
    def __init__(self, start_ms: int = 0):
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance_to(self, at_ms: int) -> None:
        assert at_ms >= self._now_ms, (at_ms, self._now_ms)  # time never runs backwards
        self._now_ms = at_ms

    def advance(self, delta_ms: int) -> None:
        self.advance_to(self._now_ms + delta_ms)


class Scheduler:
    """A heap of (time, sequence, action): equal times run in the order they were scheduled,
    so a run depends on nothing but the seed."""

    def __init__(self, clock: ManualClock):
        import heapq

        self._heapq = heapq
        self.clock = clock
        self._heap: list = []
        self._seq = 0

    def at(self, at_ms: int, action, *args) -> None:
        self._seq += 1
        self._heapq.heappush(self._heap, (max(at_ms, self.clock.now_ms()), self._seq, action, args))

    def after(self, delay_ms: int, action, *args) -> None:
        self.at(self.clock.now_ms() + delay_ms, action, *args)

    def next_time_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def run_one(self) -> bool:
        """Advance the clock to the next action and run it; False when nothing is left."""
        if not self._heap:
            return False
        at_ms, _, action, args = self._heapq.heappop(self._heap)
        self.clock.advance_to(at_ms)
        action(*args)
        return True

    def __len__(self) -> int:
        return len(self._heap)
