"""controller/controller.py: one step's notes in the broker's log. Routine ones (a clean
election, an ISR shrink) beyond SUMMARIZED_OVER become one line per kind, each kept in the
state-change log; an unclean election and notes without an event always get their own line."""

from __future__ import annotations

import json
import logging

import pytest

from localcluster import coord
from localcluster.broker import state_change_log as scl
from localcluster.broker.config import BrokerConfig
from localcluster.controller import actions as act
from localcluster.controller import controller as controller_module
from localcluster.controller.controller import KafkaController
from localcluster.coord.kafka_zk import KafkaZkClient


@pytest.fixture
def controller(tmp_path):
    zk = KafkaZkClient(coord.connect(str(tmp_path / "store")))
    scl.open_file(tmp_path / scl.FILE_NAME, 1)
    yield KafkaController(1, zk, BrokerConfig(broker_id=1))
    scl.close_file()
    zk.coord.stop()


def elected(p: int, unclean: bool = False) -> act.Note:
    return act.Note(f"t-{p}: leader 2 elected (offline) in epoch 1, ISR [2]",
                    ("elected", {"topic": "t", "partition": p, "leader": 2, "leader_epoch": 1,
                                 "isr": [2], "election": "offline", "unclean": unclean}))  # fmt: skip


def shrunk(p: int) -> act.Note:
    return act.Note(f"t-{p}: ISR shrank to [2] (broker 3 is gone)",
                    ("isr_shrunk", {"topic": "t", "partition": p, "leader": 2, "leader_epoch": 2,
                                    "isr": [2], "removed": 3}))  # fmt: skip


def logged(caplog) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == controller_module.log.name]  # fmt: skip


def test_many_routine_notes_are_one_line_per_kind_and_each_in_the_state_change_log(
    controller, caplog, tmp_path
):
    many = scl.SUMMARIZED_OVER + 1
    notes = [act.Note("broker(s) [3] died"), *(elected(p) for p in range(many)),
             elected(many, unclean=True), *(shrunk(p) for p in range(many))]  # fmt: skip
    with caplog.at_level(logging.INFO, logger=controller_module.log.name):
        controller._log_notes(notes)
    assert logged(caplog) == [
        ("INFO", "controller 1: broker(s) [3] died"),
        ("INFO", f"controller 1: {elected(many).line}"),  # unclean: never summarized
        ("INFO", f"controller 1: {many} partition(s) elected, e.g. {elected(0).line}; each one "
                 f"is in {scl.FILE_NAME}"),
        ("INFO", f"controller 1: {many} partition(s) isr shrunk, e.g. {shrunk(0).line}; each "
                 f"one is in {scl.FILE_NAME}"),
    ]  # fmt: skip
    events = [json.loads(line) for line in (tmp_path / scl.FILE_NAME).read_text().splitlines()]
    assert [(e["event"], e["partition"]) for e in events] == (
        [("elected", p) for p in range(many + 1)] + [("isr_shrunk", p) for p in range(many)]
    )


def test_a_few_routine_notes_are_logged_one_by_one(controller, caplog):
    notes = [elected(p) for p in range(scl.SUMMARIZED_OVER)]
    with caplog.at_level(logging.INFO, logger=controller_module.log.name):
        controller._log_notes(notes)
    assert logged(caplog) == [("INFO", f"controller 1: {note.line}") for note in notes]
