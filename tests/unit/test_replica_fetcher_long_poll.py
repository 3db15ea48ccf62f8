"""The follower's long poll never outlasts the backoff of a partition it left out."""

from __future__ import annotations

from localcluster.replication.fetch_sessions import PartitionFetchState, long_poll_ms


def test_the_whole_wait_when_no_partition_backs_off():
    states = [PartitionFetchState(3, False), PartitionFetchState(3, False, backoff_until_ms=9000)]
    assert long_poll_ms(states, now_ms=10_000, wait_max_ms=500) == 500  # that backoff is over


def test_no_longer_than_until_the_first_backoff_ends():
    states = [PartitionFetchState(3, False), PartitionFetchState(4, True, backoff_until_ms=10_250),
              PartitionFetchState(4, False, backoff_until_ms=10_500)]  # fmt: skip
    assert long_poll_ms(states, now_ms=10_000, wait_max_ms=500) == 250
    assert long_poll_ms(states, now_ms=10_000, wait_max_ms=20) == 20
    assert long_poll_ms(states, now_ms=10_249, wait_max_ms=500) == 1  # never 0 early
