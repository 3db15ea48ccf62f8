"""The ZooKeeper-era controller requests, which kio (Kafka 4's schemas) no longer has.

Encoded on the layouts of the design documents (design-docs/004), with Kafka's framing and a
v1 request header, as version 0 of their API keys:

LeaderAndIsr (4):  controller_id int32, controller_epoch int32, is_init int8,
                   [topic string, partition int32, controller_epoch int32, leader int32,
                    leader_epoch int32, isr [int32], zk_version int32, replicas [int32],
                    is_new int8]
    response:      error_code int16, [topic string, partition int32, error_code int16]
StopReplica (5):   controller_id int32, controller_epoch int32, delete_partitions int8,
                   [topic string, partition int32]
    response:      error_code int16, [topic string, partition int32, error_code int16]
UpdateMetadata (6): controller_id int32, controller_epoch int32, type int8,
                   [topic string, partition int32, controller_epoch int32, leader int32,
                    leader_epoch int32, isr [int32], zk_version int32, replicas [int32],
                    offline_replicas [int32]],
                   [broker_id int32, [listener string, host string, port int32,
                    security_protocol string] (as UpdateMetadata v3+ carries endpoints),
                    rack nullable_string, unix_socket string]
    response:      error_code int16
    type (UpdateMetadata v8's Type, KIP-866): FULL (2), the whole picture, which replaces what
    the broker held; INCREMENTAL (1), the partitions that changed, each replacing its own
    entry, a leader of LEADER_DURING_DELETE (-2) removing it (Kafka's marker for a partition
    of a topic being deleted). The broker list is always the whole list.
ControlledShutdown (7): broker_id int32
    response:      error_code int16, [topic string, partition int32] (partitions still led)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from localcluster.metadata_types import EndPoint
from localcluster.protocol.wire import Reader, Writer

INCREMENTAL = 1  # UpdateMetadata's type: the partitions that changed
FULL = 2  # UpdateMetadata's type: every partition
LEADER_DURING_DELETE = -2  # Kafka's LeaderAndIsr.LeaderDuringDelete: UpdateMetadata removes it


@dataclass(frozen=True, slots=True)
class PartitionState:
    topic: str
    partition: int
    controller_epoch: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    zk_version: int
    replicas: tuple[int, ...]
    is_new: bool = False


@dataclass(frozen=True, slots=True)
class LeaderAndIsrRequest:
    controller_id: int
    controller_epoch: int
    partitions: tuple[PartitionState, ...]
    is_init: bool = False


@dataclass(frozen=True, slots=True)
class MetadataBroker:
    broker_id: int
    endpoints: tuple[EndPoint, ...]  # advertised listeners, in their configured order
    rack: str | None
    unix_socket: str

    def endpoint(self, listener_name: str) -> EndPoint | None:
        return next((e for e in self.endpoints if e.listener_name == listener_name), None)


@dataclass(frozen=True, slots=True)
class UpdateMetadataRequest:
    """The controller's picture of live brokers and partition leadership: all of it (FULL)
    or the partitions that changed (INCREMENTAL); see the module's docstring."""

    controller_id: int
    controller_epoch: int
    partitions: tuple[PartitionState, ...]  # is_new unused; offline replicas travel apart
    offline_replicas: tuple[tuple[int, ...], ...]  # parallel to partitions
    brokers: tuple[MetadataBroker, ...]
    type: int = FULL


@dataclass(frozen=True, slots=True)
class StopReplicaRequest:
    controller_id: int
    controller_epoch: int
    delete_partitions: bool
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class PartitionErrors:
    """The response of LeaderAndIsr and StopReplica."""

    error_code: int
    partitions: tuple[tuple[str, int, int], ...]  # (topic, partition, error code)


_STATE_NUMBERS = struct.Struct(">iiii")  # partition, controller epoch, leader, leader epoch


def _write_partition_state(w: Writer, p: PartitionState) -> None:
    """The fields LeaderAndIsr and UpdateMetadata share, in their order."""
    w.string(p.topic).fields(
        _STATE_NUMBERS, p.partition, p.controller_epoch, p.leader, p.leader_epoch
    )
    w.int32_array(p.isr).int32(p.zk_version).int32_array(p.replicas)


def _read_partition_state(r: Reader) -> tuple:
    """(topic, partition, controller epoch, leader, leader epoch, isr, zk version, replicas)."""
    topic = r.string()
    partition, controller_epoch, leader, leader_epoch = r.fields(_STATE_NUMBERS)
    isr = r.int32_array()
    return topic, partition, controller_epoch, leader, leader_epoch, isr, r.int32(), r.int32_array()


def write_leader_and_isr(request: LeaderAndIsrRequest) -> bytes:
    w = Writer().int32(request.controller_id).int32(request.controller_epoch)
    w.int8(int(request.is_init)).int32(len(request.partitions))
    for p in request.partitions:
        _write_partition_state(w, p)
        w.int8(int(p.is_new))
    return w.getvalue()


def read_leader_and_isr(r: Reader) -> LeaderAndIsrRequest:
    controller_id, controller_epoch, is_init = r.int32(), r.int32(), bool(r.int8())
    partitions = []
    for _ in range(r.array_length()):
        fields = _read_partition_state(r)
        partitions.append(PartitionState(*fields, is_new=bool(r.int8())))
    return LeaderAndIsrRequest(controller_id, controller_epoch, tuple(partitions), is_init)


def write_stop_replica(request: StopReplicaRequest) -> bytes:
    w = Writer().int32(request.controller_id).int32(request.controller_epoch)
    w.int8(int(request.delete_partitions)).int32(len(request.partitions))
    for topic, partition in request.partitions:
        w.string(topic).int32(partition)
    return w.getvalue()


def read_stop_replica(r: Reader) -> StopReplicaRequest:
    controller_id, controller_epoch, delete = r.int32(), r.int32(), bool(r.int8())
    partitions = tuple((r.string(), r.int32()) for _ in range(r.array_length()))
    return StopReplicaRequest(controller_id, controller_epoch, delete, partitions)


def write_partition_errors(response: PartitionErrors) -> bytes:
    w = Writer().int16(response.error_code).int32(len(response.partitions))
    for topic, partition, error in response.partitions:
        w.string(topic).int32(partition).int16(error)
    return w.getvalue()


def read_partition_errors(r: Reader) -> PartitionErrors:
    error_code = r.int16()
    partitions = tuple((r.string(), r.int32(), r.int16()) for _ in range(r.array_length()))
    return PartitionErrors(error_code, partitions)


def write_update_metadata(request: UpdateMetadataRequest) -> bytes:
    w = Writer().int32(request.controller_id).int32(request.controller_epoch).int8(request.type)
    w.int32(len(request.partitions))
    for p, offline in zip(request.partitions, request.offline_replicas, strict=True):
        _write_partition_state(w, p)
        w.int32_array(offline)
    w.int32(len(request.brokers))
    for b in request.brokers:
        w.int32(b.broker_id).int32(len(b.endpoints))
        for e in b.endpoints:
            w.string(e.listener_name).string(e.host).int32(e.port).string(e.security_protocol)
        w.nullable_string(b.rack).string(b.unix_socket)
    return w.getvalue()


def read_update_metadata(r: Reader) -> UpdateMetadataRequest:
    controller_id, controller_epoch, update_type = r.int32(), r.int32(), r.int8()
    if update_type not in (INCREMENTAL, FULL):
        raise ValueError(
            f"UpdateMetadata type {update_type} is neither INCREMENTAL (1) nor FULL (2)"
        )
    partitions, offline = [], []
    for _ in range(r.array_length()):
        partitions.append(PartitionState(*_read_partition_state(r)))
        offline.append(r.int32_array())
    brokers = tuple(_read_metadata_broker(r) for _ in range(r.array_length()))
    return UpdateMetadataRequest(
        controller_id, controller_epoch, tuple(partitions), tuple(offline), brokers, update_type
    )


def _read_metadata_broker(r: Reader) -> MetadataBroker:
    broker_id = r.int32()
    endpoints = tuple(EndPoint(r.string(), r.string(), r.int32(), r.string())
                      for _ in range(r.array_length()))  # fmt: skip
    return MetadataBroker(broker_id, endpoints, r.nullable_string(), r.string())


def write_error_code(error_code: int) -> bytes:
    return Writer().int16(error_code).getvalue()


def read_error_code(r: Reader) -> int:
    return r.int16()


def write_controlled_shutdown(broker_id: int) -> bytes:
    return Writer().int32(broker_id).getvalue()


def read_controlled_shutdown(r: Reader) -> int:
    return r.int32()


def write_controlled_shutdown_response(error_code: int, remaining: list[tuple[str, int]]) -> bytes:
    w = Writer().int16(error_code).int32(len(remaining))
    for topic, partition in remaining:
        w.string(topic).int32(partition)
    return w.getvalue()


def read_controlled_shutdown_response(r: Reader) -> tuple[int, list[tuple[str, int]]]:
    error_code = r.int16()
    return error_code, [(r.string(), r.int32()) for _ in range(r.array_length())]
