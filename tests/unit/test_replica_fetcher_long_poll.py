"""The follower's long poll never outlasts the backoff of a partition it left out."""

from __future__ import annotations

from localcluster.broker.replica_fetcher import FollowedPartition, long_poll_ms


def test_the_whole_wait_when_no_partition_backs_off():
    partitions = [FollowedPartition(3, False), FollowedPartition(3, False, backoff_until=9.0)]
    assert long_poll_ms(partitions, now=10.0, wait_max_ms=500) == 500  # that backoff is over


def test_no_longer_than_until_the_first_backoff_ends():
    partitions = [FollowedPartition(3, False), FollowedPartition(4, True, backoff_until=10.25),
                  FollowedPartition(4, False, backoff_until=10.5)]  # fmt: skip
    assert long_poll_ms(partitions, now=10.0, wait_max_ms=500) == 250
    assert long_poll_ms(partitions, now=10.0, wait_max_ms=20) == 20
    assert long_poll_ms(partitions, now=10.2499, wait_max_ms=500) == 1  # rounds up, never 0 early
