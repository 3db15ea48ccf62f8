"""broker/replica_manager.py: the periodic checkpoints are written off the event loop's thread,
one write at a time, and a clean close waits for the write in progress; broker/log_manager.py
keeps the newest values on disk whatever order the writes come in."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from localcluster.broker.config import BrokerConfig
from localcluster.broker.replica_manager import ReplicaManager
from localcluster.protocol.controller_requests import PartitionState
from localcluster.replication import ready as r
from localcluster.storage import Record, encode_batch
from localcluster.storage.checkpoint import read_partition_offsets

DEADLINE_S = 10.0


def test_the_hw_checkpoint_is_written_on_its_own_thread_one_at_a_time(tmp_path):
    manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
    write = manager.log_manager.write_high_watermarks
    writes: list[tuple[str, dict]] = []
    entered, gate = threading.Event(), threading.Event()

    def slow_write(high_watermarks, taken=None):
        writes.append((threading.current_thread().name, dict(high_watermarks)))
        entered.set()
        assert gate.wait(DEADLINE_S)  # a write stuck in fsync
        write(high_watermarks, taken)

    manager.log_manager.write_high_watermarks = slow_write
    manager.core._checkpointed_hw[("t", 0)] = 5
    manager.checkpoint_high_watermarks()
    assert entered.wait(DEADLINE_S)  # the caller went on while the write waits
    manager.core._checkpointed_hw[("t", 0)] = 7  # the write has its own copy of the values
    manager.checkpoint_high_watermarks()  # skipped: one write at a time
    assert [(name.startswith("hw-checkpoint"), hws) for name, hws in writes] == [
        (True, {("t", 0): 5})
    ]
    closing = threading.Thread(target=manager.close, name="closing")
    closing.start()
    gate.set()
    closing.join(DEADLINE_S)
    assert not closing.is_alive()
    # close waited for the write in progress, then wrote the latest values itself
    assert [hws for _, hws in writes] == [{("t", 0): 5}, {("t", 0): 7}]
    assert writes[1][0] == "closing"
    assert read_partition_offsets(tmp_path / "replication-offset-checkpoint") == {("t", 0): 7}


def test_a_failed_checkpoint_write_is_logged_and_the_next_round_writes(tmp_path, caplog):
    manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
    write = manager.log_manager.write_high_watermarks
    failures = [OSError(28, "No space left on device")]

    def failing_once(high_watermarks, taken=None):
        if failures:
            raise failures.pop()
        write(high_watermarks, taken)

    manager.log_manager.write_high_watermarks = failing_once
    manager.core._checkpointed_hw[("t", 0)] = 3
    manager.checkpoint_high_watermarks()
    manager._hw_checkpoint.exception(DEADLINE_S)  # wait for it (it failed)
    manager.checkpoint_high_watermarks()
    assert manager._hw_checkpoint.result(DEADLINE_S) is None
    assert read_partition_offsets(tmp_path / "replication-offset-checkpoint") == {("t", 0): 3}
    assert "periodic checkpoint failed" in caplog.text
    manager.close()


def test_the_logs_are_synced_and_the_recovery_points_written_on_the_thread(tmp_path, monkeypatch):
    """fdatasync of a log on a disk blocked the event loop 0.3-1.6 s per round: the sync and
    the checkpoint write both run on the checkpoint thread, never on the loop's."""
    import localcluster.storage.log as log_module

    synced: list[tuple[str, str]] = []
    fdatasync = log_module.os.fdatasync

    def recording_fdatasync(fd):
        synced.append((threading.current_thread().name, Path(f"/proc/self/fd/{fd}").resolve().name))
        fdatasync(fd)

    monkeypatch.setattr(log_module.os, "fdatasync", recording_fdatasync)

    async def run():
        manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
        lg = manager.log_manager.get_or_create(("t", 0))
        lg.append(encode_batch([Record(b"v") for _ in range(3)]), leader_epoch=0)
        writers = []
        write = manager.log_manager.write_recovery_points

        def recording(*args):
            writers.append(threading.current_thread().name)
            write(*args)

        manager.log_manager.write_recovery_points = recording
        manager.checkpoint_recovery_points()
        assert lg.recovery_point == 0  # nothing synced on the loop
        await wait_for(lambda: writers, "the recovery-point checkpoint written")
        await asyncio.wrap_future(manager._recovery_checkpoint)
        round_writers, round_syncs = list(writers), list(synced)
        manager.close()  # a clean close syncs and writes again, on the caller's thread
        return lg.recovery_point, round_writers, round_syncs

    point, writers, syncs = asyncio.run(run())
    assert point == 3
    assert writers and all(w.startswith("hw-checkpoint") for w in writers)
    assert syncs and all(thread.startswith("hw-checkpoint") for thread, _ in syncs)
    assert {name for _, name in syncs} == {
        "00000000000000000000.log", "00000000000000000000.index",
        "00000000000000000000.timeindex",
    }  # fmt: skip
    assert read_partition_offsets(tmp_path / "recovery-point-offset-checkpoint") == {("t", 0): 3}
    assert read_partition_offsets(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 0}


def test_a_truncation_during_the_sync_keeps_the_recovery_point_where_it_was(tmp_path, monkeypatch):
    """Records written after a cut made while the thread synced were not synced: the round
    must not move the recovery point over them (a crash would then trust them unchecked)."""
    import localcluster.storage.log as log_module

    entered, gate = threading.Event(), threading.Event()
    fdatasync = log_module.os.fdatasync

    def slow_fdatasync(fd):
        entered.set()
        assert gate.wait(DEADLINE_S)
        fdatasync(fd)

    async def run():
        manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
        lg = manager.log_manager.get_or_create(("t", 0))
        lg.append(encode_batch([Record(b"v") for _ in range(4)]), leader_epoch=0)
        lg.append(encode_batch([Record(b"v") for _ in range(6)]), leader_epoch=0)
        monkeypatch.setattr(log_module.os, "fdatasync", slow_fdatasync)
        manager.checkpoint_recovery_points()
        assert await asyncio.to_thread(entered.wait, DEADLINE_S)
        lg.truncate_to(4)  # a follower cut back to its new leader
        lg.append(encode_batch([Record(b"w") for _ in range(8)]), leader_epoch=1)  # unsynced
        gate.set()
        await wait_for(lambda: read_partition_offsets(
            tmp_path / "recovery-point-offset-checkpoint"), "the checkpoint written")  # fmt: skip
        point = lg.recovery_point
        monkeypatch.setattr(log_module.os, "fdatasync", fdatasync)
        manager.close()
        return point

    # The round leaves the point where the cut put it (the next round moves it): records
    # below the cut may have been written after the round named its files, too.
    assert asyncio.run(run()) == 0
    # the close flushed everything before it wrote the file again
    assert read_partition_offsets(tmp_path / "recovery-point-offset-checkpoint") == {("t", 0): 12}


async def wait_for(condition, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        assert loop.time() < deadline, f"not within {DEADLINE_S} s: {what}"
        await asyncio.sleep(0.005)


def test_values_taken_earlier_never_overwrite_newer_ones_on_disk(tmp_path):
    manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
    logs = manager.log_manager
    older, newer = logs.checkpoint_taken(), logs.checkpoint_taken()
    logs.write_high_watermarks({("t", 0): 9}, newer)
    logs.write_high_watermarks({("t", 0): 4}, older)  # a late write of older values
    assert read_partition_offsets(tmp_path / "replication-offset-checkpoint") == {("t", 0): 9}
    logs.write_high_watermarks({("t", 0): 10})  # a write without a time is taken now
    assert read_partition_offsets(tmp_path / "replication-offset-checkpoint") == {("t", 0): 10}


def test_a_leader_and_isr_needs_the_configs_of_the_topics_it_starts_hosting_only(tmp_path):
    """Kafka reads a topic's config when it creates the partition; a hosted partition has its
    configs (AlterConfigs reaches it through apply_topic_config), so a new controller's full
    LeaderAndIsr of hosted partitions reads nothing from the store."""

    async def run():
        manager = ReplicaManager(BrokerConfig(broker_id=1), tmp_path / "data", tmp_path)
        hosted = PartitionState("t", 0, 1, 1, 0, (1, 2), 0, (1, 2))
        assert manager.topics_to_configure([hosted]) == {"t"}
        manager.lead_or_follow(1, [hosted], {})
        new = PartitionState("u", 0, 1, 2, 0, (2, 1), 0, (2, 1))
        again = PartitionState("t", 0, 2, 1, 0, (1, 2), 0, (1, 2))
        assert manager.topics_to_configure([again, new]) == {"u"}
        manager.close()

    asyncio.run(run())


def test_a_moved_log_start_is_written_on_the_thread_and_delete_records_waits_for_it(tmp_path):
    """A follower takes its leader's start from every fetch answer that moves it (under
    retention, several times a second); each write fsyncs on the broker's disk, which blocked
    the event loop 7-35 ms a time until Dec 2026. Moves during a write are covered by one more
    write after it; `log_starts_written` (DeleteRecords' answer) waits until they are on disk."""

    async def run():
        manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
        lg = manager.log_manager.get_or_create(("t", 0))
        lg.append(encode_batch([Record(b"v") for _ in range(10)]), leader_epoch=0)
        write = manager.log_manager.write_log_start_offsets
        writes: list[tuple[str, dict]] = []
        entered, gate = threading.Event(), threading.Event()

        def slow_write(starts, taken):
            writes.append((threading.current_thread().name, dict(starts)))
            entered.set()
            assert gate.wait(DEADLINE_S)  # a write stuck in fsync
            write(starts, taken)

        manager.log_manager.write_log_start_offsets = slow_write
        manager.execute(r.Ready(log_actions=[r.IncrementLogStartOffset(("t", 0), 2)]))
        assert await asyncio.to_thread(entered.wait, DEADLINE_S)  # the loop went on
        for offset in (4, 6):  # two more moves while the first write waits
            manager.execute(r.Ready(log_actions=[r.IncrementLogStartOffset(("t", 0), offset)]))
        written = asyncio.ensure_future(manager.log_starts_written())
        await asyncio.sleep(0)
        assert not written.done()
        gate.set()
        await asyncio.wait_for(written, DEADLINE_S)
        assert [(name.startswith("hw-checkpoint"), starts) for name, starts in writes] == [
            (True, {("t", 0): 2}), (True, {("t", 0): 6})]  # fmt: skip
        assert read_partition_offsets(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 6}
        await manager.log_starts_written()  # nothing moved since: at once
        manager.close()

    asyncio.run(run())


def test_a_failed_log_start_write_reaches_its_waiter_and_the_next_wait_writes_again(tmp_path):
    """DeleteRecords answers KAFKA_STORAGE_ERROR then, rather than a deletion a kill -9 undoes."""

    async def run():
        manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
        lg = manager.log_manager.get_or_create(("t", 0))
        lg.append(encode_batch([Record(b"v") for _ in range(10)]), leader_epoch=0)
        write = manager.log_manager.write_log_start_offsets
        failures = [OSError(28, "No space left on device")]
        gate = threading.Event()

        def failing_once(starts, taken):
            assert gate.wait(DEADLINE_S)
            if failures:
                raise failures.pop()
            write(starts, taken)

        manager.log_manager.write_log_start_offsets = failing_once
        manager.execute(r.Ready(log_actions=[r.IncrementLogStartOffset(("t", 0), 3)]))
        waiting = asyncio.ensure_future(manager.log_starts_written())
        await asyncio.sleep(0)  # it waits for the write under way
        gate.set()
        with pytest.raises(OSError, match="No space left"):
            await asyncio.wait_for(waiting, DEADLINE_S)
        await asyncio.wait_for(manager.log_starts_written(), DEADLINE_S)  # written again
        assert read_partition_offsets(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 3}
        manager.close()

    asyncio.run(run())


def test_the_snapshot_at_a_roll_is_written_unsynced_and_synced_by_the_next_flush(
    tmp_path, monkeypatch
):
    """Kafka writes the producer snapshot at a roll and syncs it in the background: an fsync
    of it (and of its directory) on the event loop, at every roll, stalled a broker on a disk."""
    import localcluster.storage.checkpoint as checkpoint_module
    from localcluster.broker.log_manager import LogManager, run_flushes
    from localcluster.storage import BatchSpec, LogConfig

    logs = LogManager(tmp_path / "data", tmp_path, lambda _config: LogConfig(segment_bytes=1024),
                      lambda: 1_000)  # fmt: skip
    logs.open_logs()
    lg = logs.get_or_create(("t", 0))
    fsyncs = []
    fsync = checkpoint_module.os.fsync

    def recording_fsync(fd):
        fsyncs.append(Path(f"/proc/self/fd/{fd}").resolve().name)
        fsync(fd)

    monkeypatch.setattr(checkpoint_module.os, "fsync", recording_fsync)
    sequence = 0
    while len(lg.segments) < 2:  # idempotent batches until the log rolls
        records = [Record(b"v" * 100) for _ in range(4)]
        logs.append_as_leader(("t", 0), encode_batch(records, BatchSpec(
            producer_id=7, producer_epoch=0, base_sequence=sequence)), leader_epoch=0)  # fmt: skip
        sequence += 4
    (snapshot,) = lg.directory.glob("*.snapshot")
    assert fsyncs == ["leader-epoch-checkpoint.tmp", "t-0"]  # epoch 0's, synced at once
    flushes = logs.flush_plans()
    assert {snapshot, lg.directory} <= set(flushes[0].paths)
    run_flushes(flushes)
    logs.flushed(flushes)
    assert not {snapshot, lg.directory} & set(logs.flush_plans()[0].paths)  # synced once


def test_a_moved_log_start_is_written_to_the_epoch_checkpoint_by_the_next_flush_on_the_thread(
    tmp_path, monkeypatch
):
    """Under retention a log start moves once per deleted segment per partition, and each move
    rewrote leader-epoch-checkpoint (two fsyncs) on the event loop; Kafka 3.7+ writes it in the
    background (KAFKA-15046). Here the recovery-point round writes it, on the thread."""
    import localcluster.storage.checkpoint as checkpoint_module
    from localcluster.storage import LEADER_EPOCH_CHECKPOINT, LeaderEpochCache

    writes: list[tuple[str, str]] = []
    write = checkpoint_module.write_atomically

    def recording(path, data, *args, **kwargs):
        writes.append((threading.current_thread().name, Path(path).name))
        write(path, data, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "write_atomically", recording)

    async def run():
        manager = ReplicaManager(BrokerConfig(), tmp_path / "data", tmp_path)
        lg = manager.log_manager.get_or_create(("t", 0))
        for epoch in (0, 1):
            lg.append(encode_batch([Record(b"v") for _ in range(5)]), leader_epoch=epoch)
        epochs = lg.directory / LEADER_EPOCH_CHECKPOINT
        assert LeaderEpochCache(epochs).entries() == [(0, 0), (1, 5)]
        writes.clear()
        assert lg.increment_log_start_offset(7)  # DeleteRecords, or a follower's start
        assert lg.leader_epoch_cache.entries() == [(1, 7)]
        assert LeaderEpochCache(epochs).entries() == [(0, 0), (1, 5)]  # not on the loop
        assert not any(name == LEADER_EPOCH_CHECKPOINT for _, name in writes)
        manager.checkpoint_recovery_points()
        await wait_for(lambda: LeaderEpochCache(epochs).entries() == [(1, 7)],
                       "the epochs written by the flush")  # fmt: skip
        epoch_writers = [thread for thread, name in writes if name == LEADER_EPOCH_CHECKPOINT]
        manager.close()
        return epoch_writers

    epoch_writers = asyncio.run(run())
    assert len(epoch_writers) == 1 and epoch_writers[0].startswith("hw-checkpoint")
