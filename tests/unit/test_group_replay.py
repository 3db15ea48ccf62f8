"""Replaying the records a coordinator wrote rebuilds the state it holds (hypothesis).

Random sequences of joins (dynamic and static, v3/v5/v9), syncs, heartbeats, commits, leaves,
deletions, time steps, commits and failures of the coordinator's appends, and failovers drive a
shard through GroupHarness. Whenever no append is in flight, a shard loaded from the log must
hold the same committed offsets and, for every group at rest (Stable or Empty), the same
generation, protocol, leader and members with their assignments. Groups touched by a failed
append are left out: like Kafka, a failed group record or tombstone leaves memory and log apart
until the next write or failover. At the end, with time running out every session, every
request must have been answered exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.group import errors as E
from localcluster.group import messages as m
from localcluster.group.coordinator import GroupConfig
from localcluster.group.metadata import GroupState as S
from localcluster.group.records import GroupMetadataKey, OffsetCommitKey, decode_key
from tests.group_harness import GroupHarness, commit, heartbeat, join, sync

CONFIG = GroupConfig(
    group_initial_rebalance_delay_ms=1_000,
    offsets_retention_ms=120_000,
    offsets_retention_check_interval_ms=30_000,
)
PROTOCOLS = [
    (("range", None),),
    (("range", None), ("roundrobin", None)),
    (("roundrobin", None), ("range", None)),
]
INSTANCES = [None, None, "i2", "i3"]


@dataclass
class Client:
    index: int
    instance: str | None
    member_id: str = ""
    generation: int = -1
    leader: bool = False
    members: tuple[str, ...] = ()
    join_token: int | None = None
    sync_token: int | None = None
    heartbeat_token: int | None = None
    synced_generation: int = -1


def settle(h: GroupHarness, clients: list[Client]) -> None:
    """Update each client from the answers it got, as a consumer would."""
    for c in clients:
        if c.join_token is not None and (r := h.reply(c.join_token)) is not None:
            c.join_token = None
            if r.error_code == E.NONE:
                c.member_id, c.generation, c.leader = (
                    r.member_id,
                    r.generation_id,
                    r.leader == r.member_id,
                )
                c.members = tuple(x.member_id for x in r.members)
            elif r.error_code == E.MEMBER_ID_REQUIRED:
                c.member_id, c.generation = r.member_id, -1
            elif r.error_code in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.NOT_COORDINATOR):
                c.member_id, c.generation = "", -1
        if c.sync_token is not None and (r := h.reply(c.sync_token)) is not None:
            c.sync_token = None
            if r.error_code != E.NONE:
                c.generation = -1
            else:
                c.synced_generation = c.generation
        if c.heartbeat_token is not None and (r := h.reply(c.heartbeat_token)) is not None:
            c.heartbeat_token = None
            if r.error_code in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
                c.member_id, c.generation = "", -1
            elif r.error_code != E.NONE:
                c.generation = -1  # rejoin


def act(h: GroupHarness, c: Client) -> None:
    """What a consumer would do next: join, sync, or heartbeat."""
    if c.join_token is not None or c.sync_token is not None:
        if c.member_id:
            c.heartbeat_token = h.send(heartbeat(c.member_id, c.generation, instance=c.instance))
    elif not c.member_id or c.generation < 0:
        version = [5, 3, 5, 9][c.index]
        c.join_token = h.send(join(c.member_id, instance=c.instance, version=version, client_id=f"c{c.index}",
                                   session_ms=8_000, rebalance_ms=12_000))  # fmt: skip
    elif c.synced_generation != c.generation:
        assignments = (
            {mid: f"{mid}@{c.generation}".encode() for mid in c.members} if c.leader else None
        )
        c.sync_token = h.send(sync(c.member_id, c.generation, assignments, instance=c.instance))
    else:
        c.heartbeat_token = h.send(heartbeat(c.member_id, c.generation, instance=c.instance))


def step(h: GroupHarness, clients: list[Client], tainted: set[str], op: tuple) -> None:
    kind, c = op[0], clients[op[1] % len(clients)]
    if kind == "act":
        act(h, c)
    elif kind == "join" and c.join_token is None:
        c.join_token = h.send(join(c.member_id, instance=c.instance, version=op[2], protocols=op[3],
                                   client_id=f"c{c.index}", session_ms=8_000, rebalance_ms=12_000))  # fmt: skip
    elif kind == "sync" and c.generation >= 0 and c.sync_token is None:
        assignments = (
            {mid: f"{mid}@{c.generation}".encode() for mid in c.members} if c.leader else None
        )
        c.sync_token = h.send(sync(c.member_id, c.generation, assignments, instance=c.instance))
    elif kind == "heartbeat" and c.member_id:
        h.send(heartbeat(c.member_id, c.generation, instance=c.instance))
    elif kind == "commit":
        h.send(commit({("t", op[2]): op[3]}, c.member_id, c.generation, instance=c.instance))
    elif kind == "simple-commit":
        h.send(commit({("t", op[2]): op[3]}, group_id="h"))
    elif kind == "leave" and c.member_id:
        h.send(m.LeaveGroupRequest("g", (m.MemberIdentity(c.member_id, c.instance),)))
        c.member_id, c.generation = "", -1
    elif kind == "restart" and c.join_token is None and c.sync_token is None:
        c.member_id, c.generation = ("", -1) if c.instance else (c.member_id, c.generation)
    elif kind == "delete-offsets":
        h.send(m.OffsetDeleteRequest(op[2], (m.OffsetFetchTopic("t", (0, 1)),)))
    elif kind == "delete-group":
        h.send(m.DeleteGroupsRequest((op[2],)))
    elif kind == "advance":
        h.advance(op[2])
    elif kind == "commit-log":
        h.commit(op[2])
    elif kind == "fail" and h.in_flight:
        index = op[2] % len(h.in_flight)
        tainted.update(groups_left_apart(h.in_flight[index]))
        h.fail(index, op[3])
    elif kind == "failover":
        h.failover()
        tainted.clear()  # the new shard is the log's replay
    settle(h, clients)


def groups_left_apart(append) -> set[str]:
    """Groups whose memory and log a failure of `append` may part: all but plain commits'."""
    groups = set()
    for record in append.records:
        key = decode_key(record.key)
        if isinstance(key, GroupMetadataKey) or (
            isinstance(key, OffsetCommitKey) and record.value is None
        ):
            groups.add(key.group)
    return groups


def projection(shard, tainted: set[str], at_rest_only_from=None) -> dict:
    view = {}
    for group_id, g in shard.groups.items():
        if group_id in tainted or (g.generation_id == 0 and not g.offsets):
            continue  # never written: a new group that has not completed a rebalance
        entry = {"offsets": dict(g.offsets)}
        if g.state in (S.STABLE, S.EMPTY):
            members = tuple(sorted(
                (x.member_id, x.group_instance_id, x.client_id, x.client_host, x.session_timeout_ms,
                 x.rebalance_timeout_ms, x.metadata(g.protocol_name), x.assignment)
                for x in g.members.values()))  # fmt: skip
            timestamp = (
                g.current_state_timestamp_ms if g.state is S.EMPTY and g.protocol_type else None
            )
            entry["group"] = (g.state, g.generation_id, g.protocol_type, g.protocol_name,
                              g.leader_id, members, timestamp)  # fmt: skip
        view[group_id] = entry
    return view


def check_replay(h: GroupHarness, tainted: set[str]) -> None:
    live = projection(h.shard, tainted)
    rebuilt = projection(h.rebuild(), tainted)
    assert set(rebuilt) <= set(live), (live, rebuilt)
    for group_id, entry in live.items():
        # a group in mid-rebalance may not have a record yet: then it has no offsets either
        other = (
            rebuilt.get(group_id, {"offsets": {}}) if "group" not in entry else rebuilt[group_id]
        )
        assert entry["offsets"] == other["offsets"], group_id
        if "group" in entry:
            assert entry["group"] == other.get("group"), group_id


clients_ = st.integers(0, 3)
acts = st.tuples(st.just("act"), clients_)
small_steps = st.tuples(st.just("advance"), clients_, st.sampled_from([200, 1_000, 2_500]))
ops = st.one_of(
    acts,
    acts,
    acts,
    acts,
    acts,
    acts,
    small_steps,
    small_steps,
    small_steps,
    st.tuples(st.just("commit-log"), clients_, st.integers(1, 3)),
    st.tuples(st.just("commit-log"), clients_, st.integers(1, 3)),
    st.tuples(st.just("join"), clients_, st.sampled_from([3, 5, 9]), st.sampled_from(PROTOCOLS)),
    st.tuples(st.just("sync"), clients_),
    st.tuples(st.just("heartbeat"), clients_),
    st.tuples(st.just("commit"), clients_, st.integers(0, 1), st.integers(0, 100)),
    st.tuples(st.just("simple-commit"), clients_, st.integers(0, 1), st.integers(0, 100)),
    st.tuples(st.just("leave"), clients_),
    st.tuples(st.just("restart"), clients_),  # a static member comes back without its member id
    st.tuples(st.just("delete-offsets"), clients_, st.sampled_from(["g", "h"])),
    st.tuples(st.just("delete-group"), clients_, st.sampled_from(["g", "h"])),
    st.tuples(st.just("advance"), clients_, st.sampled_from([0, 500, 2_000, 5_000, 9_000, 40_000])),
    st.tuples(
        st.just("fail"),
        clients_,
        st.integers(0, 5),
        st.sampled_from([E.NOT_ENOUGH_REPLICAS, E.NOT_LEADER_OR_FOLLOWER, E.REQUEST_TIMED_OUT]),
    ),  # fmt: skip
    st.tuples(st.just("failover"), clients_),
)


@given(st.lists(ops, min_size=5, max_size=120))
@settings(max_examples=200, deadline=None)
def test_replay_of_the_written_records_rebuilds_the_state(sequence):
    h = GroupHarness(CONFIG, auto_commit=False)
    clients = [Client(i, INSTANCES[i]) for i in range(4)]
    tainted: set[str] = set()
    for op in sequence:
        step(h, clients, tainted, op)
        if not h.in_flight:
            check_replay(h, tainted)
    h.commit()
    check_replay(h, tainted)
    # let every session and rebalance run out: everything parked must get its answer
    h.auto_commit = True
    h.commit()
    for _ in range(50):
        h.advance(10_000)
    unanswered = set(h.sent) - set(h.replies)
    assert not unanswered, f"never answered: {unanswered}"
    # and no group is stuck: with every client silent, every member's session ran out
    assert all(g.state is S.EMPTY and not g.members for g in h.shard.groups.values()), (
        h.shard.groups
    )
