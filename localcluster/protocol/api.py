"""API keys, the versions this broker speaks, and the request/response headers.

Advertise only what is handled. librdkafka 2.x uses RecordBatch v2 only when Produce includes
v3 and Fetch v4, so those ranges start there (kio, generated from Kafka 4's schemas, starts
there too). A request's header is v2 (with tagged fields) when its API version is flexible,
else v1; a response's header is v1 when flexible, else v0, except ApiVersions, whose response
header is always v0 so that a client can parse the answer to a version the broker lacks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from localcluster.protocol.wire import MalformedRequestError, Reader, Writer

# Kafka's socket.request.max.bytes default; a larger frame closes the connection.
MAX_FRAME_BYTES = 100 * 1024 * 1024


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    LEADER_AND_ISR = 4
    STOP_REPLICA = 5
    UPDATE_METADATA = 6
    CONTROLLED_SHUTDOWN = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61


@dataclass(frozen=True, slots=True)
class VersionRange:
    min: int
    max: int
    first_flexible: int  # first version with tagged fields (compact encodings)

    def __contains__(self, version: int) -> bool:
        return self.min <= version <= self.max


SUPPORTED: dict[ApiKey, VersionRange] = {
    ApiKey.PRODUCE: VersionRange(3, 8, 9),
    ApiKey.FETCH: VersionRange(4, 11, 12),
    ApiKey.LIST_OFFSETS: VersionRange(1, 5, 6),
    ApiKey.METADATA: VersionRange(0, 8, 9),
    ApiKey.API_VERSIONS: VersionRange(0, 3, 3),
    ApiKey.CREATE_TOPICS: VersionRange(2, 4, 5),
    ApiKey.DELETE_TOPICS: VersionRange(1, 6, 4),  # broker/admin_apis.py
    ApiKey.DESCRIBE_CONFIGS: VersionRange(1, 4, 4),
    ApiKey.ALTER_CONFIGS: VersionRange(0, 2, 2),
    ApiKey.CREATE_PARTITIONS: VersionRange(0, 3, 2),
    ApiKey.ELECT_LEADERS: VersionRange(0, 2, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: VersionRange(0, 1, 1),
    ApiKey.DESCRIBE_CLUSTER: VersionRange(0, 1, 0),
    # broker/records_apis.py. DescribeLogDirs v0 left Kafka 4's schemas (the clients': 1+).
    ApiKey.DELETE_RECORDS: VersionRange(0, 2, 2),
    ApiKey.DESCRIBE_LOG_DIRS: VersionRange(1, 4, 2),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: VersionRange(0, 0, 0),  # broker/reassignment_apis.py
    ApiKey.LIST_PARTITION_REASSIGNMENTS: VersionRange(0, 0, 0),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: VersionRange(2, 3, 4),
    ApiKey.INIT_PRODUCER_ID: VersionRange(0, 4, 2),
    ApiKey.DESCRIBE_PRODUCERS: VersionRange(0, 0, 0),
    # The group APIs (broker/group_apis.py). OffsetCommit v0-v1 and OffsetFetch v0 left Kafka
    # 4's schemas; librdkafka needs OffsetCommit within 1-2 and OffsetFetch 1, both covered.
    # OffsetCommit/OffsetFetch v10 name topics by id (KIP-848's consumer groups) and are not here.
    ApiKey.FIND_COORDINATOR: VersionRange(0, 4, 3),
    ApiKey.JOIN_GROUP: VersionRange(0, 9, 6),
    ApiKey.SYNC_GROUP: VersionRange(0, 5, 4),
    ApiKey.HEARTBEAT: VersionRange(0, 4, 4),
    ApiKey.LEAVE_GROUP: VersionRange(0, 5, 4),
    ApiKey.OFFSET_COMMIT: VersionRange(2, 9, 8),
    ApiKey.OFFSET_FETCH: VersionRange(1, 9, 6),
    ApiKey.OFFSET_DELETE: VersionRange(0, 0, 1 << 15),
    ApiKey.LIST_GROUPS: VersionRange(0, 5, 3),
    ApiKey.DESCRIBE_GROUPS: VersionRange(0, 5, 5),
    ApiKey.DELETE_GROUPS: VersionRange(0, 2, 2),
    ApiKey.SASL_HANDSHAKE: VersionRange(0, 1, 1 << 15),
    ApiKey.SASL_AUTHENTICATE: VersionRange(0, 2, 2),
    # The ZK-era controller APIs, version 0 of our own layouts (controller_requests.py).
    ApiKey.LEADER_AND_ISR: VersionRange(0, 0, 1 << 15),
    ApiKey.STOP_REPLICA: VersionRange(0, 0, 1 << 15),
    ApiKey.UPDATE_METADATA: VersionRange(0, 0, 1 << 15),
    ApiKey.CONTROLLED_SHUTDOWN: VersionRange(0, 0, 1 << 15),
}


def is_flexible(api_key: int, version: int) -> bool:
    supported = SUPPORTED.get(api_key)
    return supported is not None and version >= supported.first_flexible


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def read_request_header(reader: Reader) -> RequestHeader:
    """Parse the header; tagged fields are skipped when the API version is flexible.

    An API key or version this broker does not know still parses (its header is v1 or v2 by
    the same rule), so the handler can answer UNSUPPORTED_VERSION instead of closing.
    """
    api_key = reader.int16()
    api_version = reader.int16()
    correlation_id = reader.int32()
    client_id = reader.nullable_string()
    if api_key == ApiKey.API_VERSIONS:
        # ApiVersions v3+ uses header v2; an unknown higher version must still be answered.
        if api_version >= 3:
            reader.skip_tagged_fields()
    elif is_flexible(api_key, api_version):
        reader.skip_tagged_fields()
    if api_version < 0:
        raise MalformedRequestError(f"negative API version {api_version}")
    return RequestHeader(api_key, api_version, correlation_id, client_id)


def write_request_header(w: Writer, header: RequestHeader) -> None:
    w.int16(header.api_key).int16(header.api_version).int32(header.correlation_id)
    w.nullable_string(header.client_id)
    if is_flexible(header.api_key, header.api_version):
        w.uvarint(0)


def response_header(api_key: int, api_version: int, correlation_id: int) -> bytes:
    w = Writer().int32(correlation_id)
    if api_key != ApiKey.API_VERSIONS and is_flexible(api_key, api_version):
        w.uvarint(0)
    return w.getvalue()
