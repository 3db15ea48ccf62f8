"""BrokerServer: one broker process. Wires storage, coordination and the network together.

Start-up order: open and recover the logs, bind both listeners, register the ephemeral
/brokers/ids/<id> (its existence is the broker's readiness), take up leadership of the
partitions the store says this broker leads, then serve. SIGTERM or SIGINT is a clean shutdown:
listeners closed, registration removed, high watermarks and recovery points checkpointed, logs
flushed and trimmed. A SIGKILL at any moment is recovered from on the next start.

Two ways to run. In a cluster dir (`localcluster up`, `--cluster-dir`): <cluster-dir>/broker-<id>/
holds checkpoints and `broker.pid`, the Unix socket is <cluster-dir>/broker-<id>.sock (or under
/tmp when that path is too long for AF_UNIX), the store is <cluster-dir>/store unless
`zookeeper.connect` names a ZooKeeper, and logs live under log.dirs, by default
/dev/shm/localcluster-<hash of cluster dir>/broker-<id>. From a server.properties alone
(`--config`, as a Kafka broker runs): nothing is shared with other brokers but ZooKeeper
(`zookeeper.connect`, required); checkpoints, the pid file and the socket live in log.dirs.

Listeners: one TCP socket per entry of `listeners` (broker/listeners.py) plus the Unix socket;
the registration advertises `advertised.listeners` with the ports actually bound.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import os
import signal
import socket
import tempfile
import time
from pathlib import Path

from localcluster import coord
from localcluster.broker import state_change_log
from localcluster.broker.admin_apis import AdminApis
from localcluster.broker.authorizer import Authorizer
from localcluster.broker.config import BrokerConfig, ConfigError
from localcluster.broker.config_changes import follow_config_changes, load_broker_configs
from localcluster.broker.group_apis import GroupApis
from localcluster.broker.group_coordinator import GroupCoordinator
from localcluster.broker.inter_broker import InterBrokerConnector, host_id
from localcluster.broker.kafka_apis import KafkaApis
from localcluster.broker.log_cleaner import LogCleaner
from localcluster.broker.metadata import ClusterMetadata
from localcluster.broker.metadata_cache import MetadataCache
from localcluster.broker.network import (
    UNIX_LISTENER,
    Listener,
    ListenerInfo,
    tcp_listen,
    unix_listen,
)
from localcluster.broker.producer_ids import ProducerIdManager
from localcluster.broker.reassignment_apis import ReassignmentApis
from localcluster.broker.records_apis import RecordsApis
from localcluster.broker.replica_fetcher import ReplicaFetcherManager
from localcluster.broker.replica_manager import ReplicaManager
from localcluster.broker.sasl_authenticator import (
    CredentialsError,
    SaslAuthenticator,
    load_server_credentials,
    store_scram_lookup,
)
from localcluster.broker.shutdown import controlled_shutdown
from localcluster.client.connection import ClientSecurity
from localcluster.controller.controller import KafkaController
from localcluster.coord import SessionExpiredError, paths
from localcluster.coord.znode_data import ZnodeDataError
from localcluster.metadata_types import BrokerRegistration, EndPoint
from localcluster.metrics import MetricsBoard, loop_probe
from localcluster.tasks import cancel_and_wait

log = logging.getLogger(__name__)

CONTROLLED_SHUTDOWN_TIMEOUT_S = 10
SESSION_CHECK_INTERVAL_S = 0.5
GC_THRESHOLD_0 = 50_000  # CPython's default is 700 allocations
METRICS_REPLICAS_INTERVAL_MS = 500
UNIX_PATH_MAX = 100  # sun_path holds 108 bytes; keep a margin


def cluster_hash(cluster_dir: Path) -> str:
    return hashlib.sha1(str(cluster_dir.resolve()).encode()).hexdigest()[:12]


def default_data_dir(cluster_dir: Path, broker_id: int) -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / f"localcluster-{cluster_hash(cluster_dir)}" / f"broker-{broker_id}"
    return cluster_dir / f"broker-{broker_id}" / "data"


def socket_path(cluster_dir: Path, broker_id: int) -> Path:
    name = f"broker-{broker_id}.sock"
    path = cluster_dir.resolve() / name
    if len(str(path)) <= UNIX_PATH_MAX:
        return path
    short = short_socket_dir(cluster_dir)
    short.mkdir(mode=0o700, exist_ok=True)
    return short / name


def short_socket_dir(cluster_dir: Path) -> Path:
    """Where the sockets go when the cluster dir makes too long a path for AF_UNIX: under
    TMPDIR, or under /tmp when TMPDIR is itself that deep (a test's tmp dir under xdist was)."""
    name = f"localcluster-{cluster_hash(cluster_dir)}"
    base = Path(tempfile.gettempdir())
    if len(str(base / name)) > UNIX_PATH_MAX - len("/broker-99999999999.sock"):
        base = Path("/tmp")
    return base / name


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def default_coordination(cluster_dir: Path) -> str:
    return str(cluster_dir / "store")


def coordination_of(config: BrokerConfig, cluster_dir: Path | None, given: str | None) -> str:
    if given:
        return given
    if config.zookeeper_connect:
        return "zookeeper://" + config.zookeeper_connect.strip()
    if cluster_dir is None:
        raise ConfigError("a broker run from --config needs zookeeper.connect=host:port "
                          "(the ZooKeeper every broker of the cluster uses)")  # fmt: skip
    return default_coordination(cluster_dir)


class BrokerServer:
    def __init__(self, config: BrokerConfig, cluster_dir: Path | None,
                 coordination: str | None = None):  # fmt: skip
        self.config = config
        self.coordination = coordination_of(config, cluster_dir, coordination)
        if cluster_dir is not None:
            self.cluster_dir = cluster_dir
            self.broker_dir = cluster_dir / f"broker-{config.broker_id}"
            self.data_dir = Path(config.log_dirs) if config.log_dirs else default_data_dir(
                cluster_dir, config.broker_id)  # fmt: skip
            self.socket_path = socket_path(cluster_dir, config.broker_id)
        else:  # a Kafka-style broker: everything of its own lives in log.dirs
            if not config.log_dirs:
                raise ConfigError("a broker run from --config needs log.dirs")
            self.data_dir = Path(config.log_dirs)
            self.cluster_dir = self.broker_dir = self.data_dir
            self.socket_path = socket_path(self.data_dir, config.broker_id)
        self.listener_settings = config.listener_settings
        try:
            self.credentials = load_server_credentials(config.java_security_auth_login_config)
            inter_broker = self.listener_settings.inter_broker
            mechanism = config.sasl_mechanism_inter_broker_protocol.strip().upper()
            login = self.credentials.login(mechanism) if inter_broker else ("", "")
        except CredentialsError as e:
            raise ConfigError(str(e)) from None
        self.inter_broker_security = ClientSecurity(
            "SASL_PLAINTEXT" if inter_broker else "PLAINTEXT", mechanism, *login
        )
        self.replica_manager = ReplicaManager(config, self.data_dir, self.broker_dir)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._listeners: list[Listener] = []
        self.controller: KafkaController | None = None
        self.log_cleaner: LogCleaner | None = None
        self.loop_probe: loop_probe.LoopProbe | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        self.broker_dir.mkdir(parents=True, exist_ok=True)
        state_change_log.open_file(
            self.broker_dir / state_change_log.FILE_NAME, self.config.broker_id
        )
        self.coord = await asyncio.to_thread(
            coord.connect, self.coordination,
            session_timeout_ms=self.config.zookeeper_session_timeout_ms)  # fmt: skip
        self.metadata_cache = MetadataCache()
        self.metadata = ClusterMetadata(
            self.coord, self.config.broker_id, self.config, self.metadata_cache
        )
        try:
            await self._await_free_registration()
            await load_broker_configs(self.metadata, self.replica_manager)
            await asyncio.to_thread(self.replica_manager.open_logs, await self._configs_on_disk())
            await self._serve()
        finally:
            await self._shutdown()

    async def _configs_on_disk(self) -> dict:
        """The configs of the topics this broker has logs of: each log opens with its topic's,
        as Kafka's LogManager does. One that cannot be read is not worth refusing to start
        for: the logs then open with the broker's defaults, and each topic's config applies
        from its first LeaderAndIsr (which reads it again and says what is wrong)."""
        try:
            return await self.metadata.topic_configs(
                self.replica_manager.log_manager.topics_on_disk()
            )
        except (coord.CoordinationError, ZnodeDataError) as e:
            log.warning("could not read the topics' configs before opening their logs (%s); "
                        "opening them with the broker's defaults until each topic's config "
                        "arrives with its first LeaderAndIsr", e)  # fmt: skip
            return {}

    async def _await_free_registration(self) -> None:
        """A broker restarted right after a kill -9 finds its old registration until the store
        reaps the dead session; wait for that, but refuse at once if the holder is alive."""
        deadline = time.monotonic() + self.config.zookeeper_session_timeout_ms / 1000 + 2
        while await asyncio.to_thread(self.metadata.is_registered):
            holder = await asyncio.to_thread(self.metadata.registered_pid)
            if (holder is not None and _pid_alive(holder)) or time.monotonic() > deadline:
                raise RuntimeError(self.metadata.duplicate_message())
            await asyncio.sleep(0.05)

    def _bind(self) -> tuple[list[tuple], dict[str, int]]:
        """Bind every TCP listener and the Unix socket (all or none: a failure closes the
        ones already bound)."""
        bound: list[tuple] = []
        try:
            for endpoint in self.listener_settings.listeners:
                sock = tcp_listen(endpoint.host, endpoint.port, endpoint.listener_name)
                bound.append((sock, ListenerInfo(endpoint.listener_name,
                                                 endpoint.security_protocol)))  # fmt: skip
            bound.append((unix_listen(str(self.socket_path)),
                          ListenerInfo(UNIX_LISTENER, "PLAINTEXT", is_unix=True)))  # fmt: skip
        except BaseException:
            for sock, _ in bound:
                sock.close()
            raise
        ports = {info.name: sock.getsockname()[1] for sock, info in bound if not info.is_unix}
        return bound, ports

    def _advertised(self, ports: dict[str, int]) -> tuple[EndPoint, ...]:
        advertised = self.listener_settings.advertised(ports)
        return tuple(EndPoint(e.listener_name, e.host or socket.getfqdn(), e.port,
                              e.security_protocol) for e in advertised)  # fmt: skip

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        c = self.config
        bound, ports = self._bind()
        connector = InterBrokerConnector(
            c.broker_id, host_id(), self.listener_settings.inter_broker,
            c.inter_broker_unix_socket_enable, self.inter_broker_security, self.metadata.zk.broker)  # fmt: skip
        self.connector = connector
        sasl = SaslAuthenticator(c.enabled_mechanisms, self.credentials,
                                 store_scram_lookup(self.metadata.zk),
                                 c.connection_failed_authentication_delay_ms)  # fmt: skip
        apis = KafkaApis(self.replica_manager, self.metadata, Authorizer(c.super_user_names), sasl)
        apis.producer_ids = ProducerIdManager(c.broker_id, lambda: self.coord)
        self.group_coordinator = GroupCoordinator(self.replica_manager, c,
                                                  self.metadata.offsets_partition_count)  # fmt: skip
        apis.add_handlers(GroupApis(self.group_coordinator, self.metadata, c).handlers())
        apis.add_handlers(AdminApis(self.metadata, c).handlers())
        apis.add_handlers(RecordsApis(self.replica_manager).handlers())
        apis.add_handlers(ReassignmentApis(self.metadata).handlers())
        apis.on_replicas_changed = self.group_coordinator.on_replicas_changed
        self.replica_manager.metrics = MetricsBoard.open_writer(self.cluster_dir, c.broker_id)
        self.replica_manager.isr_writer = lambda update, step: asyncio.to_thread(
            self.metadata.update_isr, update, step
        )
        self.replica_manager.fetchers = ReplicaFetcherManager(
            self.replica_manager, c.broker_id, c.replica_fetch_wait_max_ms, connector
        )
        for sock, info in bound:
            listener = Listener(sock, apis.handle, c.socket_request_max_bytes, info)
            listener.start()
            self._listeners.append(listener)
        endpoints = self._advertised(ports)
        registration = BrokerRegistration(c.broker_id, endpoints, str(self.socket_path),
                                          c.broker_rack, os.getpid(), int(time.time() * 1000),
                                          host_id())  # fmt: skip
        await asyncio.to_thread(self.metadata.register, registration)
        self._registration = registration
        (self.broker_dir / "broker.pid").write_text(f"{os.getpid()}\n")
        if c.controller_eligible:
            self.controller = KafkaController(c.broker_id, self.metadata.zk, self.metadata.defaults)
            self.controller.connector = connector
            apis.controller = self.controller
            self.controller.start()
        self._tasks = [
            loop.create_task(self._watch_session()),
            loop.create_task(follow_config_changes(
                self.metadata, self.replica_manager,
                self.controller and self.controller.enable_topic_unclean_leader_election,
                self.controller and self.controller.update_broker_config)),
            *(loop.create_task(self._every(interval_ms, job))
              for interval_ms, job in self.replica_manager.periodic_jobs(c)),
            loop.create_task(self._every(METRICS_REPLICAS_INTERVAL_MS,
                                         self.replica_manager.publish_replicas)),
        ]  # fmt: skip
        if c.log_cleaner_enable:
            self.log_cleaner = LogCleaner(self.replica_manager, c.log_cleaner_backoff_ms)
            self.log_cleaner.start()
        # Startup's objects live as long as the broker: keep the cyclic GC from rescanning
        # them, and run it less often (its full passes show up as produce latency spikes).
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD_0, 50, 100)
        self.loop_probe = loop_probe.start_from_env(f"broker-{c.broker_id}")  # opt-in
        first = endpoints[0]
        log.info("broker %d ready: listeners %s, unix %s, logs in %s, store %s", c.broker_id,
                 ", ".join(map(str, endpoints)), self.socket_path, self.data_dir,
                 self.coordination)  # fmt: skip
        print(f"broker {c.broker_id} ready on {first.host}:{first.port} (pid {os.getpid()})",
              flush=True)  # fmt: skip
        await self._stop.wait()
        log.info("broker %d shutting down", c.broker_id)

    async def _controlled_shutdown(self) -> None:
        """Ask the controller to move our leaderships away first (Kafka's controlled
        shutdown), so producers see a leader change instead of a dead leader."""
        deadline = time.monotonic() + CONTROLLED_SHUTDOWN_TIMEOUT_S
        previous = None
        while time.monotonic() < deadline:
            try:
                remaining = await controlled_shutdown(
                    self.metadata, self.controller, self.config.broker_id, self.connector
                )
            except Exception as e:
                log.info("controlled shutdown: %s; retrying", e)
                remaining = None
            if remaining == []:
                log.info("controlled shutdown: leaderships moved away")
                return
            if remaining is not None and (remaining == previous
                                          or all(self._sole_replica(tp) for tp in remaining)):  # fmt: skip
                log.info("controlled shutdown: %d partition(s) have no other live replica to "
                         "lead them; shutting down with them", len(remaining))  # fmt: skip
                return
            previous = remaining
            await asyncio.sleep(0.1)
        log.warning(
            "controlled shutdown did not complete in %d s; shutting down anyway",
            CONTROLLED_SHUTDOWN_TIMEOUT_S,
        )

    async def _watch_session(self) -> None:
        """A broker paused (SIGSTOP) longer than zookeeper.session.timeout.ms comes back with
        an expired session: its registration and any controller seat are gone. Like Kafka,
        open a new session and register again; the controller then treats it as a broker
        that restarted and sends it the current LeaderAndIsr."""
        while True:
            await asyncio.sleep(SESSION_CHECK_INTERVAL_S)
            try:
                await asyncio.to_thread(self.coord.exists, paths.BROKER_IDS)
            except SessionExpiredError:
                await self._renew_session()
            except Exception as e:
                log.debug("session check: %s", e)

    async def _renew_session(self) -> None:
        log.warning("broker %d: its coordination session expired (paused longer than "
                    "zookeeper.session.timeout.ms=%d?); opening a new one and registering again",
                    self.config.broker_id, self.config.zookeeper_session_timeout_ms)  # fmt: skip
        if self.controller is not None:
            await self.controller.stop()
        old = self.coord
        self.coord = await asyncio.to_thread(
            coord.connect, self.coordination,
            session_timeout_ms=self.config.zookeeper_session_timeout_ms)  # fmt: skip
        self.metadata.coord = self.metadata.zk.coord = self.coord
        try:
            old.stop()
        except Exception as e:
            log.debug("closing the expired session: %s", e)
        await asyncio.to_thread(self.metadata.register, self._registration)
        if self.controller is not None:
            self.controller.start()

    def _sole_replica(self, tp) -> bool:
        hosted = self.replica_manager.partitions.get(tuple(tp))
        return hosted is None or len(hosted.state.assignment) <= 1

    async def _every(self, interval_ms: int, action) -> None:
        while True:
            await asyncio.sleep(max(interval_ms, 10) / 1000)
            try:
                action()
            except Exception:
                log.exception("periodic %s failed; will retry", getattr(action, "__name__", action))

    async def _shutdown(self) -> None:
        if self.controller is not None and self.config.controlled_shutdown_enable:
            await self._controlled_shutdown()
        if self.controller is not None:
            await self.controller.stop()
        if getattr(self, "metadata", None) is not None:
            await asyncio.to_thread(self.metadata.deregister)  # clients stop routing here first
        await cancel_and_wait(*self._tasks)
        if self.log_cleaner is not None:
            await self.log_cleaner.stop()
        if getattr(self, "group_coordinator", None) is not None:
            self.group_coordinator.close()
        if self.replica_manager.fetchers is not None:
            await self.replica_manager.fetchers.close()
        for listener in self._listeners:
            await listener.close()
        try:
            self.socket_path.unlink(missing_ok=True)
        except OSError:
            pass
        self.replica_manager.close()
        self.replica_manager.metrics.close()
        if getattr(self, "coord", None) is not None:
            self.coord.stop()
        (self.broker_dir / "broker.pid").unlink(missing_ok=True)
        if self.loop_probe is not None:
            self.loop_probe.stop()
        log.info("broker %d stopped cleanly", self.config.broker_id)
