"""SASL for Kafka's SaslHandshake (key 17) / SaslAuthenticate (key 36): sans-I/O state machines.

One interface for every mechanism so the network code can drive any of them:
  server = new_sasl_server(mechanism, plain_users=..., scram_lookup=..., nonce=os.urandom(24))
  reply = server.evaluate(auth_bytes)   # bytes for the SaslAuthenticate response
  server.complete, server.principal     # "User:<name>" once complete
  client = new_sasl_client(mechanism, username, password, nonce=os.urandom(24))
  token = client.initial(); token = client.evaluate(challenge)  # None: nothing more to send
A failure raises SaslAuthenticationError: `message` is safe to send to the client (it never says
whether the user exists or which part was wrong), `reason` is the detail for the broker's log,
`error_code` the Kafka error code to answer with. Once failed or complete, every further token
is an IllegalSaslStateError. Nothing here reads a clock, a socket, a file or a random source:
nonces come in as arguments. PLAIN (RFC 4616) lives here, SCRAM (RFC 5802/7677) in scram.py.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from localcluster.protocol.scram import ScramCredential

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
SUPPORTED_MECHANISMS: tuple[str, ...] = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)
# A SASL token rides in one request, which the network already bounds; this bound keeps a
# hostile token from costing more than a few microseconds to reject. RFC 4616 asks for 255
# octets per PLAIN field; SCRAM messages are a few hundred bytes.
SASL_TOKEN_MAX_BYTES = 16384
USER_PRINCIPAL_TYPE = "User"

# Kafka's error codes for the SaslAuthenticate/SaslHandshake responses.
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58


class SaslAuthenticationError(Exception):
    error_code = SASL_AUTHENTICATION_FAILED

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.message = message  # for the peer
        self.reason = reason or message  # for our log: may name the user


class IllegalSaslStateError(SaslAuthenticationError):
    """A token after the exchange completed or failed, or a step out of order."""

    error_code = ILLEGAL_SASL_STATE


class UnsupportedSaslMechanismError(SaslAuthenticationError):
    error_code = UNSUPPORTED_SASL_MECHANISM


class SaslServer(Protocol):
    mechanism: str

    @property
    def complete(self) -> bool: ...

    @property
    def authorization_id(self) -> str: ...

    @property
    def principal(self) -> str: ...

    def evaluate(self, token: bytes) -> bytes: ...


class SaslClient(Protocol):
    mechanism: str

    @property
    def complete(self) -> bool: ...

    def initial(self) -> bytes: ...

    def evaluate(self, challenge: bytes) -> bytes | None: ...


def user_principal(name: str) -> str:
    return f"{USER_PRINCIPAL_TYPE}:{name}"


def check_token_size(token: bytes, mechanism: str) -> None:
    if len(token) > SASL_TOKEN_MAX_BYTES:
        raise SaslAuthenticationError(
            f"Authentication failed: SASL/{mechanism} token of {len(token)} bytes is larger "
            f"than {SASL_TOKEN_MAX_BYTES}"
        )


class PlainServer:
    """RFC 4616's one token, `authzid NUL authcid NUL passwd`, checked against `users` (the
    PlainLoginModule's user_<name> options). Messages are Kafka's PlainSaslServer's."""

    mechanism = PLAIN
    INVALID_CREDENTIALS = "Authentication failed: Invalid username or password"
    AUTHORIZATION_ID_MISMATCH = ("Authentication failed: Client requested an authorization id "
                                 "that is different from username")  # fmt: skip

    def __init__(self, users: dict[str, str]):
        # Digests, so the comparison takes the same time whatever the lengths.
        self._password_digests = {name: _digest(password) for name, password in users.items()}
        self._state = "receive_response"  # -> complete | failed
        self._authorization_id: str | None = None

    @property
    def complete(self) -> bool:
        return self._state == "complete"

    @property
    def authorization_id(self) -> str:
        assert self._authorization_id is not None, "SASL/PLAIN exchange has not completed"
        return self._authorization_id

    @property
    def principal(self) -> str:
        return user_principal(self.authorization_id)

    def evaluate(self, token: bytes) -> bytes:
        if self._state != "receive_response":
            raise IllegalSaslStateError(f"Unexpected SASL/PLAIN token in state {self._state}")
        try:
            self._authorization_id = self._authenticate(bytes(token))
        except SaslAuthenticationError:
            self._state = "failed"
            raise
        self._state = "complete"
        return b""

    def _authenticate(self, token: bytes) -> str:
        check_token_size(token, PLAIN)
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise _plain_malformed("not valid UTF-8") from None
        fields = text.split("\0")
        if len(fields) != 3:
            raise _plain_malformed(f"expected 3 tokens separated by NUL, got {len(fields)}")
        authorization_id, username, password = fields
        if not username:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        expected = self._password_digests.get(username, _NO_SUCH_USER_DIGEST)
        password_matches = hmac.compare_digest(_digest(password), expected)
        if not password_matches or username not in self._password_digests:
            known = "wrong password" if username in self._password_digests else "unknown user"
            raise SaslAuthenticationError(self.INVALID_CREDENTIALS,
                                          f"SASL/PLAIN {known} for {username!r}")  # fmt: skip
        if authorization_id and authorization_id != username:
            raise SaslAuthenticationError(
                self.AUTHORIZATION_ID_MISMATCH,
                f"SASL/PLAIN user {username!r} asked for authorization id {authorization_id!r}",
            )
        return username


def _digest(password: str) -> bytes:
    return hashlib.sha256(password.encode("utf-8")).digest()


# A PLAIN password never holds NUL, so no password has this digest's preimage.
_NO_SUCH_USER_DIGEST = _digest("\0no such user")


def _plain_malformed(what: str) -> SaslAuthenticationError:
    return SaslAuthenticationError(f"Authentication failed: Invalid SASL/PLAIN response: {what}")


class PlainClient:
    mechanism = PLAIN

    def __init__(self, username: str, password: str, authorization_id: str = ""):
        assert username and password, "SASL/PLAIN needs a username and a password"
        assert "\0" not in username + password + authorization_id, "NUL separates PLAIN fields"
        self._token = f"{authorization_id}\0{username}\0{password}".encode()
        self._state = "send_response"  # -> receive_outcome -> complete | failed

    @property
    def complete(self) -> bool:
        return self._state == "complete"

    def initial(self) -> bytes:
        if self._state != "send_response":
            raise IllegalSaslStateError(f"SASL/PLAIN initial token asked in state {self._state}")
        self._state = "receive_outcome"
        return self._token

    def evaluate(self, challenge: bytes) -> bytes | None:
        """The server's (empty) reply to a successful authentication."""
        if self._state != "receive_outcome":
            raise IllegalSaslStateError(f"Unexpected SASL/PLAIN challenge in state {self._state}")
        if challenge:
            self._state = "failed"
            raise SaslAuthenticationError("SASL/PLAIN server replied with a non-empty token")
        self._state = "complete"
        return None


def new_sasl_server(mechanism: str, *, plain_users: dict[str, str] | None = None,
                    scram_lookup: Callable[[str], ScramCredential | None] | None = None,
                    nonce: str | bytes | None = None) -> SaslServer:  # fmt: skip
    """`scram_lookup(username)` returns the user's credential for this mechanism (None: no
    such user); `nonce` is the server's SCRAM nonce: a printable str, or random bytes (>= 16)."""
    from localcluster.protocol import scram  # scram.py imports this module's errors

    if mechanism == PLAIN:
        assert plain_users is not None, "PLAIN needs plain_users"
        return PlainServer(plain_users)
    if mechanism in scram.SCRAM_MECHANISMS:
        assert scram_lookup is not None and nonce is not None, "SCRAM needs a lookup and a nonce"
        return scram.ScramServer(mechanism, scram_lookup, nonce)
    raise _unsupported(mechanism)


def new_sasl_client(mechanism: str, username: str, password: str, *,
                    nonce: str | bytes | None = None) -> SaslClient:  # fmt: skip
    from localcluster.protocol import scram  # scram.py imports this module's errors

    if mechanism == PLAIN:
        return PlainClient(username, password)
    if mechanism in scram.SCRAM_MECHANISMS:
        assert nonce is not None, "SCRAM needs a client nonce"
        return scram.ScramClient(mechanism, username, password, nonce)
    raise _unsupported(mechanism)


def _unsupported(mechanism: str) -> UnsupportedSaslMechanismError:
    return UnsupportedSaslMechanismError(f"Unsupported SASL mechanism {mechanism!r}; supported "
                                         f"mechanisms are {', '.join(SUPPORTED_MECHANISMS)}")  # fmt: skip
