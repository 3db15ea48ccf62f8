"""Dynamic broker configs: which broker properties change live, and how their layers resolve.

ZooKeeper-mode Kafka keeps two layers of broker properties in the store above the ones a
broker starts with: `/config/brokers/<default>` (cluster-wide) and `/config/brokers/<id>` (one
broker). A property's value comes from the first layer that has it, in Kafka's order and with
its DescribeConfigs source numbers: DYNAMIC_BROKER_CONFIG (2, per broker) >
DYNAMIC_DEFAULT_BROKER_CONFIG (3, cluster-wide) > STATIC_BROKER_CONFIG (4, the broker's
properties) > DEFAULT_CONFIG (5, BrokerConfig's default). For a topic, its own override
(DYNAMIC_TOPIC_CONFIG, 1) comes before them all.

Dynamic here: the log defaults that topics inherit (every broker property that a topic config
falls back to, topic_config.SPECS), which each broker applies live to the topics without an
override of their own. They are Kafka's cluster-wide dynamic log configs (DynamicLogConfig).
Anything else is read once at start (listeners, log.dirs, broker.id, ...): a change is refused
with INVALID_REQUEST and Kafka's words, "Cannot update these configs dynamically". Values are
checked with the topic config's parser of the same setting (the same ranges; a bad one is
INVALID_CONFIG naming the broker property). Pure: no store, no clock.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from localcluster import topic_config
from localcluster.broker.config import BrokerConfig, ConfigError, parse_property

log = logging.getLogger(__name__)

INVALID_REQUEST = 42
DEFAULT_ENTITY = "<default>"  # Kafka's ZooKeeper name for the cluster-wide default
# DescribeConfigs' config_source values (Kafka's DescribeConfigsResponse.ConfigSource)
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 1, 2, 3
STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 4, 5

# broker property -> the topic config spec whose fallback it is
DYNAMIC: dict[str, topic_config._Spec] = {
    spec.broker_property: spec for spec in topic_config.SPECS.values()
}
_FIELDS = {f.metadata["property"]: f for f in dataclasses.fields(BrokerConfig)}
_DEFAULTS = BrokerConfig()


class DynamicConfigError(ValueError):
    def __init__(self, error_code: int, message: str):
        super().__init__(message)
        self.error_code = error_code


def entity(broker_id: int | None) -> str:
    """The store's entity name: "<id>", or "<default>" for the cluster-wide layer (None)."""
    return DEFAULT_ENTITY if broker_id is None else str(broker_id)


def validate(properties: Mapping[str, str | None]) -> dict[str, str]:
    """Check a layer's properties; their normalised strings to store. Raises
    DynamicConfigError: unknown names (INVALID_CONFIG), static ones (INVALID_REQUEST, as
    Kafka), a missing or bad value (INVALID_CONFIG naming the property)."""
    unknown = sorted(set(properties) - set(_FIELDS))
    if unknown:
        raise DynamicConfigError(topic_config.INVALID_CONFIG,
                                 f"unknown broker property {', '.join(unknown)}")  # fmt: skip
    static = sorted(set(properties) - set(DYNAMIC))
    if static:
        raise DynamicConfigError(INVALID_REQUEST, f"Cannot update these configs dynamically: "
                                 f"{', '.join(static)} (read at start only; dynamic here: "
                                 f"{', '.join(sorted(DYNAMIC))})")  # fmt: skip
    out = {}
    for name, given in properties.items():
        if given is None:
            raise DynamicConfigError(topic_config.INVALID_CONFIG, f"{name}: a value is required")
        try:
            out[name] = topic_config.text(DYNAMIC[name].parse(name, str(given)))
        except topic_config.TopicConfigError as e:
            raise DynamicConfigError(e.error_code, str(e)) from None
    return out


def _typed(name: str, text: str):
    """A stored string as the BrokerConfig field's value (raises ConfigError or TopicConfigError
    when it does not parse)."""
    DYNAMIC[name].parse(name, text)  # the range check
    return parse_property(name, text)


def effective(static: BrokerConfig, cluster_default: Mapping[str, str],
              per_broker: Mapping[str, str]) -> BrokerConfig:  # fmt: skip
    """The broker's config with both dynamic layers over its own properties. A stored value
    that is not dynamic or does not parse (a hand-edited znode) is skipped with a warning."""
    values = {}
    for layer, where in ((cluster_default, DEFAULT_ENTITY), (per_broker, str(static.broker_id))):
        for name, text in layer.items():
            if name not in DYNAMIC:
                log.warning("/config/brokers/%s: ignoring %s (not dynamic)", where, name)
                continue
            try:
                values[_FIELDS[name].name] = _typed(name, str(text))
            except (ConfigError, topic_config.TopicConfigError) as e:
                log.warning("/config/brokers/%s: ignoring %s (%s)", where, name, e)
    return dataclasses.replace(static, **values) if values else static


def text(value) -> str | None:
    return None if value is None else topic_config.text(value)


def synonyms(name: str, static: BrokerConfig, cluster_default: Mapping[str, str],
             per_broker: Mapping[str, str]) -> list[tuple[str, str | None, int]]:  # fmt: skip
    """A broker property's (name, value, source) in precedence order, the first being the
    effective one: the dynamic layers where they hold it (and it is dynamic), the broker's own
    value when it differs from the default, and the default."""
    chain = []
    if name in DYNAMIC:
        for layer, source in ((per_broker, DYNAMIC_BROKER_CONFIG),
                              (cluster_default, DYNAMIC_DEFAULT_BROKER_CONFIG)):  # fmt: skip
            if name in layer and _parses(name, layer[name]):
                chain.append((name, str(layer[name]), source))
    field = _FIELDS[name].name
    own, default = getattr(static, field), getattr(_DEFAULTS, field)
    if own != default:
        chain.append((name, text(own), STATIC_BROKER_CONFIG))
    chain.append((name, text(default), DEFAULT_CONFIG))
    return chain


def topic_synonyms(topic_name: str, overrides: Mapping[str, str], static: BrokerConfig,
                   cluster_default: Mapping[str, str], per_broker: Mapping[str, str]
                   ) -> list[tuple[str, str | None, int]]:  # fmt: skip
    """A topic config's chain: its override, then its broker property's chain (synonyms)."""
    spec = topic_config.SPECS[topic_name]
    chain = synonyms(spec.broker_property, static, cluster_default, per_broker)
    if topic_name in overrides:
        chain.insert(0, (topic_name, overrides[topic_name], DYNAMIC_TOPIC_CONFIG))
    return chain


def _parses(name: str, value) -> bool:
    try:
        _typed(name, str(value))
        return True
    except (ConfigError, topic_config.TopicConfigError):
        return False


def properties() -> list[str]:
    """Every broker property, sorted (DescribeConfigs' order)."""
    return sorted(_FIELDS)


def config_type(name: str) -> int:
    """DescribeConfigs' config_type (Kafka's ConfigDef.Type) of a broker property."""
    if name in DYNAMIC:
        return DYNAMIC[name].kind
    annotation = _FIELDS[name].type
    if annotation == "bool":
        return topic_config.BOOLEAN
    if annotation == "int":
        default = getattr(_DEFAULTS, _FIELDS[name].name)
        return topic_config.LONG if abs(default) > 2**31 - 1 else topic_config.INT
    if annotation == "float":
        return topic_config.DOUBLE
    return topic_config.STRING


def documentation(name: str) -> str | None:
    """DescribeConfigs' documentation of a broker property (the topic config's words for a
    dynamic one; BrokerConfig's note, if any, for the rest)."""
    if name in DYNAMIC:
        return DYNAMIC[name].documentation
    return _FIELDS[name].metadata.get("doc") or None
