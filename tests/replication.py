"""A stand-in controller for replication tests, and read-only views of replicas' logs.

Until the controller exists, tests play its part: write the topic and partition state znodes
and send LeaderAndIsr over each broker's Unix socket, exactly as the controller will. Logs are
read straight from their segment files (read-only maps), never through Log.open, which would
recover (and so change) a live broker's files.
"""

from __future__ import annotations

import asyncio
import json
import mmap
from pathlib import Path

from localcluster import coord
from localcluster.client.connection import Address, BrokerConnection
from localcluster.coord import NoNodeError, paths
from localcluster.coord.znode_data import (
    decode_leader_and_isr,
    encode_leader_and_isr,
    encode_topic_assignment,
)
from localcluster.metadata_types import LeaderAndIsr, TopicAssignment
from localcluster.protocol import controller_requests as cr
from localcluster.protocol.api import ApiKey
from localcluster.protocol.wire import Reader
from localcluster.storage import record_batch as rb


class TestController:
    __test__ = False  # not a pytest class

    def __init__(self, cluster_dir: Path, brokers: dict):
        self.coord = coord.connect(str(cluster_dir / "store"))
        self.brokers = brokers  # broker id -> BrokerProcess
        self.controller_epoch = 1

    def close(self) -> None:
        self.coord.stop()

    def create_topic(
        self, topic: str, replicas: tuple[int, ...], config: dict | None = None
    ) -> None:
        self.coord.create(f"/config/topics/{topic}",
                          json.dumps({"version": 1, "config": config or {}}).encode(),
                          makepath=True)  # fmt: skip
        self.coord.create(paths.topic_path(topic), encode_topic_assignment(TopicAssignment({0: tuple(replicas)})),
                          makepath=True)  # fmt: skip

    def state(self, topic: str, partition: int = 0) -> tuple[LeaderAndIsr, int]:
        data, stat = self.coord.get(paths.partition_state_path(topic, partition))
        return decode_leader_and_isr("", data), stat.version

    def elect(self, topic: str, leader: int, leader_epoch: int, isr, replicas,
              send_to=None, partition: int = 0) -> dict[int, cr.PartitionErrors]:  # fmt: skip
        """Write the partition state and send LeaderAndIsr to `send_to` (default: every
        replica whose process is alive)."""
        path = paths.partition_state_path(topic, partition)
        state = LeaderAndIsr(leader, leader_epoch, tuple(isr), self.controller_epoch)
        try:
            stat = self.coord.set(path, encode_leader_and_isr(state))
        except NoNodeError:
            self.coord.create(path, encode_leader_and_isr(state), makepath=True)
            _, stat = self.coord.get(path)
        request = cr.LeaderAndIsrRequest(0, self.controller_epoch, (cr.PartitionState(
            topic, partition, self.controller_epoch, leader, leader_epoch, tuple(isr),
            stat.version, tuple(replicas)),))  # fmt: skip
        targets = send_to if send_to is not None else [
            r for r in replicas if r in self.brokers and self.brokers[r].is_alive()]  # fmt: skip
        return {b: self.leader_and_isr(b, request) for b in targets}

    def leader_and_isr(self, broker_id: int, request: cr.LeaderAndIsrRequest) -> cr.PartitionErrors:
        reader = asyncio.run(self._send(broker_id, ApiKey.LEADER_AND_ISR,
                                        cr.write_leader_and_isr(request)))  # fmt: skip
        return cr.read_partition_errors(reader)

    def stop_replica(self, broker_id: int, request: cr.StopReplicaRequest) -> cr.PartitionErrors:
        reader = asyncio.run(
            self._send(broker_id, ApiKey.STOP_REPLICA, cr.write_stop_replica(request))
        )
        return cr.read_partition_errors(reader)

    async def _send(self, broker_id: int, api_key: int, body: bytes):
        connection = await BrokerConnection.open(Address(unix_socket=str(self.brokers[broker_id].socket_path)),
                                                 client_id="test-controller")  # fmt: skip
        try:
            frame, offset = await connection.send(
                api_key, lambda v: body, version=0, timeout_ms=20_000
            )
            return Reader(frame, offset)
        finally:
            connection.close()


def log_batches(partition_dir: Path) -> list[tuple[rb.BatchHeader, bytes]]:
    """Every valid batch in a partition directory's segments, in order, read-only."""
    out = []
    for segment in sorted(partition_dir.glob("*.log")):
        size = segment.stat().st_size
        if not size:
            continue
        with open(segment, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            position = 0
            while position < size:
                try:
                    header = rb.validate_batch(mm, position)
                except rb.CorruptRecordError:
                    break  # preallocated zeros (or a torn tail) end the data
                out.append((header, mm[position : position + header.size]))
                position += header.size
    return out


def log_bytes_below(partition_dir: Path, offset: int) -> bytes:
    """The bytes of every batch that ends below `offset`."""
    return b"".join(
        data for header, data in log_batches(partition_dir) if header.last_offset < offset
    )


def log_end_offset(partition_dir: Path) -> int:
    batches = log_batches(partition_dir)
    return batches[-1][0].next_offset if batches else 0


def record_values(partition_dir: Path) -> list[bytes]:
    values = []
    for _header, data in log_batches(partition_dir):
        values += [r.value for r in rb.iter_records(data)]
    return values
