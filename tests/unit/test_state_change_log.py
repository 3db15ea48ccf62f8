"""The state-change log's JSON lines, and chaos_check reading them back."""

from __future__ import annotations

import json
import logging

import pytest

from localcluster import cluster
from localcluster.broker import state_change_log as scl
from localcluster.replication import ready as r
from localcluster.tools import chaos_check


@pytest.fixture
def log_path(tmp_path):
    path = cluster.broker_dir(tmp_path, 2) / scl.FILE_NAME
    path.parent.mkdir(parents=True)
    scl.open_file(path, 2)
    yield path
    scl.close_file()


def test_a_state_change_is_one_json_line_with_its_fields_and_a_message(log_path):
    scl.log_state_change(r.Leading(("t", 0), 3, (1, 2), 0, 42, 40))
    scl.log_state_change(r.Truncated(("t", 0), 10, 12, 9))
    lines = log_path.read_text().splitlines()
    assert len(lines) == 2
    leading, truncated = (json.loads(line) for line in lines)
    assert leading["event"] == "leading" and leading["broker"] == 2
    assert (leading["topic"], leading["partition"], leading["leader_epoch"], leading["isr"],
            leading["log_end_offset"], leading["high_watermark"]) == ("t", 0, 3, [1, 2], 42, 40)  # fmt: skip
    assert leading["message"] == "leading t-0 in epoch 3, ISR [1, 2], offsets [0, 42), HW 40"
    assert truncated["event"] == "truncated" and truncated["log_end_offset"] == 9
    assert "truncated to 9" in truncated["message"]


def test_chaos_check_reads_the_events_back_and_skips_torn_lines(log_path, tmp_path):
    # In the order a cluster writes them: the election, then the leader's answer to it (the
    # two may land in the same millisecond, or in two when the machine is busy).
    scl.write_event("elected", {"topic": "t", "partition": 1, "leader": 2, "leader_epoch": 5,
                                "isr": [2], "election": "offline", "unclean": True}, "elected")  # fmt: skip
    scl.log_state_change(r.Leading(("t", 1), 5, (2,), 0, 7, 7))
    scl.log_state_change(r.Leading(("other", 0), 1, (2,), 0, 0, 0))
    with open(log_path, "a") as f:
        f.write('{"event": "leading", "topic": "t", "parti')  # a torn last line
    events = chaos_check.broker_log_events(tmp_path, [1, 2], "t")
    assert [(e.kind, e.broker, e.partition) for e in events] == [("elected", 2, 1),
                                                                 ("leading", 2, 1)]  # fmt: skip
    assert events[0].fields["unclean"] is True and events[1].fields["leader_epoch"] == 5
    assert chaos_check.check_epochs(events) == []
    assert chaos_check.broker_log_events(tmp_path, [2], "t", since_ms=events[-1].ms + 1) == []


def test_every_state_change_type_has_a_name_and_json_fields():
    update = __import__("localcluster.replication.partition", fromlist=["IsrUpdate"]).IsrUpdate(
        "t", 0, 1, 2, (1, 2), 3, "caught up"
    )
    change = r.IsrProposed(update, (1,))
    assert scl.event_name(change) == "isr_proposed"
    assert json.loads(json.dumps(scl.fields(change)))["update"]["isr"] == [1, 2]
    assert scl.event_name(r.LeaderAndIsrRejected(1, 2)) == "leader_and_isr_rejected"


def test_many_changes_of_one_request_are_one_line_per_kind_in_the_brokers_log(
    log_path, caplog, monkeypatch
):
    leading = [r.Leading(("t", p), 1, (1, 2), 0, 0, 0) for p in range(scl.SUMMARIZED_OVER)]
    ignored = [r.PartitionStateIgnored(("u", p), 0, 0) for p in range(3)]
    rejected = r.LeaderAndIsrRejected(4, 5)  # a warning: always a line of its own
    handler = next(h for h in scl._json_log.handlers if isinstance(h, logging.FileHandler))
    written = []
    monkeypatch.setattr(
        handler, "emit", lambda record, emit=handler.emit: (written.append(record), emit(record))
    )
    with caplog.at_level("DEBUG", logger=scl.log.name):
        scl.log_state_changes([*leading, *ignored, rejected], "LeaderAndIsr of controller 1")
    assert len(written) == 1, "a request's JSON lines go to the file in one write"
    records = [rec for rec in caplog.records if rec.name == scl.log.name]  # not the JSON lines
    info = [rec.getMessage() for rec in records if rec.levelname == "INFO"]
    assert info == [
        f"LeaderAndIsr of controller 1: {scl.SUMMARIZED_OVER} partition(s) leading, e.g. "
        f"leading t-0 in epoch 1, ISR [1, 2], offsets [0, 0), HW 0; each one is in {scl.FILE_NAME}",
        "LeaderAndIsr of controller 1: 3 partition(s) partition state ignored, e.g. ignoring "
        f"LeaderAndIsr for u-0 in leader epoch 0: epoch 0 is current; each one is in {scl.FILE_NAME}",
    ]  # fmt: skip
    assert [rec.getMessage() for rec in records if rec.levelname == "WARNING"] == [
        "rejected LeaderAndIsr in controller epoch 4: controller epoch 5 is current"
    ]
    assert len([rec for rec in records if rec.levelname == "DEBUG"]) == len(leading) + 3
    events = [json.loads(line)["event"] for line in log_path.read_text().splitlines()]
    assert events == ["leading"] * len(leading) + ["partition_state_ignored"] * 3 + [
        "leader_and_isr_rejected"
    ], "the state-change log still has every change"


def test_a_few_changes_of_one_request_are_logged_one_by_one(log_path, caplog):
    changes = [r.Leading(("t", p), 1, (1,), 0, 0, 0) for p in range(scl.SUMMARIZED_OVER)]
    with caplog.at_level("INFO", logger=scl.log.name):
        scl.log_state_changes(changes, "LeaderAndIsr of controller 1")
    assert [rec.getMessage() for rec in caplog.records if rec.name == scl.log.name] == [
        f"leading t-{p} in epoch 1, ISR [1], offsets [0, 0), HW 0" for p in range(len(changes))
    ]


def test_a_replication_steps_many_changes_are_one_line_in_the_brokers_log(log_path, caplog):
    # A follower's truncations answered by one OffsetForLeaderEpoch: 2,000 changes of one step
    from types import SimpleNamespace

    from localcluster.broker.replica_manager import ReplicaManager

    manager = SimpleNamespace(_request_changes=None)
    done = [r.TruncationDone(("t", p), 4, 0) for p in range(2000)]
    with caplog.at_level("INFO", logger=scl.log.name):
        ReplicaManager.on_state_changes(manager, done)
    info = [rec.getMessage() for rec in caplog.records if rec.name == scl.log.name]
    assert info == [
        "one replication step: 2,000 partition(s) truncation done, e.g. t-0: truncation against "
        f"leader 4 done, fetching from 0; each one is in {scl.FILE_NAME}"
    ]
    assert len(log_path.read_text().splitlines()) == 2000
