"""Who may send broker requests: Kafka's CLUSTER_ACTION right, held by brokers only.

Kafka guards the requests only brokers and the controller send (LeaderAndIsr, StopReplica,
UpdateMetadata, ControlledShutdown, and Fetch and OffsetForLeaderEpoch with a replica id) with
the ClusterAction operation on the cluster resource. Here that right has two holders:
- a connection on the Unix socket: the socket file is owner-only, so the kernel has already
  checked that the peer runs as the broker's user (one host: the cluster's own processes);
- a SASL-authenticated principal listed in `super.users` (other hosts: the brokers' credential).
A PLAINTEXT TCP connection (User:ANONYMOUS) never has it, whatever it claims. A refused request
changes nothing and is answered as Kafka answers it: CLUSTER_AUTHORIZATION_FAILED, and
TOPIC_AUTHORIZATION_FAILED per partition for a follower Fetch.
"""

from __future__ import annotations

import logging
import time

from localcluster.broker.network import ConnectionContext
from localcluster.protocol.api import ApiKey

log = logging.getLogger(__name__)

CLUSTER_AUTHORIZATION_FAILED = 31
TOPIC_AUTHORIZATION_FAILED = 29

# Requests that only a broker or the controller sends, whatever their body says.
BROKER_ONLY_APIS = frozenset({ApiKey.LEADER_AND_ISR, ApiKey.STOP_REPLICA,
                              ApiKey.UPDATE_METADATA, ApiKey.CONTROLLED_SHUTDOWN})  # fmt: skip
# One line per principal, peer host and API per interval: a flood stays readable.
REFUSAL_LOG_INTERVAL_S = 10.0


class Authorizer:
    def __init__(self, super_users: frozenset[str]):
        self.super_users = super_users
        self._last_logged: dict[tuple[str, str, int], float] = {}

    def may_cluster_action(self, context: ConnectionContext) -> bool:
        if context.listener.is_unix:
            return True
        return context.authenticated and context.principal in self.super_users

    def refused(self, context: ConnectionContext, api_key: int, what: str = "") -> None:
        """Log a refusal (rate-limited per peer and API) naming who tried what."""
        key = (context.principal, context.peer.rsplit(":", 1)[0], int(api_key))
        now = time.monotonic()
        if now - self._last_logged.get(key, -REFUSAL_LOG_INTERVAL_S) < REFUSAL_LOG_INTERVAL_S:
            return
        if len(self._last_logged) > 10_000:
            self._last_logged.clear()
        self._last_logged[key] = now
        log.warning("refused %s%s from %s: only brokers may send it (the Unix socket, or a SASL "
                    "principal in super.users); answered CLUSTER_AUTHORIZATION_FAILED, nothing "
                    "changed", ApiKey(api_key).name, f" ({what})" if what else "",
                    context.describe())  # fmt: skip
