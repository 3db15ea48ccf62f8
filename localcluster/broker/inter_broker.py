"""How one broker reaches another: the Unix socket on the same host, else TCP with SASL.

A registration carries the broker's host id (the kernel's boot id and the network namespace
it runs in) beside its Unix socket path: a broker with the same host id can open the socket,
which is the fast path and needs no password (its file mode is the credential). Any other
broker is reached on its `inter.broker.listener.name` endpoint, authenticating with the
mechanism `sasl.mechanism.inter.broker.protocol` and the broker's own login from its JAAS
file. With no inter-broker listener configured, a broker on another host is unreachable and
the error says which setting is missing. Each new route is logged once per broker, so an
operator can see which way replication runs ("broker 2 over tcp BROKER://10.0.0.2:9093").
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from localcluster.client.connection import (
    PLAINTEXT_SECURITY,
    Address,
    BrokerConnection,
    ClientSecurity,
    KafkaConnectionError,
)
from localcluster.coord.znode_data import BrokerRegistration

log = logging.getLogger(__name__)


class UnreachableBrokerError(KafkaConnectionError):
    pass


def host_id() -> str:
    """Equal for two processes exactly when they share a kernel and a network namespace
    (containers and network namespaces on one machine count as separate hosts)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = os.uname().nodename
    try:
        namespace = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        namespace = 0
    return f"{boot}/{namespace}"


class InterBrokerConnector:
    def __init__(self, broker_id: int, own_host_id: str, listener_name: str | None,
                 unix_socket_enabled: bool, security: ClientSecurity,
                 lookup: Callable[[int], BrokerRegistration | None]):  # fmt: skip
        self.broker_id = broker_id
        self.own_host_id = own_host_id
        self.listener_name = listener_name
        self.unix_socket_enabled = unix_socket_enabled
        self.security = security
        self.lookup = lookup  # blocking read of /brokers/ids/<id>
        self._logged: dict[int, str] = {}

    def route(self, registration: BrokerRegistration) -> tuple[Address, ClientSecurity, str]:
        """(address, security, description) to reach a registered broker."""
        same_host = registration.host_id == self.own_host_id and registration.unix_socket
        if same_host and (self.unix_socket_enabled or self.listener_name is None):
            return (Address(unix_socket=registration.unix_socket), PLAINTEXT_SECURITY,
                    f"unix socket {registration.unix_socket}")  # fmt: skip
        if self.listener_name is None:
            raise UnreachableBrokerError(
                f"broker {registration.broker_id} runs on another host (or network namespace) "
                "and this broker has no inter.broker.listener.name: set it to a SASL_PLAINTEXT "
                "listener on every broker")  # fmt: skip
        endpoint = registration.endpoint(self.listener_name)
        if endpoint is None:
            raise UnreachableBrokerError(
                f"broker {registration.broker_id} advertises no {self.listener_name} listener "
                f"(it has {', '.join(str(e) for e in registration.endpoints) or 'none'}); every "
                "broker needs the same inter.broker.listener.name")  # fmt: skip
        security = self.security if endpoint.security_protocol == "SASL_PLAINTEXT" else (
            PLAINTEXT_SECURITY)  # fmt: skip
        how = (
            f"SASL {security.mechanism} as {security.username}" if security.uses_sasl else "no SASL"
        )
        return Address(endpoint.host, endpoint.port), security, f"tcp {endpoint} ({how})"

    async def open(self, broker_id: int, client_id: str, max_in_flight: int = 1,
                   registration: BrokerRegistration | None = None) -> BrokerConnection:  # fmt: skip
        if registration is None:
            registration = await asyncio.to_thread(self.lookup, broker_id)
        if registration is None:
            raise UnreachableBrokerError(f"broker {broker_id} is not registered")
        address, security, description = self.route(registration)
        if broker_id != self.broker_id and self._logged.get(broker_id) != description:
            self._logged[broker_id] = description
            log.info("broker %d reaches broker %d over %s", self.broker_id, broker_id, description)
        try:
            return await BrokerConnection.open(address, client_id=client_id,
                                               max_in_flight=max_in_flight, security=security)  # fmt: skip
        except KafkaConnectionError:
            raise
        except Exception as e:
            # An authentication refusal: say which broker refused whom, once per attempt.
            log.warning("broker %d cannot reach broker %d over %s: %s", self.broker_id, broker_id,
                        description, e)  # fmt: skip
            raise
