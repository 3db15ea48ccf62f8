"""Producer ids for InitProducerId, handed out in blocks as ZooKeeper-mode Kafka does.

`/latest_producer_id_block` holds the last block any broker took:
`{"version":1,"broker":B,"block_start":S,"block_end":E}`. A broker takes the next block
(`block_start = E + 1`, `PRODUCER_ID_BLOCK_SIZE` ids) with a write conditional on the znode's
version, retrying on a conflict, so two brokers never hold the same block. Ids of a block that
a broker held when it died are never handed out again: the next block starts after it (Kafka
loses them the same way). Everything touching the store runs in a worker thread.

For an idempotent (non-transactional) producer Kafka's broker always answers with a fresh id
and epoch 0, whatever producer id and epoch a KIP-360 client sends back (its "epoch bump"
after UNKNOWN_PRODUCER_ID or a timeout then starts cleanly under a new id). Transactional ids
are refused with INVALID_REQUEST: there is no transaction coordinator here.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from localcluster.coord import BadVersionError, NodeExistsError, NoNodeError

log = logging.getLogger(__name__)

LATEST_PRODUCER_ID_BLOCK = "/latest_producer_id_block"
PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
MAX_ALLOCATION_ATTEMPTS = 100
MAX_PRODUCER_ID = 2**63 - 1


class ProducerIdAllocationError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    broker: int
    block_start: int
    block_end: int  # inclusive, as Kafka writes it

    def encode(self) -> bytes:
        return json.dumps({"version": 1, "broker": self.broker, "block_start": self.block_start,
                           "block_end": self.block_end}, separators=(",", ":")).encode()  # fmt: skip

    @classmethod
    def decode(cls, data: bytes) -> ProducerIdBlock:
        try:
            value = json.loads(data)
            return cls(int(value["broker"]), int(value["block_start"]), int(value["block_end"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ProducerIdAllocationError(
                f"{LATEST_PRODUCER_ID_BLOCK} does not hold a producer id block ({e}); fix or "
                "delete the znode (ids then restart at 0, which may reuse live producers' ids)"
            ) from None


def next_block(previous: ProducerIdBlock | None, broker_id: int) -> ProducerIdBlock:
    start = 0 if previous is None else previous.block_end + 1
    if start + PRODUCER_ID_BLOCK_SIZE - 1 > MAX_PRODUCER_ID:
        raise ProducerIdAllocationError("producer ids are exhausted")
    return ProducerIdBlock(broker_id, start, start + PRODUCER_ID_BLOCK_SIZE - 1)


def claim_block(coord, broker_id: int) -> ProducerIdBlock:
    """Take the next block with a conditional write (blocking; call it in a thread)."""
    for _ in range(MAX_ALLOCATION_ATTEMPTS):
        try:
            data, stat = coord.get(LATEST_PRODUCER_ID_BLOCK)
        except NoNodeError:
            block = next_block(None, broker_id)
            try:
                coord.create(LATEST_PRODUCER_ID_BLOCK, block.encode())
                return block
            except NodeExistsError:
                continue  # another broker took the first block: read it and go after it
        block = next_block(ProducerIdBlock.decode(data), broker_id)
        try:
            coord.set(LATEST_PRODUCER_ID_BLOCK, block.encode(), version=stat.version)
            return block
        except BadVersionError:
            continue
    raise ProducerIdAllocationError(
        f"could not take a producer id block in {MAX_ALLOCATION_ATTEMPTS} attempts (every "
        "write conflicted with another broker's)")  # fmt: skip


class ProducerIdManager:
    """This broker's current block; the next id is handed out from it, a new block is taken
    (through the store) when it runs out."""

    def __init__(self, broker_id: int, coord_of):
        self.broker_id = broker_id
        self._coord_of = coord_of  # () -> the current coordination client (sessions renew)
        self._block: ProducerIdBlock | None = None
        self._next = 0
        self._lock = asyncio.Lock()

    async def generate_producer_id(self) -> int:
        async with self._lock:
            if self._block is None or self._next > self._block.block_end:
                self._block = await asyncio.to_thread(claim_block, self._coord_of(), self.broker_id)
                self._next = self._block.block_start
                log.info("broker %d took producer ids %d-%d", self.broker_id,
                         self._block.block_start, self._block.block_end)  # fmt: skip
            producer_id = self._next
            self._next += 1
            return producer_id
