"""The JSON stored in Kafka's znodes, encoded and decoded in one place.

Layouts follow Kafka's ZK-era formats so a reader of Kafka's docs recognises them:
    /brokers/ids/<id>          {"version":5,"host","port","endpoints":["NAME://host:port"],
                                "listener_security_protocol_map","rack",...}
                               plus ours: "unix_socket" (the one-host inter-broker path),
                               "host_id", "pid"
    /brokers/topics/<t>        {"version":2,"partitions":{"0":[1,2]},"adding_replicas":{},
                                "removing_replicas":{}}
    .../partitions/<p>/state   {"version":1,"leader","leader_epoch","isr","controller_epoch"}
A znode that does not parse raises ZnodeDataError naming the path: a corrupt store is an
operator's problem to see, not something to guess around.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


class ZnodeDataError(ValueError):
    pass


def _load(path: str, data: bytes) -> dict:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ZnodeDataError(f"znode {path} does not hold JSON: {e}") from None
    if not isinstance(value, dict):
        raise ZnodeDataError(f"znode {path} holds {type(value).__name__}, expected an object")
    return value


def _broker_ids(value) -> tuple[int, ...]:
    # A JSON list only: iterating a string would turn "12" into brokers 1 and 2.
    if not isinstance(value, list):
        raise TypeError(f"expected a list of broker ids, got {value!r}")
    return tuple(int(b) for b in value)


def _dump(value: dict) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True, slots=True)
class EndPoint:
    """One advertised listener: Kafka's EndPoint (listener name, host, port, protocol)."""

    listener_name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.listener_name}://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """/brokers/ids/<id>. `endpoints` are the advertised listeners in their configured order;
    `unix_socket` and `host_id` (boot id and network namespace) are ours: a broker with the same
    host id can reach the socket, any other goes over the inter-broker listener."""

    broker_id: int
    endpoints: tuple[EndPoint, ...]
    unix_socket: str = ""
    rack: str | None = None
    pid: int | None = None
    timestamp_ms: int = 0
    host_id: str = ""

    @property
    def client_endpoint(self) -> EndPoint | None:
        """The first advertised endpoint: what a Unix-socket client is told (it has no
        listener of its own to be answered for)."""
        return self.endpoints[0] if self.endpoints else None

    @property
    def host(self) -> str:
        return self.endpoints[0].host if self.endpoints else ""

    @property
    def port(self) -> int:
        return self.endpoints[0].port if self.endpoints else -1

    def endpoint(self, listener_name: str) -> EndPoint | None:
        return next((e for e in self.endpoints if e.listener_name == listener_name), None)

    def encode(self) -> bytes:
        plaintext = next((e for e in self.endpoints if e.security_protocol == "PLAINTEXT"), None)
        return _dump({
            "version": 5,
            # Kafka fills host/port from the PLAINTEXT endpoint, null/-1 without one.
            "host": plaintext.host if plaintext else None,
            "port": plaintext.port if plaintext else -1,
            "endpoints": [str(e) for e in self.endpoints],
            "listener_security_protocol_map": {
                e.listener_name: e.security_protocol for e in self.endpoints},
            "jmx_port": -1, "rack": self.rack, "timestamp": str(self.timestamp_ms),
            "unix_socket": self.unix_socket, "pid": self.pid, "host_id": self.host_id,
        })  # fmt: skip

    @classmethod
    def decode(cls, broker_id: int, path: str, data: bytes) -> BrokerRegistration:
        value = _load(path, data)
        try:
            protocols = value.get("listener_security_protocol_map") or {}
            endpoints = tuple(_endpoint(text, protocols) for text in value["endpoints"])
            return cls(broker_id, endpoints, value.get("unix_socket", ""), value.get("rack"),
                       value.get("pid"), int(value.get("timestamp", 0)),
                       str(value.get("host_id", "")))  # fmt: skip
        except (KeyError, ValueError, TypeError) as e:
            raise ZnodeDataError(f"broker registration {path} lacks or garbles {e}") from None


def _endpoint(text: str, protocols: dict) -> EndPoint:
    name, sep, rest = str(text).partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep or not colon:
        raise ValueError(f"endpoint {text!r}")
    name = name.upper()
    return EndPoint(name, host.strip("[]"), int(port), str(protocols.get(name, name)))


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    partitions: dict[int, tuple[int, ...]]
    adding_replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)
    removing_replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def encode(self) -> bytes:
        def table(d):
            return {str(p): list(r) for p, r in sorted(d.items())}

        return _dump({"version": 2, "partitions": table(self.partitions),
                      "adding_replicas": table(self.adding_replicas),
                      "removing_replicas": table(self.removing_replicas)})  # fmt: skip

    @classmethod
    def decode(cls, path: str, data: bytes) -> TopicAssignment:
        value = _load(path, data)

        def table(key):
            try:
                return {int(p): _broker_ids(r) for p, r in value.get(key, {}).items()}
            except (ValueError, TypeError, AttributeError):
                raise ZnodeDataError(f"topic znode {path}: {key} is malformed") from None

        if "partitions" not in value:
            raise ZnodeDataError(f"topic znode {path} has no partitions")
        return cls(table("partitions"), table("adding_replicas"), table("removing_replicas"))


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    """The partition state znode: who leads, in which epoch, with which ISR."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def encode(self) -> bytes:
        return _dump({"version": 1, "leader": self.leader, "leader_epoch": self.leader_epoch,
                      "isr": list(self.isr), "controller_epoch": self.controller_epoch})  # fmt: skip

    @classmethod
    def decode(cls, path: str, data: bytes) -> LeaderAndIsr:
        value = _load(path, data)
        try:
            return cls(int(value["leader"]), int(value["leader_epoch"]),
                       _broker_ids(value["isr"]), int(value["controller_epoch"]))  # fmt: skip
        except (KeyError, ValueError, TypeError) as e:
            raise ZnodeDataError(f"partition state {path} lacks or garbles {e}") from None


def encode_topic_config(config: dict[str, str]) -> bytes:
    return _dump({"version": 1, "config": dict(config)})


def decode_topic_config(path: str, data: bytes) -> dict[str, str]:
    config = _load(path, data).get("config", {})
    if not isinstance(config, dict):
        raise ZnodeDataError(
            f"topic config {path}: config is {type(config).__name__}, expected an object"
        )
    return {str(k): str(v) for k, v in config.items()}
