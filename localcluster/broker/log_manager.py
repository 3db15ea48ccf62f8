"""LogManager: a broker's partition logs and the checkpoint files beside them (Kafka's
LogManager, plus the HW checkpoint that ReplicaManager writes), and the hands that carry out
the replica core's log actions and follower appends on them.

The broker runtime and the simulator both keep their logs here, so opening, recovering,
checkpointing and truncating a log is written once. Nothing here decides: what to cut, append
or delete comes from the core's Ready.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from localcluster.replication import ready as r
from localcluster.storage import (
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CorruptRecordError,
    Log,
    LogConfig,
    UnexpectedAppendOffsetError,
    read_partition_offsets,
    write_partition_offsets,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> TopicPartition | None:
    topic, sep, number = name.rpartition("-")
    return (topic, int(number)) if sep and topic and number.isdigit() else None


class LogManager:
    def __init__(self, data_dir: Path, checkpoint_dir: Path,
                 log_config: Callable[[dict[str, str] | None], LogConfig]):  # fmt: skip
        self.data_dir = data_dir
        self.checkpoint_dir = checkpoint_dir
        self.log_config = log_config  # topic config overrides -> the log's settings
        self.logs: dict[TopicPartition, Log] = {}

    def open_logs(self) -> dict[TopicPartition, int]:
        """Open (and recover) every partition log in the data dir; the checkpointed HWs."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        recovery_points = read_partition_offsets(
            self.checkpoint_dir / RECOVERY_POINT_OFFSET_CHECKPOINT
        )
        checkpointed_hw = read_partition_offsets(
            self.checkpoint_dir / REPLICATION_OFFSET_CHECKPOINT
        )
        for path in sorted(self.data_dir.iterdir()):
            tp = parse_partition_dir(path.name) if path.is_dir() else None
            if tp is None:
                continue
            opened = Log.open(
                path, self.log_config(None), recovery_point=recovery_points.get(tp, 0)
            )
            self.logs[tp] = opened
            log.info("opened log %s-%d: offsets [%d, %d), checkpointed HW %s%s", tp[0], tp[1],
                     opened.log_start_offset, opened.log_end_offset, checkpointed_hw.get(tp),
                     f", recovery cut {sum(c.bytes_cut for c in opened.cuts)} bytes"
                     if opened.cuts else "")  # fmt: skip
        return checkpointed_hw

    def get_or_create(self, tp: TopicPartition, topic_config: dict[str, str] | None = None) -> Log:
        existing = self.logs.get(tp)
        if existing is None:
            existing = Log.open(
                self.data_dir / partition_dir_name(*tp), self.log_config(topic_config)
            )
            self.logs[tp] = existing
        return existing

    # -- checkpoints -----------------------------------------------------------------------------

    def write_high_watermarks(self, high_watermarks: Mapping[TopicPartition, int]) -> None:
        write_partition_offsets(self.checkpoint_dir / REPLICATION_OFFSET_CHECKPOINT,
                                high_watermarks)  # fmt: skip

    def checkpoint_recovery_points(self) -> None:
        """Flush every log, then record how far each is on disk."""
        points = {tp: lg.flush() for tp, lg in self.logs.items()}
        write_partition_offsets(self.checkpoint_dir / RECOVERY_POINT_OFFSET_CHECKPOINT, points)

    def close(self, high_watermarks: Mapping[TopicPartition, int]) -> None:
        """A clean shutdown: flush, both checkpoints, close every log."""
        self.checkpoint_recovery_points()
        self.write_high_watermarks(high_watermarks)
        for lg in self.logs.values():
            lg.close()
        self.logs.clear()

    def delete_old_segments(self, now_ms: int,
                            high_watermarks: Mapping[TopicPartition, int]) -> list[TopicPartition]:  # fmt: skip
        """Retention (log.retention.*), never past the HW; the partitions whose start moved."""
        return [tp for tp, hw in high_watermarks.items()
                if self.logs[tp].delete_old_segments(now_ms, hw)]  # fmt: skip

    # -- the core's log actions ------------------------------------------------------------------

    def apply(self, action) -> None:
        lg = self.logs.get(action.tp)
        if isinstance(action, r.AssignEpoch):
            lg.leader_epoch_cache.assign(action.leader_epoch, action.start_offset)
        elif isinstance(action, r.TruncateTo):
            lg.truncate_to(action.offset)
        elif isinstance(action, r.TruncateFullyAndStartAt):
            lg.truncate_fully_and_start_at(action.offset)
        else:
            assert isinstance(action, r.DeleteLog), action
            if lg is not None:
                del self.logs[action.tp]
                lg.delete()

    def append_as_follower(self, append: r.FollowerAppend) -> str | None:
        """Append fetched batches; what went wrong (report it to the core), or None."""
        try:
            if len(append.records):
                self.logs[append.tp].append_as_follower(append.records)
        except (UnexpectedAppendOffsetError, CorruptRecordError) as e:
            return str(e)
        return None
