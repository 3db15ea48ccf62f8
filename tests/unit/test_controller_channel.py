"""controller/channel.py: the controller's queue to a broker keeps serving whatever a broker
answers. Before, an UpdateMetadata answered with an error code (a broker that had heard a newer
controller, or refused the request) raised AttributeError in the queue's task, which died
silently: every later request to that broker (LeaderAndIsr included) sat in the queue unsent
for the rest of the controller's term, and the broker could never again be told to follow.

The connections are recording stand-ins that answer each request with the bytes a test gives;
the channel is the real one."""

from __future__ import annotations

import asyncio
import logging

from localcluster.controller import channel as channel_module
from localcluster.controller.channel import ControllerChannelManager
from localcluster.protocol import controller_requests as cr
from localcluster.protocol.api import ApiKey

DEADLINE_S = 10.0
STALE_CONTROLLER_EPOCH = 11
BROKER = 1


class AnsweringBroker:
    """Connections that record each request and answer it with `answers[api_key]`."""

    def __init__(self, answers: dict[int, bytes]):
        self.answers = answers
        self.sent: list[int] = []
        self.changed = asyncio.Event()

    async def open(self, broker_id, client_id, max_in_flight=1, registration=None):
        assert broker_id == BROKER
        return AnsweringConnection(self)


class AnsweringConnection:
    def __init__(self, broker: AnsweringBroker):
        self.broker = broker
        self.closed = False

    def close(self):
        self.closed = True

    async def send(self, api_key, encode, *, version, timeout_ms=None):
        self.broker.sent.append(api_key)
        self.broker.changed.set()
        return self.broker.answers[api_key], 0


async def sent_until(broker: AnsweringBroker, condition) -> list[int]:
    async with asyncio.timeout(DEADLINE_S):
        while not condition(broker.sent):
            broker.changed.clear()
            await broker.changed.wait()
    return broker.sent


def leader_and_isr() -> bytes:
    return cr.write_leader_and_isr(cr.LeaderAndIsrRequest(0, 2, (cr.PartitionState(
        "t", 0, 2, leader=BROKER, leader_epoch=1, isr=(BROKER,), zk_version=0,
        replicas=(BROKER,)),)))  # fmt: skip


def test_an_update_metadata_answered_with_an_error_leaves_the_queue_serving(caplog):
    broker = AnsweringBroker({
        ApiKey.UPDATE_METADATA: cr.write_error_code(STALE_CONTROLLER_EPOCH),
        ApiKey.LEADER_AND_ISR: cr.write_partition_errors(cr.PartitionErrors(0, (("t", 0, 0),))),
    })  # fmt: skip
    answered = []

    async def run():
        manager = ControllerChannelManager(0, broker)
        manager.add_broker(BROKER, registration=None)
        try:
            manager.send(BROKER, ApiKey.UPDATE_METADATA, b"", parse=cr.read_error_code)
            manager.send(BROKER, ApiKey.LEADER_AND_ISR, leader_and_isr(), answered.append)
            return await sent_until(broker, lambda sent: ApiKey.LEADER_AND_ISR in sent)
        finally:
            await manager.close()

    with caplog.at_level(logging.WARNING, logger=channel_module.__name__):
        sent = asyncio.run(run())
    assert sent == [ApiKey.UPDATE_METADATA, ApiKey.LEADER_AND_ISR]
    assert [r.partitions for r in answered] == [(("t", 0, 0),)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["controller: broker 1 answered UPDATE_METADATA with error 11"]


def test_an_answer_that_cannot_be_read_is_logged_and_the_next_request_is_sent(caplog):
    broker = AnsweringBroker({
        ApiKey.STOP_REPLICA: b"\x00",  # cut short: not a StopReplica response
        ApiKey.LEADER_AND_ISR: cr.write_partition_errors(cr.PartitionErrors(0, ())),
    })  # fmt: skip

    async def run():
        manager = ControllerChannelManager(0, broker)
        manager.add_broker(BROKER, registration=None)
        try:
            manager.send(BROKER, ApiKey.STOP_REPLICA, b"")
            manager.send(BROKER, ApiKey.LEADER_AND_ISR, leader_and_isr())
            return await sent_until(broker, lambda sent: ApiKey.LEADER_AND_ISR in sent)
        finally:
            await manager.close()

    with caplog.at_level(logging.ERROR, logger=channel_module.__name__):
        sent = asyncio.run(run())
    assert sent == [ApiKey.STOP_REPLICA, ApiKey.LEADER_AND_ISR]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "STOP_REPLICA to broker 1" in errors[0].getMessage()


def test_a_request_given_up_on_is_reported_dropped(monkeypatch):
    """`on_dropped` is called for a request that is never queued (no channel, a full queue) or
    whose delivery fails unexpectedly: the controller then sends a broker that missed an
    UpdateMetadata the full picture next (an incremental one would leave it stale)."""
    monkeypatch.setattr(channel_module, "QUEUE_BOUND", 2)
    broker = AnsweringBroker({ApiKey.UPDATE_METADATA: b""})  # cut short: the answer cannot be read
    dropped = []

    async def run():
        manager = ControllerChannelManager(0, broker)
        manager.add_broker(BROKER, registration=None)
        try:
            manager.send(2, ApiKey.UPDATE_METADATA, b"", on_dropped=lambda: dropped.append("none"))
            for name in ("first", "second", "full"):  # no await between: the queue takes two
                manager.send(BROKER, ApiKey.UPDATE_METADATA, b"", parse=cr.read_error_code,
                             on_dropped=lambda n=name: dropped.append(n))  # fmt: skip
            async with asyncio.timeout(DEADLINE_S):
                while len(dropped) < 4:
                    await asyncio.sleep(0.01)
        finally:
            await manager.close()

    asyncio.run(run())
    assert dropped == ["none", "full", "first", "second"]
