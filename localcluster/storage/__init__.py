"""Storage: Kafka record batches in segmented, memory-mapped logs, checkpoints, epoch history.

Pure files-and-bytes: no sockets, no clocks (callers pass `now_ms`), no replication logic.
"""

from localcluster.storage.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CheckpointError,
    read_partition_offsets,
    write_partition_offsets,
)
from localcluster.storage.leader_epoch_cache import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    LeaderEpochCache,
)
from localcluster.storage.log import (
    AppendInfo,
    Log,
    LogConfig,
    OffsetOutOfRangeError,
    ReadResult,
    RecordBatchTooLargeError,
    UnexpectedAppendOffsetError,
)
from localcluster.storage.record_batch import (
    BatchHeader,
    BatchSpec,
    CorruptRecordError,
    Record,
    encode_batch,
    iter_batches,
    iter_records,
    validate_batch,
)
from localcluster.storage.reservation import LogDirectoryFullError
from localcluster.storage.segment import CutReport, FileSlice

__all__ = [
    "AppendInfo", "BatchHeader", "BatchSpec", "CheckpointError", "CorruptRecordError",
    "CutReport", "FileSlice", "LEADER_EPOCH_CHECKPOINT", "LOG_START_OFFSET_CHECKPOINT", "LeaderEpochCache", "Log", "LogConfig",
    "LogDirectoryFullError",
    "OffsetOutOfRangeError", "RECOVERY_POINT_OFFSET_CHECKPOINT", "REPLICATION_OFFSET_CHECKPOINT",
    "ReadResult", "Record", "RecordBatchTooLargeError", "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET", "UnexpectedAppendOffsetError", "encode_batch", "iter_batches",
    "iter_records", "read_partition_offsets", "validate_batch", "write_partition_offsets",
]  # fmt: skip
