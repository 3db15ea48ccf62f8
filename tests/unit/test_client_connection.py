"""BrokerConnection against an in-process fake broker: negotiation, pipelining, failures."""

from __future__ import annotations

import asyncio
import struct

import pytest

from localcluster.client.connection import (
    Address,
    BrokerConnection,
    KafkaConnectionError,
    KafkaError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    resolve_config,
)
from localcluster.protocol import messages
from localcluster.protocol.api import SUPPORTED, ApiKey, read_request_header, response_header
from localcluster.protocol.wire import Reader


def test_address_parse():
    assert Address.parse("127.0.0.1:9092") == Address("127.0.0.1", 9092)
    assert Address.parse("unix:/tmp/b.sock") == Address(unix_socket="/tmp/b.sock")
    assert Address.parse("/tmp/b.sock") == Address(unix_socket="/tmp/b.sock")
    assert str(Address.parse("localhost:1")) == "localhost:1"
    with pytest.raises(ValueError, match="host:port"):
        Address.parse("nohost")


def test_resolve_config_takes_kafka_names_and_keywords():
    defaults = {
        "linger.ms": 5,
        "batch.size": 16384,
        "check.crcs": True,
        "auto.offset.reset": "latest",
    }
    got = resolve_config(defaults, {"linger.ms": "7"}, {"batch_size": 10, "check_crcs": "false"})
    assert got == {
        "linger.ms": 7,
        "batch.size": 10,
        "check.crcs": False,
        "auto.offset.reset": "latest",
    }
    with pytest.raises(ValueError, match="unknown setting 'lingr.ms'"):
        resolve_config(defaults, {"lingr.ms": 1}, {})
    with pytest.raises(ValueError, match="expected an integer"):
        resolve_config(defaults, {"linger.ms": "soon"}, {})


def test_errors_from_codes():
    e = KafkaError.from_code(6, "produce t-0")
    assert e.retriable and e.code == 6 and "NOT_LEADER_OR_FOLLOWER" in str(e)
    assert isinstance(KafkaError.from_code(1), OffsetOutOfRangeError)
    assert not KafkaError.from_code(36).retriable  # TOPIC_ALREADY_EXISTS


class FakeBroker:
    """Answers ApiVersions with `versions`; everything else goes to on_request(broker,
    writer, header, body reader)."""

    def __init__(self, versions: dict[int, tuple[int, int]], on_request=None):
        self.versions = versions
        self.on_request = on_request
        self.requests: list[tuple[int, int, int]] = []  # (api_key, version, correlation id)
        self.writers: list[asyncio.StreamWriter] = []

    async def serve(self, tmp_path) -> Address:
        path = str(tmp_path / "fake.sock")
        self.server = await asyncio.start_unix_server(self._connection, path)
        return Address(unix_socket=path)

    async def serve_tcp(self) -> Address:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return Address("127.0.0.1", self.server.sockets[0].getsockname()[1])

    async def _connection(self, reader, writer):
        self.writers.append(writer)
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                frame = await reader.readexactly(size)
                r = Reader(frame)
                header = read_request_header(r)
                self.requests.append((header.api_key, header.api_version, header.correlation_id))
                if header.api_key == ApiKey.API_VERSIONS:
                    keys = [{"api_key": k, "min_version": lo, "max_version": hi}
                            for k, (lo, hi) in self.versions.items()]  # fmt: skip
                    body = messages.encode_response(ApiKey.API_VERSIONS, header.api_version,
                                                    {"error_code": 0, "api_keys": keys})  # fmt: skip
                    self.send(writer, header, body)
                elif self.on_request is not None:
                    await self.on_request(self, writer, header, r)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    @staticmethod
    def send(writer, header, body: bytes, correlation_id: int | None = None):
        head = response_header(
            header.api_key,
            header.api_version,
            header.correlation_id if correlation_id is None else correlation_id,
        )
        writer.write(struct.pack(">i", len(head) + len(body)) + head + body)

    async def close(self):
        for w in self.writers:
            w.close()
        self.server.close()
        await self.server.wait_closed()


def metadata_body(version: int) -> bytes:
    return messages.encode_response(ApiKey.METADATA, version, {"brokers": [], "topics": []})


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_negotiates_the_highest_common_version(tmp_path):
    async def main():
        broker = FakeBroker({ApiKey.METADATA: (0, 5), ApiKey.PRODUCE: (0, 20), ApiKey.FETCH: (0, 3),
                             ApiKey.LIST_OFFSETS: (2, 30)})  # fmt: skip
        address = await broker.serve(tmp_path)
        c = await BrokerConnection.open(address)
        try:
            assert c.versions[ApiKey.METADATA] == 5
            assert c.versions[ApiKey.PRODUCE] == SUPPORTED[ApiKey.PRODUCE].max
            assert ApiKey.FETCH not in c.versions  # 0-3 does not meet our 4-11
            assert c.versions[ApiKey.LIST_OFFSETS] == SUPPORTED[ApiKey.LIST_OFFSETS].max
            with pytest.raises(KafkaError, match="does not support FETCH"):
                c.version(ApiKey.FETCH)
        finally:
            c.close()
            await broker.close()

    run(main())


def test_pipelined_requests_are_matched_in_order_and_bounded(tmp_path):
    held: list = []

    async def on_request(broker, writer, header, body):
        held.append(header)
        if len(held) == 3:  # answer only once three are outstanding: proves pipelining
            for h in held:
                broker.send(writer, h, metadata_body(h.api_version))
            held.clear()

    async def main():
        broker = FakeBroker({ApiKey.METADATA: (0, 8)}, on_request)
        address = await broker.serve(tmp_path)
        c = await BrokerConnection.open(address, max_in_flight=3)
        try:
            encode = lambda v: messages.encode_request(ApiKey.METADATA, v, {"topics": None})  # noqa: E731
            tasks = [asyncio.create_task(c.send(ApiKey.METADATA, encode)) for _ in range(6)]
            results = await asyncio.gather(*tasks)
            assert len(results) == 6 and c.in_flight == 0
            ids = [cid for key, _, cid in broker.requests if key == ApiKey.METADATA]
            assert ids == sorted(ids) and len(set(ids)) == 6
        finally:
            c.close()
            await broker.close()

    run(main())


def test_a_wrong_correlation_id_closes_the_connection(tmp_path):
    async def on_request(broker, writer, header, body):
        broker.send(writer, header, metadata_body(header.api_version), correlation_id=999)

    async def main():
        broker = FakeBroker({ApiKey.METADATA: (0, 8)}, on_request)
        c = await BrokerConnection.open(await broker.serve(tmp_path))
        try:
            with pytest.raises(KafkaConnectionError, match="correlation id 999"):
                await c.send(
                    ApiKey.METADATA,
                    lambda v: messages.encode_request(ApiKey.METADATA, v, {"topics": None}),
                )
            assert c.closed
            with pytest.raises(KafkaConnectionError):
                await c.send(ApiKey.METADATA, lambda v: b"")
        finally:
            c.close()
            await broker.close()

    run(main())


def test_broker_gone_fails_every_outstanding_request(tmp_path):
    async def on_request(broker, writer, header, body):
        if header.correlation_id >= 4:  # ApiVersions was 1; hold 2 and 3, then hang up
            writer.close()

    async def main():
        broker = FakeBroker({ApiKey.METADATA: (0, 8)}, on_request)
        c = await BrokerConnection.open(await broker.serve(tmp_path))
        encode = lambda v: messages.encode_request(ApiKey.METADATA, v, {"topics": None})  # noqa: E731
        tasks = [asyncio.create_task(c.send(ApiKey.METADATA, encode)) for _ in range(3)]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, KafkaConnectionError) for r in results), results
        assert "closed the connection" in str(results[0]) and "unanswered" in str(results[0])
        assert results[0].retriable
        await broker.close()

    run(main())


def test_request_timeout_closes_the_connection(tmp_path):
    async def on_request(broker, writer, header, body):
        pass  # never answers

    async def main():
        broker = FakeBroker({ApiKey.METADATA: (0, 8)}, on_request)
        c = await BrokerConnection.open(await broker.serve(tmp_path), request_timeout_ms=100)
        with pytest.raises(RequestTimedOutError, match="unanswered after 100 ms"):
            await c.send(
                ApiKey.METADATA,
                lambda v: messages.encode_request(ApiKey.METADATA, v, {"topics": None}),
            )
        assert c.closed
        await broker.close()

    run(main())


def test_unreachable_broker_is_a_clear_error(tmp_path):
    async def main():
        with pytest.raises(KafkaConnectionError, match="cannot connect to broker at unix:"):
            await BrokerConnection.open(Address(unix_socket=str(tmp_path / "nobody.sock")))

    run(main())
