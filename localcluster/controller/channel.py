"""The controller's channel to brokers: requests queued per broker, sent in order, retried.

Runtime: what to send is the controller core's (request_batch.py batches one event's requests
per broker). A broker's queue is served by one task over one connection (its Unix socket on this
host, else its inter-broker listener: broker/inter_broker.py decides); a request that fails for
a connection reason is retried (with backoff) until it is answered or the broker is removed (it
died: its next registration brings a fresh queue and a full LeaderAndIsr). Whatever else goes
wrong with one request (an answer that does not parse, a callback that raises) is logged with
its traceback and the queue goes on with the next: a queue task that died would leave every
later request to its broker unsent for the rest of the term, LeaderAndIsr included, and the
broker out of every ISR (an UpdateMetadata answered with an error code did exactly that).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from localcluster.backoff import ExponentialBackoff
from localcluster.client.connection import BrokerConnection, KafkaError
from localcluster.protocol import controller_requests as cr
from localcluster.protocol.api import ApiKey
from localcluster.protocol.wire import Reader
from localcluster.tasks import cancel_and_wait

log = logging.getLogger(__name__)

QUEUE_BOUND = 10_000
RETRY_BACKOFF = ExponentialBackoff(initial_s=0.05, max_s=1.0)
REQUEST_TIMEOUT_MS = 30_000

OnResponse = Callable[[cr.PartitionErrors], Awaitable[None] | None]


@dataclass(slots=True)
class _Request:
    api_key: int
    body: bytes
    on_response: OnResponse | None
    parse: Callable[[Reader], object] = cr.read_partition_errors
    on_dropped: Callable[[], None] | None = None  # given up on: never queued, or failed oddly


class _BrokerQueue:
    def __init__(self, broker_id: int, registration, client_id: str, connector):
        self.broker_id = broker_id
        self.registration = registration
        self.client_id = client_id
        self.connector = connector
        self.queue: asyncio.Queue[_Request] = asyncio.Queue(QUEUE_BOUND)
        self.task = asyncio.get_running_loop().create_task(self._run())
        self.connection: BrokerConnection | None = None

    async def _run(self) -> None:
        while True:
            request = await self.queue.get()
            try:
                await self._deliver(request)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("controller: %s to broker %d failed unexpectedly; going on with "
                              "the next request", ApiKey(request.api_key).name, self.broker_id)  # fmt: skip
                self._close()
                if request.on_dropped is not None:
                    request.on_dropped()

    async def _deliver(self, request: _Request) -> None:
        """Send until answered (a connection failure is retried), then hand the answer on."""
        failures = 0
        while True:
            try:
                response = await self._send(request)
                break
            except (KafkaError, OSError, ConnectionError, TimeoutError) as e:
                failures += 1
                backoff = RETRY_BACKOFF.backoff_s(failures)
                log.info("controller: request %s to broker %d failed (%s); retrying in %.2f s",
                         ApiKey(request.api_key).name, self.broker_id, e, backoff)  # fmt: skip
                self._close()
                await asyncio.sleep(backoff)
        if request.on_response is not None:
            result = request.on_response(response)
            if asyncio.iscoroutine(result):
                await result

    async def _send(self, request: _Request) -> cr.PartitionErrors:
        if self.connection is None or self.connection.closed:
            self.connection = await self.connector.open(self.broker_id, self.client_id, 1,
                                                        self.registration)  # fmt: skip
        frame, offset = await self.connection.send(request.api_key, lambda v: request.body, version=0,
                                                   timeout_ms=REQUEST_TIMEOUT_MS)  # fmt: skip
        response = request.parse(Reader(frame, offset))
        # UpdateMetadata's answer is its error code alone; the others carry one
        error_code = response if isinstance(response, int) else response.error_code
        if error_code:
            log.warning("controller: broker %d answered %s with error %d", self.broker_id,
                        ApiKey(request.api_key).name, error_code)  # fmt: skip
        return response

    def _close(self) -> None:
        if self.connection is not None:
            self.connection.close()
        self.connection = None

    async def close(self) -> None:
        await cancel_and_wait(self.task)
        self._close()


class ControllerChannelManager:
    def __init__(self, controller_id: int, connector):
        self.controller_id = controller_id
        self.connector = connector  # broker/inter_broker.py's InterBrokerConnector
        self._queues: dict[int, _BrokerQueue] = {}

    def add_broker(self, broker_id: int, registration) -> None:
        existing = self._queues.get(broker_id)
        if existing is not None and existing.registration == registration:
            return
        if existing is not None:
            asyncio.get_running_loop().create_task(existing.close())
        self._queues[broker_id] = _BrokerQueue(broker_id, registration,
                                               f"controller-{self.controller_id}", self.connector)  # fmt: skip

    async def remove_broker(self, broker_id: int) -> None:
        queue = self._queues.pop(broker_id, None)
        if queue is not None:
            await queue.close()

    def send(self, broker_id: int, api_key: int, body: bytes, on_response: OnResponse | None = None,
             parse: Callable[[Reader], object] = cr.read_partition_errors,
             on_dropped: Callable[[], None] | None = None) -> None:  # fmt: skip
        """Queue the request. `on_dropped` is called if it is given up on: not queued (no
        channel, or its queue is full), or its delivery failed unexpectedly."""
        request = _Request(api_key, body, on_response, parse, on_dropped)
        queue = self._queues.get(broker_id)
        if queue is None:
            log.info("controller: no channel to broker %d (not live); dropping %s", broker_id,
                     ApiKey(api_key).name)  # fmt: skip
        else:
            try:
                queue.queue.put_nowait(request)
                return
            except asyncio.QueueFull:
                log.error("controller: queue to broker %d is full (%d requests); dropping %s",
                          broker_id, QUEUE_BOUND, ApiKey(api_key).name)  # fmt: skip
        if on_dropped is not None:
            on_dropped()

    async def close(self) -> None:
        for broker_id in list(self._queues):
            await self.remove_broker(broker_id)
