"""A runtime stand-in for the group coordinator core: a manual clock, an in-memory log, replies.

`GroupHarness` plays the broker: it hands requests to a GroupCoordinatorShard with explicit
`now_ms`, keeps its appends in flight until the test commits (or fails) them, writes committed
records to a list that stands for the partition's log, fires deadlines as time advances, and
collects replies by token, failing the test if any request is answered twice.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from localcluster.group import messages as m
from localcluster.group.consumer_protocol import Subscription, encode_subscription
from localcluster.group.coordinator import Append, GroupConfig, GroupCoordinatorShard, Result


@dataclass(frozen=True)
class LogRecord:
    offset: int
    key: bytes
    value: bytes | None


class GroupHarness:
    __test__ = False

    def __init__(self, config: GroupConfig | None = None, auto_commit: bool = True,
                 num_partitions: int = 1, partition: int = 0):  # fmt: skip
        self.config = config or GroupConfig(group_initial_rebalance_delay_ms=0)
        self.partition, self.num_partitions = partition, num_partitions
        self.uuids = (f"uuid{i}" for i in itertools.count(1))
        self.shard = self._new_shard()
        self.now_ms = 0
        self.log: list[LogRecord] = []
        self.in_flight: list[Append] = []
        self.failed: list[Append] = []
        self.replies: dict[object, object] = {}
        self.auto_commit = auto_commit
        self._tokens = itertools.count(1)
        self.sent: list[int] = []
        self.shard.begin_loading()
        self.absorb(self.shard.complete_loading(self.now_ms))

    def _new_shard(self) -> GroupCoordinatorShard:
        return GroupCoordinatorShard(self.partition, self.num_partitions, self.config,
                                     new_uuid=lambda: next(self.uuids))  # fmt: skip

    # -- driving ----------------------------------------------------------------------------

    def absorb(self, result: Result) -> None:
        for reply in result.replies:
            assert reply.reply_to not in self.replies, f"{reply.reply_to} answered twice"
            self.replies[reply.reply_to] = reply.response
        self.in_flight.extend(result.appends)
        if self.auto_commit and self.in_flight:
            self.commit()

    def send(self, request) -> int:
        token = next(self._tokens)
        self.sent.append(token)
        self.absorb(self.shard.handle(request, self.now_ms, reply_to=token))
        self.advance(0)  # a deadline of now fires at once, as the runtime's timer would
        return token

    def call(self, request):
        token = self.send(request)
        assert token in self.replies, f"{type(request).__name__} was not answered"
        return self.replies[token]

    def run_until_answered(self, tokens, step_ms: int = 1_000, limit_ms: int = 60_000) -> list:
        """Advance in steps until every token has its reply (a delayed join phase ends)."""
        for _ in range(limit_ms // step_ms):
            if all(t in self.replies for t in tokens):
                break
            self.advance(step_ms)
        assert all(t in self.replies for t in tokens), "not answered in time"
        return [self.replies[t] for t in tokens]

    def reply(self, token: int):
        return self.replies.get(token)

    def advance(self, ms: int) -> None:
        target = self.now_ms + ms
        while (deadline := self.shard.next_deadline_ms()) is not None and deadline <= target:
            self.now_ms = max(self.now_ms, deadline)
            self.absorb(self.shard.tick(self.now_ms))
        self.now_ms = target

    def commit(self, count: int | None = None) -> None:
        """Write the first `count` in-flight appends to the log and move the HW past them."""
        count = len(self.in_flight) if count is None else count
        done, self.in_flight = self.in_flight[:count], self.in_flight[count:]
        for append in done:
            for record in append.records:
                self.log.append(LogRecord(len(self.log), record.key, record.value))
            self.shard.on_appended(append.append_id, len(self.log) - 1)
        self.absorb(self.shard.on_committed(len(self.log), self.now_ms))

    def fail(self, index: int, error_code: int) -> None:
        append = self.in_flight.pop(index)
        self.failed.append(append)
        self.absorb(self.shard.on_append_failed(append.append_id, error_code, self.now_ms))

    def rebuild(self) -> GroupCoordinatorShard:
        """A new shard loaded from the log, as a new leader would load it."""
        shard = self._new_shard()
        shard.begin_loading()
        shard.replay(self.log)
        shard.complete_loading(self.now_ms)
        return shard

    def failover(self) -> Result:
        """The coordinator moves: unload this shard and load a fresh one from the log."""
        unloaded = self.shard.unload()
        self.absorb(unloaded)
        self.in_flight.clear()
        self.shard = self.rebuild()
        return unloaded

    def group(self, group_id: str = "g"):
        return self.shard.groups.get(group_id)


# -- request builders -------------------------------------------------------------------------


def subscription(*topics: str) -> bytes:
    return encode_subscription(Subscription(tuple(topics)))


def join(member_id: str = "", group_id: str = "g", instance: str | None = None, version: int = 5,
         protocols=(("range", None),), session_ms: int = 10_000, rebalance_ms: int = 30_000,
         protocol_type: str = "consumer", client_id: str = "c", topics=("t",)) -> m.JoinGroupRequest:  # fmt: skip
    return m.JoinGroupRequest(
        group_id=group_id,
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        member_id=member_id,
        group_instance_id=instance,
        protocol_type=protocol_type,
        protocols=tuple(
            m.JoinGroupProtocol(n, subscription(*topics) if md is None else md)
            for n, md in protocols
        ),  # fmt: skip
        api_version=version,
        client_id=client_id,
        client_host="/127.0.0.1",
    )


def sync(member_id: str, generation: int, assignments: dict[str, bytes] | None = None,
         group_id: str = "g", instance: str | None = None, **kw) -> m.SyncGroupRequest:  # fmt: skip
    return m.SyncGroupRequest(group_id, generation, member_id, tuple(
        m.SyncGroupAssignment(k, v) for k, v in (assignments or {}).items()), instance, **kw)  # fmt: skip


def heartbeat(member_id: str, generation: int, group_id: str = "g", instance: str | None = None):
    return m.HeartbeatRequest(group_id, generation, member_id, instance)


def commit(offsets: dict[tuple[str, int], int], member_id: str = "", generation: int = -1,
           group_id: str = "g", instance: str | None = None, metadata: str = "",
           retention_ms: int = -1) -> m.OffsetCommitRequest:  # fmt: skip
    topics: dict[str, list] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(
            m.OffsetCommitPartition(partition, offset, committed_metadata=metadata)
        )
    return m.OffsetCommitRequest(
        group_id, tuple(m.OffsetCommitTopic(t, tuple(ps)) for t, ps in topics.items()),
        generation, member_id, instance, retention_ms)  # fmt: skip


def fetch(
    group_id: str = "g", partitions: dict[str, tuple[int, ...]] | None = None
) -> m.OffsetFetchRequest:
    topics = (
        None
        if partitions is None
        else tuple(m.OffsetFetchTopic(t, ps) for t, ps in partitions.items())
    )
    return m.OffsetFetchRequest((m.OffsetFetchGroup(group_id, topics),))


def committed(h: GroupHarness, group_id: str = "g") -> dict[tuple[str, int], int]:
    """What OffsetFetch (all partitions) answers for the group."""
    response = h.call(fetch(group_id))
    (group,) = response.groups
    assert group.error_code == 0, group
    return {
        (t.name, p.partition_index): p.committed_offset for t in group.topics for p in t.partitions
    }


def errors_of(response: m.OffsetCommitResponse) -> dict[tuple[str, int], int]:
    return {
        (t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions
    }
