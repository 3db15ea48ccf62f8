"""Topic config changes applied live, as ZooKeeper-mode Kafka's ConfigChangeListener does.

AlterConfigs and IncrementalAlterConfigs write a topic's overrides together with a sequential
notification under /config/changes naming the topic (coord/kafka_zk.py). Every broker watches
that list; for each notification it has not seen it re-reads the topic's config from the store
and hands the resolved TopicConfig to the replica host, whose logs and core take it at once.
Notifications present at start are not replayed: the configs they announced are read with the
LeaderAndIsr that starts hosting each partition. A lost watch is covered by re-reading the
list every RECHECK_S.

On the controller's broker a change that leaves a topic's unclean.leader.election.enable true
is also handed to the controller (`on_unclean_enabled`), which elects for the topic's offline
partitions at once, as Kafka's TopicConfigHandler does; other changes reach the controller when
it next reads the topic.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

RECHECK_S = 30.0
TOPIC_ENTITY = "topics/"


async def follow_config_changes(metadata, replica_host, on_unclean_enabled=None) -> None:
    """Run until cancelled. `on_unclean_enabled(topic)`: called on the event loop for each
    changed topic whose unclean.leader.election.enable is now true (None: not wanted)."""
    loop = asyncio.get_running_loop()
    seen: set[str] | None = None
    while True:
        fired = asyncio.Event()
        try:
            names = await asyncio.to_thread(
                metadata.zk.config_changes,
                lambda _event, fired=fired: loop.call_soon_threadsafe(fired.set),
            )
            new = [] if seen is None else [n for n in names if n not in seen]
            seen = set(names)
            topics = set()
            for name in new:
                entity = await asyncio.to_thread(metadata.zk.config_change_entity, name)
                if entity and entity.startswith(TOPIC_ENTITY):
                    topics.add(entity[len(TOPIC_ENTITY) :])
            hosted = {tp[0] for tp in replica_host.partitions}
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
