"""Exponential backoff between retries, as Kafka's ExponentialBackoff: the one place that says
how long to wait after the n-th failure in a row.

Pure arithmetic (no clock, no sleep): the caller counts its failures and sleeps. No jitter:
each retrying loop here talks to one peer, so there is no herd to spread.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExponentialBackoff:
    initial_s: float
    max_s: float
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        assert 0 < self.initial_s <= self.max_s and self.multiplier >= 1, self

    def backoff_s(self, failures: int) -> float:
        """The wait after `failures` failures in a row (1: the first): initial_s, doubled
        each time, at most max_s."""
        assert failures >= 1, failures
        exponent = min(failures - 1, 64)  # past the cap long before: keeps the power finite
        return min(self.initial_s * self.multiplier**exponent, self.max_s)
