"""KafkaApis: one request frame in, one response (or none for acks=0) out.

Parses the header, checks the version against what we advertise, and hands the body to the
API's handler. Handlers translate between the wire and ReplicaManager / ClusterMetadata; they
hold no state of their own. A request for an API or version we do not advertise closes the
connection (as Kafka does), except ApiVersions, which is answered in its v0 body with
UNSUPPORTED_VERSION and our key list so the client can retry with a version we know.

Before a handler runs, the connection's context decides: on a SASL listener nothing but
ApiVersions and the SASL exchange is served until the client authenticated
(sasl_authenticator.py), and broker-only requests need the cluster-action right
(authorizer.py); a refused one is answered with Kafka's authorization error and changes nothing.
"""

from __future__ import annotations

import logging
import time

from kio.schema.errors import ErrorCode

from localcluster.broker.authorizer import (
    BROKER_ONLY_APIS,
    CLUSTER_AUTHORIZATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    Authorizer,
)
from localcluster.broker.metadata import OFFSETS_TOPIC, ClusterMetadata, TopicCreationError
from localcluster.broker.network import ConnectionContext
from localcluster.broker.replica_manager import ReplicaManager
from localcluster.broker.sasl_authenticator import SaslAuthenticator
from localcluster.broker.shutdown import ask_local_controller
from localcluster.protocol import controller_requests, fetch, messages, metadata_response, produce
from localcluster.protocol.api import (
    SUPPORTED,
    ApiKey,
    RequestHeader,
    read_request_header,
    response_header,
)
from localcluster.protocol.wire import MalformedRequestError, Reader

log = logging.getLogger(__name__)

INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC})


class KafkaApis:
    def __init__(self, replica_manager: ReplicaManager, metadata: ClusterMetadata,
                 authorizer: Authorizer, sasl: SaslAuthenticator | None = None):  # fmt: skip
        self.replica_manager = replica_manager
        self.metadata = metadata
        self.authorizer = authorizer
        self.sasl = sasl
        self._handlers = {
            ApiKey.API_VERSIONS: self.handle_api_versions,
            ApiKey.METADATA: self.handle_metadata,
            ApiKey.PRODUCE: self.handle_produce,
            ApiKey.FETCH: self.handle_fetch,
            ApiKey.LIST_OFFSETS: self.handle_list_offsets,
            ApiKey.CREATE_TOPICS: self.handle_create_topics,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.handle_offset_for_leader_epoch,
            ApiKey.LEADER_AND_ISR: self.handle_leader_and_isr,
            ApiKey.STOP_REPLICA: self.handle_stop_replica,
            ApiKey.UPDATE_METADATA: self.handle_update_metadata,
            ApiKey.CONTROLLED_SHUTDOWN: self.handle_controlled_shutdown,
            ApiKey.INIT_PRODUCER_ID: self.handle_init_producer_id,
            ApiKey.DESCRIBE_PRODUCERS: self.handle_describe_producers,
            ApiKey.SASL_HANDSHAKE: self.handle_sasl_handshake,
            ApiKey.SASL_AUTHENTICATE: self.handle_sasl_authenticate,
        }
        self._refusals = {
            ApiKey.LEADER_AND_ISR: self._refuse_partition_request,
            ApiKey.STOP_REPLICA: self._refuse_partition_request,
            ApiKey.UPDATE_METADATA: lambda h, r: controller_requests.write_error_code(
                CLUSTER_AUTHORIZATION_FAILED),
            ApiKey.CONTROLLED_SHUTDOWN: lambda h, r: (
                controller_requests.write_controlled_shutdown_response(
                    CLUSTER_AUTHORIZATION_FAILED, [])),
        }  # fmt: skip
        self.controller = None  # KafkaController, set by the server
        self.producer_ids = None  # ProducerIdManager, set by the server
        self.on_replicas_changed = lambda: None  # the group coordinator's, set by the server

    def add_handlers(self, handlers: dict) -> None:
        """APIs served by another module (the group APIs)."""
        assert not set(handlers) & set(self._handlers)
        self._handlers.update(handlers)

    async def handle(self, frame: memoryview, context: ConnectionContext) -> list | None:
        if (
            context.needs_authentication
            and self.sasl is not None
            and self.sasl.is_raw_token(context)
        ):
            return await self.sasl.handle_raw_token(context, frame)
        reader = Reader(frame)
        header = read_request_header(reader)
        if context.needs_authentication:
            if self.sasl is None:
                raise MalformedRequestError("SASL listener without SASL configured")
            self.sasl.check_before_authentication(context, header)
        handler = self._handlers.get(header.api_key)
        if handler is None:
            raise MalformedRequestError(f"API key {header.api_key} is not supported")
        if (
            header.api_key != ApiKey.API_VERSIONS
            and header.api_version not in SUPPORTED[header.api_key]
        ):
            raise MalformedRequestError(
                f"{ApiKey(header.api_key).name} v{header.api_version} is not supported "
                f"(we speak {SUPPORTED[header.api_key].min}-{SUPPORTED[header.api_key].max})"
            )
        if header.api_key in BROKER_ONLY_APIS and not self.authorizer.may_cluster_action(context):
            self.authorizer.refused(context, header.api_key)
            body = self._refusals[header.api_key](header, reader)
        else:
            body = await handler(header, reader, context)
        if body is None:
            return None
        head = response_header(header.api_key, header.api_version, header.correlation_id)
        return [head, *body] if isinstance(body, list) else [head, body]

    def _refuse_partition_request(self, header: RequestHeader, reader: Reader) -> bytes:
        """LeaderAndIsr or StopReplica from a non-broker: every partition refused, as Kafka's
        error response for these requests lists them."""
        if header.api_key == ApiKey.LEADER_AND_ISR:
            partitions = [(p.topic, p.partition)
                          for p in controller_requests.read_leader_and_isr(reader).partitions]  # fmt: skip
        else:
            partitions = list(controller_requests.read_stop_replica(reader).partitions)
        return controller_requests.write_partition_errors(controller_requests.PartitionErrors(
            CLUSTER_AUTHORIZATION_FAILED,
            tuple((t, p, CLUSTER_AUTHORIZATION_FAILED) for t, p in partitions)))  # fmt: skip

    # -- SASL ---------------------------------------------------------------------------------

    async def handle_sasl_handshake(self, header: RequestHeader, reader: Reader,
                                    context: ConnectionContext) -> bytes:  # fmt: skip
        if self.sasl is None or not context.needs_authentication:
            context.close_after_response = "SaslHandshake on a listener without SASL"
            return messages.encode_response(header.api_key, header.api_version, {
                "error_code": ErrorCode.illegal_sasl_state, "mechanisms": []})  # fmt: skip
        return await self.sasl.handle_handshake(context, header, reader)

    async def handle_sasl_authenticate(self, header: RequestHeader, reader: Reader,
                                       context: ConnectionContext) -> bytes:  # fmt: skip
        if self.sasl is None or not context.needs_authentication:
            context.close_after_response = "SaslAuthenticate on a listener without SASL"
            return messages.encode_response(header.api_key, header.api_version, {
                "error_code": ErrorCode.illegal_sasl_state,
                "error_message": "this listener does not use SASL"})  # fmt: skip
        return await self.sasl.handle_authenticate(context, header, reader)

    # -- ApiVersions --------------------------------------------------------------------------

    async def handle_api_versions(
        self, header: RequestHeader, reader: Reader, context: ConnectionContext
    ) -> bytes:
        keys = [{"api_key": int(k), "min_version": r.min, "max_version": r.max}
                for k, r in sorted(SUPPORTED.items())]  # fmt: skip
        if header.api_version not in SUPPORTED[ApiKey.API_VERSIONS]:
            return messages.encode_response(ApiKey.API_VERSIONS, 0, {
                "error_code": ErrorCode.unsupported_version, "api_keys": keys})  # fmt: skip
        return messages.encode_response(ApiKey.API_VERSIONS, header.api_version,
                                        {"error_code": 0, "api_keys": keys})  # fmt: skip

    # -- Metadata -----------------------------------------------------------------------------

    async def handle_metadata(
        self, header: RequestHeader, reader: Reader, context: ConnectionContext
    ) -> bytes:
        request = messages.decode_request(
            header.api_key, header.api_version, reader.buf, reader.pos
        )
        topics = getattr(request, "topics", None)
        names = None if topics is None else [t.name if hasattr(t, "name") else t for t in topics]
        if header.api_version == 0 and names == []:
            names = None  # v0: an empty list means all topics
        allow_auto_create = getattr(request, "allow_auto_topic_creation", True)
        data = await self.metadata.describe(names, allow_auto_create, context.listener)
        return metadata_response.encode(header.api_version, data)

    # -- Produce ------------------------------------------------------------------------------

    async def handle_produce(
        self, header: RequestHeader, reader: Reader, context: ConnectionContext
    ) -> bytes | None:
        request = produce.read_produce_request(reader, header.api_version)
        entries = [((topic, p.partition), p.records)
                   for topic, partitions in request.topics for p in partitions]  # fmt: skip
        if request.acks not in (0, 1, -1):
            results = [produce.ProducePartitionResponse(tp[1], ErrorCode.invalid_required_acks)
                       for tp, _ in entries]  # fmt: skip
        elif any(tp[0] in INTERNAL_TOPICS for tp, _ in entries):
            results = await self._append_refusing_internal(request, entries, context)
        else:
            results = await self.replica_manager.append_records(request.acks, request.timeout_ms,
                                                                entries)  # fmt: skip
        if request.acks == 0:
            return None
        responses: dict[str, list] = {}
        for ((topic, _), _records), result in zip(entries, results, strict=True):
            responses.setdefault(topic, []).append(result)
        return produce.write_produce_response(list(responses.items()), header.api_version)

    async def _append_refusing_internal(self, request, entries, context) -> list:
        """Kafka's rule: only the group coordinator appends to an internal topic; a client's
        batch for one gets INVALID_TOPIC_EXCEPTION, the others are appended as usual."""
        refused = [tp for tp, _ in entries if tp[0] in INTERNAL_TOPICS]
        log.warning("produce to internal topic %s from %s refused: only the group coordinator "
                    "writes it", ", ".join(sorted({t for t, _ in refused})), context.describe())  # fmt: skip
        allowed = [(tp, records) for tp, records in entries if tp[0] not in INTERNAL_TOPICS]
        appended = iter(await self.replica_manager.append_records(
            request.acks, request.timeout_ms, allowed) if allowed else [])  # fmt: skip
        return [produce.ProducePartitionResponse(tp[1], ErrorCode.invalid_topic_exception,
                                                 error_message=f"cannot append to internal topic {tp[0]}")
                if tp[0] in INTERNAL_TOPICS else next(appended) for tp, _ in entries]  # fmt: skip

    # -- Fetch --------------------------------------------------------------------------------

    async def handle_fetch(
        self, header: RequestHeader, reader: Reader, context: ConnectionContext
    ) -> list:
        request = fetch.read_fetch_request(reader, header.api_version)
        if request.replica_id >= 0 and not self.authorizer.may_cluster_action(context):
            # A follower's fetch moves the leader's view of its followers (and so the HW): a
            # client claiming a replica id gets Kafka's per-partition refusal and moves nothing.
            self.authorizer.refused(context, header.api_key, f"replica id {request.replica_id}")
            return fetch.write_fetch_response(
                [(topic, [fetch.FetchPartitionResponse(p.partition, TOPIC_AUTHORIZATION_FAILED)
                          for p in partitions]) for topic, partitions in request.topics],
                header.api_version)  # fmt: skip
        session = self.replica_manager.fetch_session_cache.context(
            request, request.replica_id >= 0, self.replica_manager.now_ms())  # fmt: skip
        if session.error:
            return fetch.write_fetch_response([], header.api_version, session.error)
        responses = await self.replica_manager.fetch(session)
        self.replica_manager.metrics.record_fetch(
            sum(p.records_size for _, partitions in responses for p in partitions))  # fmt: skip
        return fetch.write_fetch_response(responses, header.api_version, 0, session.session_id)

    # -- ListOffsets --------------------------------------------------------------------------

    async def handle_list_offsets(
        self, header: RequestHeader, reader: Reader, context: ConnectionContext
    ) -> bytes:
        request = messages.decode_request(
            header.api_key, header.api_version, reader.buf, reader.pos
        )
        consumer = request.replica_id < 0
        topics = []
        for topic in request.topics:
            partitions = []
            for p in topic.partitions:
                error, timestamp, offset = self.replica_manager.list_offset(
                    (topic.name, p.partition_index), p.timestamp, consumer)  # fmt: skip
                partitions.append({"partition_index": p.partition_index, "error_code": error,
                                   "timestamp": timestamp, "offset": offset,
                                   "leader_epoch": self._leader_epoch(topic.name, p.partition_index)})  # fmt: skip
            topics.append({"name": topic.name, "partitions": partitions})
        return messages.encode_response(header.api_key, header.api_version,
                                        {"throttle_time": 0, "topics": topics})  # fmt: skip

    def _leader_epoch(self, topic: str, partition: int) -> int:
        hosted = self.replica_manager.partitions.get((topic, partition))
        return hosted.state.leader_epoch if hosted else -1

    # -- replication: OffsetForLeaderEpoch, LeaderAndIsr, StopReplica ------------------------

    async def handle_offset_for_leader_epoch(
        self, header: RequestHeader, reader: Reader, context: ConnectionContext
    ) -> bytes:
        request = messages.decode_request(
            header.api_key, header.api_version, reader.buf, reader.pos
        )
        refused = getattr(request, "replica_id", -1) >= 0 and not (
            self.authorizer.may_cluster_action(context))  # fmt: skip
        if refused:
            self.authorizer.refused(context, header.api_key, f"replica id {request.replica_id}")
        topics = []
        for topic in request.topics:
            partitions = []
            for p in topic.partitions:
                if refused:
                    partitions.append({"error_code": CLUSTER_AUTHORIZATION_FAILED,
                                       "partition": p.partition, "leader_epoch": -1,
                                       "end_offset": -1})  # fmt: skip
                    continue
                error, epoch, end = self.replica_manager.end_offset_for_epoch(
                    (topic.topic, p.partition), p.current_leader_epoch, p.leader_epoch)  # fmt: skip
                partitions.append({"error_code": error, "partition": p.partition,
                                   "leader_epoch": epoch, "end_offset": end})  # fmt: skip
            topics.append({"topic": topic.topic, "partitions": partitions})
        return messages.encode_response(header.api_key, header.api_version,
                                        {"throttle_time": 0, "topics": topics})  # fmt: skip

    async def handle_leader_and_isr(
        self, header: RequestHeader, reader: Reader, context: ConnectionContext
    ) -> bytes:
        request = controller_requests.read_leader_and_isr(reader)
        configs = await self.metadata.topic_configs(
            self.replica_manager.topics_to_configure(request.partitions)
        )
        response = self.replica_manager.become_leader_or_follower(request, configs)
        self.on_replicas_changed()
        return controller_requests.write_partition_errors(response)

    async def handle_update_metadata(
        self, header: RequestHeader, reader: Reader, context: ConnectionContext
    ) -> bytes:
        request = controller_requests.read_update_metadata(reader)
        return controller_requests.write_error_code(self.metadata.cache.update(request))

    async def handle_stop_replica(
        self, header: RequestHeader, reader: Reader, context: ConnectionContext
    ) -> bytes:
        request = controller_requests.read_stop_replica(reader)
        response = self.replica_manager.stop_replicas(request)
        self.on_replicas_changed()
        return controller_requests.write_partition_errors(response)

    async def handle_controlled_shutdown(
        self, header: RequestHeader, reader: Reader, context: ConnectionContext
    ) -> bytes:
        broker_id = controller_requests.read_controlled_shutdown(reader)
        if self.controller is None or not self.controller.is_active:
            return controller_requests.write_controlled_shutdown_response(
                ErrorCode.not_controller, []
            )
        result = await ask_local_controller(self.controller, broker_id)
        if result is None:
            return controller_requests.write_controlled_shutdown_response(
                ErrorCode.not_controller, []
            )
        error, remaining = result
        return controller_requests.write_controlled_shutdown_response(error, remaining)

    # -- InitProducerId ---------------------------------------------------------------------

    async def handle_init_producer_id(self, header: RequestHeader, reader: Reader,
                                      context: ConnectionContext) -> bytes:  # fmt: skip
        request = messages.read_request(header, reader)
        if request.transactional_id is not None:
            log.warning("InitProducerId with transactional id %r from %s refused: transactions "
                        "do not exist here (idempotence does: leave transactional.id unset)",
                        request.transactional_id, context.describe())  # fmt: skip
            return self._init_producer_id_response(header, ErrorCode.invalid_request, -1, -1)
        try:
            producer_id = await self.producer_ids.generate_producer_id()
        except Exception as e:  # the store is unreachable or the block znode is corrupt
            log.warning("InitProducerId: no producer id for %s: %s", context.describe(), e)
            return self._init_producer_id_response(
                header, ErrorCode.coordinator_not_available, -1, -1)  # fmt: skip
        return self._init_producer_id_response(header, 0, producer_id, 0)

    async def handle_describe_producers(self, header: RequestHeader, reader: Reader,
                                        context: ConnectionContext) -> bytes:  # fmt: skip
        """The leader's producer state per partition, as Kafka's DescribeProducers (KIP-664)."""
        request = messages.read_request(header, reader)
        topics = [{"name": topic.name, "partitions": [
            self._describe_partition_producers((topic.name, p)) for p in topic.partition_indexes]}
            for topic in request.topics]  # fmt: skip
        return messages.encode_response(header.api_key, header.api_version,
                                        {"throttle_time": 0, "topics": topics})  # fmt: skip

    def _describe_partition_producers(self, tp) -> dict:
        hosted = self.replica_manager.partitions.get(tp)
        if hosted is None:
            return {"partition_index": tp[1], "error_code": ErrorCode.unknown_topic_or_partition}
        if not hosted.state.is_leader:
            return {"partition_index": tp[1], "error_code": ErrorCode.not_leader_or_follower}
        state = self.replica_manager.log_manager.producer_states[tp].state
        return {"partition_index": tp[1], "error_code": 0, "active_producers": [
            {"producer_id": pid, "producer_epoch": e.producer_epoch, "last_sequence": e.last_seq,
             "last_timestamp": e.last_timestamp, "coordinator_epoch": e.coordinator_epoch,
             "current_txn_start_offset": -1}
            for pid, e in sorted(state.producers.items())]}  # fmt: skip

    @staticmethod
    def _init_producer_id_response(header, error, producer_id: int, epoch: int) -> bytes:
        return messages.encode_response(header.api_key, header.api_version, {
            "throttle_time": 0, "error_code": error, "producer_id": producer_id,
            "producer_epoch": epoch})  # fmt: skip

    # -- CreateTopics -------------------------------------------------------------------------

    async def handle_create_topics(
        self, header: RequestHeader, reader: Reader, context: ConnectionContext
    ) -> bytes:
        request = messages.decode_request(
            header.api_key, header.api_version, reader.buf, reader.pos
        )
        results = []
        for topic in request.topics:
            configs = {c.name: c.value for c in topic.configs if c.value is not None}
            assignments = {a.partition_index: tuple(a.broker_ids) for a in topic.assignments}
            try:
                await self.metadata.create_topic(
                    topic.name, topic.num_partitions, topic.replication_factor, configs,
                    assignments or None, validate_only=request.validate_only)  # fmt: skip
                results.append({"name": topic.name, "error_code": 0})
            except TopicCreationError as e:
                results.append({"name": topic.name, "error_code": e.error_code,
                                "error_message": str(e)})  # fmt: skip
        deadline_ms = int(time.monotonic() * 1000) + max(
            int(request.timeout.total_seconds() * 1000), 0
        )
        # validate_only creates nothing: waiting for those topics would last the whole timeout
        created = (
            [] if request.validate_only else [r["name"] for r in results if r["error_code"] == 0]
        )
        await self.metadata.wait_for_topics(created, deadline_ms)
        return messages.encode_response(header.api_key, header.api_version,
                                        {"throttle_time": 0, "topics": results})  # fmt: skip
