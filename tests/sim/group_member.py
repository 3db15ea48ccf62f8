"""The simulated consumer group member: finds the group's coordinator, joins, syncs, heartbeats,
commits offsets and fetches them back, with group/messages.py's requests over the network.

FindCoordinator is the store's answer the real one gives: the leader of the group's offsets
partition (`partition_for(group_id, offsets partitions)`). One request is in flight at a time
(a consumer's one connection to its coordinator); an unanswered request is given up after
`request_timeout_ms`, as a lost connection, and the coordinator looked up again. Errors follow
the Java consumer: NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE and COORDINATOR_LOAD_IN_PROGRESS
retry (after finding the coordinator again, but for the last); UNKNOWN_MEMBER_ID,
ILLEGAL_GENERATION and REBALANCE_IN_PROGRESS rejoin. Commits and fetches are the script's (`group
G commit T-P OFFSET`, `group G fetch`), done in order; an acknowledged commit is reported to the
invariant checker, and so is every offset an OffsetFetch answers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from localcluster.broker.group_host import OFFSETS_TOPIC
from localcluster.group import errors, partition_for
from localcluster.group import messages as gm
from tests.sim import network as m

RETRY_COORDINATOR = {errors.NOT_COORDINATOR, errors.COORDINATOR_NOT_AVAILABLE}
REJOIN = {errors.UNKNOWN_MEMBER_ID, errors.ILLEGAL_GENERATION, errors.REBALANCE_IN_PROGRESS}


@dataclass(slots=True)
class InFlight:
    corr: int
    kind: str  # join | sync | heartbeat | commit | fetch
    broker: int


class GroupMember:
    """One member of one group (the node "member")."""

    def __init__(self, sim, group_id: str, session_timeout_ms: int = 300,
                 heartbeat_interval_ms: int = 50, request_timeout_ms: int = 150,
                 retry_backoff_ms: int = 20):  # fmt: skip
        self.sim = sim
        self.group_id = group_id
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.coordinator: int | None = None
        self.member_id = gm.UNKNOWN_MEMBER_ID
        self.generation = gm.NO_GENERATION
        self.phase = "unjoined"  # unjoined | syncing | stable
        self.ops: deque[tuple] = deque()  # ("commit", (topic, partition), offset) | ("fetch",)
        self.inflight: InFlight | None = None
        self.inflight_src = None  # the broker whose answer is being handled
        self.fetch_floor: dict = {}  # the acknowledged commits when the fetch went out
        self.heartbeat_at_ms = 0
        self.retry_at_ms = 0
        self.corr = 0
        self.active = False
        self.commits_acknowledged = 0

    @property
    def busy(self) -> bool:
        """Commits or fetches not answered yet, or not in the group."""
        return bool(self.ops) or self.phase != "stable"

    def _now(self) -> int:
        return self.sim.clock.now_ms()

    def _trace(self, line: str) -> None:
        self.sim.trace(f"member: {line}")

    # -- the script's operations ---------------------------------------------------------------

    def join(self) -> None:
        if not self.active:
            self.active = True
            self.sim.every(10, self._pump)
        self._pump()

    def commit(self, tp: tuple[str, int], offset: int) -> None:
        self.ops.append(("commit", tp, offset))
        self._pump()

    def fetch(self) -> None:
        self.ops.append(("fetch",))
        self._pump()

    # -- sending -------------------------------------------------------------------------------

    def _find_coordinator(self) -> int | None:
        tp = (OFFSETS_TOPIC, partition_for(self.group_id, self.sim.config.offsets_partitions))
        state = self.sim.zk.states.get(tp)
        leader = -1 if state is None else state[0].leader
        return leader if leader >= 0 else None

    def _pump(self) -> None:
        now = self._now()
        if self.inflight is not None or not self.active or now < self.retry_at_ms:
            return
        if self.coordinator is None:
            self.coordinator = self._find_coordinator()
            if self.coordinator is None:
                return  # asked again on the next pump
            self._trace(f"coordinator of {self.group_id} is b{self.coordinator}")
        if self.phase == "unjoined":
            self._send("join", gm.JoinGroupRequest(
                self.group_id, self.session_timeout_ms, self.member_id, "consumer",
                (gm.JoinGroupProtocol("range", b""),), api_version=7, client_id="member",
                rebalance_timeout_ms=self.session_timeout_ms))  # fmt: skip
        elif self.phase == "syncing":
            self._send("sync", self._sync_request)
        elif self.ops:
            op = self.ops[0]
            if op[0] == "commit":
                (topic, partition), offset = op[1], op[2]
                self._send("commit", gm.OffsetCommitRequest(
                    self.group_id,
                    (gm.OffsetCommitTopic(topic, (gm.OffsetCommitPartition(partition, offset),)),),
                    self.generation, self.member_id))  # fmt: skip
            else:
                self.fetch_floor = dict(self.sim.checker.committed.get(self.group_id, {}))
                self._send("fetch", gm.OffsetFetchRequest((gm.OffsetFetchGroup(self.group_id),)))
        elif now >= self.heartbeat_at_ms:
            self._send("heartbeat",
                       gm.HeartbeatRequest(self.group_id, self.generation, self.member_id))  # fmt: skip

    def _send(self, kind: str, request) -> None:
        self.corr += 1
        self.inflight = InFlight(self.corr, kind, self.coordinator)
        self.sim.network.send("member", self.coordinator, m.GroupRequest(self.corr, request))
        # a JoinGroup may be parked until the rebalance completes (the Java consumer's join
        # timeout is the rebalance timeout plus the request timeout's margin)
        timeout_ms = self.request_timeout_ms + (self.session_timeout_ms if kind == "join" else 0)
        self.sim.scheduler.after(timeout_ms, self._timed_out, self.corr)

    def _timed_out(self, corr: int) -> None:
        if self.inflight is not None and self.inflight.corr == corr:
            self._trace(f"{self.inflight.kind} to b{self.inflight.broker} unanswered; "
                        f"looking up the coordinator again")  # fmt: skip
            self.inflight = None
            self.coordinator = None
            self._pump()

    # -- answers -------------------------------------------------------------------------------

    def receive(self, src, msg) -> bool:
        inflight = self.inflight
        if inflight is None or msg.corr != inflight.corr:
            return True  # an answer to a request given up
        self.inflight, self.inflight_src = None, src
        error = getattr(self, "_on_" + inflight.kind)(msg.response)
        if error is not None and error != errors.NONE:
            self._on_error(inflight.kind, error, src)
        self._pump()
        return True

    def _on_error(self, kind: str, error: int, src) -> None:
        name = errors.error_name(error)
        if error in RETRY_COORDINATOR or error == errors.COORDINATOR_LOAD_IN_PROGRESS:
            self._trace(f"{kind}: {name} from b{src}; retrying")
            if error != errors.COORDINATOR_LOAD_IN_PROGRESS:
                self.coordinator = None
            self.retry_at_ms = self._now() + self.retry_backoff_ms
        elif error in REJOIN:
            self._trace(f"{kind}: {name} from b{src}; rejoining")
            if error == errors.UNKNOWN_MEMBER_ID:
                self.member_id = gm.UNKNOWN_MEMBER_ID
            self.phase = "unjoined"
        else:
            self._trace(f"{kind}: {name} from b{src}; given up")
            if kind in ("commit", "fetch"):
                self.ops.popleft()

    def _on_join(self, response: gm.JoinGroupResponse) -> int:
        if response.error_code == errors.MEMBER_ID_REQUIRED:
            self.member_id = response.member_id  # KIP-394: join again with it
            return errors.NONE
        if response.error_code != errors.NONE:
            return response.error_code
        self.member_id, self.generation = response.member_id, response.generation_id
        leader = response.leader == self.member_id
        assignments = tuple(gm.SyncGroupAssignment(member.member_id, b"")
                            for member in response.members) if leader else ()  # fmt: skip
        self._sync_request = gm.SyncGroupRequest(self.group_id, self.generation, self.member_id,
                                                 assignments)  # fmt: skip
        self.phase = "syncing"
        self._trace(f"joined {self.group_id} as {self.member_id} in generation "
                    f"{self.generation}{' (leader)' * leader}")  # fmt: skip
        return errors.NONE

    def _on_sync(self, response: gm.SyncGroupResponse) -> int:
        if response.error_code == errors.NONE:
            self.phase = "stable"
            self.heartbeat_at_ms = self._now() + self.heartbeat_interval_ms
            self._trace(f"{self.group_id} is stable in generation {self.generation}")
        return response.error_code

    def _on_heartbeat(self, response: gm.HeartbeatResponse) -> int:
        self.heartbeat_at_ms = self._now() + self.heartbeat_interval_ms
        return response.error_code

    def _on_commit(self, response: gm.OffsetCommitResponse) -> int:
        error = max((p.error_code for t in response.topics for p in t.partitions),
                    key=lambda e: e != errors.NONE, default=errors.NONE)  # fmt: skip
        if error != errors.NONE:
            return error
        _, tp, offset = self.ops.popleft()
        self._trace(f"commit {tp[0]}-{tp[1]}@{offset} acknowledged by b{self.inflight_src}")
        self.sim.checker.on_commit_acked(self.group_id, tp, offset)
        self.commits_acknowledged += 1
        return errors.NONE

    def _on_fetch(self, response: gm.OffsetFetchResponse) -> int:
        group = response.groups[0]
        if group.error_code != errors.NONE:
            return group.error_code
        self.ops.popleft()
        found = {(t.name, p.partition_index): p.committed_offset
                 for t in group.topics for p in t.partitions}  # fmt: skip
        shown = " ".join(f"{t}-{p}@{o}" for (t, p), o in sorted(found.items())) or "nothing"
        self._trace(f"fetched {self.group_id}'s offsets from b{self.inflight_src}: {shown}")
        self.sim.checker.on_offsets_fetched(self.group_id, found, self.fetch_floor,
                                            self.inflight_src)  # fmt: skip
        return errors.NONE
