"""localcluster.backoff: initial, doubled per failure, capped."""

from __future__ import annotations

import pytest

from localcluster.backoff import ExponentialBackoff


def test_doubles_from_the_initial_wait_up_to_the_cap():
    backoff = ExponentialBackoff(initial_s=0.05, max_s=1.0)
    assert [backoff.backoff_s(n) for n in range(1, 8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.backoff_s(10_000) == 1.0  # a long outage neither overflows nor grows


def test_a_wait_before_any_failure_is_a_programming_error():
    with pytest.raises(AssertionError):
        ExponentialBackoff(initial_s=0.05, max_s=1.0).backoff_s(0)
    with pytest.raises(AssertionError):
        ExponentialBackoff(initial_s=2.0, max_s=1.0)
