"""cooperative-sticky (assignors.py) by its properties, over hypothesis' group shapes: every
partition exactly once and only to a subscriber, balanced (within one when the subscriptions
are equal), sticky (a member that keeps its subscription keeps its partitions when another
joins or leaves), and cooperative (a partition another member owns in the same generation is
never handed out; the incremental protocol settles within two rounds, never with a partition
owned twice)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.client.assignors import (
    COOPERATIVE,
    EAGER,
    MemberSubscription,
    cooperative_sticky_assign,
    parse_strategy,
    rebalance_protocol,
    sticky_assign,
    valid_owners,
)

TOPICS = ("a", "b", "c")
counts_strategy = st.fixed_dictionaries({t: st.integers(0, 9) for t in TOPICS})
subscriptions_strategy = st.lists(
    st.sets(st.sampled_from(TOPICS), min_size=1).map(lambda s: tuple(sorted(s))),
    min_size=1, max_size=6)  # fmt: skip


def member_ids(n: int) -> list[str]:
    return [f"member-{i}" for i in range(n)]


def subscribers(counts, topics) -> list[tuple[str, int]]:
    return [(t, p) for t in sorted(set(topics)) for p in range(counts.get(t, 0))]


def check_valid_and_balanced(counts, group: list[MemberSubscription], got) -> None:
    wanted = sorted({tp for m in group for tp in subscribers(counts, m.topics)})
    assert sorted(tp for tps in got.values() for tp in tps) == wanted  # each exactly once
    topics = {m.member_id: set(m.topics) for m in group}
    for member, tps in got.items():
        assert all(t in topics[member] for t, _ in tps), f"{member} got an unsubscribed topic"
    if len({m.topics for m in group}) == 1:
        sizes = [len(tps) for tps in got.values()]
        assert max(sizes) - min(sizes) <= 1
        return
    for source, tps in got.items():  # no partition could go to a member with two fewer
        for target in got:
            if len(got[target]) + 1 < len(tps):
                assert not [tp for tp in tps if tp[0] in topics[target]], (source, target, got)


def rebalance_rounds(counts, topics_of: dict[str, tuple[str, ...]], owned, generation: int):
    """The cooperative protocol over rounds until no member revokes: (owned after, rounds).
    Asserts that no partition is ever held by two members."""
    owned = {m: set(owned.get(m, ())) for m in topics_of}
    for rounds in range(1, 4):
        group = [MemberSubscription(m, topics_of[m], None, tuple(sorted(owned[m])), generation)
                 for m in topics_of]  # fmt: skip
        got = cooperative_sticky_assign(counts, group)
        revoked = False
        for member, tps in got.items():
            others = {tp for m, mine in owned.items() if m != member for tp in mine}
            added = set(tps) - owned[member]
            assert not added & others, f"{member} was given partitions another member owns"
        for member, tps in got.items():
            revoked |= bool(owned[member] - set(tps))
            owned[member] = set(tps)
        generation += 1
        if not revoked:
            return owned, rounds, generation
    raise AssertionError(f"no settled assignment after 3 rounds: {owned}")


@settings(max_examples=150, deadline=None)
@given(counts_strategy, subscriptions_strategy)
def test_every_partition_once_and_balanced(counts, subscriptions):
    group = [
        MemberSubscription(m, s)
        for m, s in zip(member_ids(len(subscriptions)), subscriptions, strict=True)
    ]
    check_valid_and_balanced(counts, group, sticky_assign(counts, group))


@settings(max_examples=150, deadline=None)
@given(counts_strategy, subscriptions_strategy, st.data())
def test_cooperative_settles_valid_balanced_and_never_owned_twice(counts, subscriptions, data):
    ids = member_ids(len(subscriptions))
    topics_of = dict(zip(ids, subscriptions, strict=True))
    # arbitrary (even unbalanced) owned partitions to start from, each with one owner
    all_tps = sorted({tp for s in subscriptions for tp in subscribers(counts, s)})
    owners = data.draw(st.lists(st.sampled_from([None, *ids]), min_size=len(all_tps),
                                max_size=len(all_tps)))  # fmt: skip
    start: dict[str, set] = {m: set() for m in ids}
    for tp, owner in zip(all_tps, owners, strict=True):
        if owner is not None and tp[0] in topics_of[owner]:
            start[owner].add(tp)
    owned, _, generation = rebalance_rounds(counts, topics_of, start, 5)
    group = [MemberSubscription(m, topics_of[m], None, tuple(sorted(owned[m])), generation)
             for m in ids]  # fmt: skip
    check_valid_and_balanced(counts, group, {m: sorted(tps) for m, tps in owned.items()})


@settings(max_examples=100, deadline=None)
@given(counts_strategy, st.integers(1, 6), st.sets(st.sampled_from(TOPICS), min_size=1))
def test_a_member_that_stays_keeps_its_partitions(counts, n, topics):
    topics = tuple(sorted(topics))
    ids = member_ids(n + 1)
    before, _, generation = rebalance_rounds(counts, {m: topics for m in ids[:n]}, {}, 1)
    # one joins: the others only give partitions up (they never take the newcomer's share)
    joined, rounds, _ = rebalance_rounds(counts, {m: topics for m in ids}, before, generation)
    assert rounds <= 2  # the second round hands out what the first one revoked
    for member in ids[:n]:
        assert joined[member] <= before[member]
        # and gives up only what balance needs
        assert len(joined[member]) >= min(len(before[member]), len(joined[ids[n]]))
    # one leaves: the others keep everything they had
    stay = {m: topics for m in ids if m != ids[0]}
    left, rounds, _ = rebalance_rounds(counts, stay, joined, generation + 2)
    assert rounds == 1  # nothing to revoke
    for member in stay:
        assert left[member] >= joined[member]


def test_claims_of_an_older_generation_or_contested_ones_do_not_count():
    counts = {"t": 3}
    group = [MemberSubscription("old", ("t",), None, (("t", 0),), 3),
             MemberSubscription("x", ("t",), None, (("t", 1), ("t", 2)), 4),
             MemberSubscription("y", ("t",), None, (("t", 2),), 4)]  # fmt: skip
    assert valid_owners(counts, group) == {("t", 1): "x"}


def test_a_partition_moving_is_left_out_until_its_owner_revoked_it():
    counts = {"t": 4}
    both = [MemberSubscription("a", ("t",), None, tuple(("t", p) for p in range(4)), 1),
            MemberSubscription("b", ("t",), None, (), 1)]  # fmt: skip
    first = cooperative_sticky_assign(counts, both)
    assert first == {"a": [("t", 0), ("t", 1)], "b": []}  # t-2, t-3 are a's: revoke first
    after = [MemberSubscription("a", ("t",), None, (("t", 0), ("t", 1)), 2),
             MemberSubscription("b", ("t",), None, (), 2)]  # fmt: skip
    assert cooperative_sticky_assign(counts, after) == {"a": [("t", 0), ("t", 1)],
                                                        "b": [("t", 2), ("t", 3)]}  # fmt: skip


def test_rebalance_protocol_is_cooperative_only_when_every_assignor_is():
    assert rebalance_protocol(parse_strategy("cooperative-sticky")) == COOPERATIVE
    assert rebalance_protocol(parse_strategy("range,cooperative-sticky")) == EAGER
    assert parse_strategy("org.apache.kafka.clients.consumer.CooperativeStickyAssignor") == (
        "cooperative-sticky",)  # fmt: skip
