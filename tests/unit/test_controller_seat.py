"""controller/controller.py: the controller's event task survives a seat check that fails.
The /controller watch only enqueues a check; the check reads the store. Before, a read that
raised (a ZooKeeper connection loss, a session being renewed) ended the event task for good:
the broker then handled no event at all, and when it already held the seat the cluster had
a controller that elected nobody and told no restarted broker to follow, until its session
ended. Now the failure is logged and the check made again a moment later.

Runs the real KafkaController against a file store in the test's directory; the broker
around it is absent (no broker registers, so no request is sent)."""

from __future__ import annotations

import asyncio
import logging

from localcluster import coord
from localcluster.broker.config import BrokerConfig
from localcluster.controller import controller as controller_module
from localcluster.controller.controller import KafkaController
from localcluster.coord.kafka_zk import KafkaZkClient

DEADLINE_S = 10.0


def test_a_failed_seat_check_is_made_again_and_the_broker_becomes_controller(
    tmp_path, caplog, monkeypatch
):
    monkeypatch.setattr(controller_module, "SEAT_RETRY_S", 0.05)
    zk = KafkaZkClient(coord.connect(str(tmp_path / "store")))
    zk.ensure_persistent_paths()
    failures = []
    read_seat = zk.controller_id

    def controller_id_failing_once():
        if not failures:
            failures.append(1)
            raise OSError("the store did not answer (as a ZooKeeper connection loss)")
        return read_seat()

    zk.controller_id = controller_id_failing_once
    controller = KafkaController(
        1, zk, BrokerConfig(broker_id=1, auto_leader_rebalance_enable=False)
    )

    async def run():
        controller.start()
        try:
            async with asyncio.timeout(DEADLINE_S):
                while not controller.is_active:
                    await asyncio.sleep(0.01)
            return read_seat()
        finally:
            await controller.stop()

    try:
        with caplog.at_level(logging.ERROR, logger=controller_module.__name__):
            holder = asyncio.run(run())
    finally:
        zk.coord.stop()
    assert failures and holder == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "checking /controller failed" in errors[0].getMessage()
