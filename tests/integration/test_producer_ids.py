"""Producer id blocks in /latest_producer_id_block: brokers racing for blocks never share an id,
on the file store and on a real ZooKeeper; a corrupt znode is a clear error; InitProducerId
from real brokers hands out distinct ids, also after the broker holding a block is killed -9."""

from __future__ import annotations

import threading

import pytest

from localcluster import coord
from localcluster.broker.producer_ids import (
    LATEST_PRODUCER_ID_BLOCK,
    PRODUCER_ID_BLOCK_SIZE,
    ProducerIdAllocationError,
    ProducerIdBlock,
    claim_block,
)
from localcluster.client.connection import Address, BrokerConnection, LoopThread
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey
from tests.helpers import wait_until


def isolated_client(backend):
    """A client whose root is this test's own: a chroot on ZooKeeper, the fresh store on file."""
    if backend.name == "zookeeper":
        return coord.connect(backend.spec + backend.base)
    return backend.connect()


def test_racing_brokers_take_disjoint_consecutive_blocks(coord_backend):
    clients = [isolated_client(coord_backend) for _ in range(4)]
    taken: list[ProducerIdBlock] = []
    lock = threading.Lock()

    def claim(broker_id: int, client) -> None:
        for _ in range(15):
            block = claim_block(client, broker_id)
            with lock:
                taken.append(block)

    threads = [threading.Thread(target=claim, args=(b, c)) for b, c in enumerate(clients)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        starts = sorted(b.block_start for b in taken)
        assert starts == [i * PRODUCER_ID_BLOCK_SIZE for i in range(60)], "a gap or an overlap"
        assert all(b.block_end - b.block_start + 1 == PRODUCER_ID_BLOCK_SIZE for b in taken)
        data, _ = clients[0].get(LATEST_PRODUCER_ID_BLOCK)
        assert ProducerIdBlock.decode(data).block_end == 60 * PRODUCER_ID_BLOCK_SIZE - 1
    finally:
        for c in clients:
            c.stop()


def test_a_corrupt_block_znode_is_a_clear_error_and_is_left_alone(coord_backend):
    client = isolated_client(coord_backend)
    try:
        client.create(LATEST_PRODUCER_ID_BLOCK, b"{not json")
        with pytest.raises(ProducerIdAllocationError, match="does not hold a producer id block"):
            claim_block(client, 1)
        assert client.get(LATEST_PRODUCER_ID_BLOCK)[0] == b"{not json"
    finally:
        client.stop()


def init_producer_id(port: int, version: int = 4, transactional_id=None):
    loop = LoopThread("init-producer-id")

    async def ask():
        connection = await BrokerConnection.open(Address("127.0.0.1", port))
        try:
            frame, offset = await connection.send(
                ApiKey.INIT_PRODUCER_ID, lambda v: messages.encode_request(ApiKey.INIT_PRODUCER_ID, v, {
                    "transactional_id": transactional_id, "transaction_timeout": 60_000,
                    "producer_id": -1, "producer_epoch": -1}), version=version)  # fmt: skip
            return messages.decode_response(ApiKey.INIT_PRODUCER_ID, version, frame, offset)
        finally:
            connection.close()

    try:
        return loop.run(ask(), 30)
    finally:
        loop.stop()


def test_brokers_hand_out_distinct_ids_across_a_kill_of_the_block_holder(brokers):
    b1, b2 = brokers.start(1), brokers.start(2)
    seen: list[int] = []
    for port in (b1.port, b2.port, b1.port, b2.port):
        for version in (0, 2, 4):
            response = init_producer_id(port, version)
            assert response.error_code == 0 and response.producer_epoch == 0
            seen.append(response.producer_id)
    assert len(set(seen)) == len(seen)
    b1.kill()
    brokers.restart(b1)
    after = [init_producer_id(b1.port).producer_id for _ in range(3)]
    assert not set(after) & set(seen), "a restarted broker reused ids of its old block"
    assert min(after) >= 2 * PRODUCER_ID_BLOCK_SIZE, (
        "the dead broker's block is not handed out again"
    )


def test_a_transactional_id_is_refused_with_invalid_request(brokers):
    broker = brokers.start(1)
    response = init_producer_id(broker.port, transactional_id="txn-1")
    assert response.error_code == 42 and response.producer_id == -1
    # the broker's output reaches us through a reader thread: wait for the line
    wait_until(lambda: "transactions do not exist here" in broker.log_text(), timeout_s=10,
               message="the refusal in the broker's log")  # fmt: skip
