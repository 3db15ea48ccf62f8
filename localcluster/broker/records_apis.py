"""DeleteRecords and DescribeLogDirs: the Admin APIs a partition's leader (or each broker)
answers from its own logs, not through the controller.

- DeleteRecords (v0-v2) moves each partition's log start offset on its leader (-1 means the
  high watermark, past the HW is OFFSET_OUT_OF_RANGE, as Kafka), then waits as Kafka's
  DelayedDeleteRecords does until the low watermark (the lowest start of the ISR's replicas)
  reaches it: followers learn the leader's start from their fetch answers and move their own
  (replication/replica_core.py). The answer's low_watermark is that lowest start;
  REQUEST_TIMED_OUT when the timeout passes first (the followers still follow). Segments wholly
  below the start are deleted at once and the start is checkpointed (log-start-offset-checkpoint).
  `__consumer_offsets` is refused (INVALID_TOPIC_EXCEPTION): Kafka allows it, and it drops
  committed offsets the group coordinator still serves.
- DescribeLogDirs (v1-v4; v0 left Kafka 4's schemas, which is what the clients speak) lists this
  broker's one log directory: each hosted partition's size in bytes, its offset lag as Kafka
  computes it for a current (not future) replica, max(HW - log end, 0), and is_future false;
  v4's total and usable bytes of the directory's file system.
"""

from __future__ import annotations

import os

from kio.schema.errors import ErrorCode

from localcluster.broker.metadata import OFFSETS_TOPIC
from localcluster.broker.replica_manager import ReplicaManager
from localcluster.protocol import messages
from localcluster.protocol.api import ApiKey


class RecordsApis:
    def __init__(self, replica_manager: ReplicaManager):
        self.replica_manager = replica_manager

    def handlers(self) -> dict:
        return {ApiKey.DELETE_RECORDS: self.handle_delete_records,
                ApiKey.DESCRIBE_LOG_DIRS: self.handle_describe_log_dirs}  # fmt: skip

    # -- DeleteRecords ----------------------------------------------------------------------------

    async def handle_delete_records(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)
        entries = [((t.name, p.partition_index), p.offset)
                   for t in request.topics for p in t.partitions
                   if t.name != OFFSETS_TOPIC]  # fmt: skip
        timeout_ms = int(request.timeout.total_seconds() * 1000)
        answers = dict(zip([tp for tp, _ in entries],
                           await self.replica_manager.delete_records(entries, timeout_ms),
                           strict=True))  # fmt: skip
        topics = []
        for t in request.topics:
            rows = []
            for p in t.partitions:
                code, low = answers.get((t.name, p.partition_index),
                                        (ErrorCode.invalid_topic_exception, -1))  # fmt: skip
                rows.append({"partition_index": p.partition_index, "low_watermark": low,
                             "error_code": code})  # fmt: skip
            topics.append({"name": t.name, "partitions": rows})
        return messages.write_response(header, {"topics": topics})

    # -- DescribeLogDirs --------------------------------------------------------------------------

    async def handle_describe_log_dirs(self, header, reader, context) -> bytes:
        request = messages.read_request(header, reader)
        manager = self.replica_manager
        hosted = manager.partitions
        if request.topics is None:
            wanted = sorted(manager.log_manager.logs)
        else:
            wanted = [(t.topic, p) for t in request.topics for p in t.partitions
                      if (t.topic, p) in manager.log_manager.logs]  # fmt: skip
        by_topic: dict[str, list] = {}
        for tp in wanted:
            lg = manager.log_manager.logs[tp]
            state = hosted.get(tp)
            hw = state.state.high_watermark if state else lg.log_end_offset
            by_topic.setdefault(tp[0], []).append({
                "partition_index": tp[1], "partition_size": lg.size_in_bytes,
                "offset_lag": max(hw - lg.log_end_offset, 0), "is_future_key": False})  # fmt: skip
        stat = os.statvfs(manager.data_dir)
        result = {"error_code": 0, "log_dir": str(manager.data_dir.resolve()),
                  "topics": [{"name": t, "partitions": rows} for t, rows in by_topic.items()],
                  "total_bytes": stat.f_blocks * stat.f_frsize,
                  "usable_bytes": stat.f_bavail * stat.f_frsize}  # fmt: skip
        return messages.write_response(header, {"error_code": 0, "results": [result]})
