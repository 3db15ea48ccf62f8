"""The broker's side of controlled shutdown: ask the controller to move leaderships away.

Returns the partitions the broker still leads, or None when the controller could not be
asked (none elected, unreachable, or it answered with an error): the caller retries.
"""

from __future__ import annotations

import asyncio
import logging

from localcluster.protocol import controller_requests as cr
from localcluster.protocol.api import ApiKey
from localcluster.protocol.wire import Reader

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 5


async def ask_local_controller(controller, broker_id: int):
    answer = asyncio.get_running_loop().create_future()
    controller.request_controlled_shutdown(broker_id, answer)
    return await asyncio.wait_for(answer, ANSWER_TIMEOUT_S)


async def controlled_shutdown(metadata, controller, broker_id: int,
                              connector) -> list[tuple[str, int]] | None:  # fmt: skip
    if controller is not None and controller.is_active:
        result = await ask_local_controller(controller, broker_id)
        if result is None or result[0] != 0:
            return None
        return list(result[1])
    controller_id = await asyncio.to_thread(metadata.zk.controller_id)
    if controller_id is None:
        return None
    connection = await connector.open(controller_id, f"broker-{broker_id}-shutdown", 1)
    try:
        frame, offset = await connection.send(ApiKey.CONTROLLED_SHUTDOWN,
                                              lambda v: cr.write_controlled_shutdown(broker_id),
                                              version=0, timeout_ms=ANSWER_TIMEOUT_S * 1000)  # fmt: skip
    finally:
        connection.close()
    error, remaining = cr.read_controlled_shutdown_response(Reader(frame, offset))
    if error:
        log.info("controller %d answered ControlledShutdown with error %d", controller_id, error)
        return None
    return remaining
