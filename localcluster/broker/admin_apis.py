"""Admin APIs beside CreateTopics: DeleteTopics, CreatePartitions, ElectLeaders, DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs and DescribeCluster (DeleteRecords and DescribeLogDirs,
answered from the logs: records_apis.py).

- DeleteTopics (v1-v6) asks the controller as ZooKeeper-mode Kafka does (a znode under
  /admin/delete_topics) and answers when the topic is gone from the store or its timeout
  passes (REQUEST_TIMED_OUT; the deletion goes on). Topic ids do not exist here: a request
  naming only an id gets UNKNOWN_TOPIC_ID. `__consumer_offsets` is refused
  (INVALID_TOPIC_EXCEPTION): its deletion would drop every group's offsets.
- CreatePartitions (v0-v3) extends a topic's assignment (a version-conditional write of its
  znode, which the controller watches: New -> Online as for a new topic) and answers once the
  new partitions have leaders or the timeout passes. Kafka's rules: the count must grow
  (INVALID_PARTITIONS), given assignments must name the new partitions with the topic's
  replication factor of distinct live brokers (INVALID_REPLICA_ASSIGNMENT). `__consumer_offsets`
  is refused: more partitions would move groups to other coordinators (Kafka allows it, and it
  silently orphans their offsets).
- ElectLeaders (v0-v2, PREFERRED and UNCLEAN) checks each partition first, as Kafka does:
  ELECTION_NOT_NEEDED (the preferred replica leads already; for UNCLEAN, a live leader exists),
  PREFERRED_LEADER_NOT_AVAILABLE (the preferred replica is dead or out of the ISR),
  ELIGIBLE_LEADERS_NOT_AVAILABLE (no live replica at all). The rest are handed to the
  controller through /admin/preferred_replica_election (Kafka's znode) or
  /admin/unclean_leader_election (ours, the same format: ZooKeeper-mode Kafka ran ElectLeaders
  inside the controller's process, which any broker reaches here through the store), and each
  is answered when its new leader is in the store, or REQUEST_TIMED_OUT.
- DescribeConfigs (v1-v4) describes a topic (its effective TopicConfig: each value with its
  source, DYNAMIC_TOPIC_CONFIG for an override, else the broker property it falls back to with
  that one's source, and the synonyms in precedence order when asked) or a broker: "<id>" is
  every property of this broker with its source (dynamic_config.py's layers; read_only false
  for the dynamic ones), answered by that broker only (clients send it there); "" is the
  cluster-wide dynamic default layer alone, as Kafka answers it. The layers are read from the
  store at each request, so a describe right after an alter shows it on every broker.
- AlterConfigs (v0-v2) replaces a topic's overrides; IncrementalAlterConfigs (v0-v1) sets,
  deletes, appends to or subtracts from single ones (APPEND/SUBTRACT on cleanup.policy, the one
  list). The result is validated as CreateTopics validates (INVALID_CONFIG naming the
  property, nothing written), then written with a change notification, as ZooKeeper-mode Kafka
  does; every broker applies it live (broker/config_changes.py). validate_only writes nothing.
  A broker resource ("<id>" or "" for the cluster-wide default) changes that dynamic layer
  the same way (/config/brokers/<id> or <default>); only the log defaults topics inherit are
  dynamic (INVALID_REQUEST "Cannot update these configs dynamically" for the others, as
  Kafka; a bad value is INVALID_CONFIG naming the property, where Kafka's ZooKeeper mode says
  INVALID_REQUEST). Any broker takes a broker resource (Kafka wants it sent to that broker):
  all run the same checks, and the store is shared.
- DescribeCluster (v0-v1) answers the live brokers on the request's listener, the controller
  id from the store and the cluster id; authorized operations are Kafka's "not asked"
  (INT32_MIN) unless asked, then every cluster operation (nothing is denied here). Only
  endpoint type 1 (brokers) exists in ZooKeeper mode: another gets UNSUPPORTED_ENDPOINT_TYPE.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from kio.schema.errors import ErrorCode

from localcluster import topic_config
from localcluster.broker import dynamic_config
from localcluster.broker.config import BrokerConfig
from localcluster.broker.metadata import OFFSETS_TOPIC, ClusterMetadata, legal_topic
from localcluster.controller.assignment import (
    InvalidReplicationFactorError,
    assign_replicas_to_brokers,
)
from localcluster.coord.znode_data import ZnodeDataError
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
UNKNOWN_TOPIC_ID = 100
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)  # Kafka's Int32.MinValue: not asked
# Kafka's cluster operations (AclOperation codes): CREATE 4, CLUSTER_ACTION 7, DESCRIBE_CONFIGS 8,
# ALTER_CONFIGS 9, IDEMPOTENT_WRITE 10, ALTER 11 (bit n set for code n), DESCRIBE 12.
CLUSTER_OPERATIONS = sum(1 << code for code in (4, 7, 8, 9, 10, 11, 12))
BROKERS_ENDPOINT = 1
log = logging.getLogger(__name__)


class AdminApis:
    def __init__(self, metadata: ClusterMetadata, config: BrokerConfig):
        self.metadata = metadata
        self.config = config

    def handlers(self) -> dict:
        return {ApiKey.DELETE_TOPICS: self.handle_delete_topics,
                ApiKey.CREATE_PARTITIONS: self.handle_create_partitions,
                ApiKey.ELECT_LEADERS: self.handle_elect_leaders,
                ApiKey.DESCRIBE_CONFIGS: self.handle_describe_configs,
                ApiKey.ALTER_CONFIGS: self.handle_alter_configs,
                ApiKey.INCREMENTAL_ALTER_CONFIGS: self.handle_incremental_alter_configs,
                ApiKey.DESCRIBE_CLUSTER: self.handle_describe_cluster}  # fmt: skip

    async def _assignment(self, name: str):
        """The topic's assignment from the store; None when it does not exist (an illegal name
        is never looked up: it is no znode path)."""
        if not legal_topic(name):
            return None
        return await asyncio.to_thread(self.metadata.zk.assignment, name)

    # -- DescribeCluster ------------------------------------------------------------------------

    async def handle_describe_cluster(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)
        endpoint_type = getattr(request, "endpoint_type", BROKERS_ENDPOINT)
        if endpoint_type != BROKERS_ENDPOINT:
            return messages.write_response(header, {
                "error_code": ErrorCode.unsupported_endpoint_type, "endpoint_type": endpoint_type,
                "error_message": "ZooKeeper mode has no controller endpoints: ask for brokers (1)",
                "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED})  # fmt: skip
        zk = self.metadata.zk
        live, controller, cluster_id = await asyncio.to_thread(
            lambda: (zk.live_brokers(), zk.controller_id(), self.metadata.cluster_id()))  # fmt: skip
        brokers, _ = self.metadata.brokers_on(context.listener, live)
        operations = (CLUSTER_OPERATIONS if request.include_cluster_authorized_operations
                      else AUTHORIZED_OPERATIONS_OMITTED)  # fmt: skip
        return messages.write_response(header, {
            "error_code": 0, "endpoint_type": BROKERS_ENDPOINT, "cluster_id": cluster_id,
            "controller_id": -1 if controller is None else controller,
            "brokers": [{"broker_id": b["node_id"], "host": b["host"], "port": b["port"],
                         "rack": b["rack"]} for b in brokers],
            "cluster_authorized_operations": operations})  # fmt: skip

    # -- DeleteTopics --------------------------------------------------------------------------

    async def handle_delete_topics(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)
        if header.api_version >= 6:
            names = [(t.name, t.topic_id) for t in request.topics]
        else:
            names = [(name, None) for name in request.topic_names]
        deadline = time.monotonic() + max(request.timeout.total_seconds(), 0)
        results = await asyncio.gather(*(self._delete(name, topic_id, deadline)
                                         for name, topic_id in names))  # fmt: skip
        return messages.write_response(header, {"responses": list(results)})

    async def _delete(self, name: str | None, topic_id, deadline: float) -> dict:
        def result(code, message=None):
            return {"name": name, "topic_id": topic_id, "error_code": code,
                    "error_message": message}  # fmt: skip

        if name is None:
            return result(UNKNOWN_TOPIC_ID, "topic ids do not exist here: name the topic")
        if name == OFFSETS_TOPIC:
            return result(ErrorCode.invalid_topic_exception,
                          f"{OFFSETS_TOPIC} is internal: deleting it would drop every "
                          "group's committed offsets")  # fmt: skip
        zk = self.metadata.zk
        if await self._assignment(name) is None:
            return result(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
        await asyncio.to_thread(zk.request_topic_deletion, name)
        while await asyncio.to_thread(zk.assignment, name) is not None:
            if time.monotonic() >= deadline:
                return result(ErrorCode.request_timed_out,
                              "the controller has not finished deleting it; it goes on")  # fmt: skip
            await asyncio.sleep(0.02)
        return result(ErrorCode.none)

    # -- CreatePartitions ---------------------------------------------------------------------

    async def handle_create_partitions(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)
        deadline_ms = time.monotonic() * 1000 + max(request.timeout.total_seconds() * 1000, 0)
        results, grown = [], {}
        for topic in request.topics:
            code, message = await self._add_partitions(topic, request.validate_only)
            results.append({"name": topic.name, "error_code": code, "error_message": message})
            if code == ErrorCode.none and not request.validate_only:
                grown[topic.name] = topic.count
        await self.metadata.wait_for_topics(list(grown), int(deadline_ms), grown)
        return messages.write_response(header, {"results": results})

    async def _add_partitions(self, topic, validate_only: bool) -> tuple[int, str | None]:
        name, zk = topic.name, self.metadata.zk
        if name == OFFSETS_TOPIC:
            return ErrorCode.invalid_request, (f"{OFFSETS_TOPIC} keeps its partition count: groups "
                                               "map onto it, more would move them")  # fmt: skip
        assignment = await self._assignment(name)
        if assignment is None:
            return ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist"
        current = len(assignment.partitions)
        if topic.count <= current:
            return ErrorCode.invalid_partitions, (
                f"topic {name!r} already has {current} partitions" if topic.count == current else
                f"topic {name!r} has {current} partitions, more than the requested {topic.count}")  # fmt: skip
        rf = len(assignment.partitions[0])
        live = await asyncio.to_thread(zk.live_brokers)
        if topic.assignments:
            added = {current + i: tuple(a.broker_ids) for i, a in enumerate(topic.assignments)}
            problem = _check_new_assignment(added, topic.count - current, rf, set(live))
            if problem:
                return ErrorCode.invalid_replica_assignment, problem
        else:
            try:
                table = assign_replicas_to_brokers(sorted(live), topic.count - current, rf,
                                                   start_partition_id=current,
                                                   racks={b: r.rack for b, r in live.items()})  # fmt: skip
            except InvalidReplicationFactorError as e:
                return ErrorCode.invalid_replication_factor, str(e)
            added = {current + i: tuple(r) for i, r in enumerate(table.values())}
        if validate_only:
            return ErrorCode.none, None
        if not await asyncio.to_thread(zk.add_partitions, name, added):
            return ErrorCode.reassignment_in_progress, ("the topic's assignment changed meanwhile; "
                                                        "try again")  # fmt: skip
        return ErrorCode.none, None

    # -- ElectLeaders ---------------------------------------------------------------------------

    async def handle_elect_leaders(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)
        unclean = getattr(request, "election_type", PREFERRED) == UNCLEAN
        deadline = time.monotonic() + max(request.timeout.total_seconds(), 0)
        asked = None if request.topic_partitions is None else [
            (t.topic, p) for t in request.topic_partitions for p in t.partitions]  # fmt: skip
        verdicts = await asyncio.to_thread(self._election_verdicts, asked, unclean)
        chosen = [tp for tp, (code, _) in verdicts.items() if code is None]
        if chosen:
            written = await self._request_election(chosen, unclean, deadline)
            for tp in chosen:
                verdicts[tp] = (ErrorCode.none, None) if written else (
                    ErrorCode.request_timed_out, "another election request is still pending")  # fmt: skip
            if written:
                await self._await_elected(chosen, unclean, deadline, verdicts)
        by_topic: dict[str, list] = {}
        for (topic, partition), (code, message) in sorted(verdicts.items()):
            by_topic.setdefault(topic, []).append(
                {"partition_id": partition, "error_code": code, "error_message": message}
            )
        return messages.write_response(header, {"error_code": 0, "replica_election_results": [
            {"topic": t, "partition_result": rows} for t, rows in by_topic.items()]})  # fmt: skip

    def _election_verdicts(self, asked, unclean: bool) -> dict:
        """Per partition (error code, message), or (None, None) for the ones to elect."""
        zk = self.metadata.zk
        live = set(zk.live_brokers())
        if asked is None:
            asked = [(t, p) for t in zk.topics()
                     for p in getattr(zk.assignment(t), "partitions", {})]  # fmt: skip
        out = {}
        for topic, partition in asked:
            assignment = zk.assignment(topic) if legal_topic(topic) else None
            found = zk.partition_state(topic, partition) if assignment else None
            if found is None or partition not in assignment.partitions:
                out[(topic, partition)] = (ErrorCode.unknown_topic_or_partition,
                                           f"{topic}-{partition} does not exist")  # fmt: skip
                continue
            state, replicas = found[0], assignment.partitions[partition]
            out[(topic, partition)] = (_unclean_verdict if unclean else _preferred_verdict)(
                state, replicas, live
            )
        return out

    async def _request_election(self, chosen, unclean: bool, deadline: float) -> bool:
        from localcluster.coord import NodeExistsError, paths

        path = paths.UNCLEAN_LEADER_ELECTION if unclean else paths.PREFERRED_REPLICA_ELECTION
        body = json.dumps({"version": 1, "partitions": [
            {"topic": t, "partition": p} for t, p in chosen]}).encode()  # fmt: skip
        while True:
            try:
                await asyncio.to_thread(self.metadata.coord.create, path, body, makepath=True)
                return True
            except NodeExistsError:  # an earlier request is being carried out
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(0.02)

    async def _await_elected(self, chosen, unclean: bool, deadline: float, verdicts) -> None:
        zk = self.metadata.zk

        def pending() -> list:
            live = set(zk.live_brokers())
            left = []
            for topic, partition in chosen:
                found = zk.partition_state(topic, partition)
                preferred = zk.assignment(topic).partitions[partition][0]
                leader = found[0].leader if found else -1
                if (leader not in live) if unclean else (leader != preferred):
                    left.append((topic, partition))
            return left

        while (left := await asyncio.to_thread(pending)) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for tp in left:
            verdicts[tp] = (ErrorCode.request_timed_out,
                            "the controller has not elected it yet; it goes on")  # fmt: skip

    # -- DescribeConfigs ----------------------------------------------------------------------

    async def handle_describe_configs(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)
        synonyms = getattr(request, "include_synonyms", False)
        documentation = getattr(request, "include_documentation", False)
        results = []
        for resource in request.resources:
            keys = None if resource.configuration_keys is None else set(resource.configuration_keys)
            if resource.resource_type == TOPIC_RESOURCE:
                result = await self._describe_topic(resource.resource_name, keys, synonyms,
                                                    documentation)  # fmt: skip
            elif resource.resource_type == BROKER_RESOURCE:
                result = await self._describe_broker(resource.resource_name, keys, synonyms,
                                                     documentation)  # fmt: skip
            else:
                result = {"error_code": ErrorCode.invalid_request,
                          "error_message": f"resource type {resource.resource_type} is not "
                          "described here (topics: 2, brokers: 4)", "configs": []}  # fmt: skip
            results.append({"resource_type": resource.resource_type,
                            "resource_name": resource.resource_name, **result})  # fmt: skip
        return messages.write_response(header, {"results": results})

    async def _broker_layers(self) -> tuple[dict, dict]:
        """This broker's dynamic layers from the store: (cluster-wide default, own)."""
        zk, own = self.metadata.zk, dynamic_config.entity(self.config.broker_id)
        return await asyncio.to_thread(
            lambda: (zk.broker_config(dynamic_config.DEFAULT_ENTITY), zk.broker_config(own)))  # fmt: skip

    async def _describe_topic(self, name: str, keys, synonyms: bool, documentation: bool) -> dict:
        zk = self.metadata.zk
        if await self._assignment(name) is None:
            return {"error_code": ErrorCode.unknown_topic_or_partition,
                    "error_message": f"topic {name!r} does not exist", "configs": []}  # fmt: skip
        try:
            overrides = await asyncio.to_thread(zk.topic_config, name)
        except ZnodeDataError as e:
            return {"error_code": ErrorCode.unknown_server_error, "configs": [],
                    "error_message": f"{e}; setting a config on the topic writes it again"}  # fmt: skip
        layers = await self._broker_layers()
        effective = topic_config.resolve(overrides, dynamic_config.effective(self.config, *layers),
                                         name)  # fmt: skip
        configs = []
        for key, spec in sorted(topic_config.SPECS.items()):
            if keys is not None and key not in keys:
                continue
            chain = dynamic_config.topic_synonyms(key, overrides, self.config, *layers)
            configs.append({
                "name": key, "value": topic_config.text(getattr(effective, spec.field)),
                "read_only": False, "config_source": chain[0][2], "is_sensitive": False,
                "synonyms": _synonyms(chain) if synonyms else [], "config_type": spec.kind,
                "documentation": spec.documentation if documentation else None})  # fmt: skip
        return {"error_code": 0, "configs": configs}

    async def _describe_broker(self, name: str, keys, synonyms: bool, documentation: bool
                               ) -> dict:  # fmt: skip
        if name not in ("", str(self.config.broker_id)):
            return {"error_code": ErrorCode.invalid_request,
                    "error_message": f"this is broker {self.config.broker_id}: send broker "
                    f"{name}'s DescribeConfigs to that broker", "configs": []}  # fmt: skip
        cluster_default, own = await self._broker_layers()
        if name == "":  # Kafka: the cluster-wide dynamic layer alone
            return {"error_code": 0, "configs": [
                _entry(key, value, dynamic_config.DYNAMIC_DEFAULT_BROKER_CONFIG,
                       [(key, value, dynamic_config.DYNAMIC_DEFAULT_BROKER_CONFIG)], synonyms,
                       documentation)
                for key, value in sorted(cluster_default.items())
                if keys is None or key in keys]}  # fmt: skip
        configs = []
        for key in dynamic_config.properties():
            if keys is not None and key not in keys:
                continue
            chain = dynamic_config.synonyms(key, self.config, cluster_default, own)
            configs.append(_entry(key, chain[0][1], chain[0][2], chain, synonyms, documentation))
        return {"error_code": 0, "configs": configs}

    # -- AlterConfigs / IncrementalAlterConfigs --------------------------------------------------

    async def handle_alter_configs(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)

        def replace(_current: dict, resource) -> dict:
            return {c.name: c.value for c in resource.configs}

        return await self._alter(header, request, replace)

    async def handle_incremental_alter_configs(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)
        return await self._alter(header, request, _apply_operations)

    async def _alter(self, header, request, change) -> bytes:
        responses = []
        for resource in request.resources:
            code, message = await self._alter_one(resource, change, request.validate_only)
            responses.append({"error_code": code, "error_message": message,
                              "resource_type": resource.resource_type,
                              "resource_name": resource.resource_name})  # fmt: skip
        return messages.write_response(header, {"responses": responses})

    async def _alter_one(self, resource, change, validate_only: bool) -> tuple[int, str | None]:
        if resource.resource_type == BROKER_RESOURCE:
            return await self._alter_broker(resource, change, validate_only)
        if resource.resource_type != TOPIC_RESOURCE:
            return ErrorCode.invalid_request, ("configs change here for topics (resource type 2) "
                                               "and brokers (4)")  # fmt: skip
        name, zk = resource.resource_name, self.metadata.zk
        assignment = await self._assignment(name)
        if assignment is None:
            return ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist"
        try:
            current = await asyncio.to_thread(zk.topic_config, name)
        except ZnodeDataError as e:
            log.warning("topic %s: %s; the altered config replaces it, starting from no "
                        "overrides", name, e)  # fmt: skip
            current = {}
        try:
            wanted = change(dict(current), resource)
            rf = len(next(iter(assignment.partitions.values())))
            validated = topic_config.validate(wanted, rf)
        except topic_config.TopicConfigError as e:
            return ErrorCode(e.error_code), str(e)
        if not validate_only:
            await asyncio.to_thread(zk.change_topic_config, name, validated)
        return ErrorCode.none, None

    async def _alter_broker(self, resource, change, validate_only: bool) -> tuple[int, str | None]:
        """A dynamic broker layer: "<id>" (one broker) or "" (the cluster-wide default)."""
        name, zk = resource.resource_name, self.metadata.zk
        if name != "" and not (name.isdigit() and name == str(int(name))):
            return ErrorCode.invalid_request, (f"broker resource {name!r}: name a broker id, or "
                                               "'' for the cluster-wide default")  # fmt: skip
        entity = dynamic_config.entity(int(name) if name else None)
        current = await asyncio.to_thread(zk.broker_config, entity)
        try:
            wanted = change(dict(current), resource)
            validated = dynamic_config.validate(wanted)
        except (topic_config.TopicConfigError, dynamic_config.DynamicConfigError) as e:
            return ErrorCode(e.error_code), str(e)
        if not validate_only:
            await asyncio.to_thread(zk.change_broker_config, entity, validated)
        return ErrorCode.none, None


SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs' config_operation


def _apply_operations(current: dict, resource) -> dict:
    """Kafka's incremental operations on a topic's overrides or a dynamic broker layer (APPEND
    and SUBTRACT only for list configs; here cleanup.policy and log.cleanup.policy)."""
    out = dict(current)
    for c in resource.configs:
        if c.config_operation == SET:
            out[c.name] = c.value
        elif c.config_operation == DELETE:
            out.pop(c.name, None)
        elif c.config_operation in (APPEND, SUBTRACT):
            spec = topic_config.SPECS.get(c.name) or dynamic_config.DYNAMIC.get(c.name)
            if spec is None or spec.kind != topic_config.LIST:
                raise topic_config.TopicConfigError(topic_config.INVALID_CONFIG,
                                                    f"{c.name}: APPEND and SUBTRACT apply to list "
                                                    "configs only (cleanup.policy, "
                                                    "log.cleanup.policy)")  # fmt: skip
            have = [v for v in out.get(c.name, "delete").split(",") if v]
            given = [v.strip() for v in (c.value or "").split(",") if v.strip()]
            have = (have + [v for v in given if v not in have] if c.config_operation == APPEND
                    else [v for v in have if v not in given])  # fmt: skip
            out[c.name] = ",".join(have)
        else:
            raise topic_config.TopicConfigError(ErrorCode.invalid_request,
                                                f"{c.name}: unknown config_operation "
                                                f"{c.config_operation}")  # fmt: skip
    return out


PREFERRED, UNCLEAN = 0, 1  # ElectLeaders' election_type
ELIGIBLE_LEADERS_NOT_AVAILABLE, ELECTION_NOT_NEEDED = 83, 84
PREFERRED_LEADER_NOT_AVAILABLE = 80


def _preferred_verdict(state, replicas, live) -> tuple[int | None, str | None]:
    preferred = replicas[0]
    if state.leader == preferred:
        return ELECTION_NOT_NEEDED, f"broker {preferred}, the preferred replica, leads already"
    if preferred not in live or preferred not in state.isr:
        why = "is not alive" if preferred not in live else "is not in the ISR"
        return PREFERRED_LEADER_NOT_AVAILABLE, f"the preferred replica {preferred} {why}"
    return None, None


def _unclean_verdict(state, replicas, live) -> tuple[int | None, str | None]:
    if state.leader in live:
        return ELECTION_NOT_NEEDED, f"broker {state.leader} leads it"
    if not set(replicas) & live:
        return ELIGIBLE_LEADERS_NOT_AVAILABLE, f"no replica of {list(replicas)} is alive"
    return None, None


def _check_new_assignment(added: dict, count: int, rf: int, live: set[int]) -> str | None:
    if len(added) != count:
        return f"{len(added)} assignments given for {count} new partitions"
    for partition, replicas in sorted(added.items()):
        if len(replicas) != rf or len(set(replicas)) != rf:
            return (f"partition {partition}: {list(replicas)} should be {rf} distinct brokers "
                    "(the topic's replication factor)")  # fmt: skip
        unknown = sorted(set(replicas) - live)
        if unknown:
            return f"partition {partition}: brokers {unknown} are not alive"
    return None


def _synonyms(chain) -> list[dict]:
    return [{"name": n, "value": v, "source": source} for n, v, source in chain]


def _entry(key: str, value, source: int, chain, synonyms: bool, documentation: bool) -> dict:
    """One broker property as DescribeConfigs answers it."""
    return {"name": key, "value": value, "read_only": key not in dynamic_config.DYNAMIC,
            "config_source": source, "is_sensitive": False,
            "synonyms": _synonyms(chain) if synonyms else [],
            "config_type": dynamic_config.config_type(key),
            "documentation": dynamic_config.documentation(key) if documentation else None}  # fmt: skip
