"""Partition assignors of the classic consumer protocol: "range", "roundrobin" and
"cooperative-sticky".

The group leader runs one of these over every member's subscription and the partition counts
of the subscribed topics; each is a pure function with the Java client's rules, so a group
mixing our client with librdkafka's or the Java client assigns validly whoever leads:
- range (RangeAssignor): per topic, the members subscribed to it in order, each a contiguous
  run of partitions; the first `partitions % members` get one more.
- roundrobin (RoundRobinAssignor): every partition of every subscribed topic, sorted by topic
  and partition, dealt to the members in turn, skipping a member not subscribed to its topic.
- cooperative-sticky (CooperativeStickyAssignor, KIP-429): as balanced as the subscriptions
  allow while moving as few partitions as possible from the members that own them (the owned
  partitions and generation of ConsumerProtocolSubscription v1+). A partition that moves to
  another member is left out of this round: its owner revokes it and rejoins, and the second
  rebalance gives it to its new member, so no partition is ever owned by two members at once.
Members are ordered as Java's MemberInfo: by group.instance.id when a member has one (static
members keep their place across restarts), else by member id.

Rebalance protocols (Java's RebalanceProtocol): a member speaks "cooperative" only when every
assignor it lists supports it (cooperative-sticky alone); with range or roundrobin among them
it speaks "eager" and gives up every partition before joining, whichever assignor the
coordinator picks (the upgrade path: range,cooperative-sticky first, then cooperative-sticky).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

TopicPartition = tuple[str, int]
EAGER, COOPERATIVE = "eager", "cooperative"


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    member_id: str
    topics: tuple[str, ...]
    group_instance_id: str | None = None
    owned: tuple[TopicPartition, ...] = ()  # what the member holds (subscription v1+)
    generation_id: int = -1  # the generation it holds them from (v2+; -1 unknown)

    def sort_key(self) -> tuple:
        # Java's MemberInfo.compareTo: members with an instance id order by it, before the rest
        if self.group_instance_id is not None:
            return (0, self.group_instance_id, self.member_id)
        return (1, self.member_id, "")


Assignor = Callable[[Mapping[str, int], list[MemberSubscription]], dict[str, list[TopicPartition]]]


def range_assign(partitions_per_topic: Mapping[str, int],
                 members: list[MemberSubscription]) -> dict[str, list[TopicPartition]]:  # fmt: skip
    """{member id: its partitions} by RangeAssignor. Topics missing from
    partitions_per_topic (unknown to the leader's metadata) are skipped."""
    out: dict[str, list[TopicPartition]] = {m.member_id: [] for m in members}
    ordered = sorted(members, key=MemberSubscription.sort_key)
    for topic in sorted({t for m in members for t in m.topics}):
        count = partitions_per_topic.get(topic, 0)
        subscribers = [m for m in ordered if topic in m.topics]
        if count <= 0 or not subscribers:
            continue
        each, extra = divmod(count, len(subscribers))
        start = 0
        for i, member in enumerate(subscribers):
            length = each + (1 if i < extra else 0)
            out[member.member_id].extend((topic, p) for p in range(start, start + length))
            start += length
    return out


def roundrobin_assign(partitions_per_topic: Mapping[str, int],
                      members: list[MemberSubscription]) -> dict[str, list[TopicPartition]]:  # fmt: skip
    """{member id: its partitions} by RoundRobinAssignor."""
    out: dict[str, list[TopicPartition]] = {m.member_id: [] for m in members}
    ordered = sorted(members, key=MemberSubscription.sort_key)
    if not ordered:
        return out
    topics = sorted({t for m in members for t in m.topics})
    turn = 0
    for topic in topics:
        for partition in range(max(partitions_per_topic.get(topic, 0), 0)):
            # the next member (cyclically) subscribed to this topic; one exists: someone
            # subscribed to it for it to be listed
            for _ in range(len(ordered)):
                member = ordered[turn % len(ordered)]
                turn += 1
                if topic in member.topics:
                    out[member.member_id].append((topic, partition))
                    break
    return out


# -- cooperative-sticky -------------------------------------------------------------------
# Goals in order, as Kafka's AbstractStickyAssignor: (1) balanced: when every member subscribes
# to the same topics the counts differ by at most one, otherwise no partition can move to a
# member with at least two fewer that is subscribed to its topic; (2) sticky: a member keeps as
# many of the partitions it owns as (1) allows.
# Which claims count (Java's rules): owned partitions are valid only at the highest generation
# any member reports, and a partition claimed by two members of that generation belongs to
# neither. Partitions of topics gone or no longer subscribed are dropped.


def valid_owners(partitions_per_topic: Mapping[str, int],
                 members: list[MemberSubscription]) -> dict[TopicPartition, str]:  # fmt: skip
    """{partition: its owner} from the members' claims (module doc: which claims count)."""
    if not members:
        return {}
    highest = max(m.generation_id for m in members)
    owners: dict[TopicPartition, str] = {}
    contested: set[TopicPartition] = set()
    for member in sorted(members, key=MemberSubscription.sort_key):
        if member.generation_id != highest:
            continue  # claims from an older generation are stale: someone else may hold them
        for topic, partition in member.owned:
            tp = (topic, partition)
            if topic not in member.topics or not 0 <= partition < partitions_per_topic.get(
                topic, 0
            ):
                continue
            if tp in owners or tp in contested:
                owners.pop(tp, None)
                contested.add(tp)
                continue
            owners[tp] = member.member_id
    return owners


def sticky_assign(partitions_per_topic: Mapping[str, int],
                  members: list[MemberSubscription]) -> dict[str, list[TopicPartition]]:  # fmt: skip
    """{member id: its partitions}: balanced, then sticky (module doc)."""
    ordered = sorted(members, key=MemberSubscription.sort_key)
    out: dict[str, list[TopicPartition]] = {m.member_id: [] for m in ordered}
    if not ordered:
        return out
    owners = valid_owners(partitions_per_topic, ordered)
    for tp, owner in sorted(owners.items()):
        out[owner].append(tp)
    if len({frozenset(_known(m.topics, partitions_per_topic)) for m in ordered}) == 1:
        _constrained(out, _partitions(partitions_per_topic, ordered[0].topics), ordered)
    else:
        _general(out, partitions_per_topic, ordered)
    return {member: sorted(tps) for member, tps in out.items()}


def cooperative_sticky_assign(partitions_per_topic: Mapping[str, int],
                              members: list[MemberSubscription]) -> dict[str, list[TopicPartition]]:  # fmt: skip
    """The sticky assignment minus the partitions moving away from a valid owner this round."""
    assignment = sticky_assign(partitions_per_topic, members)
    moving = partitions_transferring(valid_owners(partitions_per_topic, members), assignment)
    return {member: [tp for tp in tps if tp not in moving] for member, tps in assignment.items()}


def partitions_transferring(owners: Mapping[TopicPartition, str],
                            assignment: Mapping[str, list[TopicPartition]]) -> set[TopicPartition]:  # fmt: skip
    return {tp for member, tps in assignment.items() for tp in tps
            if owners.get(tp, member) != member}  # fmt: skip


def _known(topics, partitions_per_topic: Mapping[str, int]) -> list[str]:
    return sorted(t for t in set(topics) if partitions_per_topic.get(t, 0) > 0)


def _partitions(partitions_per_topic: Mapping[str, int], topics) -> list[TopicPartition]:
    return [(t, p) for t in _known(topics, partitions_per_topic)
            for p in range(partitions_per_topic[t])]  # fmt: skip


def _constrained(out: dict[str, list[TopicPartition]], partitions: list[TopicPartition],
                 ordered: list[MemberSubscription]) -> None:  # fmt: skip
    """Every member subscribes to `partitions`: each gets floor or ceil of the average, and
    keeps its own partitions up to that quota (those owning more keep the larger quota while
    the `len % members` larger quotas last)."""
    min_quota, extra = divmod(len(partitions), len(ordered))
    # the members owning most choose first, so the fewest partitions move
    by_owned = sorted(ordered, key=lambda m: -len(out[m.member_id]))
    for member in by_owned:
        mine = out[member.member_id]
        if len(mine) > min_quota:
            keep = min_quota + 1 if extra > 0 else min_quota
            extra -= keep - min_quota
            del mine[keep:]
    taken = {tp for tps in out.values() for tp in tps}
    free = [tp for tp in partitions if tp not in taken]
    for member in ordered:  # everyone up to the smaller quota first
        mine = out[member.member_id]
        while len(mine) < min_quota:
            mine.append(free.pop(0))
    # then the larger quotas still open, to the members that own fewest (a newcomer first)
    for member in sorted(ordered, key=lambda m: len(m.owned)):
        if not free or extra <= 0:
            break
        mine = out[member.member_id]
        if len(mine) == min_quota:
            mine.append(free.pop(0))
            extra -= 1
    assert not free, f"partitions left over: {free}"


def _general(out: dict[str, list[TopicPartition]], partitions_per_topic: Mapping[str, int],
             ordered: list[MemberSubscription]) -> None:  # fmt: skip
    """Subscriptions differ: the free partitions (fewest possible members first) go to the
    least loaded member that may take them; then partitions move from a member to one with at
    least two fewer that may take them until none can."""
    eligible = {m.member_id: set(_known(m.topics, partitions_per_topic)) for m in ordered}
    order = [m.member_id for m in ordered]
    taken = {tp for tps in out.values() for tp in tps}
    all_topics = {t for m in ordered for t in eligible[m.member_id]}
    free = [tp for tp in _partitions(partitions_per_topic, all_topics) if tp not in taken]
    free.sort(key=lambda tp: (sum(tp[0] in eligible[m] for m in order), tp))
    for tp in free:
        member = min((m for m in order if tp[0] in eligible[m]), key=lambda m: len(out[m]))
        out[member].append(tp)
    # each move lowers the sum of squared counts by at least 2: this many moves at most
    total = sum(len(tps) for tps in out.values())
    for _ in range(total * total + 1):
        move = _best_move(out, eligible, order)
        if move is None:
            return
        tp, source, target = move
        out[source].remove(tp)
        out[target].append(tp)
    raise AssertionError("the sticky balance did not converge")


def _best_move(out, eligible, order) -> tuple[TopicPartition, str, str] | None:
    """A partition of the most loaded member that a member with at least two fewer may take
    (the least loaded such member); None when the assignment is balanced."""
    for source in sorted(order, key=lambda m: -len(out[m])):
        targets = [m for m in order if len(out[m]) + 1 < len(out[source])]
        for target in sorted(targets, key=lambda m: len(out[m])):
            for tp in reversed(out[source]):  # the partition it got last moves first
                if tp[0] in eligible[target]:
                    return tp, source, target
    return None


ASSIGNORS: dict[str, Assignor] = {"range": range_assign, "roundrobin": roundrobin_assign,
                                  "cooperative-sticky": cooperative_sticky_assign}  # fmt: skip
COOPERATIVE_ASSIGNORS = frozenset({"cooperative-sticky"})


def rebalance_protocol(assignors) -> str:
    """Java's rule: the most advanced protocol every configured assignor supports."""
    return COOPERATIVE if all(name in COOPERATIVE_ASSIGNORS for name in assignors) else EAGER


def parse_strategy(text: str) -> tuple[str, ...]:
    """partition.assignment.strategy: assignor names in preference order, comma-separated
    (Java's class names are accepted)."""
    java = "org.apache.kafka.clients.consumer."
    aliases = {java + "RangeAssignor": "range", java + "RoundRobinAssignor": "roundrobin",
               java + "CooperativeStickyAssignor": "cooperative-sticky"}  # fmt: skip
    names = []
    for item in str(text).split(","):
        name = aliases.get(item.strip(), item.strip().lower())
        if not name:
            continue
        if name not in ASSIGNORS:
            raise ValueError(f"partition.assignment.strategy: unknown assignor {item.strip()!r}; "
                             f"use {', '.join(ASSIGNORS)}")  # fmt: skip
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError(
            "partition.assignment.strategy names no assignor; use range, roundrobin or cooperative-sticky"
        )
    return tuple(names)
