"""One connection to one broker: framing, correlation ids, pipelining, version negotiation.

`BrokerConnection` owns a transport to a Unix socket path or a TCP host:port, read by
client/frames.py's protocol. Requests are written as they come (up to `max_in_flight`
unanswered at once) and each response frame is matched, as it arrives, to the oldest
outstanding request, as Kafka answers in request order on a
connection. The first request is ApiVersions; every later request goes out at the highest
version both the broker and our protocol modules speak (`SUPPORTED` in protocol/api.py).

Failure rules: a broker that closes the socket, a response whose correlation id is not the one
expected, or a request unanswered within its timeout closes the connection, and every request
still outstanding fails with a retriable error naming the broker (Kafka's clients do the
same: responses come in order, so a lost one cannot be skipped). A closed connection is never
reused; the caller opens a new one.

Also here, shared by the producer, consumer and admin: Kafka errors, configuration parsing
(Kafka's property names), and `LoopThread`, the event loop thread behind the synchronous
facades.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from localcluster.client.frames import FrameError, FrameProtocol
from localcluster.protocol import messages
from localcluster.protocol.api import (
    SUPPORTED,
    ApiKey,
    RequestHeader,
    is_flexible,
    write_request_header,
)
from localcluster.protocol.wire import Reader, Writer

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES = 256 * 1024 * 1024  # a larger size field means the stream is garbage
DEFAULT_CLIENT_ID = "localcluster-client"


# -- errors -------------------------------------------------------------------------------------


class KafkaError(Exception):
    """An error a broker answered with (a Kafka error code), or a client-side failure."""

    def __init__(self, message: str, code: int = -1, retriable: bool = False):
        super().__init__(message)
        self.code = code
        self.retriable = retriable

    @classmethod
    def from_code(cls, code: int, context: str = "", message: str | None = None) -> KafkaError:
        try:
            error = ErrorCode(code)
            name, retriable = error.name.upper(), bool(error.retriable)
        except ValueError:
            name, retriable = f"error code {code}", False
        text = f"{context}: {name}" if context else name
        if message:
            text += f" ({message})"
        kind = OffsetOutOfRangeError if code == ErrorCode.offset_out_of_range else cls
        return kind(text, code, retriable)


class KafkaConnectionError(KafkaError):
    """The broker cannot be reached or went away; retriable (another attempt reconnects)."""

    def __init__(self, message: str):
        super().__init__(message, code=-1, retriable=True)


class RequestTimedOutError(KafkaConnectionError):
    """No response within request.timeout.ms; the connection was closed."""


class OffsetOutOfRangeError(KafkaError):
    """A fetch position outside [log start, high watermark] with auto.offset.reset=none."""


def check_error(code: int, context: str = "", message: str | None = None) -> None:
    if code != 0:
        raise KafkaError.from_code(code, context, message)


# -- configuration ------------------------------------------------------------------------------


def resolve_config(defaults: Mapping[str, Any], config: Mapping[str, Any] | None,
                   overrides: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Kafka property names (`linger.ms`) from `config`, or as keywords (`linger_ms`).

    Values are coerced to the default's type; unknown names raise ValueError listing the known.
    """
    out = dict(defaults)
    given = dict(config or {})
    given.update({k.replace("_", "."): v for k, v in overrides.items() if v is not None})
    for name, value in given.items():
        if name not in defaults:
            raise ValueError(f"unknown setting {name!r}; known: {', '.join(sorted(defaults))}")
        default = defaults[name]
        if isinstance(default, bool):
            value = value if isinstance(value, bool) else str(value).lower() == "true"
        elif isinstance(default, int) and not isinstance(value, int):
            try:
                value = int(value)
            except (TypeError, ValueError):
                raise ValueError(f"{name}={value!r}: expected an integer") from None
        out[name] = value
    return out


# -- addresses ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Address:
    """A broker endpoint: a Unix socket path, or a TCP host and port."""

    host: str = ""
    port: int = 0
    unix_socket: str = ""

    @classmethod
    def parse(cls, text: str) -> Address:
        """`host:port`, `unix:/path/to/broker.sock`, or a path starting with '/'."""
        text = text.strip()
        if text.startswith("unix:"):
            return cls(unix_socket=text[len("unix:") :])
        if text.startswith("/"):
            return cls(unix_socket=text)
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"broker address {text!r}: expected host:port or unix:/path")
        return cls(host=host.strip("[]"), port=int(port))

    def __str__(self) -> str:
        return f"unix:{self.unix_socket}" if self.unix_socket else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """librdkafka's names: security.protocol, sasl.mechanism, sasl.username, sasl.password.
    SASL applies to TCP addresses only: a Unix socket's file mode is its credential."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "PLAIN"
    username: str = ""
    password: str = ""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ClientSecurity:
        protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
        if protocol not in ("PLAINTEXT", "SASL_PLAINTEXT"):
            raise ValueError(f"security.protocol={protocol}: use PLAINTEXT or SASL_PLAINTEXT")
        security = cls(protocol, str(config.get("sasl.mechanism", "PLAIN")).upper(),
                       str(config.get("sasl.username", "")), str(config.get("sasl.password", "")))  # fmt: skip
        if protocol == "SASL_PLAINTEXT" and not security.username:
            raise ValueError(
                "security.protocol=SASL_PLAINTEXT needs sasl.username and sasl.password"
            )
        return security

    @property
    def uses_sasl(self) -> bool:
        return self.protocol == "SASL_PLAINTEXT"


PLAINTEXT_SECURITY = ClientSecurity()
SECURITY_DEFAULTS = {"security.protocol": "PLAINTEXT", "sasl.mechanism": "PLAIN",
                     "sasl.username": "", "sasl.password": ""}  # fmt: skip


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"API key {api_key}"


# -- the connection -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    correlation_id: int
    api_key: int
    version: int
    future: asyncio.Future


class BrokerConnection:
    """One open connection; `send` is safe to call from many tasks at once."""

    def __init__(self, address: Address, protocol: FrameProtocol, client_id: str,
                 max_in_flight: int, request_timeout_ms: int):  # fmt: skip
        assert max_in_flight >= 1
        self.address = address
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.versions: dict[int, int] = {}
        self._protocol = protocol
        self._transport = protocol.transport
        self._correlation = itertools.count(1)
        self._pending: collections.deque[_Pending] = collections.deque()
        self._slots = asyncio.Semaphore(max_in_flight)
        self._max_in_flight = max_in_flight
        self._closed: KafkaError | None = None
        protocol.on_frame = self._dispatch
        protocol.on_lost = self._lost

    @classmethod
    async def open(cls, address: Address, *, client_id: str = DEFAULT_CLIENT_ID,
                   max_in_flight: int = 5, request_timeout_ms: int = 30_000,
                   connect_timeout_ms: int = 10_000,
                   security: ClientSecurity = PLAINTEXT_SECURITY) -> BrokerConnection:  # fmt: skip
        """Connect, negotiate API versions and, on a SASL listener, authenticate; raises
        KafkaConnectionError if unreachable, KafkaError(SASL_AUTHENTICATION_FAILED) if refused."""
        loop = asyncio.get_running_loop()

        def protocol() -> FrameProtocol:
            return FrameProtocol(MAX_RESPONSE_BYTES)

        try:
            if address.unix_socket:
                opening = loop.create_unix_connection(protocol, address.unix_socket)
            else:
                opening = loop.create_connection(protocol, address.host, address.port)
            _transport, frames = await asyncio.wait_for(opening, connect_timeout_ms / 1000)
        except (OSError, TimeoutError) as e:
            raise KafkaConnectionError(f"cannot connect to broker at {address}: {e}") from e
        connection = cls(address, frames, client_id, max_in_flight, request_timeout_ms)
        try:
            await connection._negotiate_versions()
            if security.uses_sasl and not address.unix_socket:
                await connection._authenticate(security)
        except BaseException:
            connection.close()
            raise
        return connection

    async def _authenticate(self, security: ClientSecurity) -> None:
        """SaslHandshake v1, then the mechanism's tokens in SaslAuthenticate requests."""
        import secrets

        from localcluster.protocol import sasl

        mechanism = security.mechanism
        payload, offset = await self.send(ApiKey.SASL_HANDSHAKE, lambda v: messages.encode_request(
            ApiKey.SASL_HANDSHAKE, v, {"mechanism": mechanism}), version=1)  # fmt: skip
        handshake = messages.decode_response(ApiKey.SASL_HANDSHAKE, 1, payload, offset)
        if handshake.error_code:
            raise KafkaError(f"broker at {self.address} does not accept SASL {mechanism} "
                             f"(it offers {', '.join(handshake.mechanisms) or 'none'})",
                             int(handshake.error_code))  # fmt: skip
        client = sasl.new_sasl_client(mechanism, security.username, security.password,
                                      nonce=secrets.token_urlsafe(24))  # fmt: skip
        token = client.initial()
        version = self.version(ApiKey.SASL_AUTHENTICATE)
        for _ in range(8):  # PLAIN takes one round, SCRAM two
            payload, offset = await self.send(ApiKey.SASL_AUTHENTICATE, lambda v, t=token: (
                messages.encode_request(ApiKey.SASL_AUTHENTICATE, v, {"auth_bytes": t})))  # fmt: skip
            answer = messages.decode_response(ApiKey.SASL_AUTHENTICATE, version, payload, offset)
            if answer.error_code:
                raise KafkaError(f"SASL {mechanism} authentication as {security.username!r} at "
                                 f"{self.address} failed: {answer.error_message or 'refused'}",
                                 int(answer.error_code))  # fmt: skip
            try:
                token = client.evaluate(bytes(answer.auth_bytes))
            except sasl.SaslAuthenticationError as e:
                raise KafkaError(f"SASL {mechanism} at {self.address}: the broker's answer "
                                 f"does not verify ({e})", ErrorCode.sasl_authentication_failed) from None  # fmt: skip
            if client.complete:
                return
        raise KafkaError(f"SASL {mechanism} at {self.address} did not complete",
                         ErrorCode.sasl_authentication_failed)  # fmt: skip

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def has_capacity(self) -> bool:
        return not self.closed and self._slots._value > 0  # noqa: SLF001 (no public peek)

    def version(self, api_key: int) -> int:
        """The negotiated version (KafkaError when there is none: pass version= to send)."""
        if api_key not in self.versions:
            mine = SUPPORTED.get(api_key)
            ours = f"{mine.min}-{mine.max}" if mine else "none"
            raise KafkaError(f"broker at {self.address} does not support {_api_name(api_key)} in "
                             f"versions we speak ({ours})", ErrorCode.unsupported_version)  # fmt: skip
        return self.versions[api_key]

    async def _negotiate_versions(self) -> None:
        ours = SUPPORTED[ApiKey.API_VERSIONS]
        version = ours.max
        body = {"client_software_name": "localcluster", "client_software_version": "0.1"}
        for _ in range(2):
            payload, offset = await self.send(ApiKey.API_VERSIONS,
                                              lambda v: messages.encode_request(ApiKey.API_VERSIONS, v, body),
                                              version=version)  # fmt: skip
            response = messages.decode_response(ApiKey.API_VERSIONS, version, payload, offset)
            if response.error_code == ErrorCode.unsupported_version and version != 0:
                version = 0  # the broker answered in v0 with its range; ask again in v0
                continue
            check_error(response.error_code, f"ApiVersions from {self.address}")
            break
        for key in response.api_keys:
            mine = SUPPORTED.get(key.api_key)
            if mine is None or key.api_key == ApiKey.API_VERSIONS:
                continue
            best = min(mine.max, key.max_version)
            if best >= max(mine.min, key.min_version):
                self.versions[key.api_key] = best
        self.versions[ApiKey.API_VERSIONS] = version

    async def send(self, api_key: int, encode: Callable[[int], bytes | list], *,
                   version: int | None = None, expect_response: bool = True,
                   timeout_ms: int | None = None):  # fmt: skip
        """Send a request whose body is `encode(version)`, bytes or a list of buffers (written
        as they are, with one writev); return (frame, body offset).

        With expect_response=False (Produce acks=0) returns None once the bytes are written.
        """
        if self._closed is not None:
            raise self._closed
        if version is None:
            version = self.version(api_key)
        await self._slots.acquire()
        released = False
        try:
            if self._closed is not None:
                raise self._closed
            correlation_id = next(self._correlation) & 0x7FFFFFFF
            head = Writer()
            write_request_header(
                head, RequestHeader(api_key, version, correlation_id, self.client_id)
            )
            body = encode(version)
            parts = body if isinstance(body, list) else [body]
            size = len(head.buf) + sum(len(part) for part in parts)
            try:
                self._transport.writelines([_SIZE.pack(size) + head.buf, *parts])
            except (RuntimeError, OSError) as e:  # uvloop: "the handler is closed"
                self._fail(KafkaConnectionError(f"broker at {self.address} went away: {e}"))
                raise self._closed from e
            if not expect_response:
                self._slots.release()
                released = True
                await self._drain()
                return None
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            self._pending.append(_Pending(correlation_id, api_key, version, future))
            await self._drain()
            timeout_s = (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
            timer = loop.call_later(timeout_s, self._time_out, future, api_key, timeout_s)
            try:
                return await future
            finally:
                timer.cancel()
        finally:
            if not released:
                self._slots.release()

    def _time_out(self, future: asyncio.Future, api_key: int, timeout_s: float) -> None:
        if not future.done():  # fails every outstanding request, this one included
            self._fail(RequestTimedOutError(
                f"{_api_name(api_key)} to broker at {self.address} unanswered after "
                f"{timeout_s * 1000:.0f} ms; connection closed"))  # fmt: skip

    async def _drain(self) -> None:
        try:
            await self._protocol.drain()
        except ConnectionError as e:
            self._fail(KafkaConnectionError(f"broker at {self.address} went away: {e}"))
            raise self._closed from e

    def _lost(self, error: BaseException | None) -> None:
        """The protocol's end of the connection: the broker closed it, or it broke."""
        if isinstance(error, KafkaError):
            self._fail(error)
        elif isinstance(error, FrameError):
            self._fail(KafkaConnectionError(f"broker at {self.address} sent {error}"))
        elif isinstance(error, ValueError):  # a response header that does not parse
            self._fail(
                KafkaConnectionError(f"broker at {self.address} sent a bad response: {error}")
            )
        elif error is not None:
            self._fail(KafkaConnectionError(f"broker at {self.address} went away: {error}"))
        else:
            pending = len(self._pending)
            self._fail(KafkaConnectionError(
                f"broker at {self.address} closed the connection"
                + (f" with {pending} request(s) unanswered" if pending else "")))  # fmt: skip

    def _dispatch(self, frame: bytes | memoryview) -> None:
        if not self._pending:
            raise KafkaConnectionError(f"broker at {self.address} sent a response nobody asked for")
        pending = self._pending[0]  # popped only when it matches: _fail fails it otherwise
        reader = Reader(frame)
        correlation_id = reader.int32()
        if correlation_id != pending.correlation_id:
            raise KafkaConnectionError(
                f"broker at {self.address} answered correlation id {correlation_id}, expected "
                f"{pending.correlation_id} ({_api_name(pending.api_key)})")  # fmt: skip
        self._pending.popleft()
        if pending.api_key != ApiKey.API_VERSIONS and is_flexible(pending.api_key, pending.version):
            reader.skip_tagged_fields()
        if not pending.future.done():
            pending.future.set_result((frame, reader.pos))

    def _fail(self, error: KafkaError) -> None:
        if self._closed is None:
            self._closed = error
            log.debug("connection to %s closed: %s", self.address, error)
        while self._pending:
            future = self._pending.popleft().future
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved here: a caller that timed out never awaits it
        self._transport.close()

    def close(self) -> None:
        """Close now; outstanding requests fail with KafkaConnectionError."""
        self._fail(KafkaConnectionError(f"connection to {self.address} closed by the client"))

    async def wait_closed(self) -> None:
        await self._protocol.closed


# -- the event loop thread behind the synchronous facades ---------------------------------------


class LoopThread:
    """A daemon thread running an asyncio loop; `run(coro)` blocks the caller for its result.

    The synchronous Producer, Consumer and Admin each own one, so scripts and the CLI use the
    asyncio client without writing async code. `stop()` ends the loop and joins the thread.
    """

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout_s: float | None = None):
        return self.submit(coro).result(timeout_s)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
