"""Only brokers may send broker requests: a client that forges them is refused and changes nothing.

Three real brokers share a cluster dir (they replicate over their Unix sockets, the one-host
inter-broker listener) and each also has a PLAINTEXT and a SASL_PLAINTEXT TCP client listener.
A plain socket client, no Kafka library, sends every request only brokers and the controller
send: LeaderAndIsr, StopReplica (delete_partitions=1, an invented higher controller epoch),
UpdateMetadata, ControlledShutdown (our v0 layouts, protocol/controller_requests.py), Fetch
with a follower's replica id, and OffsetForLeaderEpoch v3 with a replica id. Each answer must
be Kafka's CLUSTER_AUTHORIZATION_FAILED (TOPIC_AUTHORIZATION_FAILED per partition for the
Fetch), and afterwards, read back: every replica still holds every record, the leader, leader
epoch and ISR are those of before, the controller epoch is the same, the high watermark did
not move for a forged fetch, and the real controller can still create a topic whose
partitions every broker takes up (it could not if a broker had accepted the forged epoch).
Over SASL the same holds for a non-super user; the super user `broker` gets past the check.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from localcluster import coord
from localcluster.client import Admin, Consumer, Producer
from localcluster.coord import paths
from localcluster.coord.kafka_zk import KafkaZkClient
from localcluster.coord.znode_data import EndPoint
from localcluster.protocol import controller_requests as cr
from localcluster.protocol import fetch, messages
from localcluster.protocol.api import ApiKey
from localcluster.protocol.wire import Reader
from tests.brokers import pause
from tests.helpers import wait_until
from tests.raw_connection import RawConnection

pytestmark = pytest.mark.slow

NONE = 0
STALE_CONTROLLER_EPOCH = 11
TOPIC_AUTHORIZATION_FAILED = 29
CLUSTER_AUTHORIZATION_FAILED = 31
SASL_AUTHENTICATION_FAILED = 58
TOPIC = "victim"
RECORDS = [f"acknowledged-{i}".encode() for i in range(30)]
FORGED_EPOCH_BUMP = 100  # a controller epoch no real controller has
BROKER_PASSWORD, ALICE_PASSWORD = "b-pw", "alice-pw"
SASL_LISTENER = "SASL_PLAINTEXT"
SEGMENT_HEAD_BYTES = 1 << 20  # far more than the records of these tests


class Raw(RawConnection):
    """A plain socket speaking Kafka framing, with SASL/PLAIN done by hand."""

    def request(self, api_key: int, version: int, body: bytes) -> Reader:
        data, offset = self.recv(api_key, version, self.send(api_key, version, body))
        return Reader(data, offset)

    def sasl_plain(self, username: str, password: str, authorization_id: str = "") -> int:
        """SaslHandshake v1 then one SaslAuthenticate; the error code of the latter."""
        reader = self.request(ApiKey.SASL_HANDSHAKE, 1, messages.encode_request(
            ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}))  # fmt: skip
        handshake = messages.decode_response(ApiKey.SASL_HANDSHAKE, 1, reader.buf, reader.pos)
        assert handshake.error_code == NONE and "PLAIN" in handshake.mechanisms, handshake
        token = f"{authorization_id}\0{username}\0{password}".encode()
        reader = self.request(ApiKey.SASL_AUTHENTICATE, 1, messages.encode_request(
            ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": token}))  # fmt: skip
        answer = messages.decode_response(ApiKey.SASL_AUTHENTICATE, 1, reader.buf, reader.pos)
        return int(answer.error_code)


# -- the cluster -----------------------------------------------------------------------------------


class Cluster:
    def __init__(self, brokers, started: dict, store: KafkaZkClient):
        self.brokers = brokers
        self.started = started
        self.zk = store
        self.dir = str(brokers.cluster_dir)

    def sasl_port(self, broker_id: int) -> int:
        endpoint = self.zk.broker(broker_id).endpoint(SASL_LISTENER)
        assert endpoint is not None, self.zk.broker(broker_id)
        return endpoint.port

    def state(self, topic: str = TOPIC, partition: int = 0):
        state, _version = self.zk.partition_state(topic, partition)
        return state

    def controller_epoch(self) -> int:
        data, _ = self.zk.coord.get(paths.CONTROLLER_EPOCH)
        return int(data)

    def metadata(self, broker_id: int, topic: str = TOPIC) -> tuple[int, int, tuple[int, ...]]:
        """(leader, leader epoch, ISR) of partition 0 as this broker answers Metadata."""
        raw = Raw(self.started[broker_id].port)
        try:
            reader = raw.request(ApiKey.METADATA, 8, messages.encode_request(ApiKey.METADATA, 8, {
                "topics": [{"name": topic}], "allow_auto_topic_creation": False}))  # fmt: skip
        finally:
            raw.close()
        answer = messages.decode_response(ApiKey.METADATA, 8, reader.buf, reader.pos)
        (p,) = [p for t in answer.topics if t.name == topic for p in t.partitions]
        assert p.error_code == NONE, p
        return int(p.leader_id), int(p.leader_epoch), tuple(sorted(p.isr_nodes))

    def high_watermark(self, leader: int, topic: str = TOPIC) -> tuple[int, bytes]:
        """(HW, the fetched bytes) from the leader, fetched as a consumer."""
        raw = Raw(self.started[leader].port)
        try:
            partitions = [(topic, [fetch.FetchPartition(0, 0, 1 << 20)])]
            body = fetch.write_fetch_request(
                fetch.FetchRequest(-1, 0, 1, 1 << 20, 0, partitions), 11
            )
            error, ((_, (p,)),) = fetch.read_fetch_response(raw.request(ApiKey.FETCH, 11, body), 11)
        finally:
            raw.close()
        assert error == NONE and p.error_code == NONE, p
        return p.high_watermark, b"".join(bytes(part) for part in p.records)

    def replica_holds(self, broker_id: int, values: list[bytes], topic: str = TOPIC) -> bool:
        """Every value is in this broker's segment files of the partition (records are stored
        uncompressed, so their values appear verbatim). Only each file's head is read: the
        active segment is preallocated (sparse) to log.segment.bytes, and the data is small."""
        directory = self.started[broker_id].data_dir / f"{topic}-0"
        if not directory.is_dir():
            return False
        data = b""
        for path in sorted(directory.glob("*.log")):
            with open(path, "rb") as segment:
                data += segment.read(SEGMENT_HEAD_BYTES)
        return all(v in data for v in values)


def write_jaas(path: Path) -> Path:
    path.write_text(
        "KafkaServer {\n"
        "  org.apache.kafka.common.security.plain.PlainLoginModule required\n"
        f'    username="broker" password="{BROKER_PASSWORD}"\n'
        f'    user_broker="{BROKER_PASSWORD}" user_alice="{ALICE_PASSWORD}";\n'
        "};\n"
    )
    return path


@pytest.fixture
def start_cluster(brokers, tmp_path):
    """`start_cluster(**settings)`: brokers 1-3 (killed by the `brokers` fixture), and a store
    client closed at the end."""
    stores = []

    def start(**settings) -> Cluster:
        store = KafkaZkClient(coord.connect(str(brokers.cluster_dir / "store")))
        stores.append(store)
        return _start_cluster(brokers, tmp_path, store, **settings)

    try:
        yield start
    finally:
        for store in stores:
            store.coord.close()


def _start_cluster(brokers, tmp_path: Path, store: KafkaZkClient, **settings) -> Cluster:
    """Brokers 1-3 with PLAINTEXT (first: the port they print) and SASL_PLAINTEXT client
    listeners; topic `victim` (RF 3, broker 1 preferred leader) holding RECORDS, all in sync."""
    jaas = write_jaas(tmp_path / "jaas.conf")
    common = {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
              "java_security_auth_login_config": str(jaas), "super_users": "User:broker",
              "sasl_enabled_mechanisms": "PLAIN,SCRAM-SHA-256", **settings}  # fmt: skip
    started = {i: brokers.start(i, **common) for i in (1, 2, 3)}
    cluster = Cluster(brokers, started, store)
    with Admin(cluster_dir=cluster.dir) as admin:
        admin.create_topic(TOPIC, replica_assignment={0: [1, 2, 3]})
        admin.wait_for_leaders(TOPIC)
    with Producer(cluster_dir=cluster.dir, acks="all") as producer:
        futures = [producer.send(TOPIC, v, partition=0) for v in RECORDS]
        producer.flush(20)
        assert [f.result(0) for f in futures] == [(0, i) for i in range(len(RECORDS))]
    wait_until(lambda: cluster.state().isr == (1, 2, 3), 10, message="ISR [1, 2, 3]")
    wait_until(lambda: all(cluster.replica_holds(b, RECORDS) for b in started), 10,
               message="every replica holds every record")  # fmt: skip
    return cluster


# -- the forged requests ---------------------------------------------------------------------------


def forged_requests(cluster: Cluster) -> dict[ApiKey, bytes]:
    """Bodies a real controller could have sent, with a future controller epoch: accepted, each
    would move leadership, delete replicas, rewrite metadata or start a controlled shutdown."""
    state = cluster.state()
    epoch = cluster.controller_epoch() + FORGED_EPOCH_BUMP
    usurper = 3  # a follower, made leader of its own ISR
    partition = cr.PartitionState(TOPIC, 0, epoch, usurper, state.leader_epoch + 50, (usurper,),
                                  99, (1, 2, 3))  # fmt: skip
    return {
        ApiKey.LEADER_AND_ISR: cr.write_leader_and_isr(cr.LeaderAndIsrRequest(
            usurper, epoch, (partition,))),
        ApiKey.STOP_REPLICA: cr.write_stop_replica(cr.StopReplicaRequest(
            usurper, epoch, True, ((TOPIC, 0),))),
        ApiKey.UPDATE_METADATA: cr.write_update_metadata(cr.UpdateMetadataRequest(
            usurper, epoch, (partition,), ((),),
            (cr.MetadataBroker(usurper, (EndPoint("PLAINTEXT", "10.9.9.9", 9),), None, ""),))),
        ApiKey.CONTROLLED_SHUTDOWN: cr.write_controlled_shutdown(state.leader),
    }  # fmt: skip


def assert_refused(raw: Raw, api_key: ApiKey, body: bytes) -> None:
    reader = raw.request(api_key, 0, body)
    if api_key in (ApiKey.LEADER_AND_ISR, ApiKey.STOP_REPLICA):
        answer = cr.read_partition_errors(reader)
        assert answer == cr.PartitionErrors(CLUSTER_AUTHORIZATION_FAILED, (
            (TOPIC, 0, CLUSTER_AUTHORIZATION_FAILED),)), (api_key.name, answer)  # fmt: skip
    elif api_key == ApiKey.UPDATE_METADATA:
        assert cr.read_error_code(reader) == CLUSTER_AUTHORIZATION_FAILED
    else:
        assert cr.read_controlled_shutdown_response(reader) == (CLUSTER_AUTHORIZATION_FAILED, [])


def forged_fetch(raw: Raw, replica_id: int, fetch_offset: int, leader_epoch: int) -> list:
    """A follower's Fetch as the follower would send it; the per-partition error codes."""
    body = fetch.write_fetch_request(fetch.FetchRequest(replica_id, 0, 1, 1 << 20, 0, [
        (TOPIC, [fetch.FetchPartition(0, fetch_offset, 1 << 20, leader_epoch)])]), 11)  # fmt: skip
    error, responses = fetch.read_fetch_response(raw.request(ApiKey.FETCH, 11, body), 11)
    assert error == NONE
    return [p.error_code for _, partitions in responses for p in partitions]


def forged_offset_for_leader_epoch(raw: Raw, replica_id: int, leader_epoch: int) -> list:
    partition = {"partition": 0, "current_leader_epoch": leader_epoch, "leader_epoch": leader_epoch}
    topics = [{"topic": TOPIC, "partitions": [partition]}]
    body = messages.encode_request(
        ApiKey.OFFSET_FOR_LEADER_EPOCH, 3, {"replica_id": replica_id, "topics": topics}
    )
    reader = raw.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, 3, body)
    answer = messages.decode_response(ApiKey.OFFSET_FOR_LEADER_EPOCH, 3, reader.buf, reader.pos)
    return [(p.error_code, p.end_offset) for t in answer.topics for p in t.partitions]


def send_every_forgery(cluster: Cluster, connect, principal: str, listener: str) -> None:
    """Every broker-only request to every broker on a new connection of `connect(broker_id)`,
    each refused, and each broker's log naming who tried."""
    state = cluster.state()
    bodies = forged_requests(cluster)
    for broker_id in cluster.started:
        for api_key, body in bodies.items():
            raw = connect(broker_id)
            try:
                assert_refused(raw, api_key, body)
            finally:
                raw.close()
            assert_logged_refusal(cluster, broker_id, api_key.name, principal, raw, listener)
        raw = connect(broker_id)
        try:
            assert forged_offset_for_leader_epoch(raw, 2, state.leader_epoch) == [
                (CLUSTER_AUTHORIZATION_FAILED, -1)]  # fmt: skip
        finally:
            raw.close()
        assert_logged_refusal(cluster, broker_id, r"OFFSET_FOR_LEADER_EPOCH \(replica id 2\)",
                              principal, raw, listener)  # fmt: skip
    raw = connect(state.leader)
    try:  # follower 2 claims to have everything the leader has
        assert forged_fetch(raw, 2, len(RECORDS), state.leader_epoch) == [
            TOPIC_AUTHORIZATION_FAILED
        ]
    finally:
        raw.close()
    assert_logged_refusal(
        cluster, state.leader, r"FETCH \(replica id 2\)", principal, raw, listener
    )


def assert_logged_refusal(cluster: Cluster, broker_id: int, what: str, principal: str, raw: Raw,
                          listener: str) -> None:  # fmt: skip
    pattern = (rf"refused {what} from {re.escape(principal)} at 127\.0\.0\.1:{raw.local_port} "
               rf"\(listener {listener}\)")  # fmt: skip
    broker = cluster.started[broker_id]
    wait_until(lambda: re.search(pattern, broker.log_text()), 5,
               message=f"broker {broker_id} logs {pattern!r}")  # fmt: skip


def assert_nothing_changed(cluster: Cluster, before_state, before_epoch: int) -> None:
    """Read back: records on every replica and consumable, leadership, ISR, controller epoch."""
    assert cluster.state() == before_state
    assert cluster.controller_epoch() == before_epoch
    for broker_id, broker in cluster.started.items():
        assert broker.is_alive(), broker.log_text()[-3000:]
        expected = (before_state.leader, before_state.leader_epoch, tuple(sorted(before_state.isr)))
        assert cluster.metadata(broker_id) == expected, broker_id
        assert cluster.replica_holds(broker_id, RECORDS), f"broker {broker_id} lost its replica"
    with Consumer(
        bootstrap_servers=cluster.started[1].bootstrap, auto_offset_reset="earliest"
    ) as c:
        c.assign([(TOPIC, 0)])
        got = []
        deadline = time.monotonic() + 15
        while len(got) < len(RECORDS) and time.monotonic() < deadline:
            got += c.poll(200)
    assert [(r.offset, r.value) for r in got] == list(enumerate(RECORDS))


def assert_real_controller_still_rules(cluster: Cluster) -> None:
    """A new topic with a partition led by each broker: every broker must accept the real
    controller's LeaderAndIsr (a broker holding a forged higher controller epoch would answer
    STALE_CONTROLLER_EPOCH and never lead or follow), so acks=all produce succeeds everywhere."""
    with Admin(cluster_dir=cluster.dir) as admin:
        admin.create_topic("after", replica_assignment={0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]})
        admin.wait_for_leaders("after")
    with Producer(cluster_dir=cluster.dir, acks="all", delivery_timeout_ms=15_000) as producer:
        futures = [producer.send("after", b"x", partition=p) for p in range(3)]
        producer.flush(20)
        assert [f.result(0) for f in futures] == [(p, 0) for p in range(3)]
    assert {p: cluster.state("after", p).leader for p in range(3)} == {0: 1, 1: 2, 2: 3}


# -- the cases -------------------------------------------------------------------------------------


def test_broker_requests_from_a_plaintext_client_are_refused_and_change_nothing(start_cluster):
    cluster = start_cluster()
    before_state, before_epoch = cluster.state(), cluster.controller_epoch()
    send_every_forgery(cluster, lambda b: Raw(cluster.started[b].port), "User:ANONYMOUS",
                       "PLAINTEXT")  # fmt: skip
    assert_nothing_changed(cluster, before_state, before_epoch)
    assert_real_controller_still_rules(cluster)


def test_a_forged_follower_fetch_does_not_move_the_high_watermark(start_cluster):
    # Long lag and session timeouts: the paused follower stays in the ISR (and registered) for
    # the whole test, so the HW can only pass its fetch position if the forged fetch counts.
    cluster = start_cluster(replica_lag_time_max_ms=60_000, zookeeper_session_timeout_ms=60_000)
    state = cluster.state()
    leader, paused = state.leader, 3
    assert leader == 1
    hw_before, _ = cluster.high_watermark(leader)
    assert hw_before == len(RECORDS)
    pause(cluster.started[paused])
    try:
        with Producer(cluster_dir=cluster.dir, acks=1) as producer:
            assert producer.send(TOPIC, b"uncommitted", partition=0).result(10) == (0, len(RECORDS))
        # Broker 2 fetches the new record; broker 3 cannot: the HW stays where 3 left it.
        wait_until(lambda: cluster.replica_holds(2, [b"uncommitted"]), 10,
                   message="follower 2 has the new record")  # fmt: skip
        assert cluster.high_watermark(leader)[0] == hw_before
        raw = Raw(cluster.started[leader].port)
        try:
            codes = forged_fetch(raw, paused, len(RECORDS) + 1, state.leader_epoch)
        finally:
            raw.close()
        assert codes == [TOPIC_AUTHORIZATION_FAILED]
        # A bounded wait on a condition that must stay false: the HW never moves while 3 is
        # paused (an accepted fetch would move it at once, within the request).
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert cluster.high_watermark(leader)[0] == hw_before
        assert cluster.state().isr == (1, 2, 3)
    finally:
        os.kill(cluster.started[paused].pid, signal.SIGCONT)
    # The control: once the real follower fetches, the HW passes the record.
    wait_until(lambda: cluster.high_watermark(leader)[0] == len(RECORDS) + 1, 15,
               message="the HW moves once broker 3 really fetches")  # fmt: skip


def test_over_sasl_only_a_super_user_may_send_broker_requests(start_cluster):
    cluster = start_cluster()
    before_state, before_epoch = cluster.state(), cluster.controller_epoch()

    def as_user(user: str, password: str):
        def connect(broker_id: int) -> Raw:
            raw = Raw(cluster.sasl_port(broker_id))
            assert raw.sasl_plain(user, password) == NONE
            return raw

        return connect

    send_every_forgery(cluster, as_user("alice", ALICE_PASSWORD), "User:alice", SASL_LISTENER)
    assert_nothing_changed(cluster, before_state, before_epoch)

    # alice cannot borrow the broker's identity as her authorization id
    raw = Raw(cluster.sasl_port(1))
    try:
        assert raw.sasl_plain("alice", ALICE_PASSWORD, authorization_id="broker") == (
            SASL_AUTHENTICATION_FAILED)  # fmt: skip
        assert raw.closed_by_broker()
    finally:
        raw.close()

    # The super user gets past the authorization: its stale-epoch requests are judged on their
    # controller epoch (an old one changes nothing), not refused as unauthorized.
    stale = cluster.controller_epoch() - 1
    broker_login = as_user("broker", BROKER_PASSWORD)
    for broker_id in cluster.started:
        raw = broker_login(broker_id)
        try:
            reader = raw.request(ApiKey.UPDATE_METADATA, 0, cr.write_update_metadata(
                cr.UpdateMetadataRequest(1, stale, (), (), ())))  # fmt: skip
            assert cr.read_error_code(reader) == STALE_CONTROLLER_EPOCH
            reader = raw.request(ApiKey.STOP_REPLICA, 0, cr.write_stop_replica(
                cr.StopReplicaRequest(1, stale, True, ((TOPIC, 0),))))  # fmt: skip
            assert cr.read_partition_errors(reader).error_code == STALE_CONTROLLER_EPOCH
        finally:
            raw.close()
    assert_nothing_changed(cluster, before_state, before_epoch)
    assert_real_controller_still_rules(cluster)


def test_every_principal_that_tries_is_logged(start_cluster):
    cluster = start_cluster()
    body = forged_requests(cluster)[ApiKey.STOP_REPLICA]
    anonymous = Raw(cluster.started[2].port)
    alice = Raw(cluster.sasl_port(2))
    try:
        assert_refused(anonymous, ApiKey.STOP_REPLICA, body)
        assert_logged_refusal(cluster, 2, "STOP_REPLICA", "User:ANONYMOUS", anonymous, "PLAINTEXT")
        assert alice.sasl_plain("alice", ALICE_PASSWORD) == NONE
        assert_refused(alice, ApiKey.STOP_REPLICA, body)
        assert_logged_refusal(cluster, 2, "STOP_REPLICA", "User:alice", alice, SASL_LISTENER)
    finally:
        anonymous.close()
        alice.close()
