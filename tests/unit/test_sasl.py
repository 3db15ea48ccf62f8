"""protocol.sasl, protocol.scram, protocol.jaas: PLAIN and SCRAM servers and clients (RFC 7677's
test vector byte for byte, Kafka's rules, our client against our server, kafka-python's clients
against our servers), the ZooKeeper encoding of SCRAM credentials, and JAAS parsing with errors
that name the line. Hypothesis feeds both servers arbitrary bytes: only SaslAuthenticationError
may come out."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.protocol.jaas import (
    PLAIN_LOGIN_MODULE,
    SCRAM_LOGIN_MODULE,
    JaasConfigError,
    LoginModule,
    login_module_for,
    parse_jaas,
    parse_jaas_entry,
)
from localcluster.protocol.sasl import (
    ILLEGAL_SASL_STATE,
    SASL_AUTHENTICATION_FAILED,
    SUPPORTED_MECHANISMS,
    UNSUPPORTED_SASL_MECHANISM,
    IllegalSaslStateError,
    PlainClient,
    PlainServer,
    SaslAuthenticationError,
    UnsupportedSaslMechanismError,
    new_sasl_client,
    new_sasl_server,
)
from localcluster.protocol.scram import (
    MIN_ITERATIONS,
    ScramClient,
    ScramCredential,
    ScramCredentialError,
    ScramServer,
    decode_scram_credential,
    encode_scram_credential,
    scram_credential,
)

FAST = settings(max_examples=300, deadline=None)
SCRAM = ["SCRAM-SHA-256", "SCRAM-SHA-512"]
SALT = b"0123456789abcdef"
SERVER_NONCE = "Srv0nce"
CLIENT_NONCE = "Cl1entN0nce"

# RFC 7677 section 3.
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")  # fmt: skip
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")  # fmt: skip
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

_CREDENTIALS: dict[tuple[str, str, int], ScramCredential] = {}


def credential(password: str, mechanism: str = "SCRAM-SHA-256", iterations: int = 4096):
    key = (password, mechanism, iterations)
    if key not in _CREDENTIALS:
        _CREDENTIALS[key] = scram_credential(password, SALT, iterations, mechanism)
    return _CREDENTIALS[key]


def scram_server(mechanism="SCRAM-SHA-256", users=None, nonce=SERVER_NONCE) -> ScramServer:
    users = {"alice": credential("alice-secret", mechanism)} if users is None else users
    return ScramServer(mechanism, users.get, nonce)


def scram_client(mechanism="SCRAM-SHA-256", username="alice", password="alice-secret"):
    return ScramClient(mechanism, username, password, CLIENT_NONCE)


def exchange(client, server) -> None:
    """Drive any mechanism through the uniform interface, as the network code will."""
    token = client.initial()
    for _ in range(4):  # no supported mechanism takes more than two round trips
        token = client.evaluate(server.evaluate(token))
        if token is None:
            break
    assert client.complete and server.complete


def failure(call, *args) -> SaslAuthenticationError:
    with pytest.raises(SaslAuthenticationError) as caught:
        call(*args)
    return caught.value


# --- RFC 7677's test vector -------------------------------------------------------------------


def test_rfc7677_vector_our_client_sends_the_rfc_messages():
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", RFC_CLIENT_NONCE)
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)
    assert client.complete


def test_rfc7677_vector_our_server_sends_the_rfc_messages():
    rfc_credential = scram_credential("pencil", RFC_SALT, 4096)
    server = ScramServer("SCRAM-SHA-256", {"user": rfc_credential}.get, RFC_SERVER_NONCE)
    assert server.evaluate(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert not server.complete
    assert server.evaluate(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.complete and server.principal == "User:user"


def test_credential_zookeeper_encoding_round_trips():
    rfc_credential = scram_credential("pencil", RFC_SALT, 4096)
    text = encode_scram_credential(rfc_credential)
    assert text.startswith("salt=W22ZaJ0SNY7soEsUEjb6gQ==,stored_key=")
    assert text.endswith(",iterations=4096")
    assert [f.split("=")[0] for f in text.split(",")] == ["salt", "stored_key", "server_key",
                                                          "iterations"]  # fmt: skip
    assert decode_scram_credential(text) == rfc_credential
    assert decode_scram_credential(text, "SCRAM-SHA-256") == rfc_credential


GOOD = encode_scram_credential(scram_credential("pencil", RFC_SALT, 4096))


@pytest.mark.parametrize("text, problem", [
    (GOOD.replace(",iterations=4096", ""), "lacks iterations"),
    (GOOD + ",pepper=AA==", "unknown fields ['pepper']"),
    (GOOD.replace("salt=W22", "salt=*22"), "salt is not non-empty base64"),
    (GOOD.replace("salt=W22ZaJ0SNY7soEsUEjb6gQ==", "salt="), "salt is not non-empty base64"),
    (GOOD.replace("iterations=4096", "iterations=4k"), "iterations '4k' is not"),
    (GOOD.replace("iterations=4096", "iterations=-1"), "is not a positive integer"),
    (GOOD + ",salt=AA==", "'salt' given twice"),
    ("salt", "'salt' is not key=value"),
    ("", "is not key=value"),
])  # fmt: skip
def test_credential_decoding_errors_say_what_is_wrong(text, problem):
    with pytest.raises(ScramCredentialError) as caught:
        decode_scram_credential(text)
    assert problem in str(caught.value)


def test_credential_decoding_checks_key_lengths_against_the_mechanism():
    with pytest.raises(
        ScramCredentialError, match="stored_key is 32 bytes, SCRAM-SHA-512 needs 64"
    ):
        decode_scram_credential(GOOD, "SCRAM-SHA-512")


# --- our SCRAM client against our SCRAM server -----------------------------------------------


@pytest.mark.parametrize("mechanism", SCRAM)
def test_scram_success(mechanism):
    server, client = scram_server(mechanism), scram_client(mechanism)
    exchange(client, server)
    assert server.principal == "User:alice" and server.authorization_id == "alice"


def test_scram_random_nonces_from_bytes_work():
    server = ScramServer("SCRAM-SHA-256", {"alice": credential("alice-secret")}.get, b"\xfe" * 18)
    client = ScramClient("SCRAM-SHA-256", "alice", "alice-secret", bytes(range(24)))
    exchange(client, server)


def test_scram_saslname_escapes_comma_and_equals():
    users = {"a,b=c": credential("pw")}
    client = ScramClient("SCRAM-SHA-256", "a,b=c", "pw", CLIENT_NONCE)
    assert client.first() == b"n,,n=a=2Cb=3Dc,r=" + CLIENT_NONCE.encode()
    server = scram_server(users=users)
    exchange(ScramClient("SCRAM-SHA-256", "a,b=c", "pw", CLIENT_NONCE), server)
    assert server.principal == "User:a,b=c"


def test_scram_bad_escape_in_username_is_refused():
    error = failure(scram_server().evaluate, b"n,,n=a=2Xb,r=abc")
    assert "badly escaped" in error.message


def test_scram_wrong_password_fails_at_the_proof_without_saying_why():
    server, client = scram_server(), scram_client(password="wrong")
    final = client.evaluate(server.evaluate(client.initial()))
    error = failure(server.evaluate, final)
    assert error.message == ("Authentication failed during authentication due to invalid "
                             "credentials with SASL mechanism SCRAM-SHA-256")  # fmt: skip
    assert error.error_code == SASL_AUTHENTICATION_FAILED
    assert "alice" not in error.message and "invalid proof for 'alice'" in error.reason
    assert not server.complete


def test_scram_unknown_user_looks_like_a_wrong_password():
    def attempt(username):
        server, client = scram_server(), scram_client(username=username, password="guess")
        server_first = server.evaluate(client.initial())  # no refusal at the first message
        return server_first, failure(server.evaluate, client.evaluate(server_first))

    known_first, known_error = attempt("alice")
    unknown_first, unknown_error = attempt("mallory")
    assert unknown_error.message == known_error.message
    assert "unknown user 'mallory'" in unknown_error.reason
    assert b",i=4096" in unknown_first
    assert attempt("mallory")[0] == unknown_first, "the mock salt must not change per attempt"
    assert attempt("trudy")[0] != unknown_first


def test_scram_tampered_server_signature_is_refused_by_the_client():
    server, client = scram_server(), scram_client()
    server_final = server.evaluate(client.evaluate(server.evaluate(client.initial())))
    signature = bytearray(base64.b64decode(server_final[2:]))
    signature[0] ^= 1
    error = failure(client.evaluate, b"v=" + base64.b64encode(bytes(signature)))
    assert error.message == "Invalid server signature in server final message"
    assert not client.complete
    assert isinstance(failure(client.evaluate, server_final), IllegalSaslStateError)


def test_scram_server_error_is_reported_by_the_client():
    client = scram_client()
    client.evaluate(scram_server().evaluate(client.initial()))
    assert (
        "failed with error: invalid-proof" in failure(client.evaluate, b"e=invalid-proof").message
    )


def test_scram_client_refuses_a_nonce_that_does_not_extend_its_own():
    for nonce in ["Xl1entN0nceSrv", CLIENT_NONCE]:  # another prefix; no server part at all
        client = scram_client()
        client.initial()
        error = failure(client.evaluate, f"r={nonce},s=AAAA,i=4096".encode())
        assert "Invalid server nonce" in error.message


def test_scram_server_refuses_a_final_message_with_another_nonce():
    server, client = scram_server(), scram_client()
    final = client.evaluate(server.evaluate(client.initial()))
    tampered = final.replace(SERVER_NONCE.encode(), b"Srv0ncf")
    assert "Invalid client nonce" in failure(server.evaluate, tampered).message


def test_scram_server_refuses_a_credential_below_the_minimum_iterations():
    server = scram_server(users={"alice": credential("alice-secret", iterations=1000)})
    error = failure(server.evaluate, scram_client().initial())
    assert "1000" not in error.message, "the client must not learn the user exists"
    assert "1000 iterations, fewer than the minimum 4096" in error.reason


@pytest.mark.parametrize("iterations", [MIN_ITERATIONS - 1, 1, 16385, 10**30])
def test_scram_client_refuses_iterations_outside_kafkas_range(iterations):
    client = scram_client()
    client.initial()
    challenge = f"r={CLIENT_NONCE}{SERVER_NONCE},s=AAAA,i={iterations}".encode()
    assert "Requested iterations" in failure(client.evaluate, challenge).message


@pytest.mark.parametrize("first, problem", [
    (b"p=tls-unique,,n=alice,r=abc", "channel binding is not supported"),
    (b"y,,n=alice,r=abc", "only the gs2 header 'n'"),
    (b"n=alice,r=abc", "only the gs2 header 'n'"),
    (b"n,x=alice,n=alice,r=abc", "gs2 header is not"),
    (b"n,a=,n=alice,r=abc", "authorization id is empty"),
    (b"n,,m=ext,n=alice,r=abc", "mandatory extension 'm'"),
    (b"n,,r=abc,n=alice", "expected n=<name>,r=<nonce>"),
    (b"n,,n=,r=abc", "username is empty"),
    (b"n,,n=alice,r=", "nonce is empty"),
])  # fmt: skip
def test_scram_bad_client_first_messages(first, problem):
    error = failure(scram_server().evaluate, first)
    assert problem in error.message


def test_scram_authorization_id_must_equal_the_username():
    error = failure(scram_server().evaluate, b"n,a=bob,n=alice,r=abc")
    assert error.message == ("Authentication failed: Client requested an authorization id that "
                             "is different from username")  # fmt: skip
    server = scram_server()
    server.evaluate(b"n,a=alice,n=alice,r=" + CLIENT_NONCE.encode())  # equal: accepted


def test_scram_final_channel_binding_must_match_the_gs2_header():
    server, client = scram_server(), scram_client()
    final = client.evaluate(server.evaluate(client.initial()))
    tampered = final.replace(b"c=biws", b"c=" + base64.b64encode(b"y,,"))
    assert "does not match the gs2 header" in failure(server.evaluate, tampered).message


def test_scram_tokenauth_true_is_refused_and_other_extensions_are_ignored():
    refused = failure(scram_server().evaluate, b"n,,n=alice,r=abc,tokenauth=true")
    assert "delegation token" in refused.reason and "alice" not in refused.message
    server = scram_server()
    first = b"n,,n=alice,r=" + CLIENT_NONCE.encode() + b",tokenauth=false,other=x=y"
    reply = server.evaluate(first)
    assert reply.startswith(b"r=" + CLIENT_NONCE.encode() + SERVER_NONCE.encode())


def test_scram_messages_after_completion_or_failure_are_illegal_state():
    server, client = scram_server(), scram_client()
    exchange(client, server)
    error = failure(server.evaluate, b"n,,n=alice,r=abc")
    assert isinstance(error, IllegalSaslStateError) and error.error_code == ILLEGAL_SASL_STATE
    assert isinstance(failure(client.evaluate, b"v=AAAA"), IllegalSaslStateError)
    assert isinstance(failure(client.first), IllegalSaslStateError)
    failed = scram_server()
    failure(failed.evaluate, b"garbage")
    assert isinstance(failure(failed.evaluate, scram_client().initial()), IllegalSaslStateError)


@pytest.mark.parametrize("token", [b"", b"\xff\xfe", b"n,,", b"n,,n=alice,r=a\0b", b"x" * 20000,
                                   b"n,,n=alice", b",,,", b"n,,n=alice,r=abc,"])  # fmt: skip
def test_scram_garbage_first_messages_are_authentication_failures(token):
    server = scram_server()
    assert isinstance(failure(server.evaluate, token), SaslAuthenticationError)
    assert not server.complete


@pytest.mark.parametrize("final", [b"", b"c=biws", b"c=biws,r=x,p=", b"\xff",
                                   b"c=biws,r=" + (CLIENT_NONCE + SERVER_NONCE).encode() + b",p=AAAA",
                                   b"c=bi,r=" + (CLIENT_NONCE + SERVER_NONCE).encode() + b",p=AAAA"])  # fmt: skip
def test_scram_garbage_final_messages_are_authentication_failures(final):
    server = scram_server()
    server.evaluate(scram_client().initial())
    failure(server.evaluate, final)
    assert not server.complete


def test_scram_lookup_errors_become_authentication_failures():
    def lookup(username):
        raise OSError("store unreachable")

    server = ScramServer("SCRAM-SHA-256", lookup, SERVER_NONCE)
    error = failure(server.evaluate, scram_client().initial())
    assert "store unreachable" in error.reason and "store" not in error.message


def test_scram_credential_of_another_mechanism_is_refused():
    server = scram_server("SCRAM-SHA-512", users={"alice": credential("alice-secret")})
    assert "needs 64" in failure(server.evaluate, scram_client("SCRAM-SHA-512").initial()).reason


# --- PLAIN -------------------------------------------------------------------------------------

PLAIN_USERS = {"broker": "broker-secret", "alice": "alice-secret"}
INVALID = "Authentication failed: Invalid username or password"


def test_plain_success_through_the_uniform_interface():
    server, client = (
        new_sasl_server("PLAIN", plain_users=PLAIN_USERS),
        PlainClient("alice", "alice-secret"),
    )
    exchange(client, server)
    assert server.principal == "User:alice"


def test_plain_client_token_and_reply():
    client = new_sasl_client("PLAIN", "alice", "alice-secret")
    assert client.initial() == b"\0alice\0alice-secret"
    assert not client.complete
    assert client.evaluate(b"") is None and client.complete
    other = PlainClient("alice", "alice-secret")
    other.initial()
    failure(other.evaluate, b"unexpected")


@pytest.mark.parametrize("token", [b"\0alice\0wrong", b"\0mallory\0alice-secret",
                                   b"\0alice\0alice-secretX", b"\0alice\0alice-secre"])  # fmt: skip
def test_plain_wrong_password_and_unknown_user_fail_alike(token):
    error = failure(PlainServer(PLAIN_USERS).evaluate, token)
    assert error.message == INVALID


def test_plain_authorization_id():
    server = PlainServer(PLAIN_USERS)
    assert server.evaluate(b"alice\0alice\0alice-secret") == b"" and server.complete
    error = failure(PlainServer(PLAIN_USERS).evaluate, b"bob\0alice\0alice-secret")
    assert error.message == ("Authentication failed: Client requested an authorization id that "
                             "is different from username")  # fmt: skip


@pytest.mark.parametrize("token, problem", [
    (b"alice-secret", "expected 3 tokens separated by NUL, got 1"),
    (b"alice\0alice-secret", "got 2"),
    (b"\0alice\0alice-secret\0", "got 4"),
    (b"\0alice\0\xff\xfe", "not valid UTF-8"),
    (b"\0\0alice-secret", "username not specified"),
    (b"\0alice\0", "password not specified"),
    (b"\0alice\0" + b"x" * 20000, "larger than"),
])  # fmt: skip
def test_plain_malformed_tokens(token, problem):
    server = PlainServer(PLAIN_USERS)
    assert problem in failure(server.evaluate, token).message
    assert not server.complete


def test_plain_message_after_completion_is_illegal_state():
    server = PlainServer(PLAIN_USERS)
    server.evaluate(b"\0alice\0alice-secret")
    assert isinstance(failure(server.evaluate, b"\0alice\0alice-secret"), IllegalSaslStateError)


# --- factories ---------------------------------------------------------------------------------


def test_supported_mechanisms_and_factories():
    assert SUPPORTED_MECHANISMS == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    users = {"alice": credential("alice-secret")}
    for mechanism in SUPPORTED_MECHANISMS:
        scram_users = (
            {"alice": credential("alice-secret", mechanism)} if "SCRAM" in mechanism else users
        )
        server = new_sasl_server(mechanism, plain_users={"alice": "alice-secret"},
                                 scram_lookup=scram_users.get, nonce=SERVER_NONCE)  # fmt: skip
        client = new_sasl_client(mechanism, "alice", "alice-secret", nonce=CLIENT_NONCE)
        assert server.mechanism == client.mechanism == mechanism
        exchange(client, server)
        assert server.principal == "User:alice"
    for factory in (lambda: new_sasl_server("GSSAPI", plain_users={}),
                    lambda: new_sasl_client("scram-sha-256", "a", "b", nonce="n")):  # fmt: skip
        error = failure(factory)
        assert isinstance(error, UnsupportedSaslMechanismError)
        assert error.error_code == UNSUPPORTED_SASL_MECHANISM
        assert "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512" in error.message


# --- kafka-python's clients against our servers ---------------------------------------------

# kafka-python's schema loader uses importlib.resources' deprecated read_text on import.
KAFKA_PYTHON_IMPORT = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def drive_kafka_python(mechanism_client, server) -> None:
    """kafka-python's SaslMechanism: auth_bytes() to send, receive(reply), is_done()."""
    for _ in range(4):
        mechanism_client.receive(server.evaluate(mechanism_client.auth_bytes()))
        if mechanism_client.is_done():
            break
    assert mechanism_client.is_authenticated() and server.complete


@KAFKA_PYTHON_IMPORT
@pytest.mark.parametrize("mechanism", SCRAM)
def test_kafka_python_scram_client_authenticates_against_our_server(mechanism):
    from kafka.net.sasl.scram import SaslMechanismScram

    client = SaslMechanismScram(sasl_plain_username="alice", sasl_plain_password="alice-secret",
                                sasl_mechanism=mechanism)  # fmt: skip
    server = scram_server(mechanism)
    drive_kafka_python(client, server)
    assert server.principal == "User:alice"


@KAFKA_PYTHON_IMPORT
def test_kafka_python_scram_client_with_a_wrong_password_is_refused():
    from kafka.net.sasl.scram import SaslMechanismScram

    client = SaslMechanismScram(sasl_plain_username="alice", sasl_plain_password="nope",
                                sasl_mechanism="SCRAM-SHA-256")  # fmt: skip
    server = scram_server()
    client.receive(server.evaluate(client.auth_bytes()))
    assert "invalid credentials" in failure(server.evaluate, client.auth_bytes()).message


@KAFKA_PYTHON_IMPORT
def test_kafka_python_plain_client_authenticates_against_our_server():
    from kafka.net.sasl.plain import SaslMechanismPlain

    client = SaslMechanismPlain(sasl_plain_username="alice", sasl_plain_password="alice-secret")
    server = PlainServer(PLAIN_USERS)
    drive_kafka_python(client, server)
    assert server.principal == "User:alice"


# --- hypothesis: only SaslAuthenticationError comes out of a server --------------------------

VALID_FIRST = b"n,,n=alice,r=" + CLIENT_NONCE.encode()


def _valid_final() -> bytes:
    server, client = scram_server(), scram_client()
    return client.evaluate(server.evaluate(client.initial()))


VALID_FINAL = _valid_final()


@st.composite
def mutated(draw, valid: bytes):
    data = bytearray(valid)
    for _ in range(draw(st.integers(0, 4))):
        position = draw(st.integers(0, len(data)))
        choice = draw(st.sampled_from(["insert", "delete", "replace"]))
        byte = draw(st.sampled_from(list(b",=\0\xff\x80a=2C=3Dp=y,n,")) | st.integers(0, 255))
        if choice == "insert":
            data.insert(position, byte)
        elif position < len(data):
            if choice == "delete":
                del data[position]
            else:
                data[position] = byte
    return bytes(data)


def _only_authentication_errors(server, token: bytes) -> None:
    try:
        server.evaluate(token)
    except SaslAuthenticationError:
        assert not server.complete


@FAST
@given(st.binary(max_size=300) | mutated(b"\0alice\0alice-secret"))
def test_plain_server_raises_only_authentication_errors(token):
    _only_authentication_errors(PlainServer(PLAIN_USERS), token)


@FAST
@given(st.binary(max_size=300) | mutated(VALID_FIRST) | mutated(b"n,a=alice,n=alice,r=x,e=1"))
def test_scram_server_first_step_raises_only_authentication_errors(token):
    _only_authentication_errors(scram_server(), token)


@FAST
@given(st.binary(max_size=300) | mutated(VALID_FINAL))
def test_scram_server_final_step_raises_only_authentication_errors(token):
    server = scram_server()
    server.evaluate(scram_client().initial())
    _only_authentication_errors(server, token)


@FAST
@given(st.binary(max_size=200) | mutated(b"r=" + (CLIENT_NONCE + SERVER_NONCE).encode()
                                         + b",s=AAAA,i=4096"))  # fmt: skip
def test_scram_client_raises_only_authentication_errors(challenge):
    client = scram_client()
    client.initial()
    try:
        client.evaluate(challenge)
    except SaslAuthenticationError:
        assert not client.complete


# --- JAAS --------------------------------------------------------------------------------------

JAAS_FILE = """\
KafkaServer {
  org.apache.kafka.common.security.plain.PlainLoginModule required
    username="broker" password="broker-secret"
    user_broker="broker-secret" user_alice="alice-secret";
  org.apache.kafka.common.security.scram.ScramLoginModule required
    username="broker" password="broker-secret";
};
KafkaClient {
  org.apache.kafka.common.security.plain.PlainLoginModule required
    username="alice" password="alice-secret";
};
"""


def test_jaas_file_sections_and_modules():
    sections = parse_jaas(JAAS_FILE)
    assert list(sections) == ["KafkaServer", "KafkaClient"]
    plain, scram = sections["KafkaServer"]
    assert plain == LoginModule(PLAIN_LOGIN_MODULE, "required", {
        "username": "broker", "password": "broker-secret",
        "user_broker": "broker-secret", "user_alice": "alice-secret"})  # fmt: skip
    assert plain.plain_users == {"broker": "broker-secret", "alice": "alice-secret"}
    assert plain.mechanisms == ("PLAIN",) and plain.line == 2
    assert scram.class_name == SCRAM_LOGIN_MODULE and scram.line == 5
    assert scram.mechanisms == ("SCRAM-SHA-256", "SCRAM-SHA-512")
    assert (scram.username, scram.password) == ("broker", "broker-secret")
    assert login_module_for(sections["KafkaServer"], "SCRAM-SHA-512") is scram
    assert login_module_for(sections["KafkaServer"], "PLAIN") is plain
    assert login_module_for(sections["KafkaClient"], "SCRAM-SHA-256") is None
    assert sections["KafkaClient"][0].username == "alice"


def test_jaas_inline_entry():
    entry = parse_jaas_entry('org.apache.kafka.common.security.plain.PlainLoginModule required '
                             'username="a" password="b";')  # fmt: skip
    assert entry == LoginModule(PLAIN_LOGIN_MODULE, "required", {"username": "a", "password": "b"})


def test_jaas_comments_escapes_bare_words_and_flag_case():
    text = """// the broker's credentials
    /* a comment
       over lines */ Server { // trailing
      com.example.Module OPTIONAL a=bare-word.1 b="say \\"hi\\"\\\\" c='single "quoted"'
        d="" e="tab\\there" f="x//not a comment"; /* between */
      com.example.Other Sufficient;
    };"""
    (module, other) = parse_jaas(text)["Server"]
    assert module.control_flag == "optional" and module.line == 4
    assert module.options == {"a": "bare-word.1", "b": 'say "hi"\\', "c": 'single "quoted"',
                              "d": "", "e": "tab\there", "f": "x//not a comment"}  # fmt: skip
    assert other == LoginModule("com.example.Other", "sufficient", {})
    assert parse_jaas("  // nothing here\n") == {}


M = "org.apache.kafka.common.security.plain.PlainLoginModule"


@pytest.mark.parametrize("text, line, problem", [
    (f"KafkaServer {{\n  {M}\n    username=\"a\";\n}};", 3, "control flag not specified"),
    (f"KafkaServer {{\n  {M} requird\n    username=\"a\";\n}};", 2, "invalid login module control flag 'requird'"),
    (f"KafkaServer {{\n  {M} required\n    username \"a\";\n}};", 3, "expected '=' after option 'username'"),
    (f"KafkaServer {{\n  {M} required\n    username=;\n}};", 3, "value not specified for option 'username'"),
    (f"KafkaServer {{\n  {M} required username=\"a\"\n  {M} required;\n}};", 3, "is the ';' after the entry"),
    (f"KafkaServer {{\n  {M} required username=\"a\"\n}};", 3, "not terminated by ';'"),
    (f"KafkaServer {{\n  {M} required username=\"a\";\n", 3, "is not closed with '};'"),
    (f"KafkaServer {{\n  {M} required;\n}}\nKafkaClient {{ {M} required; }};", 4, "expected ';' after '}'"),
    (f"KafkaServer {{\n  {M} required\n    username=\"a;\n}};", 3, "is not closed with \" on the same line"),
    (f"KafkaServer {{\n  {M} required; /* oops\n}};", 2, "comment '/*' is not closed"),
    (f"KafkaServer {{\n  {M} required\n    a=\"1\"\n    a=\"2\";\n}};", 4, "option 'a' given twice (first on line 3)"),
    (f"A {{ {M} required; }};\n\nA {{ {M} required; }};", 3, "section 'A' given twice (first on line 1)"),
    ("KafkaServer {\n};", 2, "section 'KafkaServer' has no login module"),
    (f"KafkaServer\n  {M} required;", 2, "expected '{' after section name 'KafkaServer'"),
    (f"{{ {M} required; }};", 1, "expected a section name"),
    (f"KafkaServer {{\n  \"{M}\" required;\n}};", 2, "expected a login module class name"),
])  # fmt: skip
def test_jaas_file_errors_name_the_line(text, line, problem):
    with pytest.raises(JaasConfigError) as caught:
        parse_jaas(text)
    assert caught.value.line == line, str(caught.value)
    assert problem in caught.value.message
    assert str(caught.value).startswith(f"line {line}: ")


@pytest.mark.parametrize("text, line, problem", [
    (f'{M} required username="a";\n{M} required;', 2, "more than one login module"),
    ("  // only a comment", 1, "login module not specified"),
    (f'{M} required username="a"', 1, "not terminated by ';'"),
])  # fmt: skip
def test_jaas_entry_errors_name_the_line(text, line, problem):
    with pytest.raises(JaasConfigError) as caught:
        parse_jaas_entry(text)
    assert caught.value.line == line and problem in caught.value.message


@FAST
@given(st.text(alphabet=st.sampled_from(list("ab {};=\"'\\/*\n\tc")), max_size=80))
def test_jaas_parser_raises_only_config_errors(text):
    for parse in (parse_jaas, parse_jaas_entry):
        try:
            parse(text)
        except JaasConfigError as e:
            assert e.line >= 1
