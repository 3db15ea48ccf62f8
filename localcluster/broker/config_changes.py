"""Topic and broker config changes applied live, as ZooKeeper-mode Kafka's ConfigChangeListener does.

AlterConfigs and IncrementalAlterConfigs write a topic's overrides, or a dynamic broker layer
(/config/brokers/<id>, /config/brokers/<default>: broker/dynamic_config.py), together with a
sequential notification under /config/changes naming the entity (coord/kafka_zk.py). Every
broker watches that list; for each notification it has not seen it re-reads what changed:
- a topic: its config from the store, resolved over this broker's effective properties, goes
  to the replica host, whose logs and core take it at once;
- this broker's layer or the default one: both layers are read again, the effective broker
  config replaces the one topics fall back to (metadata.defaults, the replica host's
  broker_topic_defaults), and every hosted topic is resolved and applied again, so a topic
  without an override of its own takes the new value live. Another broker's layer is not ours.
Notifications present at start are not replayed: `load_broker_configs` reads both layers
before the broker registers, and topic configs come with the LeaderAndIsr that starts hosting
each partition. A lost watch is covered by re-reading the list every RECHECK_S.

On the controller's broker a change that leaves a topic's unclean.leader.election.enable true
is also handed to the controller (`on_unclean_enabled`), which elects for the topic's offline
partitions at once, as Kafka's TopicConfigHandler does; a broker-level change of it first goes
to `on_broker_config` (the controller's default, as Kafka's DynamicLogConfig reconfigures it).
"""

from __future__ import annotations

import asyncio
import logging

from localcluster.broker import dynamic_config
from localcluster.topic_config import resolve_broker_defaults

log = logging.getLogger(__name__)

RECHECK_S = 30.0
TOPIC_ENTITY = "topics/"
BROKER_ENTITY = "brokers/"


async def load_broker_configs(metadata, replica_host) -> bool:
    """Read this broker's dynamic layers and make their effective config the one topics fall
    back to; True when it changed (`metadata.static`: the broker's own properties)."""
    static = metadata.static
    zk, own = metadata.zk, dynamic_config.entity(static.broker_id)
    default_layer, own_layer = await asyncio.to_thread(
        lambda: (zk.broker_config(dynamic_config.DEFAULT_ENTITY), zk.broker_config(own)))  # fmt: skip
    current = dynamic_config.effective(static, default_layer, own_layer)
    if current == metadata.defaults:
        return False
    metadata.defaults = current
    replica_host.broker_topic_defaults = resolve_broker_defaults(current)
    log.info("dynamic broker configs: %s (default) and %s (broker %d)",
             default_layer or "none", own_layer or "none", static.broker_id)  # fmt: skip
    return True


async def follow_config_changes(metadata, replica_host, on_unclean_enabled=None,
                                on_broker_config=None) -> None:  # fmt: skip
    """Run until cancelled. `on_unclean_enabled(topic)`: called on the event loop for each
    changed topic whose unclean.leader.election.enable is now true; `on_broker_config(config)`
    with this broker's new effective BrokerConfig (None: not wanted)."""
    loop = asyncio.get_running_loop()
    seen: set[str] | None = None
    ours = {
        BROKER_ENTITY + dynamic_config.DEFAULT_ENTITY,
        BROKER_ENTITY + dynamic_config.entity(metadata.defaults.broker_id),
    }
    while True:
        fired = asyncio.Event()
        try:
            names = await asyncio.to_thread(
                metadata.zk.config_changes,
                lambda _event, fired=fired: loop.call_soon_threadsafe(fired.set),
            )
            new = [] if seen is None else [n for n in names if n not in seen]
            seen = set(names)
            topics, broker_changed = set(), False
            for name in new:
                entity = await asyncio.to_thread(metadata.zk.config_change_entity, name)
                if entity and entity.startswith(TOPIC_ENTITY):
                    topics.add(entity[len(TOPIC_ENTITY) :])
                broker_changed |= entity in ours
            hosted = {tp[0] for tp in replica_host.partitions}
            if broker_changed and await load_broker_configs(metadata, replica_host):
                topics |= hosted  # those without an override take the new value
                if on_broker_config is not None:
                    on_broker_config(metadata.defaults)
            for topic, config in (await metadata.topic_configs(topics)).items():
                if topic in hosted:
                    replica_host.apply_topic_config(topic, config)
                    log.info("topic %s: config changed; now %s", topic, config)
                if on_unclean_enabled is not None and config.unclean_leader_election_enable:
                    on_unclean_enabled(topic)
        except Exception as e:  # the store is unreachable for a moment: try again
            log.warning("reading config changes: %s; retrying", e)
        try:
            await asyncio.wait_for(fired.wait(), RECHECK_S)
        except TimeoutError:
            pass
