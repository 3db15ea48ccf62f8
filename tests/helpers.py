"""Small helpers shared by the tests: waiting on a condition, and storage scans.

Append only: several test modules (and engineers) share this file.
"""

from __future__ import annotations

from localcluster import waiting

# -- waiting ------------------------------------------------------------------------------------


def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.002, message: str = ""):
    """Return predicate()'s first truthy value; fail (AssertionError) when the deadline passes."""
    value = waiting.wait_until(predicate, timeout_s, interval_s)
    if not value:
        raise AssertionError(f"condition not met within {timeout_s} s: {message or predicate}")
    return value


# -- storage: what a log holds, read by a plain scan (the oracle for the indexes) ---------------


def scan_segment(segment):
    """(position, header) of every batch in `segment`, found by walking batchLength fields."""
    from localcluster.storage import record_batch as rb

    with segment.view(0, segment.size) as data:
        return list(rb.iter_batches(data))


def scan_log(log):
    """[(segment base, position, header, batch bytes)] of every batch, in log order."""
    out = []
    for segment in log.segments:
        for position, header in scan_segment(segment):
            with segment.view(position, header.size) as v:
                out.append((segment.base_offset, position, header, bytes(v)))
    return out


def check_indexes_agree(log) -> None:
    """Assert each segment's index and time index list exactly the batches a scan finds."""
    for segment in log.segments:
        scanned = scan_segment(segment)
        index = segment.index
        assert index.count == len(scanned), (segment, index.count, len(scanned))
        for i, (position, header) in enumerate(scanned):
            assert index.entry(i) == (header.base_offset - segment.base_offset, position), (
                segment,
                i,
                index.entry(i),
                position,
                header.base_offset,
            )
            assert int(index.max_timestamps[i]) == header.max_timestamp, (segment, i)
        expected_next = scanned[-1][1].next_offset if scanned else segment.base_offset
        assert segment.next_offset == expected_next, (segment, expected_next)
    bases = [s.base_offset for s in log.segments]
    assert bases == sorted(bases) and len(set(bases)) == len(bases), bases
    for earlier, later in zip(log.segments, log.segments[1:], strict=False):
        assert earlier.next_offset <= later.base_offset, (earlier, later)


# -- kafka-python -------------------------------------------------------------------------------


def poll_kafka_python(consumer, count: int, timeout_s: float, broker_killed: bool = False) -> list:
    """kafka-python records until `count` arrived or `timeout_s` passed (the caller asserts).
    With `broker_killed`, a poll that raises the connection error of a dead broker is polled
    again, as an application retries: kafka-python 3.0 can raise it from poll (its coordinator
    lookup) instead of trying another broker.

    Each poll may last until the deadline (it returns as soon as it has records): a kafka-python
    3.0 group member must not time out a poll between its JoinGroup and the SyncGroup answer. It
    takes that answer up only inside a poll that finds a rejoin still needed, and a rejoin the
    leader starts for a metadata change (the first join races the metadata of the new
    subscription, so this one is common) stops being needed once the leader has assigned: a poll
    that gave up on the join leaves the member rebalancing, without heartbeats or fetches, until
    something else makes it rejoin. (Java's rejoinNeededOrPending also counts a pending join;
    kafka-python's need_rejoin does not; docs/groups.md.) 200 ms polls gave up so under CPU
    load, about one run in 20."""
    import time

    from kafka.errors import KafkaConnectionError

    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and (left_s := deadline - time.monotonic()) > 0:
        try:
            polled = consumer.poll(timeout_ms=max(int(left_s * 1000), 1))
        except KafkaConnectionError:
            if not broker_killed:
                raise
            time.sleep(0.05)  # an application's retry backoff, not a wait for a condition
            continue
        for records in polled.values():
            got.extend(records)
    return got
