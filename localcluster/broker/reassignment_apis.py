"""AlterPartitionReassignments and ListPartitionReassignments (v0, KIP-455), through the
controller's /admin/reassign_partitions.

ZooKeeper-mode Kafka 2.4+ ran these inside the controller's process (a broker that is not the
controller answered NOT_CONTROLLER and the client asked again). Here any broker takes them: it
merges its targets into /admin/reassign_partitions (Kafka's znode, the one the controller already
watches and carries out; a conditional write, as the controller's removal of finished entries
is) instead of forwarding, because no broker-to-controller request channel exists here (ElectLeaders
goes through the store the same way) and the znode survives a controller failover, which a
forwarded request would not. The answer comes once the controller accepted the target (the
topic's znode shows it under way, or done), as Kafka answers once it started, else
REQUEST_TIMED_OUT with the request left in place.

Kafka's checks per partition: UNKNOWN_TOPIC_OR_PARTITION; INVALID_REPLICA_ASSIGNMENT for an
empty list, a broker named twice or a broker that is not alive; null replicas cancel: the
original replicas (AR without the adding ones) become the target, and a partition not under way
gets NO_REASSIGNMENT_IN_PROGRESS. List answers each partition under way with its AR and the
adding and removing replicas the controller wrote into the topic's znode.
"""

from __future__ import annotations

import asyncio
import time

from kio.schema.errors import ErrorCode

from localcluster.broker.metadata import ClusterMetadata, legal_topic
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey

Verdict = tuple[int, str | None]


class ReassignmentApis:
    def __init__(self, metadata: ClusterMetadata):
        self.metadata = metadata

    def handlers(self) -> dict:
        return {ApiKey.ALTER_PARTITION_REASSIGNMENTS: self.handle_alter,
                ApiKey.LIST_PARTITION_REASSIGNMENTS: self.handle_list}  # fmt: skip

    # -- AlterPartitionReassignments --------------------------------------------------------------

    async def handle_alter(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)
        deadline = time.monotonic() + max(request.timeout.total_seconds(), 0)
        asked = [((t.name, p.partition_index), None if p.replicas is None else tuple(p.replicas))
                 for t in request.topics for p in t.partitions]  # fmt: skip
        verdicts, targets = await asyncio.to_thread(self._request, asked)
        while targets and time.monotonic() < deadline:
            accepted = await asyncio.to_thread(self._accepted, targets)
            for tp in accepted:
                del targets[tp]
            if targets:
                await asyncio.sleep(0.02)
        for tp in targets:
            verdicts[tp] = (ErrorCode.request_timed_out,
                            "the controller has not taken it up yet; it stays requested")  # fmt: skip
        by_topic: dict[str, list] = {}
        for (topic, partition), _ in asked:
            code, message = verdicts[(topic, partition)]
            by_topic.setdefault(topic, []).append({"partition_index": partition,
                                                   "error_code": code, "error_message": message})  # fmt: skip
        return messages.write_response(header, {"error_code": 0, "error_message": None, "responses": [
            {"name": t, "partitions": rows} for t, rows in by_topic.items()]})  # fmt: skip

    def _request(self, asked) -> tuple[dict, dict]:
        """Check each partition, write the accepted ones; (verdicts, targets to wait for)."""
        zk = self.metadata.zk
        live = set(zk.live_brokers())
        requested = zk.reassignments() or {}
        verdicts: dict = {}
        targets: dict = {}
        drops: set = set()
        for tp, replicas in asked:
            assignment = zk.assignment(tp[0]) if legal_topic(tp[0]) else None
            if assignment is None or tp[1] not in assignment.partitions:
                verdicts[tp] = (
                    ErrorCode.unknown_topic_or_partition,
                    f"{tp[0]}-{tp[1]} does not exist",
                )
                continue
            current = assignment.partitions[tp[1]]
            adding = assignment.adding_replicas.get(tp[1], ())
            under_way = bool(adding or assignment.removing_replicas.get(tp[1]))
            if replicas is None:
                verdicts[tp], target = _cancel(tp, current, adding, under_way, requested)
                if verdicts[tp][0] == ErrorCode.none:
                    if target is None:
                        drops.add(tp)  # not taken up yet: withdrawing the request cancels it
                    else:
                        targets[tp] = target
                continue
            verdicts[tp] = _check_replicas(replicas, live)
            if verdicts[tp][0] == ErrorCode.none:
                targets[tp] = replicas
        if targets or drops:
            zk.update_reassignments(lambda entries: {
                **{tp: r for tp, r in entries.items() if tp not in drops}, **targets})  # fmt: skip
        return verdicts, dict(targets)

    def _accepted(self, targets: dict) -> list:
        """The partitions whose topic znode shows the target under way or done: AR without
        the replicas being removed is the target."""
        zk = self.metadata.zk
        out = []
        for tp, target in targets.items():
            assignment = zk.assignment(tp[0])
            if assignment is None:
                out.append(tp)  # deleted meanwhile: nothing left to wait for
                continue
            removing = set(assignment.removing_replicas.get(tp[1], ()))
            staying = set(assignment.partitions.get(tp[1], ())) - removing
            if staying == set(target):
                out.append(tp)
        return out

    # -- ListPartitionReassignments ---------------------------------------------------------------

    async def handle_list(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)
        asked = None if request.topics is None else {
            t.name: set(t.partition_indexes) for t in request.topics}  # fmt: skip
        topics = await asyncio.to_thread(self._ongoing, asked)
        return messages.write_response(
            header, {"error_code": 0, "error_message": None, "topics": topics}
        )

    def _ongoing(self, asked: dict | None) -> list[dict]:
        zk = self.metadata.zk
        out = []
        for topic in sorted(zk.topics() if asked is None else asked):
            assignment = zk.assignment(topic) if legal_topic(topic) else None
            if assignment is None:
                continue
            under_way = sorted(set(assignment.adding_replicas) | set(assignment.removing_replicas))
            rows = [{"partition_index": p, "replicas": list(assignment.partitions[p]),
                     "adding_replicas": list(assignment.adding_replicas.get(p, ())),
                     "removing_replicas": list(assignment.removing_replicas.get(p, ()))}
                    for p in under_way
                    if p in assignment.partitions and (asked is None or p in asked[topic])]  # fmt: skip
            if rows:
                out.append({"name": topic, "partitions": rows})
        return out


def _check_replicas(replicas: tuple[int, ...], live: set[int]) -> Verdict:
    if not replicas:
        return ErrorCode.invalid_replica_assignment, "an empty replica list"
    if len(set(replicas)) != len(replicas):
        return ErrorCode.invalid_replica_assignment, f"{list(replicas)} names a broker twice"
    dead = sorted(set(replicas) - live)
    if dead:
        return ErrorCode.invalid_replica_assignment, (f"brokers {dead} are not alive (live: "
                                                      f"{sorted(live)})")  # fmt: skip
    return ErrorCode.none, None


def _cancel(tp, current, adding, under_way: bool,
            requested) -> tuple[Verdict, tuple[int, ...] | None]:  # fmt: skip
    """A cancel's verdict and target: the original replicas (AR without those being added);
    None when the controller has not taken the request up yet (withdrawing it cancels)."""
    if tp not in requested:
        return (ErrorCode.no_reassignment_in_progress,
                f"{tp[0]}-{tp[1]} is not being reassigned"), None  # fmt: skip
    if not under_way:
        return (ErrorCode.none, None), None
    return (ErrorCode.none, None), tuple(r for r in current if r not in adding)
