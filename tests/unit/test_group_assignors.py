"""The range and roundrobin assignors against the Java client's worked cases (RangeAssignor's
and RoundRobinAssignor's javadoc and tests): every subscribed partition to exactly one
subscribed member, contiguous runs for range, dealt in turn for roundrobin, static members
ordered by group.instance.id."""

from __future__ import annotations

import itertools

import pytest

from localcluster.client.assignors import (
    MemberSubscription,
    parse_strategy,
    range_assign,
    roundrobin_assign,
)


def members(*specs):
    return [MemberSubscription(m, tuple(topics), instance) for m, topics, instance in specs]


def test_range_gives_the_first_members_one_more():
    # RangeAssignor's javadoc: C0 [t0p0, t0p1, t1p0, t1p1], C1 [t0p2, t1p2]
    got = range_assign({"t0": 3, "t1": 3},
                       members(("C0", ["t0", "t1"], None), ("C1", ["t0", "t1"], None)))  # fmt: skip
    assert got == {"C0": [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)],
                   "C1": [("t0", 2), ("t1", 2)]}  # fmt: skip


def test_range_orders_members_by_id_not_by_arrival():
    got = range_assign({"t": 4}, members(("b", ["t"], None), ("a", ["t"], None)))
    assert got == {"a": [("t", 0), ("t", 1)], "b": [("t", 2), ("t", 3)]}


def test_range_only_counts_the_members_subscribed_to_each_topic():
    got = range_assign({"x": 2, "y": 3},
                       members(("m1", ["x"], None), ("m2", ["x", "y"], None)))  # fmt: skip
    assert got == {"m1": [("x", 0)], "m2": [("x", 1), ("y", 0), ("y", 1), ("y", 2)]}


def test_range_more_members_than_partitions_leaves_some_empty():
    got = range_assign({"t": 2}, members(*((f"m{i}", ["t"], None) for i in range(4))))
    assert got == {"m0": [("t", 0)], "m1": [("t", 1)], "m2": [], "m3": []}


def test_static_members_order_by_instance_id_before_dynamic_ones():
    # the instance id decides, whatever member id the coordinator generated this time
    got = range_assign({"t": 3}, members(("zzz", ["t"], "a-instance"), ("aaa", ["t"], None),
                                         ("mmm", ["t"], "b-instance")))  # fmt: skip
    assert got == {"zzz": [("t", 0)], "mmm": [("t", 1)], "aaa": [("t", 2)]}


def test_unknown_topics_are_skipped():
    got = range_assign({"known": 1}, members(("m", ["known", "missing"], None)))
    assert got == {"m": [("known", 0)]}


def test_roundrobin_deals_sorted_partitions_in_turn():
    # RoundRobinAssignor's javadoc: C0 [t0p0, t0p2, t1p1], C1 [t0p1, t1p0, t1p2]
    got = roundrobin_assign({"t0": 3, "t1": 3},
                            members(("C0", ["t0", "t1"], None), ("C1", ["t0", "t1"], None)))  # fmt: skip
    assert got == {"C0": [("t0", 0), ("t0", 2), ("t1", 1)],
                   "C1": [("t0", 1), ("t1", 0), ("t1", 2)]}  # fmt: skip


def test_roundrobin_skips_members_not_subscribed():
    # the javadoc's uneven case: C0 [t0], C1 [t0, t1], C2 [t0, t1, t2]; t0 1, t1 2, t2 3
    got = roundrobin_assign({"t0": 1, "t1": 2, "t2": 3},
                            members(("C0", ["t0"], None), ("C1", ["t0", "t1"], None),
                                    ("C2", ["t0", "t1", "t2"], None)))  # fmt: skip
    assert got == {"C0": [("t0", 0)], "C1": [("t1", 0)],
                   "C2": [("t1", 1), ("t2", 0), ("t2", 1), ("t2", 2)]}  # fmt: skip


@pytest.mark.parametrize("assign", [range_assign, roundrobin_assign])
@pytest.mark.parametrize(
    "n_members,n_partitions", list(itertools.product((1, 2, 3, 7), (1, 6, 50)))
)
def test_every_partition_exactly_once_and_balanced(assign, n_members, n_partitions):
    group = members(*((f"member-{i}", ["a", "b"], None) for i in range(n_members)))
    got = assign({"a": n_partitions, "b": 2}, group)
    owned = [tp for tps in got.values() for tp in tps]
    assert sorted(owned) == sorted([("a", p) for p in range(n_partitions)] + [("b", 0), ("b", 1)])
    if assign is range_assign:  # balanced within each topic
        for topic in ("a", "b"):
            counts = [sum(1 for t, _ in tps if t == topic) for tps in got.values()]
            assert max(counts) - min(counts) <= 1
    else:  # balanced over all partitions
        counts = [len(tps) for tps in got.values()]
        assert max(counts) - min(counts) <= 1


def test_strategy_names_in_preference_order():
    assert parse_strategy("range,roundrobin") == ("range", "roundrobin")
    assert parse_strategy("org.apache.kafka.clients.consumer.RoundRobinAssignor, range") == (
        "roundrobin", "range")  # fmt: skip
    with pytest.raises(ValueError, match="'sticky'"):
        parse_strategy("sticky")  # the eager StickyAssignor is not here
    with pytest.raises(ValueError, match="names no assignor"):
        parse_strategy(" , ")
