"""IsrUpdate.outcome: what the state znode says of a leader's ISR write that failed or went
unanswered (broker/metadata.update_isr and the simulator's store both decide with it), and
write_isr_updates, the sequence of many such writes at once."""

from dataclasses import replace

from localcluster.broker.replica_host import write_isr_updates
from localcluster.metadata_types import LeaderAndIsr
from localcluster.replication.partition import IsrUpdate

UPDATE = IsrUpdate("t", 0, leader=1, leader_epoch=4, isr=(1, 2), zk_version=7, reason="caught up")


def test_the_write_landed_when_the_znode_holds_it():
    assert UPDATE.outcome((LeaderAndIsr(1, 4, (1, 2), 9), 8)) == (True, 8)


def test_only_the_version_moved_when_leader_and_epoch_are_ours():
    assert UPDATE.outcome((LeaderAndIsr(1, 4, (1,), 9), 8)) == (False, 8)


def test_fenced_by_another_leader_or_epoch_or_no_znode():
    assert UPDATE.outcome((LeaderAndIsr(2, 5, (2,), 9), 8)) == (False, None)
    assert UPDATE.outcome((LeaderAndIsr(1, 5, (1, 2), 9), 8)) == (False, None)
    assert UPDATE.outcome(None) == (False, None)


def test_the_new_value_keeps_the_znodes_controller_epoch():
    assert UPDATE.state(9) == LeaderAndIsr(1, 4, (1, 2), 9)


def test_many_writes_read_together_and_only_the_clashes_read_back():
    updates = [replace(UPDATE, partition=p) for p in range(3)]
    stored = {0: (LeaderAndIsr(1, 4, (1, 2, 3), 9), 7), 1: (LeaderAndIsr(2, 5, (2,), 9), 8)}
    reads, writes = [], []

    def read_states(some):
        reads.append([u.partition for u in some])
        return [stored.get(u.partition) for u in some]

    def write(states):
        writes.append(states)
        return [10, None, None]  # partition 0 written; 1 fenced; 2 has no znode

    assert write_isr_updates(updates, read_states, write) == [
        (True, 10),
        (False, None),
        (False, None),
    ]
    assert reads == [[0, 1, 2], [1, 2]], "one read of all, one read back of the clashes"
    assert writes == [[UPDATE.state(9), UPDATE.state(9), UPDATE.state(0)]]
