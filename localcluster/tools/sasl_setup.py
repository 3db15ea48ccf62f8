"""`localcluster up --listener-protocol SASL_PLAINTEXT`: credentials for a whole cluster.

Writes, in the cluster dir, what an operator writes by hand for Kafka:
- `kafka_server_jaas.conf` (mode 0600): the KafkaServer section with the brokers' own login
  (user `broker`, in `super.users`) and PLAIN's users (`broker`, `client`);
- `client.properties` (mode 0600): the settings a client uses (security.protocol,
  sasl.mechanism, sasl.username, sasl.password), as Kafka's tools take `--command-config`;
- SCRAM-SHA-256 credentials for both users in the store at /config/users/<name>, as
  `kafka-configs.sh --alter --add-config 'SCRAM-SHA-256=[password=...]'` writes them.
Passwords are random per cluster. The cluster's own commands (produce, consume, status) use
the Unix sockets, which need no password.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from localcluster.protocol.sasl import PLAIN, SCRAM_SHA_256
from localcluster.protocol.scram import encode_scram_credential, scram_credential
from localcluster.storage.checkpoint import write_atomically

BROKER_USER = "broker"
CLIENT_USER = "client"
JAAS_FILE = "kafka_server_jaas.conf"
CLIENT_PROPERTIES = "client.properties"
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


def broker_sasl_settings(cluster_dir: Path) -> dict[str, str]:
    return {"java.security.auth.login.config": str(Path(cluster_dir) / JAAS_FILE),
            "super.users": f"User:{BROKER_USER}"}  # fmt: skip


def set_scram_user(zk, user: str, password: str) -> None:
    credential = scram_credential(password, os.urandom(24), mechanism=SCRAM_SHA_256)
    config = dict(zk.user_config(user))
    config[SCRAM_SHA_256] = encode_scram_credential(credential)
    zk.set_user_config(user, config)


def setup_sasl(cluster_dir: Path, zk) -> dict[str, str]:
    """Write the JAAS file, client.properties and the SCRAM users; return the client settings."""
    broker_password, client_password = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
    write_atomically(Path(cluster_dir) / JAAS_FILE, (
        "KafkaServer {\n"
        f'  {PLAIN_MODULE} required\n'
        f'    username="{BROKER_USER}" password="{broker_password}"\n'
        f'    user_{BROKER_USER}="{broker_password}"\n'
        f'    user_{CLIENT_USER}="{client_password}";\n'
        f'  {SCRAM_MODULE} required\n'
        f'    username="{BROKER_USER}" password="{broker_password}";\n'
        "};\n"), mode=0o600)  # fmt: skip
    for user, password in ((BROKER_USER, broker_password), (CLIENT_USER, client_password)):
        set_scram_user(zk, user, password)
    settings = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": PLAIN,
                "sasl.username": CLIENT_USER, "sasl.password": client_password}  # fmt: skip
    write_atomically(client_properties_path(cluster_dir),
                     "".join(f"{k}={v}\n" for k, v in settings.items()), mode=0o600)  # fmt: skip
    return settings


def client_properties_path(cluster_dir: Path) -> Path:
    return Path(cluster_dir) / CLIENT_PROPERTIES


def client_settings(spec) -> dict[str, str]:
    """The settings `up` wrote to client.properties ({} when the cluster has no SASL)."""
    if not spec.client_properties:
        return {}
    path = Path(spec.client_properties)
    if not path.exists():
        return {}
    from localcluster.broker.config import read_properties_file

    return read_properties_file(path)
