"""SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka implements them (KIP-84).

Credentials are Kafka's: `ScramCredential(salt, stored_key, server_key, iterations)`, stored in
ZooKeeper's /config/users/<name> as `salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=N`.
Passwords are UTF-8 without SASLprep, as Kafka's ScramFormatter does, so credentials made by
Kafka's tools verify here. Kafka's rules: the gs2 header is `n,` with an optional authzid equal
to the username (channel binding 'p' and 'y' are refused), saslname escapes `=2C` `=3D`,
iterations >= 4096, the final nonce must end with the server-first nonce, a `tokenauth=true`
extension (delegation tokens, which do not exist here) is refused and other extensions are
ignored. Where RFC 5802 is stricter than Kafka we follow the RFC: a mandatory extension `m=` is
refused and the client-final `c=` must carry the gs2 header it was sent.
An unknown user is not refused at the first message (which would tell the client the name does
not exist): the exchange goes on with a mock credential and fails at the proof with the same
message as a wrong password. The salt of the mock is derived from the name so it repeats.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass

from localcluster.protocol.sasl import (
    IllegalSaslStateError,
    SaslAuthenticationError,
    check_token_size,
    user_principal,
)

SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
SCRAM_MECHANISMS = tuple(SCRAM_HASHES)
MIN_ITERATIONS = 4096  # Kafka's ScramMechanism.minIterations
# Kafka's maxIterations (for credentials it creates). Our client refuses more, which bounds the
# work a hostile server can make it do (PBKDF2 runs `iterations` HMACs).
MAX_ITERATIONS = 16384
GS2_HEADER = "n,,"
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z]+")
_MOCK_SALT_LABEL = b"localcluster SCRAM mock salt\0"


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


class ScramCredentialError(ValueError):
    pass


def scram_credential(password: str, salt: bytes, iterations: int = MIN_ITERATIONS,
                     mechanism: str = "SCRAM-SHA-256") -> ScramCredential:  # fmt: skip
    """The credential a server stores for `password`; the caller supplies the (random) salt."""
    assert salt and iterations >= 1, "a SCRAM credential needs a salt and iterations >= 1"
    hash_name = SCRAM_HASHES[mechanism]
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode("utf-8"), salt, iterations)
    client_key = _hmac(hash_name, salted, b"Client Key")
    return ScramCredential(salt, hashlib.new(hash_name, client_key).digest(),
                           _hmac(hash_name, salted, b"Server Key"), iterations)  # fmt: skip


def encode_scram_credential(credential: ScramCredential) -> str:
    return (f"salt={_b64(credential.salt)},stored_key={_b64(credential.stored_key)},"
            f"server_key={_b64(credential.server_key)},iterations={credential.iterations}")  # fmt: skip


def decode_scram_credential(text: str, mechanism: str | None = None) -> ScramCredential:
    """Kafka's ScramCredentialUtils.credentialFromString, with errors that say what is wrong
    (never the key material). With `mechanism`, the keys' lengths are checked against it."""
    fields: dict[str, str] = {}
    for part in text.strip().split(","):
        key, equals, value = part.partition("=")
        if not equals or not key:
            raise ScramCredentialError(f"SCRAM credential field {key or part!r} is not key=value")
        if key in fields:
            raise ScramCredentialError(f"SCRAM credential field {key!r} given twice")
        fields[key] = value
    expected = ("salt", "stored_key", "server_key", "iterations")
    if unknown := sorted(set(fields) - set(expected)):
        raise ScramCredentialError(f"SCRAM credential has unknown fields {unknown}")
    if missing := [name for name in expected if name not in fields]:
        raise ScramCredentialError(f"SCRAM credential lacks {', '.join(missing)}")
    decoded = {}
    for name in expected[:3]:
        value = _b64decode(fields[name])
        if not value:
            raise ScramCredentialError(f"SCRAM credential {name} is not non-empty base64")
        decoded[name] = value
    if not fields["iterations"].isascii() or not fields["iterations"].isdigit():
        raise ScramCredentialError(f"SCRAM credential iterations {fields['iterations']!r} is not "
                                   "a positive integer")  # fmt: skip
    credential = ScramCredential(decoded["salt"], decoded["stored_key"], decoded["server_key"],
                                 int(fields["iterations"]))  # fmt: skip
    if mechanism is not None and (problem := _key_length_problem(credential, mechanism)):
        raise ScramCredentialError(problem)
    return credential


def scram_nonce(nonce: str | bytes) -> str:
    """A nonce as SCRAM sends it: a str is used as given (printable ASCII, no ','); bytes are
    random bytes from the caller (os.urandom), sent as base64."""
    if isinstance(nonce, bytes):
        assert len(nonce) >= 16, "a SCRAM nonce needs at least 128 random bits"
        return _b64(nonce)
    assert nonce and _is_printable(nonce), "a SCRAM nonce is printable ASCII without ','"
    return nonce


def saslname(username: str) -> str:
    return username.replace("=", "=3D").replace(",", "=2C")


def username_of(name: str) -> str | None:
    """The username a saslname escapes, or None when an '=' is not part of =2C or =3D."""
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        return None
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    # Kafka's broker sends this for every SaslException: it names no user and no cause.
    FAILED = ("Authentication failed during authentication due to invalid credentials with "
              "SASL mechanism {}")  # fmt: skip
    AUTHORIZATION_ID_MISMATCH = ("Authentication failed: Client requested an authorization id "
                                 "that is different from username")  # fmt: skip

    def __init__(self, mechanism: str, credential_lookup: Callable[[str], ScramCredential | None],
                 nonce: str | bytes):  # fmt: skip
        self.mechanism = mechanism
        self._hash_name = SCRAM_HASHES[mechanism]
        self._lookup = credential_lookup
        self._server_nonce = scram_nonce(nonce)
        self._state = "receive_client_first"  # -> receive_client_final -> complete; or failed
        self._username: str | None = None
        self._credential: ScramCredential | None = None  # the mock when the user is unknown
        self._known_user = False
        self._gs2_header = self._client_first_bare = self._server_first = self._nonce = ""

    @property
    def complete(self) -> bool:
        return self._state == "complete"

    @property
    def authorization_id(self) -> str:
        assert self.complete and self._username is not None, "SCRAM exchange has not completed"
        return self._username

    @property
    def principal(self) -> str:
        return user_principal(self.authorization_id)

    def evaluate(self, token: bytes) -> bytes:
        if self._state not in ("receive_client_first", "receive_client_final"):
            raise IllegalSaslStateError(f"Unexpected SASL/{self.mechanism} token in server "
                                        f"state {self._state}")  # fmt: skip
        try:
            text = _decode(bytes(token), self.mechanism, "client")
            if self._state == "receive_client_first":
                reply = self._client_first(text)
                self._state = "receive_client_final"
            else:
                reply = self._client_final(text)
                self._state = "complete"
            return reply
        except SaslAuthenticationError:
            self._state, self._credential = "failed", None
            raise

    def _fail(self, reason: str) -> SaslAuthenticationError:
        """A failure whose cause the client must not learn (it would tell which users exist)."""
        return SaslAuthenticationError(self.FAILED.format(self.mechanism), reason)

    def _client_first(self, text: str) -> bytes:
        first = _parse_client_first(text)
        if first.authorization_id and first.authorization_id != first.username:
            raise SaslAuthenticationError(self.AUTHORIZATION_ID_MISMATCH,
                                          f"{first.username!r} asked for authorization id "
                                          f"{first.authorization_id!r}")  # fmt: skip
        if first.extensions.get("tokenauth", "").lower() == "true":
            raise self._fail(f"{first.username!r} asked for delegation token authentication, "
                             "which is not supported")  # fmt: skip
        self._username = first.username
        self._credential = self._credential_for(first.username)
        self._gs2_header, self._client_first_bare = first.gs2_header, first.bare
        self._nonce = first.nonce + self._server_nonce
        self._server_first = (f"r={self._nonce},s={_b64(self._credential.salt)},"
                              f"i={self._credential.iterations}")  # fmt: skip
        return self._server_first.encode()

    def _credential_for(self, username: str) -> ScramCredential:
        try:
            credential = self._lookup(username)
        except Exception as e:  # the store's fault, not the client's: log it, refuse politely
            raise self._fail(f"credential lookup for {username!r} failed: {e!r}") from e
        if credential is None:
            return self._mock_credential(username)
        if credential.iterations < MIN_ITERATIONS:
            raise self._fail(f"{username!r}'s credential has {credential.iterations} iterations, "
                             f"fewer than the minimum {MIN_ITERATIONS} for {self.mechanism}")  # fmt: skip
        if problem := _key_length_problem(credential, self.mechanism):
            raise self._fail(f"{username!r}'s credential is unusable: {problem}")
        self._known_user = True
        return credential

    def _mock_credential(self, username: str) -> ScramCredential:
        salt = hashlib.sha256(_MOCK_SALT_LABEL + username.encode("utf-8")).digest()[:20]
        key = hashlib.new(self._hash_name, salt).digest()
        return ScramCredential(salt, key, key, MIN_ITERATIONS)

    def _client_final(self, text: str) -> bytes:
        without_proof, marker, proof_text = text.rpartition(",p=")
        if not marker:
            raise _malformed("client-final", "no proof 'p='")
        attributes = _attributes(without_proof, "client-final")
        if [name for name, _ in attributes[:2]] != ["c", "r"]:
            raise _malformed("client-final", "expected c=<binding>,r=<nonce>,...,p=<proof>")
        if _b64decode(attributes[0][1]) != self._gs2_header.encode():
            raise _malformed("client-final", "channel binding 'c=' does not match the gs2 header")
        # Kafka's ScramSaslServer checks endsWith, not equality, and librdkafka (2.0-2.3 at
        # least) relies on it: it sends its client nonce before the whole server nonce again.
        if not attributes[1][1].endswith(self._nonce):
            raise _malformed("client-final", "Invalid client nonce in the final client message")
        proof = _b64decode(proof_text)
        digest_size = hashlib.new(self._hash_name).digest_size
        if proof is None or len(proof) != digest_size:
            raise _malformed("client-final", f"proof is not {digest_size} bytes of base64")
        credential = self._credential
        assert credential is not None and self._username is not None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = _hmac(self._hash_name, credential.stored_key, auth_message)
        client_key = _xor(proof, client_signature)
        proof_matches = hmac.compare_digest(
            hashlib.new(self._hash_name, client_key).digest(), credential.stored_key
        )
        if not (proof_matches and self._known_user):
            why = "invalid proof for" if self._known_user else "unknown user"
            raise self._fail(f"SASL/{self.mechanism} {why} {self._username!r}")
        server_signature = _hmac(self._hash_name, credential.server_key, auth_message)
        self._credential = None
        return b"v=" + _b64(server_signature).encode()


@dataclass(frozen=True, slots=True)
class _ClientFirst:
    gs2_header: str  # "n,," or "n,a=<saslname>,": the client-final's c= must carry it
    bare: str  # client-first-message-bare, exactly as sent (it is signed)
    authorization_id: str  # "" when none
    username: str
    nonce: str
    extensions: dict[str, str]


def _parse_client_first(text: str) -> _ClientFirst:
    if text.startswith("p="):
        raise _malformed("client-first", "channel binding is not supported")
    if not text.startswith("n,"):
        raise _malformed("client-first", "only the gs2 header 'n' (no channel binding) "
                                         "is supported")  # fmt: skip
    authzid_field, comma, bare = text[2:].partition(",")
    if not comma or (authzid_field and not authzid_field.startswith("a=")):
        raise _malformed("client-first", "gs2 header is not 'n,,' or 'n,a=<name>,'")
    authorization_id = username_of(authzid_field[2:]) if authzid_field else ""
    if authzid_field and not authorization_id:
        raise _malformed("client-first", "authorization id is empty or badly escaped")
    attributes = _attributes(bare, "client-first")
    names = [name for name, _ in attributes]
    if names[:1] == ["m"]:
        raise _malformed("client-first", "mandatory extension 'm' is not supported")
    if names[:2] != ["n", "r"]:
        raise _malformed("client-first", "expected n=<name>,r=<nonce>")
    username, nonce = username_of(attributes[0][1]), attributes[1][1]
    if not username:
        raise _malformed("client-first", "username is empty or badly escaped")
    if not _is_printable(nonce):
        raise _malformed("client-first", "nonce is empty or not printable")
    return _ClientFirst(text[: len(text) - len(bare)], bare, authorization_id, username, nonce,
                        dict(attributes[2:]))  # fmt: skip


class ScramClient:
    def __init__(self, mechanism: str, username: str, password: str, nonce: str | bytes):
        assert username, "SCRAM needs a username"
        self.mechanism = mechanism
        self._hash_name = SCRAM_HASHES[mechanism]
        self._password = password.encode("utf-8")
        self._client_nonce = scram_nonce(nonce)
        self._client_first_bare = f"n={saslname(username)},r={self._client_nonce}"
        self._expected_server_signature = b""
        self._state = "send_client_first"  # -> receive_server_first -> receive_server_final
        #                                     -> complete; or failed

    @property
    def complete(self) -> bool:
        return self._state == "complete"

    def initial(self) -> bytes:
        return self.first()

    def evaluate(self, challenge: bytes) -> bytes | None:
        if self._state == "receive_server_first":
            return self.final(challenge)
        self.verify(challenge)
        return None

    def first(self) -> bytes:
        self._expect("send_client_first")
        self._state = "receive_server_first"
        return (GS2_HEADER + self._client_first_bare).encode()

    def final(self, server_first: bytes) -> bytes:
        self._expect("receive_server_first")
        try:
            message = self._client_final(_decode(bytes(server_first), self.mechanism, "server"))
        except SaslAuthenticationError:
            self._state = "failed"
            raise
        self._state = "receive_server_final"
        return message

    def verify(self, server_final: bytes) -> None:
        """Check the server's signature: a server that cannot produce it never knew the
        credential, so the client must not trust the connection."""
        self._expect("receive_server_final")
        self._state = "failed"
        text = _decode(bytes(server_final), self.mechanism, "server")
        if text.startswith("e="):
            raise SaslAuthenticationError(f"SASL/{self.mechanism} authentication failed with "
                                          f"error: {text[2:]}")  # fmt: skip
        signature = _b64decode(text[2:].partition(",")[0]) if text.startswith("v=") else None
        if signature is None:
            raise _malformed("server-final", "expected v=<signature> or e=<error>")
        if not hmac.compare_digest(signature, self._expected_server_signature):
            raise SaslAuthenticationError("Invalid server signature in server final message")
        self._state = "complete"

    def _expect(self, state: str) -> None:
        if self._state != state:
            raise IllegalSaslStateError(f"SASL/{self.mechanism} client is in state {self._state}"
                                        f", not {state}")  # fmt: skip

    def _client_final(self, server_first: str) -> bytes:
        attributes = _attributes(server_first, "server-first")
        values = dict(attributes)
        if [name for name, _ in attributes[:3]] != ["r", "s", "i"]:
            raise _malformed("server-first", "expected r=<nonce>,s=<salt>,i=<iterations>")
        nonce, salt, iterations_text = values["r"], _b64decode(values["s"]), values["i"]
        if not nonce.startswith(self._client_nonce) or len(nonce) == len(self._client_nonce):
            raise SaslAuthenticationError("Invalid server nonce: does not start with client "
                                          "nonce followed by the server's")  # fmt: skip
        if not _is_printable(nonce):
            raise _malformed("server-first", "nonce is not printable")
        if not salt:
            raise _malformed("server-first", "salt is not non-empty base64")
        if not (iterations_text.isascii() and iterations_text.isdigit()):
            raise _malformed("server-first", f"iterations {iterations_text!r} is not a number")
        iterations = int(iterations_text)
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise SaslAuthenticationError(f"Requested iterations {iterations} is outside "
                                          f"[{MIN_ITERATIONS}, {MAX_ITERATIONS}] for "
                                          f"{self.mechanism}")  # fmt: skip
        salted = hashlib.pbkdf2_hmac(self._hash_name, self._password, salt, iterations)
        client_key = _hmac(self._hash_name, salted, b"Client Key")
        stored_key = hashlib.new(self._hash_name, client_key).digest()
        without_proof = f"c={_b64(GS2_HEADER.encode())},r={nonce}"
        auth_message = f"{self._client_first_bare},{server_first},{without_proof}".encode()
        client_signature = _hmac(self._hash_name, stored_key, auth_message)
        proof = _xor(client_key, client_signature)
        server_key = _hmac(self._hash_name, salted, b"Server Key")
        self._expected_server_signature = _hmac(self._hash_name, server_key, auth_message)
        return f"{without_proof},p={_b64(proof)}".encode()


def _decode(token: bytes, mechanism: str, sender: str) -> str:
    check_token_size(token, mechanism)
    try:
        text = token.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed(f"{sender} message", "not valid UTF-8") from None
    if "\0" in text:
        raise _malformed(f"{sender} message", "contains NUL")
    return text


def _attributes(text: str, what: str) -> list[tuple[str, str]]:
    """RFC 5802's `name=value,...` (Kafka allows multi-letter extension names)."""
    attributes = []
    for part in text.split(","):
        name, equals, value = part.partition("=")
        if not equals or not _ATTRIBUTE_NAME.fullmatch(name):
            raise _malformed(what, f"attribute {part[:40]!r} is not name=value")
        attributes.append((name, value))
    return attributes


def _malformed(what: str, problem: str) -> SaslAuthenticationError:
    # Malformed messages depend only on what the peer sent, so the peer may be told.
    return SaslAuthenticationError(f"Authentication failed: invalid SCRAM {what}: {problem}")


def _key_length_problem(credential: ScramCredential, mechanism: str) -> str | None:
    size = hashlib.new(SCRAM_HASHES[mechanism]).digest_size
    for name in ("stored_key", "server_key"):
        if len(getattr(credential, name)) != size:
            return f"{name} is {len(getattr(credential, name))} bytes, {mechanism} needs {size}"
    return None


def _is_printable(text: str) -> bool:
    return bool(text) and all("\x21" <= char <= "\x7e" and char != "," for char in text)


def _hmac(hash_name: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hash_name).digest()


def _xor(left: bytes, right: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(left, right, strict=True))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: str) -> bytes | None:
    if not _BASE64.fullmatch(text):
        return None
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        return None
