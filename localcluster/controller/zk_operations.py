"""The controller core's store operations, done with KafkaZkClient. Runtime: these block.

`execute(operation)` does one operation (actions.py) and returns its result event (events.py).
A write that /controller_epoch's version check held back is answered ControllerMoved (the core
resigns), in the broker runtime and the simulator alike; a conditional write whose version
clashed, or a create that found the znode there, is reported as a conflict, not raised.
Many writes of one operation (partition states, ISR notification deletes, a topic's znodes) go
to the store as one batch commit (CoordinationClient.commit_transactions), and many partition
states are read with one get_many, not one call each.
"""

from __future__ import annotations

from localcluster.controller import actions as act
from localcluster.controller import events as ev
from localcluster.controller.context import Leadership
from localcluster.coord import paths
from localcluster.coord.kafka_zk import ControllerMovedError, KafkaZkClient

ELECTION_REQUEST_PATHS = {
    act.ElectionRequest.PREFERRED: paths.PREFERRED_REPLICA_ELECTION,
    act.ElectionRequest.UNCLEAN: paths.UNCLEAN_LEADER_ELECTION,
}


class ZkOperations:
    def __init__(self, zk: KafkaZkClient):
        self.zk = zk

    def execute(self, operation: act.StoreOperation) -> ev.StoreResult:
        try:
            return self._execute(operation)
        except ControllerMovedError as e:
            return ev.ControllerMoved(str(e))

    def _execute(self, operation: act.StoreOperation) -> ev.StoreResult:
        zk = self.zk
        match operation:
            case act.ReadBrokers():
                return ev.BrokersRead(zk.live_brokers())
            case act.ReadTopicNames():
                return ev.TopicNamesRead(tuple(zk.topics()))
            case act.ReadTopics(topics=topics):
                return self._read_topics(topics)
            case act.ReadPartitionStates(partitions=partitions):
                found = zk.partition_states(partitions)
                return ev.PartitionStatesRead(
                    {tp: None if f is None else Leadership(*f) for tp, f in found.items()}
                )
            case act.WritePartitionStates():
                return self._write_states(operation)
            case act.WriteAssignment(topic=topic, assignment=assignment):
                zk.write_assignment(topic, assignment, operation.controller_epoch_zk_version)
                return ev.StoreWritten()
            case act.DeleteTopicZnodes(topic=topic):
                zk.delete_topic_znodes(topic)
                return ev.StoreWritten()
            case act.ConsumeIsrChangeNotifications():
                changed = zk.consume_isr_change_notifications(zk.isr_change_notifications())
                return ev.IsrChangesRead(tuple(sorted(set(changed))))
            case act.ReadTopicDeletions():
                return ev.TopicDeletionsRead(tuple(zk.topics_to_delete()))
            case act.ReadReassignments():
                return ev.ReassignmentsRead(zk.reassignments())
            case act.RemoveReassignments(partitions=partitions):
                # conditional: AlterPartitionReassignments may add entries meanwhile
                zk.update_reassignments(lambda requested: {
                    tp: r for tp, r in requested.items() if tp not in partitions})  # fmt: skip
                return ev.StoreWritten()
            case act.ReadElectionRequest(kind=kind):
                found = zk.requested_elections(ELECTION_REQUEST_PATHS[kind])
                return ev.ElectionRequestRead(None if found is None else tuple(found))
            case act.DeleteElectionRequest(kind=kind):
                zk.delete_election_request(ELECTION_REQUEST_PATHS[kind])
                return ev.StoreWritten()
        raise AssertionError(f"controller: no store operation {operation!r}")

    def _read_topics(self, topics) -> ev.TopicsRead:
        """Every topic's assignment and config in one read (get_many), not two per topic."""
        return ev.TopicsRead(*self.zk.assignments_and_configs(topics))

    def _write_states(self, operation: act.WritePartitionStates) -> ev.PartitionStatesWritten:
        """All the writes in one batch commit (zk.write_partition_states): the store's commit
        cost is paid once per operation, not once per partition."""
        found = self.zk.write_partition_states(
            [(write.tp, write.state, write.zk_version) for write in operation.writes],
            operation.controller_epoch_zk_version,
        )
        versions = {tp: version for tp, version in found.items() if version is not None}
        conflicts = tuple(write.tp for write in operation.writes if found[write.tp] is None)
        return ev.PartitionStatesWritten(versions, conflicts)
