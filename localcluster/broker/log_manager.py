"""LogManager: a broker's partition logs and the checkpoint files beside them (Kafka's
LogManager, plus the HW checkpoint that ReplicaManager writes), and the hands that carry out
the replica core's log actions and follower appends on them.

The broker runtime and the simulator both keep their logs here, so opening, recovering,
checkpointing and truncating a log is written once. Nothing here decides: what to cut, append
or delete comes from the core's Ready.

Beside each log lives its producer state (storage/producer_snapshot.py, Kafka's
ProducerStateManager): loaded with the log, checked on a leader's client append (the rules are
storage/producer_state.py's, pure), replayed from a follower's, rebuilt on truncation,
snapshotted at a segment roll and a clean close. Time for it is wall-clock milliseconds
(`wall_clock_ms`), as producer expiry is measured from batch timestamps.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from localcluster.replication import ready as r
from localcluster.storage import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CorruptRecordError,
    Log,
    LogConfig,
    LogDirectoryFullError,
    LogFlush,
    UnexpectedAppendOffsetError,
    read_partition_offsets,
    write_partition_offsets,
)
from localcluster.storage import record_batch as rb
from localcluster.storage.cleaner import CLEANER_OFFSET_CHECKPOINT, CleanerCheckpoints
from localcluster.storage.producer_snapshot import ProducerStateManager
from localcluster.storage.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    DuplicateBatch,
    ProducerAppendInfo,
    RejectedAppend,
)
from localcluster.topic_config import TopicConfig

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def check_compressed_batches(records, batches: list[tuple[int, rb.BatchHeader]]) -> None:
    """A leader's check of a client's compressed batches (`batches`: as Log.validate found
    them), as Kafka's LogValidator does: the payload must decompress to exactly the records the
    header counts (the CRC covers only the compressed bytes). Raises CorruptRecordError
    (CORRUPT_MESSAGE); plain batches cost nothing."""
    view = memoryview(records)
    for position, header in batches:
        if header.compression:
            for _ in rb.iter_records(view[position : position + header.size]):
                pass  # iter_records raises on a bad payload or a wrong record count


def run_flushes(flushes: list[LogFlush]) -> None:
    """fdatasync what `LogManager.flush_plans` named and write the leader epochs they took
    (the broker: on its checkpoint thread)."""
    for flush in flushes:
        flush.run()


def parse_partition_dir(name: str) -> TopicPartition | None:
    topic, sep, number = name.rpartition("-")
    return (topic, int(number)) if sep and topic and number.isdigit() else None


class LogManager:
    def __init__(self, data_dir: Path, checkpoint_dir: Path,
                 log_config: Callable[[TopicConfig | None], LogConfig],
                 wall_clock_ms: Callable[[], int],
                 producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS):  # fmt: skip
        self.data_dir = data_dir
        self.checkpoint_dir = checkpoint_dir
        self.log_config = log_config  # a topic's config (None: the broker's) -> the log's
        self.wall_clock_ms = wall_clock_ms
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.logs: dict[TopicPartition, Log] = {}
        self.producer_states: dict[TopicPartition, ProducerStateManager] = {}
        self.topic_configs: dict[TopicPartition, TopicConfig] = {}  # the log cleaner reads them
        # beside the logs (Kafka keeps it in each log dir): lost with them, never stale
        self.cleaner_checkpoints = CleanerCheckpoints(data_dir / CLEANER_OFFSET_CHECKPOINT)
        # The checkpoint files' writes (`_write_offsets`): one at a time, newest values last.
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_clock = itertools.count()
        self._checkpoint_written: dict[str, int] = {}
        # A log start moved (DeleteRecords, or a follower taking its leader's) since the host
        # last had log-start-offset-checkpoint written: ReplicaHost.execute clears it
        self.log_starts_moved = False

    def _open_producer_state(self, tp: TopicPartition, lg: Log) -> None:
        self.producer_states[tp] = ProducerStateManager.open(
            lg, self.wall_clock_ms(), self.producer_id_expiration_ms
        )

    def _partition_dirs(self) -> list[tuple[Path, TopicPartition]]:
        """Each partition directory in the data dir, in name order, with its partition."""
        if not self.data_dir.is_dir():
            return []
        return [(path, tp) for path in sorted(self.data_dir.iterdir())
                if path.is_dir() and (tp := parse_partition_dir(path.name)) is not None]  # fmt: skip

    def topics_on_disk(self) -> set[str]:
        """The topics that have a partition directory in the data dir (before `open_logs`)."""
        return {tp[0] for _, tp in self._partition_dirs()}

    def open_logs(
        self, topic_configs: Mapping[str, TopicConfig] | None = None
    ) -> dict[TopicPartition, int]:
        """Open (and recover) every partition log in the data dir; the checkpointed HWs. Each
        log opens with its topic's config where `topic_configs` has it (as Kafka's LogManager
        reads the topics' overrides before loading the logs): its active segment is then made
        to the topic's segment.bytes, not the broker's log.segment.bytes."""
        configs = topic_configs or {}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        recovery_points = read_partition_offsets(
            self.checkpoint_dir / RECOVERY_POINT_OFFSET_CHECKPOINT
        )
        checkpointed_hw = read_partition_offsets(
            self.checkpoint_dir / REPLICATION_OFFSET_CHECKPOINT
        )
        log_starts = read_partition_offsets(self.checkpoint_dir / LOG_START_OFFSET_CHECKPOINT)
        for path, tp in self._partition_dirs():
            topic_config = configs.get(tp[0])
            opened = Log.open(path, self.log_config(topic_config),
                              recovery_point=recovery_points.get(tp, 0),
                              log_start_offset=log_starts.get(tp, 0))  # fmt: skip
            self.logs[tp] = opened
            if topic_config is not None:
                self.topic_configs[tp] = topic_config
            self._open_producer_state(tp, opened)
            log.info("opened log %s-%d: offsets [%d, %d), checkpointed HW %s%s", tp[0], tp[1],
                     opened.log_start_offset, opened.log_end_offset, checkpointed_hw.get(tp),
                     f", recovery cut {sum(c.bytes_cut for c in opened.cuts)} bytes"
                     if opened.cuts else "")  # fmt: skip
        return checkpointed_hw

    def configure(self, tp: TopicPartition, topic_config: TopicConfig) -> None:
        """The topic's current config for an open log (it applies from the next segment)."""
        lg = self.logs.get(tp)
        if lg is not None:
            lg.config = self.log_config(topic_config)
            self.topic_configs[tp] = topic_config

    def get_or_create(self, tp: TopicPartition, topic_config: TopicConfig | None = None) -> Log:
        existing = self.logs.get(tp)
        if existing is None:
            existing = Log.open(
                self.data_dir / partition_dir_name(*tp), self.log_config(topic_config)
            )
            self.logs[tp] = existing
            self._open_producer_state(tp, existing)
            if topic_config is not None:
                self.topic_configs[tp] = topic_config
        return existing

    # -- checkpoints -----------------------------------------------------------------------------

    def write_high_watermarks(self, high_watermarks: Mapping[TopicPartition, int],
                              taken: int | None = None) -> None:  # fmt: skip
        self._write_offsets(REPLICATION_OFFSET_CHECKPOINT, high_watermarks, taken)

    def checkpoint_recovery_points(self) -> None:
        """Flush every log, then record how far each is on disk (and where each starts)."""
        self.write_recovery_points(*self.recovery_points())

    def recovery_points(self) -> tuple[dict, dict, int]:
        """Flush every log: (recovery points, log start offsets, when taken), for
        `write_recovery_points`, which may run on another thread."""
        flushes = self.flush_plans()
        run_flushes(flushes)
        return self.flushed(flushes)

    def flush_plans(self) -> list[LogFlush]:
        """What flushing every log syncs (`run_flushes`, on any thread), then `flushed`."""
        return [lg.flush_plan(state.unsynced_files() if (state := self.producer_states.get(tp))
                              else ())
                for tp, lg in self.logs.items()]  # fmt: skip

    def flushed(self, flushes: list[LogFlush]) -> tuple[dict, dict, int]:
        """After `run_flushes(flushes)`: the logs' recovery points moved, and what
        `write_recovery_points` writes (every log open now, a deleted one left out)."""
        for flush in flushes:
            flush.log.flushed(flush)
        points = {tp: lg.recovery_point for tp, lg in self.logs.items()}
        starts = {tp: lg.log_start_offset for tp, lg in self.logs.items()}
        return points, starts, self.checkpoint_taken()

    def write_recovery_points(self, points: Mapping, starts: Mapping, taken: int) -> None:
        self._write_offsets(RECOVERY_POINT_OFFSET_CHECKPOINT, points, taken)
        self._write_offsets(LOG_START_OFFSET_CHECKPOINT, starts, taken)

    def checkpoint_log_start_offsets(self) -> None:
        """Kafka's log-start-offset-checkpoint, now (the host writes it whenever a start
        moves: `log_starts_moved`)."""
        self.write_log_start_offsets(*self.log_start_offsets())

    def log_start_offsets(self) -> tuple[dict, int]:
        """(every log's start, when taken), for `write_log_start_offsets`, which may run on
        another thread."""
        return {tp: lg.log_start_offset for tp, lg in self.logs.items()}, self.checkpoint_taken()

    def write_log_start_offsets(self, starts: Mapping, taken: int) -> None:
        self._write_offsets(LOG_START_OFFSET_CHECKPOINT, starts, taken)

    def checkpoint_taken(self) -> int:
        """A number that orders checkpoint values by when they were taken (on the loop)."""
        return next(self._checkpoint_clock)

    def _write_offsets(self, name: str, offsets: Mapping, taken: int | None = None) -> None:
        """Write a checkpoint file unless values taken later are in it already: the runtime
        writes the periodic checkpoints on a thread of its own, and a write of older values
        must neither race a newer one for the temp file nor land after it."""
        taken = self.checkpoint_taken() if taken is None else taken
        with self._checkpoint_lock:
            if taken < self._checkpoint_written.get(name, -1):
                return
            write_partition_offsets(self.checkpoint_dir / name, offsets)
            self._checkpoint_written[name] = taken

    def close(self, high_watermarks: Mapping[TopicPartition, int]) -> None:
        """A clean shutdown: flush, both checkpoints, close every log."""
        self.checkpoint_recovery_points()
        self.write_high_watermarks(high_watermarks)
        for tp, lg in self.logs.items():
            self._snapshot(tp)
            lg.close()
        self.logs.clear()
        self.producer_states.clear()

    def _snapshot(self, tp: TopicPartition, sync: bool = True) -> None:
        try:
            self.producer_states[tp].take_snapshot(self.logs[tp].log_end_offset, sync)
        except OSError as e:  # a full disk: the next load replays the log instead
            log.warning("%s-%d: producer state snapshot not written: %s", *tp, e)

    def delete_old_segments(self, now_ms: int,
                            high_watermarks: Mapping[TopicPartition, int]) -> list[TopicPartition]:  # fmt: skip
        """Retention (log.retention.*), never past the HW; the partitions whose start moved."""
        moved = [tp for tp, hw in high_watermarks.items()
                 if self.logs[tp].delete_old_segments(now_ms, hw)]  # fmt: skip
        for tp in moved:
            self.producer_states[tp].truncate_head(self.logs[tp].log_start_offset)
        return moved

    def expire_producers(self) -> None:
        """producer.id.expiration.ms: forget producers idle that long."""
        now_ms = self.wall_clock_ms()
        for state in self.producer_states.values():
            state.state.remove_expired(now_ms)

    # -- appends ---------------------------------------------------------------------------------

    def append_as_leader(self, tp: TopicPartition, records, leader_epoch: int):
        """A client's batches on the leader: validated once (as Kafka's LogValidator, before
        the producer state), then the producer state's verdict (a RejectedAppend or a
        DuplicateBatch appends nothing), then the append; the AppendInfo."""
        lg, producers = self.logs[tp], self.producer_states[tp]
        batches = lg.validate(records)
        check_compressed_batches(records, batches)
        verdict = producers.state.check_client_append([h for _, h in batches], lg.log_end_offset)
        if isinstance(verdict, (RejectedAppend, DuplicateBatch)):
            return verdict
        assert isinstance(verdict, ProducerAppendInfo)
        if lg.config.log_append_time:  # Kafka's LogValidator: the leader's clock, new CRCs
            records, batches = rb.with_log_append_time(records, self.wall_clock_ms()), None
        segment = lg.active_segment.base_offset
        info = lg.append(records, leader_epoch, batches)
        producers.state.apply(verdict)
        if lg.active_segment.base_offset != segment:
            self._snapshot(tp, sync=False)  # Kafka's at every roll, synced by the next flush
        return info

    # -- the core's log actions ------------------------------------------------------------------

    def apply(self, action) -> None:
        lg = self.logs.get(action.tp)
        if isinstance(action, r.AssignEpoch):
            lg.leader_epoch_cache.assign(action.leader_epoch, action.start_offset)
        elif isinstance(action, r.TruncateTo):
            lg.truncate_to(action.offset)
            self.producer_states[action.tp].truncate_to(action.offset, lg, self.wall_clock_ms())
            self.cleaner_checkpoints.truncate_to(action.tp, lg.log_end_offset)
        elif isinstance(action, r.TruncateFullyAndStartAt):
            lg.truncate_fully_and_start_at(action.offset)
            self.producer_states[action.tp].truncate_fully_and_start_at(action.offset)
            self.cleaner_checkpoints.truncate_to(action.tp, action.offset)
        elif isinstance(action, r.IncrementLogStartOffset):
            if lg.increment_log_start_offset(action.offset):
                self.producer_states[action.tp].truncate_head(lg.log_start_offset)
                self.log_starts_moved = True  # the host has the checkpoint written
        else:
            assert isinstance(action, r.DeleteLog), action
            if lg is not None:
                del self.logs[action.tp]
                self.producer_states.pop(action.tp, None)
                self.topic_configs.pop(action.tp, None)
                self.cleaner_checkpoints.remove(action.tp)
                lg.delete()

    def append_as_follower(self, append: r.FollowerAppend) -> str | None:
        """Append fetched batches; what went wrong (report it to the core), or None."""
        try:
            if len(append.records):
                lg = self.logs[append.tp]
                segment = lg.active_segment.base_offset
                info = lg.append_as_follower(append.records)
                # Followers keep the producer state too (unchecked), so a new leader has it.
                self.producer_states[append.tp].state.replay(info.headers)
                if lg.active_segment.base_offset != segment:
                    self._snapshot(append.tp, sync=False)  # as the leader's, at the roll
        except (UnexpectedAppendOffsetError, CorruptRecordError) as e:
            return str(e)
        except LogDirectoryFullError as e:
            # Kept going, not halted (docs/storage.md): the core backs this partition off
            # and fetches again; nothing was written.
            log.warning("%s-%d: follower append refused: %s", *append.tp, e)
            return str(e)
        return None
