"""What the client knows of the cluster, and the connections it keeps to its brokers.

`Cluster` is shared machinery for the producer, consumer and admin: it bootstraps from
`bootstrap_servers` (host:port or unix:/path, comma-separated) or from a cluster directory
(the broker registrations in `<dir>/store`, whose Unix sockets it then prefers over TCP),
keeps at most one connection per broker (reopened after a failure, no sooner than
`reconnect.backoff.ms`), and caches Metadata answers for the topics its user cares about.
A refresh asked for while one is running waits for that one instead of sending another.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kio.schema.errors import ErrorCode

from localcluster.client.connection import (
    DEFAULT_CLIENT_ID,
    PLAINTEXT_SECURITY,
    Address,
    BrokerConnection,
    ClientSecurity,
    KafkaConnectionError,
    KafkaError,
)
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None
    unix_socket: str | None = None  # known when bootstrapped from a cluster dir


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int  # -1 when there is none
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    error_code: int
    partitions: tuple[PartitionInfo, ...] = ()


@dataclass(slots=True)
class MetadataSnapshot:
    cluster_id: str | None = None
    controller_id: int = -1
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, TopicInfo] = field(default_factory=dict)

    def partition(self, tp: TopicPartition) -> PartitionInfo | None:
        topic = self.topics.get(tp[0])
        if topic is None:
            return None
        for p in topic.partitions:
            if p.partition == tp[1]:
                return p
        return None

    def leader(self, tp: TopicPartition) -> int | None:
        p = self.partition(tp)
        return p.leader if p is not None and p.leader >= 0 and p.leader in self.brokers else None


# -- bootstrap ----------------------------------------------------------------------------------


def read_registrations(cluster_dir: str | os.PathLike) -> dict[int, tuple[str, int, str]]:
    """{broker id: (host, port, unix socket)} from the cluster's coordination store.

    Opens a short session on `<cluster_dir>/store` (blocking: call it in a thread).
    """
    from localcluster import coord
    from localcluster.coord import paths
    from localcluster.coord.znode_data import decode_broker_registration

    store = Path(cluster_dir) / "store"
    if not store.is_dir():
        raise KafkaConnectionError(
            f"{cluster_dir} holds no coordination store ({store} is missing)"
        )
    client = coord.connect(str(store))
    try:
        out = {}
        for child in client.get_children(paths.BROKER_IDS):
            if not child.isdigit():
                continue
            try:
                data, _ = client.get(paths.broker_path(int(child)))
            except coord.NoNodeError:
                continue
            r = decode_broker_registration(int(child), paths.broker_path(int(child)), data)
            out[r.broker_id] = (r.host, r.port, r.unix_socket)
        return out
    finally:
        client.stop()


def bootstrap_addresses(bootstrap_servers: str | Iterable[str] | None) -> list[Address]:
    if bootstrap_servers is None:
        return []
    items = (
        bootstrap_servers.split(",") if isinstance(bootstrap_servers, str) else bootstrap_servers
    )
    return [Address.parse(s) for s in items if s.strip()]


# -- the cluster --------------------------------------------------------------------------------


class Cluster:
    def __init__(self, bootstrap_servers: str | Iterable[str] | None = None,
                 cluster_dir: str | os.PathLike | None = None, *,
                 client_id: str = DEFAULT_CLIENT_ID, request_timeout_ms: int = 30_000,
                 security: ClientSecurity = PLAINTEXT_SECURITY,
                 max_in_flight: int = 5, reconnect_backoff_ms: int = 50,
                 metadata_max_age_ms: int = 300_000, allow_auto_create_topics: bool = True):  # fmt: skip
        if bootstrap_servers is None and cluster_dir is None:
            raise ValueError("give bootstrap_servers='host:port' or cluster_dir=DIR")
        self.bootstrap = bootstrap_addresses(bootstrap_servers)
        self.cluster_dir = cluster_dir
        self.client_id = client_id
        self.security = security
        self.request_timeout_ms = request_timeout_ms
        self.max_in_flight = max_in_flight
        self.reconnect_backoff_ms = reconnect_backoff_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.allow_auto_create_topics = allow_auto_create_topics
        self.metadata = MetadataSnapshot()
        self.topics: set[str] = set()  # the topics Metadata requests ask about
        self.all_topics = False  # admin: ask about every topic
        self._unix_sockets: dict[int, str] = {}
        self._connections: dict[int | Address, BrokerConnection] = {}
        self._connecting: dict[int | Address, asyncio.Task] = {}
        self._last_failure: dict[int | Address, float] = {}
        self._refresh: asyncio.Task | None = None
        self._updated_at = 0.0
        self.metadata_changed = asyncio.Event()  # set (and replaced) after every refresh
        self._closed = False

    async def start(self) -> None:
        if self.cluster_dir is not None:
            await self._read_cluster_dir()
        await self.refresh_metadata()

    async def _read_cluster_dir(self) -> None:
        registrations = await asyncio.to_thread(read_registrations, self.cluster_dir)
        self._unix_sockets = {b: r[2] for b, r in registrations.items() if r[2]}
        found = [
            Address(unix_socket=s) if s else Address(h, p) for h, p, s in registrations.values()
        ]
        if not found and not self.bootstrap:
            raise KafkaConnectionError(f"no broker is registered in {self.cluster_dir}")
        self.bootstrap = found + [a for a in self.bootstrap if a not in found]

    # -- connections ------------------------------------------------------------------------

    def address_of(self, node_id: int) -> Address:
        unix = self._unix_sockets.get(node_id)
        if unix:
            return Address(unix_socket=unix)
        broker = self.metadata.brokers.get(node_id)
        if broker is None:
            raise KafkaConnectionError(f"broker {node_id} is not in the cluster metadata")
        return Address(broker.host, broker.port)

    async def connection(self, node_id: int) -> BrokerConnection:
        return await self._connect(node_id, self.address_of(node_id))

    async def _connect(self, key: int | Address, address: Address) -> BrokerConnection:
        if self._closed:
            raise KafkaConnectionError("client is closed")
        existing = self._connections.get(key)
        if existing is not None and not existing.closed and existing.address == address:
            return existing
        for other in self._connections.values():  # a bootstrap connection to the same broker
            if not other.closed and other.address == address:
                self._connections[key] = other
                return other
        task = self._connecting.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._open(key, address))
            self._connecting[key] = task
        return await asyncio.shield(task)

    async def _open(self, key, address: Address) -> BrokerConnection:
        try:
            wait_s = (
                self._last_failure.get(key, 0) + self.reconnect_backoff_ms / 1000 - time.monotonic()
            )
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            try:
                connection = await BrokerConnection.open(
                    address, client_id=self.client_id, max_in_flight=self.max_in_flight,
                    request_timeout_ms=self.request_timeout_ms, security=self.security)  # fmt: skip
            except KafkaError:
                self._last_failure[key] = time.monotonic()
                if isinstance(key, int):
                    self.request_metadata_refresh()  # a leader that is gone: who leads now?
                raise
            old = self._connections.get(key)
            self._connections[key] = connection
            if old is not None and all(c is not old for c in self._connections.values()):
                old.close()  # no other key shares it
            return connection
        finally:
            self._connecting.pop(key, None)

    def connection_failed(self, connection: BrokerConnection) -> None:
        """Note a failure seen through `connection`: close it, back off, refresh metadata."""
        connection.close()
        for key, c in list(self._connections.items()):
            if c is connection:
                self._last_failure[key] = time.monotonic()
        self.request_metadata_refresh()

    async def any_connection(self) -> BrokerConnection:
        """A connection to some live broker: a connected one, else the known ones in turn."""
        for c in self._connections.values():
            if not c.closed:
                return c
        candidates: list[tuple[int | Address, Address]] = []
        for node_id in sorted(self.metadata.brokers):
            candidates.append((node_id, self.address_of(node_id)))
        candidates += [(a, a) for a in self.bootstrap]
        errors = []
        for key, address in candidates:
            try:
                return await self._connect(key, address)
            except KafkaError as e:
                if e.code == ErrorCode.sasl_authentication_failed:
                    raise  # a refused login is not a missing broker: say so, do not retry
                errors.append(str(e))
        if self.cluster_dir is not None:
            await self._read_cluster_dir()  # brokers may have come back on other ports
        raise KafkaConnectionError("no broker reachable: " + "; ".join(errors or ["none known"]))

    # -- metadata ---------------------------------------------------------------------------

    def add_topics(self, topics: Iterable[str]) -> bool:
        """Track these topics; True when one was new (a refresh is then due)."""
        new = set(topics) - self.topics
        self.topics |= new
        return bool(new)

    def request_metadata_refresh(self) -> None:
        if self._refresh is None and not self._closed:
            self._refresh = asyncio.get_running_loop().create_task(self._refresh_once())
            self._refresh.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def refresh_metadata(self) -> MetadataSnapshot:
        """A fresh snapshot; joins a refresh already under way."""
        self.request_metadata_refresh()
        task = self._refresh
        if task is None:
            raise KafkaConnectionError("client is closed")
        await asyncio.shield(task)
        return self.metadata

    def metadata_is_stale(self) -> bool:
        return time.monotonic() - self._updated_at > self.metadata_max_age_ms / 1000

    async def _refresh_once(self) -> None:
        try:
            connection = await self.any_connection()
            try:
                snapshot = await self.fetch_metadata(connection, None if self.all_topics else
                                                     sorted(self.topics))  # fmt: skip
            except KafkaConnectionError:
                self.connection_failed(connection)
                connection = await self.any_connection()
                snapshot = await self.fetch_metadata(connection, None if self.all_topics else
                                                     sorted(self.topics))  # fmt: skip
            unknown = [b for b in snapshot.brokers if b not in self._unix_sockets]
            if self.cluster_dir is not None and unknown:
                await self._read_cluster_dir()
            self.metadata = snapshot
            self._updated_at = time.monotonic()
            if log.isEnabledFor(logging.DEBUG):
                log.debug("metadata from %s: leaders %s", connection.address, {
                    f"{t.name}-{p.partition}": (p.leader, p.leader_epoch)
                    for t in snapshot.topics.values() for p in t.partitions})  # fmt: skip
        finally:
            self._refresh = None
            event, self.metadata_changed = self.metadata_changed, asyncio.Event()
            event.set()

    async def fetch_metadata(self, connection: BrokerConnection, topics: list[str] | None,
                             allow_auto_create: bool | None = None) -> MetadataSnapshot:  # fmt: skip
        auto = self.allow_auto_create_topics if allow_auto_create is None else allow_auto_create
        request = {"topics": None if topics is None else [{"name": t} for t in topics],
                   "allow_auto_topic_creation": auto}  # fmt: skip
        frame, offset = await connection.send(
            ApiKey.METADATA, lambda v: messages.encode_request(ApiKey.METADATA, v, request)
        )
        version = connection.version(ApiKey.METADATA)
        response = messages.decode_response(ApiKey.METADATA, version, frame, offset)
        brokers = {b.node_id: BrokerInfo(b.node_id, b.host, b.port, getattr(b, "rack", None),
                                         self._unix_sockets.get(b.node_id))
                   for b in response.brokers}  # fmt: skip
        topics_out = {}
        for t in response.topics:
            partitions = tuple(sorted((PartitionInfo(
                t.name, p.partition_index, p.leader_id, getattr(p, "leader_epoch", -1),
                tuple(p.replica_nodes), tuple(p.isr_nodes),
                tuple(getattr(p, "offline_replicas", ())), int(p.error_code))
                for p in t.partitions), key=lambda p: p.partition))  # fmt: skip
            topics_out[t.name] = TopicInfo(t.name, int(t.error_code), partitions)
        return MetadataSnapshot(getattr(response, "cluster_id", None),
                                getattr(response, "controller_id", -1), brokers, topics_out)  # fmt: skip

    async def wait_for_metadata_change(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self.metadata_changed.wait(), timeout_s)
        except TimeoutError:
            pass

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in (self._refresh, *self._connecting.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        unique = {id(c): c for c in self._connections.values()}.values()  # aliases share one
        for connection in unique:
            connection.close()
        await asyncio.gather(*(c.wait_closed() for c in unique), return_exceptions=True)
        self._connections.clear()
