"""SASL on a SASL_PLAINTEXT listener: Kafka's SaslServerAuthenticator, driven per connection.

A connection on a SASL listener may send only ApiVersions, SaslHandshake and SaslAuthenticate
until it has authenticated; anything else closes it. SaslHandshake picks the mechanism (one of
`sasl.enabled.mechanisms`); with SaslHandshake v1 the tokens travel in SaslAuthenticate
requests (KIP-152), with v0 as bare size-prefixed frames (the pre-1.0 way, still spoken by old
clients). Success sets the connection's principal (`User:<name>`); a failure is answered with
SASL_AUTHENTICATION_FAILED and the connection is closed, as Kafka does.

Credentials: PLAIN checks `user_<name>="password"` entries of the JAAS file's KafkaServer
section (Kafka's PlainLoginModule); SCRAM checks the salted credentials in the coordination
store at /config/users/<name> (as `kafka-configs.sh --alter --add-config SCRAM-SHA-256=...`
writes them). The mechanism state machines are protocol/sasl.py's, sans-I/O; here they are fed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localcluster.broker.network import ConnectionContext
from localcluster.protocol import jaas, messages, sasl, scram
from localcluster.protocol.api import ApiKey, RequestHeader
from localcluster.protocol.wire import MalformedRequestError, Reader

log = logging.getLogger(__name__)

UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58
PRE_AUTHENTICATION_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE,
                                     ApiKey.SASL_AUTHENTICATE})  # fmt: skip
JAAS_SERVER_SECTION = "KafkaServer"


class CredentialsError(ValueError):
    """The JAAS file is missing, unreadable or lacks what the configuration needs."""


@dataclass(frozen=True, slots=True)
class ServerCredentials:
    """What a broker knows from its JAAS file: PLAIN's users and its own login per mechanism."""

    plain_users: dict[str, str] = field(default_factory=dict)
    logins: dict[str, tuple[str, str]] = field(default_factory=dict)  # mechanism -> (user, pw)

    def login(self, mechanism: str) -> tuple[str, str]:
        try:
            return self.logins[mechanism]
        except KeyError:
            raise CredentialsError(
                f"the JAAS file's {JAAS_SERVER_SECTION} section has no login module for "
                f"{mechanism} with username and password (the broker's own credential)"
            ) from None


def load_server_credentials(path: str | None) -> ServerCredentials:
    if not path:
        return ServerCredentials()
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise CredentialsError(f"cannot read the JAAS file {path}: {e.strerror}") from None
    try:
        sections = jaas.parse_jaas(text)
    except jaas.JaasConfigError as e:
        raise CredentialsError(f"{path}: {e}") from None
    modules = sections.get(JAAS_SERVER_SECTION)
    if not modules:
        raise CredentialsError(f"{path} has no {JAAS_SERVER_SECTION} section")
    plain_users: dict[str, str] = {}
    logins: dict[str, tuple[str, str]] = {}
    for module in modules:
        for mechanism in module.mechanisms:
            if module.username is not None and module.password is not None:
                logins.setdefault(mechanism, (module.username, module.password))
            if mechanism == sasl.PLAIN:
                plain_users.update(module.plain_users)
    return ServerCredentials(plain_users, logins)


@dataclass(slots=True)
class _Exchange:
    mechanism: str
    server: object
    raw_tokens: bool  # SaslHandshake v0: tokens come as bare frames


ScramLookup = Callable[[str, str], "scram.ScramCredential | None"]  # (mechanism, user)


def store_scram_lookup(zk) -> ScramLookup:
    """SCRAM credentials from /config/users/<user> (a blocking store read: call off the loop).
    An unparsable credential is logged and treated as no credential: that user cannot log in."""

    def lookup(mechanism: str, user: str):
        text = zk.user_config(user).get(mechanism)
        if not text:
            return None
        try:
            return scram.decode_scram_credential(text, mechanism)
        except ValueError as e:
            log.warning("the %s credential of user %s in /config/users is unusable: %s",
                        mechanism, user, e)  # fmt: skip
            return None

    return lookup


class SaslAuthenticator:
    def __init__(self, enabled_mechanisms: tuple[str, ...], credentials: ServerCredentials,
                 scram_lookup: ScramLookup, failed_authentication_delay_ms: int = 100):  # fmt: skip
        self.failed_authentication_delay_s = failed_authentication_delay_ms / 1000
        self.enabled_mechanisms = enabled_mechanisms
        self.credentials = credentials
        self.scram_lookup = scram_lookup

    def check_before_authentication(self, context: ConnectionContext, header: RequestHeader):
        if header.api_key not in PRE_AUTHENTICATION_APIS:
            raise MalformedRequestError(
                f"{_name(header.api_key)} from {context.peer} on SASL listener "
                f"{context.listener.name} before SASL authentication; the client must "
                "authenticate first (security.protocol=SASL_PLAINTEXT, sasl.mechanism, "
                "sasl.username, sasl.password)")  # fmt: skip

    def is_raw_token(self, context: ConnectionContext) -> bool:
        exchange = context.sasl
        return (
            isinstance(exchange, _Exchange) and exchange.raw_tokens and context.needs_authentication
        )

    # -- SaslHandshake ----------------------------------------------------------------------

    async def handle_handshake(self, context: ConnectionContext, header: RequestHeader,
                               reader: Reader) -> bytes:  # fmt: skip
        request = messages.read_request(header, reader)
        mechanism = str(request.mechanism).upper()
        enabled = list(self.enabled_mechanisms)
        if not context.needs_authentication or context.sasl is not None:
            context.close_after_response = (
                "SaslHandshake out of place (not a SASL listener, or sent twice)"
            )
            return self._handshake_response(header, ILLEGAL_SASL_STATE, enabled)
        if mechanism not in self.enabled_mechanisms:
            context.close_after_response = (f"SASL mechanism {mechanism} is not enabled "
                                            f"(sasl.enabled.mechanisms: {', '.join(enabled)})")  # fmt: skip
            return self._handshake_response(header, UNSUPPORTED_SASL_MECHANISM, enabled)
        server = sasl.new_sasl_server(
            mechanism, plain_users=self.credentials.plain_users,
            scram_lookup=lambda user: self.scram_lookup(mechanism, user),
            nonce=secrets.token_urlsafe(24))  # fmt: skip
        context.sasl = _Exchange(mechanism, server, raw_tokens=header.api_version == 0)
        return self._handshake_response(header, 0, enabled)

    @staticmethod
    def _handshake_response(header: RequestHeader, error: int, mechanisms: list[str]) -> bytes:
        return messages.encode_response(header.api_key, header.api_version,
                                        {"error_code": error, "mechanisms": mechanisms})  # fmt: skip

    # -- the tokens -------------------------------------------------------------------------

    async def handle_authenticate(self, context: ConnectionContext, header: RequestHeader,
                                  reader: Reader) -> bytes:  # fmt: skip
        request = messages.read_request(header, reader)
        exchange = context.sasl
        if (
            not isinstance(exchange, _Exchange)
            or exchange.raw_tokens
            or not context.needs_authentication
        ):
            context.close_after_response = "SaslAuthenticate without a SaslHandshake v1 first"
            return self._authenticate_response(header, ILLEGAL_SASL_STATE,
                                               "SaslAuthenticate needs a SaslHandshake v1 first")  # fmt: skip
        try:
            challenge = await self._evaluate(context, exchange, bytes(request.auth_bytes))
        except sasl.SaslAuthenticationError as e:
            code = getattr(e, "error_code", SASL_AUTHENTICATION_FAILED)
            return self._authenticate_response(header, code, str(e))
        return self._authenticate_response(header, 0, None, challenge)

    async def handle_raw_token(self, context: ConnectionContext, frame: memoryview) -> list:
        exchange = context.sasl
        assert isinstance(exchange, _Exchange)
        try:
            challenge = await self._evaluate(context, exchange, bytes(frame))
        except sasl.SaslAuthenticationError:
            return []  # v0 has no error frame: the closed connection is the answer
        return [challenge]

    async def _evaluate(
        self, context: ConnectionContext, exchange: _Exchange, token: bytes
    ) -> bytes:
        try:
            # SCRAM looks its credential up in the store: a blocking read, off the loop.
            challenge = await asyncio.to_thread(exchange.server.evaluate, token)
        except sasl.SaslAuthenticationError as e:
            context.close_after_response = f"SASL {exchange.mechanism} authentication failed: {e}"
            context.close_delay_s = self.failed_authentication_delay_s
            log.warning("SASL %s authentication from %s on listener %s failed: %s",
                        exchange.mechanism, context.peer, context.listener.name,
                        getattr(e, "reason", None) or e)  # fmt: skip
            raise
        if exchange.server.complete:
            context.principal = exchange.server.principal
            context.authenticated = True
            log.info("authenticated %s (SASL %s)", context.describe(), exchange.mechanism)
        return challenge or b""

    @staticmethod
    def _authenticate_response(header: RequestHeader, error: int, message: str | None,
                               auth_bytes: bytes = b"") -> bytes:  # fmt: skip
        return messages.encode_response(header.api_key, header.api_version, {
            "error_code": error, "error_message": message, "auth_bytes": auth_bytes,
            "session_lifetime": 0})  # fmt: skip


def _name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"API key {api_key}"
