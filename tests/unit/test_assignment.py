"""Replica assignment: Kafka's assignReplicasToBrokers, its worked examples and its properties."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.controller.assignment import (
    InvalidReplicationFactorError,
    assign_replicas_to_brokers,
    rack_alternated_broker_list,
    replica_index,
)

# design-docs/003: 5 brokers, 10 partitions, RF 3, start index 0. Read off its table: each
# partition's 1st, 2nd and 3rd replica (the shift grows by one at partition 5).
DESIGN_DOC_TABLE = {
    0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
    5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2],
}  # fmt: skip


def test_design_doc_table():
    assert (
        assign_replicas_to_brokers([0, 1, 2, 3, 4], 10, 3, fixed_start_index=0) == DESIGN_DOC_TABLE
    )


def test_broker_order_does_not_matter_without_racks():
    assert (
        assign_replicas_to_brokers([3, 0, 4, 2, 1], 10, 3, fixed_start_index=0) == DESIGN_DOC_TABLE
    )


def test_broker_ids_need_not_be_contiguous():
    ids = [10, 20, 30, 40, 50]
    expected = {p: [ids[b] for b in r] for p, r in DESIGN_DOC_TABLE.items()}
    assert assign_replicas_to_brokers(ids, 10, 3, fixed_start_index=0) == expected


def test_replica_index_formula():
    # (first + 1 + (shift + j) % (n - 1)) % n: never the first broker itself
    assert [replica_index(0, 0, j, 5) for j in range(4)] == [1, 2, 3, 4]
    assert [replica_index(0, 1, j, 5) for j in range(4)] == [2, 3, 4, 1]
    assert [replica_index(4, 0, j, 5) for j in range(4)] == [0, 1, 2, 3]
    assert all(replica_index(f, s, j, 5) != f for f in range(5) for s in range(7) for j in range(4))


def test_start_partition_id_continues_the_pattern():
    # adding partitions 5..9 to a topic whose 0..4 came from the same start index
    added = assign_replicas_to_brokers(
        [0, 1, 2, 3, 4], 5, 3, fixed_start_index=0, start_partition_id=5
    )
    assert added == {p: DESIGN_DOC_TABLE[p] for p in range(5, 10)}


def test_fixed_start_index_rotates_first_replicas():
    out = assign_replicas_to_brokers([0, 1, 2, 3, 4], 5, 1, fixed_start_index=2)
    assert [out[p][0] for p in range(5)] == [2, 3, 4, 0, 1]


def test_random_start_comes_from_the_rng():
    a = assign_replicas_to_brokers(range(6), 12, 3, rng=random.Random(7))
    b = assign_replicas_to_brokers(range(6), 12, 3, rng=random.Random(7))
    assert a == b
    starts = {
        assign_replicas_to_brokers(range(6), 1, 1, rng=random.Random(s))[0][0] for s in range(40)
    }
    assert len(starts) > 1  # not always the same first broker


# -- rack awareness ---------------------------------------------------------------------------------


def test_rack_alternated_list_worked_examples():
    racks = {0: "rack1", 1: "rack1", 2: "rack1", 3: "rack2", 4: "rack2", 5: "rack2",
             6: "rack3", 7: "rack3", 8: "rack3"}  # fmt: skip
    assert rack_alternated_broker_list(racks) == [0, 3, 6, 1, 4, 7, 2, 5, 8]
    racks = {0: "rack1", 5: "rack1", 3: "rack2", 4: "rack2", 1: "rack3", 2: "rack3"}
    assert rack_alternated_broker_list(racks) == [0, 3, 1, 5, 4, 2]


def test_rack_alternated_list_with_uneven_racks():
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2"}
    assert rack_alternated_broker_list(racks) == [0, 3, 1, 4, 2]
    assert rack_alternated_broker_list({0: "a", 1: "a", 2: "a", 3: "b"}) == [0, 3, 1, 2]


def test_rack_aware_matches_kafka():
    # Kafka's AdminRackAwareTest: 6 brokers on 3 racks, 7 partitions, RF 3, start index 0
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assert assign_replicas_to_brokers(sorted(racks), 7, 3, fixed_start_index=0, racks=racks) == {
        0: [0, 3, 1], 1: [3, 1, 5], 2: [1, 5, 4], 3: [5, 4, 2], 4: [4, 2, 0], 5: [2, 0, 3],
        6: [0, 4, 2],
    }  # fmt: skip


def test_rack_aware_design_doc_example():
    # design-docs/003: brokers 0,1 on rack1 and 2,3 on rack2, RF 2: every partition on both racks
    racks = {0: "rack1", 1: "rack1", 2: "rack2", 3: "rack2"}
    assert rack_alternated_broker_list(racks) == [0, 2, 1, 3]
    out = assign_replicas_to_brokers([0, 1, 2, 3], 4, 2, fixed_start_index=0, racks=racks)
    assert all({racks[b] for b in r} == {"rack1", "rack2"} for r in out.values())


def test_racks_all_none_is_rack_unaware():
    racks = dict.fromkeys(range(5))
    assert (
        assign_replicas_to_brokers(range(5), 10, 3, fixed_start_index=0, racks=racks)
        == DESIGN_DOC_TABLE
    )


# -- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "partitions, rf, error, match",
    [
        (0, 1, ValueError, "partitions must be positive, got 0"),
        (-3, 1, ValueError, "partitions must be positive"),
        (3, 0, InvalidReplicationFactorError, "replication factor must be positive"),
        (3, 4, InvalidReplicationFactorError, "replication factor 4 is larger than the 3"),
    ],
)
def test_bad_arguments(partitions, rf, error, match):
    with pytest.raises(error, match=match):
        assign_replicas_to_brokers([0, 1, 2], partitions, rf)


def test_some_brokers_without_rack_is_an_error():
    with pytest.raises(ValueError, match="some brokers have a rack and some do not"):
        assign_replicas_to_brokers([0, 1, 2], 3, 2, racks={0: "a", 1: "b", 2: None})
    with pytest.raises(ValueError, match="some brokers have a rack and some do not"):
        assign_replicas_to_brokers([0, 1, 2], 3, 2, racks={0: "a", 1: "b"})  # 2 not listed


def test_invalid_replication_factor_is_a_value_error():
    assert issubclass(InvalidReplicationFactorError, ValueError)


# -- properties ---------------------------------------------------------------------------------------


@st.composite
def clusters(draw, racked=False):
    brokers = sorted(draw(st.sets(st.integers(0, 50), min_size=1, max_size=12)))
    rf = draw(st.integers(1, len(brokers)))
    partitions = draw(st.integers(1, 40))
    start = draw(st.one_of(st.just(-1), st.integers(0, len(brokers) - 1)))
    racks = None
    if racked:
        n_racks = draw(st.integers(1, len(brokers)))
        racks = {b: f"r{draw(st.integers(0, n_racks - 1))}" for b in brokers}
    return brokers, partitions, rf, start, racks


def check_basic(out, brokers, partitions, rf, start_partition_id=0):
    assert sorted(out) == list(range(start_partition_id, start_partition_id + partitions))
    for replicas in out.values():
        assert len(replicas) == rf and len(set(replicas)) == rf
        assert set(replicas) <= set(brokers)


@settings(max_examples=200, deadline=None)
@given(clusters(), st.integers(0, 2**32))
def test_every_partition_gets_rf_distinct_brokers(cluster, seed):
    brokers, partitions, rf, start, _ = cluster
    out = assign_replicas_to_brokers(brokers, partitions, rf, fixed_start_index=start,
                                     rng=random.Random(seed))  # fmt: skip
    check_basic(out, brokers, partitions, rf)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 10), st.integers(1, 5), st.data())
def test_leaders_and_replicas_spread_evenly(n, rounds, data):
    brokers = list(range(n))
    rf = data.draw(st.integers(1, n))
    start = data.draw(st.one_of(st.just(-1), st.integers(0, n - 1)))
    out = assign_replicas_to_brokers(brokers, n * rounds, rf, fixed_start_index=start,
                                     rng=random.Random(data.draw(st.integers(0, 99))))  # fmt: skip
    leaders = Counter(r[0] for r in out.values())
    assert set(leaders) == set(brokers) and max(leaders.values()) - min(leaders.values()) <= 1
    replicas = Counter(b for r in out.values() for b in r)
    assert set(replicas.values()) == {rounds * rf}  # each broker holds the same number


@settings(max_examples=200, deadline=None)
@given(clusters(racked=True), st.integers(0, 2**32))
def test_rack_aware_spreads_over_racks(cluster, seed):
    brokers, partitions, rf, start, racks = cluster
    out = assign_replicas_to_brokers(brokers, partitions, rf, fixed_start_index=start,
                                     racks=racks, rng=random.Random(seed))  # fmt: skip
    check_basic(out, brokers, partitions, rf)
    n_racks = len(set(racks.values()))
    for replicas in out.values():
        # as many racks as possible: all distinct while RF <= racks, every rack when more
        assert len({racks[b] for b in replicas}) == min(rf, n_racks)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 4), st.data())
def test_rack_aware_leaders_spread_evenly(n_racks, per_rack, rounds, data):
    racks = {r * per_rack + i: f"rack{r}" for r in range(n_racks) for i in range(per_rack)}
    n = len(racks)
    rf = data.draw(st.integers(1, n))
    out = assign_replicas_to_brokers(list(racks), n * rounds, rf, racks=racks,
                                     rng=random.Random(data.draw(st.integers(0, 99))))  # fmt: skip
    leaders = Counter(r[0] for r in out.values())
    assert set(leaders) == set(racks) and max(leaders.values()) - min(leaders.values()) <= 1


@settings(max_examples=100, deadline=None)
@given(clusters(racked=True))
def test_rack_alternated_list_takes_racks_in_turn(cluster):
    brokers, _, _, _, racks = cluster
    arranged = rack_alternated_broker_list(racks)
    assert sorted(arranged) == brokers
    # within a rack brokers keep ascending order; each "round" visits each rack at most once
    for rack in set(racks.values()):
        mine = [b for b in arranged if racks[b] == rack]
        assert mine == sorted(mine)
    n_racks = len(set(racks.values()))
    first_round = arranged[:n_racks]
    assert len({racks[b] for b in first_round}) == n_racks
