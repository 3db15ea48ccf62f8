"""Kafka's listener settings, parsed and checked once: who listens where, speaking what.

    listeners=CLIENT://127.0.0.1:9092,BROKER://10.0.0.1:9093
    advertised.listeners=CLIENT://kafka-1.example:9092,BROKER://10.0.0.1:9093
    listener.security.protocol.map=CLIENT:PLAINTEXT,BROKER:SASL_PLAINTEXT
    inter.broker.listener.name=BROKER

A listener's name is its identity (Kafka's ListenerName); its security protocol comes from the map,
where a listener named after a protocol (PLAINTEXT://, SASL_PLAINTEXT://) needs no entry. Only
PLAINTEXT and SASL_PLAINTEXT exist here: SSL and SASL_SSL are refused with a message rather than
served in the clear. Besides these TCP listeners every broker has its Unix socket (the fast
inter-broker path on one host); it is not configured here because its file mode is its credential.

Rules checked (each a ConfigError naming the property): names unique and upper case, ports in
0..65535, every advertised name also listens, an advertised host is not 0.0.0.0, the inter-broker
listener exists, is advertised and authenticates (SASL_PLAINTEXT: over TCP only an authenticated
broker may send broker requests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from localcluster.metadata_types import EndPoint


class ListenerConfigError(ValueError):
    pass


PLAINTEXT = "PLAINTEXT"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SUPPORTED_PROTOCOLS = (PLAINTEXT, SASL_PLAINTEXT)
UNSUPPORTED_PROTOCOLS = ("SSL", "SASL_SSL")
# Kafka's default map, less the TLS protocols this project does not speak.
DEFAULT_PROTOCOL_MAP = "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"

_LISTENER = re.compile(r"^([A-Za-z0-9_]+)://(\[[^\]]*\]|[^:/]*):(\d+)$")


def parse_protocol_map(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in _items(text):
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or not protocol:
            raise ListenerConfigError(
                f"listener.security.protocol.map entry {item!r}: expected NAME:PROTOCOL, "
                "e.g. BROKER:SASL_PLAINTEXT")  # fmt: skip
        _check_protocol(f"listener.security.protocol.map entry {item!r}", protocol)
        if name in out:
            raise ListenerConfigError(f"listener.security.protocol.map names {name} twice")
        out[name] = protocol
    return out


def parse_listeners(text: str, protocol_map: dict[str, str], prop: str = "listeners"
                    ) -> tuple[EndPoint, ...]:  # fmt: skip
    endpoints: list[EndPoint] = []
    for item in _items(text):
        match = _LISTENER.match(item)
        if not match:
            raise ListenerConfigError(
                f"{prop} entry {item!r}: expected NAME://host:port, e.g. PLAINTEXT://127.0.0.1:9092")  # fmt: skip
        name, host, port = match.group(1).upper(), match.group(2).strip("[]"), int(match.group(3))
        if port > 65535:
            raise ListenerConfigError(f"{prop} entry {item!r}: port {port} is above 65535")
        protocol = protocol_map.get(name)
        if protocol is None:
            if name in UNSUPPORTED_PROTOCOLS or name in SUPPORTED_PROTOCOLS:
                protocol = name
            else:
                raise ListenerConfigError(
                    f"{prop}: listener {name} has no security protocol; add {name}:PLAINTEXT or "
                    f"{name}:SASL_PLAINTEXT to listener.security.protocol.map")  # fmt: skip
        _check_protocol(f"{prop}: listener {name}", protocol)
        if any(e.listener_name == name for e in endpoints):
            raise ListenerConfigError(f"{prop} names listener {name} twice")
        endpoints.append(EndPoint(name, host, port, protocol))
    if not endpoints:
        raise ListenerConfigError(f"{prop} is empty; e.g. PLAINTEXT://127.0.0.1:9092")
    return tuple(endpoints)


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """What the broker binds (`listeners`), what it tells others (`advertised`), and which
    listener brokers use to reach it (`inter_broker`, None: the Unix socket only)."""

    listeners: tuple[EndPoint, ...]
    advertised_template: tuple[EndPoint, ...]  # port 0 means "the port that was bound"
    inter_broker: str | None

    def advertised(self, bound_ports: dict[str, int]) -> tuple[EndPoint, ...]:
        """Advertised endpoints with port 0 replaced by the listener's bound port, and an
        unspecified host (listening on all addresses) left for the caller to fill."""
        return tuple(
            EndPoint(e.listener_name, e.host, e.port or bound_ports[e.listener_name],
                     e.security_protocol)
            for e in self.advertised_template)  # fmt: skip

    def listener(self, name: str) -> EndPoint:
        return next(e for e in self.listeners if e.listener_name == name)


def listener_settings(listeners: str, advertised: str | None, protocol_map_text: str,
                      inter_broker: str | None) -> ListenerSettings:  # fmt: skip
    protocol_map = parse_protocol_map(protocol_map_text)
    bound = parse_listeners(listeners, protocol_map)
    if advertised:
        announced = parse_listeners(advertised, protocol_map, "advertised.listeners")
        for e in announced:
            if not any(b.listener_name == e.listener_name for b in bound):
                raise ListenerConfigError(
                    f"advertised.listeners names {e.listener_name}, which is not in listeners"
                )
    else:
        announced = bound
    for e in announced:
        if e.host in ("0.0.0.0", "::"):
            raise ListenerConfigError(
                f"{'advertised.listeners' if advertised else 'listeners'}: listener "
                f"{e.listener_name} would be advertised as {e.host}, which no client can connect "
                "to; set advertised.listeners to an address clients reach")  # fmt: skip
    name = inter_broker.strip().upper() if inter_broker else None
    if name is not None:
        endpoint = next((e for e in announced if e.listener_name == name), None)
        if endpoint is None:
            raise ListenerConfigError(
                f"inter.broker.listener.name={name} is not an advertised listener "
                f"({', '.join(e.listener_name for e in announced)})")  # fmt: skip
        if endpoint.security_protocol != SASL_PLAINTEXT:
            raise ListenerConfigError(
                f"inter.broker.listener.name={name} uses {endpoint.security_protocol}; brokers "
                "authenticate each other over TCP, so map it to SASL_PLAINTEXT")  # fmt: skip
    return ListenerSettings(bound, announced, name)


def _check_protocol(where: str, protocol: str) -> None:
    if protocol in UNSUPPORTED_PROTOCOLS:
        raise ListenerConfigError(
            f"{where}: {protocol} (TLS) is not supported here; use PLAINTEXT or SASL_PLAINTEXT"
        )
    if protocol not in SUPPORTED_PROTOCOLS:
        raise ListenerConfigError(
            f"{where}: unknown security protocol {protocol}; use PLAINTEXT or SASL_PLAINTEXT"
        )


def _items(text: str) -> list[str]:
    return [s.strip() for s in (text or "").split(",") if s.strip()]
