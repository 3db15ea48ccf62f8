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
operator's problem to see, not something to guess around. The values themselves live in
localcluster/metadata_types.py (re-exported here), which the cores share without coord/.
"""

from __future__ import annotations

import json

from localcluster.metadata_types import BrokerRegistration, EndPoint, LeaderAndIsr, TopicAssignment

__all__ = [
    "BrokerRegistration", "EndPoint", "LeaderAndIsr", "TopicAssignment", "ZnodeDataError",
    "decode_broker_registration", "decode_leader_and_isr", "decode_topic_assignment",
    "decode_topic_config", "encode_broker_registration", "encode_leader_and_isr",
    "encode_topic_assignment", "encode_topic_config",
]  # fmt: skip


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


def encode_broker_registration(registration: BrokerRegistration) -> bytes:
    r = registration
    plaintext = next((e for e in r.endpoints if e.security_protocol == "PLAINTEXT"), None)
    return _dump({
        "version": 5,
        # Kafka fills host/port from the PLAINTEXT endpoint, null/-1 without one.
        "host": plaintext.host if plaintext else None,
        "port": plaintext.port if plaintext else -1,
        "endpoints": [str(e) for e in r.endpoints],
        "listener_security_protocol_map": {e.listener_name: e.security_protocol for e in r.endpoints},
        "jmx_port": -1, "rack": r.rack, "timestamp": str(r.timestamp_ms),
        "unix_socket": r.unix_socket, "pid": r.pid, "host_id": r.host_id,
    })  # fmt: skip


def decode_broker_registration(broker_id: int, path: str, data: bytes) -> BrokerRegistration:
    value = _load(path, data)
    try:
        protocols = value.get("listener_security_protocol_map") or {}
        endpoints = tuple(_endpoint(text, protocols) for text in value["endpoints"])
        return BrokerRegistration(broker_id, endpoints, value.get("unix_socket", ""),
                                  value.get("rack"), value.get("pid"),
                                  int(value.get("timestamp", 0)), str(value.get("host_id", "")))  # fmt: skip
    except (KeyError, ValueError, TypeError) as e:
        raise ZnodeDataError(f"broker registration {path} lacks or garbles {e}") from None


def _endpoint(text: str, protocols: dict) -> EndPoint:
    name, sep, rest = str(text).partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep or not colon:
        raise ValueError(f"endpoint {text!r}")
    name = name.upper()
    return EndPoint(name, host.strip("[]"), int(port), str(protocols.get(name, name)))


def encode_topic_assignment(assignment: TopicAssignment) -> bytes:
    def table(d):
        return {str(p): list(r) for p, r in sorted(d.items())}

    return _dump({"version": 2, "partitions": table(assignment.partitions),
                  "adding_replicas": table(assignment.adding_replicas),
                  "removing_replicas": table(assignment.removing_replicas)})  # fmt: skip


def decode_topic_assignment(path: str, data: bytes) -> TopicAssignment:
    value = _load(path, data)

    def table(key):
        try:
            return {int(p): _broker_ids(r) for p, r in value.get(key, {}).items()}
        except (ValueError, TypeError, AttributeError):
            raise ZnodeDataError(f"topic znode {path}: {key} is malformed") from None

    if "partitions" not in value:
        raise ZnodeDataError(f"topic znode {path} has no partitions")
    return TopicAssignment(
        table("partitions"), table("adding_replicas"), table("removing_replicas")
    )


def encode_leader_and_isr(state: LeaderAndIsr) -> bytes:
    return _dump({"version": 1, "leader": state.leader, "leader_epoch": state.leader_epoch,
                  "isr": list(state.isr), "controller_epoch": state.controller_epoch})  # fmt: skip


def decode_leader_and_isr(path: str, data: bytes) -> LeaderAndIsr:
    value = _load(path, data)
    try:
        return LeaderAndIsr(int(value["leader"]), int(value["leader_epoch"]),
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
