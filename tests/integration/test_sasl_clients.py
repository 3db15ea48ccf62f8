"""SASL_PLAINTEXT as applications use it: five clients, PLAIN and SCRAM-SHA-256, right and wrong
passwords; a plaintext client refused; `up --listener-protocol SASL_PLAINTEXT`; brokers
replicating over TCP with SASL, and one with a wrong credential kept out of the ISR.

Every client runs with its default settings plus only the SASL ones (`security.protocol`,
`sasl.mechanism`, username, password), except where a comment says why. A wrong password must
surface as an authentication error within seconds, and the broker log must name the refused
login. Each client logs in as its own user, so a test can find its own lines in the log of the
module's broker. kafka-python and aiokafka report a refused bootstrap login only in their logs
(their exceptions say "unable to bootstrap"), so those tests read the library's log records.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition

from localcluster import coord
from localcluster.client import Admin, Consumer, KafkaError, Producer
from localcluster.coord.kafka_zk import KafkaZkClient
from localcluster.protocol import messages, produce
from localcluster.protocol.api import ApiKey
from localcluster.storage import Record, encode_batch
from localcluster.tools.sasl_setup import set_scram_user
from tests.brokers import BrokerSet
from tests.helpers import wait_until
from tests.integration.cli_cluster import Cli
from tests.raw_connection import RawConnection

pytestmark = [pytest.mark.slow,
              # kafka-python loads its schemas with importlib.resources' legacy calls.
              pytest.mark.filterwarnings("ignore:.*is deprecated:DeprecationWarning")]  # fmt: skip

KCAT = shutil.which("kcat")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256")
CLIENTS = ("confluent", "kafkapython", "aiokafka", "kcat", "localcluster")
BROKER_PASSWORD = "b-pw"
WRONG = "not-the-password"
TIMEOUT_S = 20
REFUSAL_S = 10  # a refused login must be reported well within this
AUTHENTICATION_FAILED = re.compile(
    r"Authentication failed|SaslAuthenticationFailed|SASL_AUTHENTICATION_FAILED|"
    r"Authentication failure", re.IGNORECASE)  # fmt: skip
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


def password(user: str) -> str:
    return f"{user}-pw"


def write_jaas(path: Path, users: tuple[str, ...], own_password: str = BROKER_PASSWORD) -> Path:
    """A KafkaServer section: the broker's own login (PLAIN and SCRAM) with `own_password`,
    and PLAIN's users with their right passwords (the broker itself among them)."""
    plain_users = " ".join(f'user_{u}="{password(u)}"' for u in users)
    path.write_text(
        "KafkaServer {\n"
        f'  {PLAIN_MODULE} required username="broker" password="{own_password}"\n'
        f'    user_broker="{BROKER_PASSWORD}" {plain_users};\n'
        f'  {SCRAM_MODULE} required username="broker" password="{own_password}";\n'
        "};\n"
    )
    return path


def sasl_broker_settings(jaas: Path) -> dict[str, str]:
    return {"java_security_auth_login_config": str(jaas), "super_users": "User:broker",
            "sasl_enabled_mechanisms": "PLAIN,SCRAM-SHA-256"}  # fmt: skip


def add_scram_users(cluster_dir: Path, users) -> None:
    client = coord.connect(str(cluster_dir / "store"))
    try:
        zk = KafkaZkClient(client)
        for user in users:
            set_scram_user(zk, user, BROKER_PASSWORD if user == "broker" else password(user))
    finally:
        client.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One broker whose only TCP listener is SASL_PLAINTEXT; every client user exists for PLAIN
    (JAAS) and SCRAM-SHA-256 (the store). Topics are created over the Unix socket."""
    directory = tmp_path_factory.mktemp("sasl")
    cluster = directory / "cluster"
    cluster.mkdir()
    add_scram_users(cluster, CLIENTS)
    jaas = write_jaas(directory / "jaas.conf", CLIENTS)
    started = BrokerSet(cluster)
    try:
        yield started.start(
            1, listeners="SASL_PLAINTEXT://127.0.0.1:0", **sasl_broker_settings(jaas)
        )
    finally:
        started.cleanup()


def create_topic(broker, topic: str, replicas: list[int] | None = None) -> None:
    with Admin(cluster_dir=str(broker.cluster_dir)) as admin:
        if replicas is None:
            admin.create_topic(topic, 1, 1)
        else:
            admin.create_topic(topic, replica_assignment={0: replicas})
        admin.wait_for_leaders(topic)


def end_offset(cluster_dir: Path, topic: str) -> int:
    with Consumer(cluster_dir=str(cluster_dir)) as consumer:
        return consumer.end_offsets([(topic, 0)])[(topic, 0)]


def until_deadline(what: str, timeout_s: float = TIMEOUT_S):
    """Yield until the deadline passes, then fail naming what did not happen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        yield
    raise AssertionError(f"not within {timeout_s} s: {what}")


# -- each client: produce and read back, or be refused ---------------------------------------------


def rd_settings(bootstrap: str, mechanism: str, user: str, secret: str) -> dict:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": secret}  # fmt: skip


def confluent_round_trip(bootstrap, mechanism, user, topic, values) -> list[bytes]:
    producer = RdProducer(rd_settings(bootstrap, mechanism, user, password(user)))
    delivered = []
    for v in values:
        producer.produce(topic, v, partition=0, on_delivery=lambda e, m: delivered.append(e))
    assert producer.flush(TIMEOUT_S) == 0
    assert delivered == [None] * len(values)
    return rd_read(rd_settings(bootstrap, mechanism, user, password(user)), topic, len(values))


def rd_read(settings: dict, topic: str, count: int) -> list[bytes]:
    """`count` values of partition 0 from offset 0, by a librdkafka consumer."""
    # A consumer needs a group.id to exist; no auto-commit: the broker has no group coordinator.
    consumer = RdConsumer({**settings, "group.id": "assign-only", "enable.auto.commit": False})
    try:
        consumer.assign([RdTopicPartition(topic, 0, 0)])
        got = []
        for _ in until_deadline(f"{count} records back"):
            if len(got) == count:
                return got
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message.value())
    finally:
        consumer.close()


def confluent_refused(bootstrap, mechanism, user, topic) -> str:
    errors = []
    producer = RdProducer({**rd_settings(bootstrap, mechanism, user, WRONG),
                           "error_cb": errors.append})  # fmt: skip
    producer.produce(topic, b"must not land", partition=0)
    try:
        for _ in until_deadline("an authentication error", REFUSAL_S):
            producer.poll(0.1)
            refused = [e for e in errors if e.code() == RdKafkaError._AUTHENTICATION]
            if refused:
                return refused[0].str()
    finally:
        producer.purge()
        producer.flush(1)


def kafkapython_round_trip(bootstrap, mechanism, user, topic, values) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    sasl = {"bootstrap_servers": bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": mechanism, "sasl_plain_username": user,
            "sasl_plain_password": password(user)}  # fmt: skip
    producer = KafkaProducer(**sasl)  # its defaults: idempotent, acks=all
    try:
        offsets = [producer.send(topic, v, partition=0).get(TIMEOUT_S).offset for v in values]
    finally:
        producer.close(5)
    assert offsets == sorted(offsets)
    consumer = KafkaConsumer(**sasl)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got = []
        for _ in until_deadline(f"{len(values)} records back"):
            if len(got) >= len(values):
                return got
            for records in consumer.poll(timeout_ms=200).values():
                got += [r.value for r in records]
    finally:
        consumer.close()


def kafkapython_refused(bootstrap, mechanism, user, topic, caplog) -> str:
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        # Short: kafka-python retries a refused bootstrap login until this deadline.
        KafkaProducer(bootstrap_servers=bootstrap, security_protocol="SASL_PLAINTEXT",
                      sasl_mechanism=mechanism, sasl_plain_username=user,
                      sasl_plain_password=WRONG, bootstrap_timeout_ms=3000)  # fmt: skip
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("kafka"))


def aiokafka_round_trip(bootstrap, mechanism, user, topic, values) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    sasl = {"bootstrap_servers": bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": mechanism, "sasl_plain_username": user,
            "sasl_plain_password": password(user)}  # fmt: skip

    async def go():
        producer = AIOKafkaProducer(**sasl)
        await producer.start()
        try:
            for v in values:
                await asyncio.wait_for(producer.send_and_wait(topic, v, partition=0), TIMEOUT_S)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(**sasl)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got = []
            for _ in until_deadline(f"{len(values)} records back"):
                if len(got) >= len(values):
                    return got
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    got += [r.value for r in records]
        finally:
            await consumer.stop()

    return asyncio.run(go())


def aiokafka_refused(bootstrap, mechanism, user, topic, caplog) -> str:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError

    async def go():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, security_protocol="SASL_PLAINTEXT",
                                    sasl_mechanism=mechanism, sasl_plain_username=user,
                                    sasl_plain_password=WRONG)  # fmt: skip
        try:
            with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
                await asyncio.wait_for(producer.start(), REFUSAL_S)
        finally:
            await producer.stop()

    asyncio.run(go())
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("aiokafka"))


def kcat(bootstrap, mechanism, user, secret, *args, input=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [KCAT, "-b", bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
         "-X", f"sasl.mechanism={mechanism}", "-X", f"sasl.username={user}",
         "-X", f"sasl.password={secret}", *args],
        input=input, capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip


def kcat_round_trip(bootstrap, mechanism, user, topic, values) -> list[bytes]:
    lines = "".join(v.decode() + "\n" for v in values)
    sent = kcat(
        bootstrap, mechanism, user, password(user), "-P", "-t", topic, "-p", "0", input=lines
    )
    assert sent.returncode == 0, sent.stderr
    read = kcat(bootstrap, mechanism, user, password(user), "-C", "-t", topic, "-p", "0",
                "-o", "beginning", "-e", "-q")  # fmt: skip
    assert read.returncode == 0, read.stderr
    return [line.encode() for line in read.stdout.splitlines()]


def kcat_refused(bootstrap, mechanism, user, topic) -> str:
    started = time.monotonic()
    result = kcat(bootstrap, mechanism, user, WRONG, "-P", "-t", topic, "-p", "0", input="x\n")
    assert result.returncode != 0, result
    assert time.monotonic() - started < REFUSAL_S
    return result.stderr


def ours(bootstrap, mechanism, user, secret) -> dict:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": secret}  # fmt: skip


def localcluster_round_trip(bootstrap, mechanism, user, topic, values) -> list[bytes]:
    with Producer(ours(bootstrap, mechanism, user, password(user))) as producer:
        futures = [producer.send(topic, v, partition=0) for v in values]
        producer.flush(TIMEOUT_S)
        assert [f.result(0) for f in futures] == [(0, i) for i in range(len(values))]
    with Consumer(ours(bootstrap, mechanism, user, password(user))) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek((topic, 0), 0)
        got = []
        for _ in until_deadline(f"{len(values)} records back"):
            if len(got) >= len(values):
                return got
            got += [r.value for r in consumer.poll(200)]


def localcluster_refused(bootstrap, mechanism, user, topic) -> str:
    with pytest.raises(KafkaError) as refused:
        Producer(ours(bootstrap, mechanism, user, WRONG))
    return str(refused.value)


ROUND_TRIPS = {"confluent": confluent_round_trip, "kafkapython": kafkapython_round_trip,
               "aiokafka": aiokafka_round_trip, "kcat": kcat_round_trip,
               "localcluster": localcluster_round_trip}  # fmt: skip
REFUSALS = {"confluent": confluent_refused, "kafkapython": kafkapython_refused,
            "aiokafka": aiokafka_refused, "kcat": kcat_refused,
            "localcluster": localcluster_refused}  # fmt: skip
NEEDS_CAPLOG = {"kafkapython", "aiokafka"}


def skip_without(client: str) -> None:
    if client == "kcat" and KCAT is None:
        pytest.skip("kcat is not installed (Debian package kcat)")


def topic_name(client: str, mechanism: str, what: str) -> str:
    return f"{what}-{client}-{mechanism.lower()}"


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", CLIENTS)
def test_client_with_the_right_password_produces_and_reads_back(broker, client, mechanism):
    skip_without(client)
    topic = topic_name(client, mechanism, "ok")
    create_topic(broker, topic)
    values = [f"{client}-{mechanism}-{i}".encode() for i in range(10)]
    assert ROUND_TRIPS[client](broker.bootstrap, mechanism, client, topic, values) == values
    logged = rf"authenticated User:{client} at 127\.0\.0\.1:\d+ \(listener SASL_PLAINTEXT\) "
    assert re.search(logged + rf"\(SASL {mechanism}\)", broker.log_text())


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", CLIENTS)
def test_client_with_a_wrong_password_is_refused(broker, client, mechanism, caplog):
    skip_without(client)
    topic = topic_name(client, mechanism, "refused")
    create_topic(broker, topic)
    started = time.monotonic()
    if client in NEEDS_CAPLOG:
        caplog.set_level(logging.WARNING)
        text = REFUSALS[client](broker.bootstrap, mechanism, client, topic, caplog)
    else:
        text = REFUSALS[client](broker.bootstrap, mechanism, client, topic)
    assert time.monotonic() - started < REFUSAL_S
    assert AUTHENTICATION_FAILED.search(text), text
    reason = "wrong password" if mechanism == "PLAIN" else "invalid proof"
    pattern = (rf"SASL {mechanism} authentication from 127\.0\.0\.1:\d+ on listener "
               rf"SASL_PLAINTEXT failed: SASL/{mechanism} {reason} for '{client}'")  # fmt: skip
    wait_until(lambda: re.search(pattern, broker.log_text()), 5, message=pattern)
    assert end_offset(broker.cluster_dir, topic) == 0


# -- a client without SASL -------------------------------------------------------------------------


def test_a_plaintext_client_on_a_sasl_listener_is_disconnected_and_served_nothing(broker):
    topic = "plaintext-intruder"
    create_topic(broker, topic)
    raw = RawConnection(broker.port)
    try:  # ApiVersions is answered before authentication (clients ask it first, as Kafka)...
        body = messages.encode_request(ApiKey.API_VERSIONS, 3, {
            "client_software_name": "raw", "client_software_version": "0"})  # fmt: skip
        data, offset = raw.recv(ApiKey.API_VERSIONS, 3, raw.send(ApiKey.API_VERSIONS, 3, body))
        answer = messages.decode_response(ApiKey.API_VERSIONS, 3, data, offset)
        assert answer.error_code == 0
        # ...and nothing else: Metadata closes the connection unanswered.
        raw.send(ApiKey.METADATA, 8, messages.encode_request(ApiKey.METADATA, 8, {"topics": None}))
        assert raw.closed_by_broker()
    finally:
        raw.close()
    raw = RawConnection(broker.port)
    try:
        records = encode_batch([Record(b"sneaked in")])
        body = produce.write_produce_request(produce.ProduceRequest(
            None, -1, 5_000, [(topic, [produce.ProducePartition(0, records)])]), 8)  # fmt: skip
        raw.send(ApiKey.PRODUCE, 8, body)
        assert raw.closed_by_broker()
    finally:
        raw.close()
    wait_until(lambda: re.search(rf"PRODUCE from 127\.0\.0\.1:{raw.local_port} on SASL listener "
                                 r"SASL_PLAINTEXT before SASL authentication", broker.log_text()),
               5, message="the broker logs the unauthenticated Produce")  # fmt: skip
    assert end_offset(broker.cluster_dir, topic) == 0
    assert broker.is_alive()


# -- localcluster up --listener-protocol SASL_PLAINTEXT --------------------------------------------


def printed_client_settings(stdout: str) -> tuple[str, dict[str, str]]:
    """(bootstrap servers, client settings) as `up` prints them."""
    bootstrap = re.search(r"^bootstrap servers: (\S+)$", stdout, re.MULTILINE)
    assert bootstrap, stdout
    settings = dict(re.findall(r"^  ([a-z.]+)=(\S+)$", stdout, re.MULTILINE))
    assert settings.get("security.protocol") == "SASL_PLAINTEXT", stdout
    return bootstrap.group(1), settings


def test_up_with_sasl_prints_settings_that_work_and_the_cli_still_works(tmp_path):
    cli = Cli(tmp_path / "cluster")
    try:
        up = cli.run("up", "-n", "3", "--listener-protocol", "SASL_PLAINTEXT", "--detach",
                     check=True)  # fmt: skip
        bootstrap, settings = printed_client_settings(up.stdout)
        assert set(settings) == {"security.protocol", "sasl.mechanism", "sasl.username",
                                 "sasl.password"}  # fmt: skip
        cli.run("topic", "create", "sasl-up", "-p", "1", "-r", "3", check=True)
        producer = RdProducer({"bootstrap.servers": bootstrap, **settings})
        values = [f"via-confluent-{i}" for i in range(10)]
        for v in values:
            producer.produce("sasl-up", v.encode(), partition=0)
        assert producer.flush(TIMEOUT_S) == 0
        got = rd_read({"bootstrap.servers": bootstrap, **settings}, "sasl-up", len(values))
        assert [v.decode() for v in got] == values
        # The cluster's own commands use the Unix sockets: no password needed.
        cli.run("produce", "sasl-up", input="via-cli-1\nvia-cli-2\n", check=True)
        consumed = cli.run("consume", "sasl-up", "--from-beginning", "--max-messages", "12",
                           "--timeout-ms", "10000", check=True)  # fmt: skip
        assert consumed.stdout.splitlines() == values + ["via-cli-1", "via-cli-2"]
        # And a wrong password on the printed bootstrap is refused.
        errors = []
        intruder = RdProducer({"bootstrap.servers": bootstrap, **settings,
                               "sasl.password": WRONG, "error_cb": errors.append})  # fmt: skip
        for _ in until_deadline("an authentication error", REFUSAL_S):
            intruder.poll(0.1)
            if any(e.code() == RdKafkaError._AUTHENTICATION for e in errors):
                break
    finally:
        cli.teardown()


# -- brokers replicating over TCP with SASL --------------------------------------------------------


def tcp_broker_settings(jaas: Path, mechanism: str) -> dict[str, str]:
    """A client listener and an inter-broker listener, both SASL; same-host Unix sockets off."""
    return {"listeners": "SASL_PLAINTEXT://127.0.0.1:0,BROKER://127.0.0.1:0",
            "listener_security_protocol_map": "BROKER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            "inter_broker_listener_name": "BROKER", "inter_broker_unix_socket_enable": "false",
            "sasl_mechanism_inter_broker_protocol": mechanism,
            **sasl_broker_settings(jaas)}  # fmt: skip


def broker_endpoint(cluster_dir: Path, broker_id: int) -> str:
    client = coord.connect(str(cluster_dir / "store"))
    try:
        return str(KafkaZkClient(client).broker(broker_id).endpoint("BROKER"))
    finally:
        client.close()


def isr(cluster_dir: Path, topic: str) -> tuple[int, ...]:
    """The ISR in the partition state znode."""
    client = coord.connect(str(cluster_dir / "store"))
    try:
        state, _ = KafkaZkClient(client).partition_state(topic, 0)
    finally:
        client.close()
    return tuple(sorted(state.isr))


def metadata_isr(cluster_dir: Path, topic: str) -> tuple[int, ...]:
    with Admin(cluster_dir=str(cluster_dir)) as admin:
        return tuple(sorted(admin.describe_topic(topic).partitions[0].isr))


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_two_brokers_replicate_over_tcp_with_sasl(brokers, tmp_path, mechanism):
    add_scram_users(brokers.cluster_dir, ["broker", "alice"])
    jaas = write_jaas(tmp_path / "jaas.conf", ("alice",))
    started = {i: brokers.start(i, **tcp_broker_settings(jaas, mechanism)) for i in (1, 2)}
    create_topic(started[1], "over-tcp", replicas=[1, 2])
    wait_until(lambda: isr(brokers.cluster_dir, "over-tcp") == (1, 2), 10, message="ISR [1, 2]")
    bootstrap = started[1].bootstrap
    producer = RdProducer({**rd_settings(bootstrap, mechanism, "alice", password("alice")),
                           "acks": "all"})  # fmt: skip
    values = [f"replicated-{i}".encode() for i in range(50)]
    delivered = []
    for v in values:
        producer.produce("over-tcp", v, partition=0, on_delivery=lambda e, m: delivered.append(e))
    assert producer.flush(TIMEOUT_S) == 0
    assert delivered == [None] * len(values)
    alice = rd_settings(bootstrap, mechanism, "alice", password("alice"))
    assert rd_read(alice, "over-tcp", len(values)) == values
    assert (
        isr(brokers.cluster_dir, "over-tcp")
        == metadata_isr(brokers.cluster_dir, "over-tcp")
        == (1, 2)
    )
    for me, other in ((1, 2), (2, 1)):
        text = started[me].log_text()
        endpoint = broker_endpoint(brokers.cluster_dir, other)
        route = (
            f"broker {me} reaches broker {other} over tcp {endpoint} (SASL {mechanism} as broker)"
        )
        assert route in text, text[-3000:]
        assert "over unix socket" not in text
    assert re.search(rf"authenticated User:broker at 127\.0\.0\.1:\d+ \(listener BROKER\) "
                     rf"\(SASL {mechanism}\)", started[1].log_text())  # fmt: skip


def test_a_broker_with_a_wrong_credential_never_joins_the_isr(brokers, tmp_path):
    jaas = {i: write_jaas(tmp_path / f"jaas-{i}.conf", ("alice",)) for i in (1, 2)}
    started = {i: brokers.start(i, **tcp_broker_settings(jaas[i], "PLAIN")) for i in (1, 2)}
    create_topic(started[1], "guarded", replicas=[1, 2])
    wait_until(lambda: isr(brokers.cluster_dir, "guarded") == (1, 2), 10, message="ISR [1, 2]")
    started[2].kill()
    wait_until(lambda: isr(brokers.cluster_dir, "guarded") == (1,), 10, message="ISR [1]")
    with Producer(cluster_dir=str(brokers.cluster_dir), acks="all") as producer:
        assert producer.send("guarded", b"while 2 was away", partition=0).result(10) == (0, 0)

    # Broker 2 comes back with a wrong password for its own login (it still checks others
    # right): the controller reaches it, it follows broker 1, and its fetches are refused.
    write_jaas(jaas[2], ("alice",), own_password="wrong-broker-pw")
    brokers.restart(started[2])
    endpoint = broker_endpoint(brokers.cluster_dir, 1)
    refused = (rf"broker 2 cannot reach broker 1 over tcp {re.escape(endpoint)} \(SASL PLAIN as "
               rf"broker\): .*Authentication failed")  # fmt: skip
    wait_until(lambda: re.search(refused, started[2].log_text()), 10, message=refused)
    refusal = (r"SASL PLAIN authentication from 127\.0\.0\.1:\d+ on listener BROKER failed: "
               r"SASL/PLAIN wrong password for 'broker'")  # fmt: skip
    # Broker 1 logs its side after answering, so its line may come after broker 2's
    wait_until(lambda: re.search(refusal, started[1].log_text()), 10, message=refusal)
    # A bounded wait on a condition that must stay false: a follower that can fetch catches up
    # on one record in well under a second; this one must stay out of the ISR all along.
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        assert isr(brokers.cluster_dir, "guarded") == (1,)
        assert metadata_isr(brokers.cluster_dir, "guarded") == (1,)
    assert started[2].is_alive()

    # The control: with its right password it joins within the same few seconds.
    started[2].kill()
    write_jaas(jaas[2], ("alice",))
    brokers.restart(started[2])
    wait_until(lambda: isr(brokers.cluster_dir, "guarded") == (1, 2), 10,
               message="broker 2 joins the ISR with the right password")  # fmt: skip
