"""IsrUpdate.outcome: what the state znode says of a leader's ISR write that failed or went
unanswered (broker/metadata.update_isr and the simulator's store both decide with it)."""

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
