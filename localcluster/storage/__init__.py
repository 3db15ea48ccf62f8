"""Storage: Kafka record batches in segmented, memory-mapped logs, checkpoints, epoch history.

Pure files-and-bytes: no sockets, no clocks (callers pass `now_ms`), no replication logic.
"""

from localcluster.lazy_exports import lazy_getattr

# Where each name lives; each is imported on first use (lazy_exports.py says why).
_EXPORTS = {
    "LEADER_EPOCH_CHECKPOINT": "localcluster.storage.checkpoint",
    "LOG_START_OFFSET_CHECKPOINT": "localcluster.storage.checkpoint",
    "RECOVERY_POINT_OFFSET_CHECKPOINT": "localcluster.storage.checkpoint",
    "REPLICATION_OFFSET_CHECKPOINT": "localcluster.storage.checkpoint",
    "CheckpointError": "localcluster.storage.checkpoint",
    "read_partition_offsets": "localcluster.storage.checkpoint",
    "write_partition_offsets": "localcluster.storage.checkpoint",
    "UNDEFINED_EPOCH": "localcluster.storage.leader_epoch_cache",
    "UNDEFINED_EPOCH_OFFSET": "localcluster.storage.leader_epoch_cache",
    "LeaderEpochCache": "localcluster.storage.leader_epoch_cache",
    "AppendInfo": "localcluster.storage.log",
    "Log": "localcluster.storage.log",
    "LogConfig": "localcluster.storage.log",
    "LogFlush": "localcluster.storage.log",
    "OffsetOutOfRangeError": "localcluster.storage.log",
    "ReadResult": "localcluster.storage.log",
    "RecordBatchTooLargeError": "localcluster.storage.log",
    "UnexpectedAppendOffsetError": "localcluster.storage.log",
    "BatchHeader": "localcluster.storage.record_batch",
    "BatchSpec": "localcluster.storage.record_batch",
    "CorruptRecordError": "localcluster.storage.record_batch",
    "Record": "localcluster.storage.record_batch",
    "encode_batch": "localcluster.storage.record_batch",
    "iter_batches": "localcluster.storage.record_batch",
    "iter_records": "localcluster.storage.record_batch",
    "validate_batch": "localcluster.storage.record_batch",
    "LogDirectoryFullError": "localcluster.storage.reservation",
    "CutReport": "localcluster.storage.segment",
    "FileSlice": "localcluster.storage.segment",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(globals(), _EXPORTS)
