"""Partition assignors of the classic consumer protocol: "range" and "roundrobin".

The group leader runs one of these over every member's subscription and the partition counts
of the subscribed topics; each is a pure function with the Java client's rules, so a group
mixing our client with librdkafka's or the Java client assigns the same way whoever leads:
- range (RangeAssignor): per topic, the members subscribed to it in order, each a contiguous
  run of partitions; the first `partitions % members` get one more.
- roundrobin (RoundRobinAssignor): every partition of every subscribed topic, sorted by topic
  and partition, dealt to the members in turn, skipping a member not subscribed to its topic.
Members are ordered as Java's MemberInfo: by group.instance.id when a member has one (static
members keep their place across restarts), else by member id. Cooperative-sticky is not here:
it needs the incremental rebalance protocol, which this client does not speak.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    member_id: str
    topics: tuple[str, ...]
    group_instance_id: str | None = None

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


ASSIGNORS: dict[str, Assignor] = {"range": range_assign, "roundrobin": roundrobin_assign}


def parse_strategy(text: str) -> tuple[str, ...]:
    """partition.assignment.strategy: assignor names in preference order, comma-separated
    (Java's class names are accepted for the two known assignors)."""
    aliases = {"org.apache.kafka.clients.consumer.RangeAssignor": "range",
               "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin"}  # fmt: skip
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
        raise ValueError("partition.assignment.strategy names no assignor; use range or roundrobin")
    return tuple(names)
