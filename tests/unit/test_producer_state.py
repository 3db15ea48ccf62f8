"""Producer state (idempotent producer): the leader's checks, replay, expiry, and snapshots.

The pure part is driven with real batch headers and no files; the snapshot layer with a real
Log in a fresh directory. Every expectation is Kafka 3.8's (ProducerAppendInfo,
UnifiedLog.analyzeAndValidateProducerState, ProducerStateManager).
"""

from __future__ import annotations

import logging
import struct

import pytest

from localcluster.storage import BatchSpec, Log, LogConfig, Record, encode_batch
from localcluster.storage import record_batch as rb
from localcluster.storage.producer_snapshot import (
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
    list_snapshots,
    snapshot_file_name,
)
from localcluster.storage.producer_state import (
    INT32_MAX,
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    NUM_BATCHES_TO_RETAIN,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    BatchMetadata,
    DuplicateBatch,
    ProducerAppendInfo,
    ProducerState,
    ProducerStateEntry,
    RejectedAppend,
    last_sequence,
)

PID = 1000
SMALL = LogConfig(segment_bytes=1024, segment_index_bytes=80)


def batch(pid=PID, epoch=0, seq=0, n=1, ts=1000, base_offset=0, attributes=0) -> bytes:
    records = [Record(b"v%d" % i, timestamp=ts) for i in range(n)]
    return encode_batch(records, BatchSpec(base_offset=base_offset, producer_id=pid,
                                           producer_epoch=epoch, base_sequence=seq,
                                           attributes=attributes))  # fmt: skip


def header(**kwargs) -> rb.BatchHeader:
    return rb.read_header(batch(**kwargs))


class Leader:
    """The broker's leader append path over the pure state, with a log end and no log."""

    def __init__(self, state: ProducerState | None = None, log_end: int = 0):
        self.state = state or ProducerState(map_end_offset=log_end)
        self.log_end = log_end

    def produce(self, *headers: rb.BatchHeader):
        verdict = self.state.check_client_append(headers, self.log_end)
        if isinstance(verdict, ProducerAppendInfo):
            self.state.apply(verdict)
            self.log_end = verdict.end_offset
        return verdict

    def accepted(self, **kwargs) -> ProducerAppendInfo:
        verdict = self.produce(header(**kwargs))
        assert isinstance(verdict, ProducerAppendInfo), verdict
        return verdict


def rejected(verdict, code: int) -> bool:
    return isinstance(verdict, RejectedAppend) and verdict.error_code == code


def seq_ranges(entry: ProducerStateEntry) -> list[tuple[int, int]]:
    return [(b.first_seq, b.last_seq) for b in entry.batches]


# -- the leader's checks ----------------------------------------------------------------------


def test_in_order_batches_are_accepted_and_remembered():
    leader = Leader(log_end=10)
    info = leader.accepted(seq=0, n=3, ts=5)
    assert (info.start_offset, info.end_offset) == (10, 13)
    leader.accepted(seq=3, n=2, ts=6)
    entry = leader.state.entry(PID)
    assert seq_ranges(entry) == [(0, 2), (3, 4)]
    assert [(b.first_offset, b.last_offset) for b in entry.batches] == [(10, 12), (13, 14)]
    assert (entry.producer_epoch, entry.last_seq, entry.last_timestamp) == (0, 4, 6)
    assert leader.state.map_end_offset == 15


def test_only_the_last_five_batches_are_kept():
    leader = Leader()
    for k in range(8):
        leader.accepted(seq=2 * k, n=2)
    assert seq_ranges(leader.state.entry(PID)) == [(2 * k, 2 * k + 1) for k in range(3, 8)]
    assert len(leader.state.entry(PID).batches) == NUM_BATCHES_TO_RETAIN


@pytest.mark.parametrize("back", range(1, 6))
def test_a_retry_of_each_of_the_last_five_is_a_duplicate_with_its_offsets(back):
    leader = Leader(log_end=100)
    infos = [leader.accepted(seq=3 * k, n=3, ts=50 + k) for k in range(7)]
    before = (dict(leader.state.producers), leader.state.map_end_offset)
    k = 7 - back
    verdict = leader.produce(header(seq=3 * k, n=3, ts=999))
    assert verdict == DuplicateBatch(PID, infos[k].start_offset, infos[k].end_offset - 1, 50 + k)
    assert (dict(leader.state.producers), leader.state.map_end_offset) == before


def test_a_retry_older_than_the_last_five_is_out_of_order():
    leader = Leader()
    for k in range(7):
        leader.accepted(seq=k)
    assert rejected(leader.produce(header(seq=1)), OUT_OF_ORDER_SEQUENCE_NUMBER)


def test_a_duplicate_needs_the_same_sequence_range():
    leader = Leader()
    leader.accepted(seq=0, n=3)
    assert rejected(leader.produce(header(seq=0, n=2)), OUT_OF_ORDER_SEQUENCE_NUMBER)


@pytest.mark.parametrize("seq", [3, 7, 1, 0])  # 2 is next: 3 and 7 leave gaps, 1 and 0 overlap
def test_a_gap_or_a_step_back_is_out_of_order_and_changes_nothing(seq):
    leader = Leader()
    leader.accepted(seq=0, n=1)
    leader.accepted(seq=1, n=1)
    before = dict(leader.state.producers)
    verdict = leader.produce(header(seq=seq, n=2))
    assert rejected(verdict, OUT_OF_ORDER_SEQUENCE_NUMBER) and verdict.producer_id == PID
    assert dict(leader.state.producers) == before and leader.log_end == 2


def test_an_old_epoch_is_fenced():
    leader = Leader()
    leader.accepted(epoch=3, seq=0)
    assert rejected(leader.produce(header(epoch=2, seq=1)), INVALID_PRODUCER_EPOCH)
    # A retry from the old epoch is fenced too, not answered as a duplicate.
    leader.accepted(epoch=4, seq=0)
    assert rejected(leader.produce(header(epoch=3, seq=0)), INVALID_PRODUCER_EPOCH)


def test_a_new_epoch_starts_at_zero_and_forgets_the_old_batches():
    leader = Leader()
    leader.accepted(epoch=0, seq=0, n=5)
    leader.accepted(epoch=0, seq=5, n=5)
    leader.accepted(epoch=1, seq=0, n=2)
    entry = leader.state.entry(PID)
    assert (entry.producer_epoch, seq_ranges(entry)) == (1, [(0, 1)])
    # The old epoch's batch with the same range is no duplicate any more.
    assert rejected(leader.produce(header(epoch=0, seq=0, n=5)), INVALID_PRODUCER_EPOCH)


def test_a_new_epoch_at_a_nonzero_sequence_is_out_of_order():
    leader = Leader()
    leader.accepted(epoch=0, seq=0)
    assert rejected(leader.produce(header(epoch=1, seq=1)), OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert leader.state.entry(PID).producer_epoch == 0


def test_an_unknown_producer_may_start_at_any_sequence():
    leader = Leader()
    leader.accepted(pid=7, epoch=2, seq=41, n=2)
    assert leader.state.entry(7).last_seq == 42
    assert rejected(leader.produce(header(pid=7, epoch=2, seq=44)), OUT_OF_ORDER_SEQUENCE_NUMBER)
    leader.accepted(pid=7, epoch=2, seq=43)


def test_a_producer_without_an_epoch_is_not_sequence_checked():
    # Kafka skips the sequence check while the producer's entry has no epoch (-1).
    leader = Leader()
    leader.accepted(epoch=-1, seq=3)
    leader.accepted(epoch=-1, seq=9)
    assert seq_ranges(leader.state.entry(PID)) == [(3, 3), (9, 9)]
    leader.accepted(epoch=0, seq=17)  # and a first epoch may start anywhere
    assert rejected(leader.produce(header(epoch=0, seq=19)), OUT_OF_ORDER_SEQUENCE_NUMBER)


def test_the_sequence_wraps_at_int_max():
    leader = Leader()
    leader.accepted(seq=INT32_MAX - 1, n=2)
    assert leader.state.entry(PID).last_seq == INT32_MAX
    leader.accepted(seq=0, n=1)
    assert seq_ranges(leader.state.entry(PID)) == [(INT32_MAX - 1, INT32_MAX), (0, 0)]


def test_a_batch_whose_last_sequence_overflows_wraps_like_kafka():
    h = header(seq=INT32_MAX - 1, n=5)
    assert last_sequence(h) == 2  # MAX-1, MAX, 0, 1, 2
    leader = Leader()
    leader.produce(h)
    assert seq_ranges(leader.state.entry(PID)) == [(INT32_MAX - 1, 2)]
    assert isinstance(leader.produce(header(seq=INT32_MAX - 1, n=5)), DuplicateBatch)
    leader.accepted(seq=3)


def test_non_idempotent_batches_are_ignored():
    leader = Leader()
    info = leader.produce(header(pid=-1, epoch=-1, seq=-1, n=4))
    assert isinstance(info, ProducerAppendInfo) and info.updates == {}
    assert leader.state.producers == {} and leader.state.map_end_offset == 4
    leader.accepted(seq=0)
    assert leader.produce(header(pid=-1, epoch=-1, seq=-1)).updates == {}
    assert leader.state.entry(PID).batches[0].last_offset == 4


@pytest.mark.parametrize(("seq", "attributes"), [(-1, 0), (-5, 0), (0, rb.CONTROL_FLAG)])
def test_negative_sequences_and_control_batches_from_clients_are_invalid(seq, attributes):
    leader = Leader()
    verdict = leader.produce(header(seq=0, n=1), header(seq=seq, attributes=attributes))
    assert rejected(verdict, INVALID_RECORD)
    assert leader.state.producers == {}


# -- several batches in one request -----------------------------------------------------------


def test_each_batch_of_a_request_is_checked_against_the_ones_before_it():
    leader = Leader()
    leader.accepted(seq=0)
    info = leader.produce(header(seq=1, n=2), header(pid=2, seq=0), header(seq=3))
    assert info.updates[PID].last_seq == 3 and info.end_offset == 5
    assert seq_ranges(leader.state.entry(PID)) == [(0, 0), (1, 2), (3, 3)]
    assert [b.last_offset for b in leader.state.entry(PID).batches] == [0, 2, 4]


def test_a_bad_batch_in_the_middle_changes_nothing():
    leader = Leader()
    leader.accepted(seq=0)
    before = (dict(leader.state.producers), leader.state.map_end_offset)
    verdict = leader.produce(header(seq=1), header(pid=2, seq=0), header(seq=5), header(seq=2))
    assert rejected(verdict, OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert (dict(leader.state.producers), leader.state.map_end_offset) == before


def test_a_new_epoch_in_a_request_applies_to_the_batches_after_it():
    leader = Leader()
    leader.accepted(epoch=0, seq=0)
    assert rejected(leader.produce(header(epoch=1, seq=0), header(epoch=0, seq=1)),
                    INVALID_PRODUCER_EPOCH)  # fmt: skip
    info = leader.produce(header(epoch=1, seq=0), header(epoch=1, seq=1))
    assert seq_ranges(info.updates[PID]) == [(0, 0), (1, 1)]


def test_a_duplicate_anywhere_answers_the_whole_request():
    # Kafka returns the first duplicate's offsets and appends none of the request's batches.
    leader = Leader()
    leader.accepted(seq=0)
    verdict = leader.produce(header(seq=1), header(seq=0))
    assert verdict == DuplicateBatch(PID, 0, 0, 1000)
    assert leader.state.map_end_offset == 1


def test_a_batch_repeated_within_one_request_is_out_of_order():
    # Duplicates are looked up in the state before the request, as Kafka does.
    leader = Leader()
    leader.accepted(seq=0)
    assert rejected(leader.produce(header(seq=1), header(seq=1)), OUT_OF_ORDER_SEQUENCE_NUMBER)


def test_a_new_producer_takes_any_sequences_within_its_first_request():
    # Kafka checks sequences only against a producer the state already held.
    leader = Leader()
    leader.produce(header(seq=5), header(seq=9))
    assert seq_ranges(leader.state.entry(PID)) == [(5, 5), (9, 9)]


def test_a_stale_append_info_cannot_be_applied_twice():
    state = ProducerState()
    info = state.check_client_append([header(seq=0)], 0)
    other = state.check_client_append([header(pid=2, seq=0)], 0)
    state.apply(info)
    with pytest.raises(AssertionError, match="stale"):
        state.apply(other)


# -- followers, expiry -------------------------------------------------------------------------


def test_replicated_batches_update_the_state_without_checks():
    state = ProducerState()
    state.replay([header(epoch=5, seq=10, base_offset=0), header(epoch=5, seq=20, base_offset=1),
                  header(pid=-1, epoch=-1, seq=-1, base_offset=2)])  # fmt: skip
    state.replay([header(epoch=3, seq=7, n=2, base_offset=7)])  # a lower epoch: applied as is
    entry = state.entry(PID)
    assert (entry.producer_epoch, seq_ranges(entry)) == (3, [(7, 8)])
    assert entry.batches[0].last_offset == 8 and state.map_end_offset == 9


def test_idle_producers_expire():
    state = ProducerState(producer_id_expiration_ms=1000)
    state.replay([header(pid=1, ts=100, base_offset=0), header(pid=2, ts=600, base_offset=1)])
    assert state.remove_expired(now_ms=1099) == []
    assert state.remove_expired(now_ms=1100) == [1]
    assert list(state.producers) == [2]
    leader = Leader(state, log_end=2)
    leader.accepted(pid=1, seq=77)  # an expired producer is unknown: any sequence
    assert state.remove_expired(now_ms=1600) == [2]


# -- snapshots -------------------------------------------------------------------------------


@pytest.fixture
def lg(tmp_path):
    opened = Log.open(tmp_path / "t-0", SMALL)
    yield opened
    opened.close()


def leader_append(lg: Log, manager: ProducerStateManager, data: bytes):
    """The broker's path: check, append to the log, apply."""
    headers = [h for _, h in rb.iter_batches(data, check_crc=False)]
    verdict = manager.state.check_client_append(headers, lg.log_end_offset)
    if isinstance(verdict, ProducerAppendInfo):
        lg.append(data, leader_epoch=0)
        manager.state.apply(verdict)
    return verdict


def fill(lg: Log, manager: ProducerStateManager, producers=(1, 2, 3), rounds=6, first=0):
    for r in range(first, first + rounds):
        for pid in producers:
            info = leader_append(lg, manager, batch(pid=pid, epoch=pid % 2, seq=2 * r, n=2,
                                                    ts=1000 + r))  # fmt: skip
            assert isinstance(info, ProducerAppendInfo)


def last_batches(state: ProducerState) -> dict:
    return {pid: (e.producer_epoch, e.batches[-1], e.last_timestamp)
            for pid, e in state.producers.items()}  # fmt: skip


def test_snapshot_layout_is_kafkas():
    entry = ProducerStateEntry(7, 3, (BatchMetadata(9, 100, 4, 55),), 55)
    data = encode_snapshot([entry])
    version, crc, count = struct.unpack_from(">hIi", data)
    assert (version, count, len(data)) == (1, 1, 10 + 46)
    assert crc == rb.crc32c(data[6:])
    assert struct.unpack_from(">qhiqiqiq", data, 10) == (7, 3, 9, 100, 4, 55, -1, -1)
    assert decode_snapshot(data, 101) == [entry]
    assert snapshot_file_name(101) == "00000000000000000101.snapshot"


def test_snapshot_round_trip_keeps_each_producers_last_batch(lg):
    manager = ProducerStateManager.open(lg, now_ms=0)
    fill(lg, manager)
    path = manager.take_snapshot(lg.log_end_offset)
    assert path.name == snapshot_file_name(lg.log_end_offset)
    assert manager.take_snapshot() is None  # nothing new since
    reopened = ProducerStateManager.open(lg, now_ms=2000)
    assert last_batches(reopened.state) == last_batches(manager.state)
    assert all(len(e.batches) == 1 for e in reopened.state.producers.values())
    # Only the last batch is known for dedup after the load, as in Kafka.
    assert isinstance(leader_append(lg, reopened, batch(pid=1, epoch=1, seq=10, n=2)),
                      DuplicateBatch)  # fmt: skip
    assert rejected(leader_append(lg, reopened, batch(pid=1, epoch=1, seq=8, n=2)),
                    OUT_OF_ORDER_SEQUENCE_NUMBER)  # fmt: skip


def test_load_replays_the_log_after_the_snapshot(lg):
    manager = ProducerStateManager.open(lg, now_ms=0)
    fill(lg, manager, rounds=3)
    manager.take_snapshot(lg.log_end_offset)
    fill_more = [batch(pid=1, epoch=1, seq=6 + 2 * r, n=2, ts=2000 + r) for r in range(4)]
    for data in fill_more:
        leader_append(lg, manager, data)
    reopened = ProducerStateManager.open(lg, now_ms=0)
    assert last_batches(reopened.state) == last_batches(manager.state)
    assert seq_ranges(reopened.state.entry(1)) == [(4, 5), (6, 7), (8, 9), (10, 11), (12, 13)]
    assert reopened.state.map_end_offset == lg.log_end_offset
    # The load leaves a snapshot at the log end, so the next start replays nothing.
    assert list_snapshots(lg.directory)[-1] == lg.log_end_offset


def test_expired_producers_are_not_loaded_from_a_snapshot(lg):
    manager = ProducerStateManager(lg.directory, producer_id_expiration_ms=500)
    leader_append(lg, manager, batch(pid=1, seq=0, ts=100))
    leader_append(lg, manager, batch(pid=2, seq=0, ts=400))
    manager.take_snapshot(lg.log_end_offset)
    reopened = ProducerStateManager.open(lg, now_ms=650, producer_id_expiration_ms=500)
    assert list(reopened.state.producers) == [2]


def corrupt(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "garbage":
        data = bytearray(b"\x17not a snapshot at all\x00" * 3)
    elif how == "flipped byte":
        data[len(data) // 2] ^= 0x10
    elif how == "truncated":
        data = data[: len(data) - 7]
    elif how == "zero-length":
        data = bytearray()
    elif how == "wrong version":
        data[0:2] = b"\x00\x02"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["garbage", "flipped byte", "truncated", "zero-length",
                                 "wrong version"])  # fmt: skip
def test_a_corrupt_snapshot_is_deleted_and_the_state_rebuilt_from_the_log(lg, how, caplog):
    manager = ProducerStateManager.open(lg, now_ms=0)
    fill(lg, manager)
    path = manager.take_snapshot(lg.log_end_offset)
    corrupt(path, how)
    with caplog.at_level(logging.WARNING, logger="localcluster.storage.producer_snapshot"):
        reopened = ProducerStateManager.open(lg, now_ms=0)
    assert any(path.name in r.getMessage() for r in caplog.records), caplog.text
    # Rebuilt from the whole log: the very state it had, last five batches included.
    assert dict(reopened.state.producers) == dict(manager.state.producers)
    assert list_snapshots(lg.directory) == [lg.log_end_offset]  # a fresh one, rewritten
    assert decode_snapshot(path.read_bytes(), lg.log_end_offset)


def test_a_corrupt_newest_snapshot_falls_back_to_an_older_one(lg, caplog):
    manager = ProducerStateManager.open(lg, now_ms=0)
    fill(lg, manager, rounds=2)
    older = manager.take_snapshot(lg.log_end_offset)
    fill(lg, manager, rounds=2, first=2)
    newest = manager.take_snapshot(lg.log_end_offset)
    corrupt(newest, "flipped byte")
    with caplog.at_level(logging.INFO, logger="localcluster.storage.producer_snapshot"):
        reopened = ProducerStateManager.open(lg, now_ms=0)
    assert older.name in caplog.text and newest.name in caplog.text
    assert last_batches(reopened.state) == last_batches(manager.state)


def test_snapshots_above_the_log_end_are_deleted_on_load(lg):
    manager = ProducerStateManager.open(lg, now_ms=0)
    fill(lg, manager, rounds=2)
    manager.take_snapshot(lg.log_end_offset)
    stray = manager.snapshot_path(lg.log_end_offset + 50)
    stray.write_bytes(encode_snapshot([]))
    ProducerStateManager.open(lg, now_ms=0)
    assert not stray.exists()


def test_snapshots_below_the_log_start_are_deleted_on_load(tmp_path):
    # A crash between retention deleting segments and truncate_head leaves such files.
    config = LogConfig(segment_bytes=1024, segment_index_bytes=80, retention_bytes=1,
                       retention_ms=-1)  # fmt: skip
    lg = Log.open(tmp_path / "t-0", config)
    manager = ProducerStateManager.open(lg, now_ms=0)
    fill(lg, manager, rounds=2)
    old = manager.take_snapshot(lg.roll().base_offset)
    fill(lg, manager, rounds=1, first=2)
    assert lg.delete_old_segments(now_ms=0) == 1
    fill(lg, manager, rounds=1, first=3)
    lg.roll()
    fill(lg, manager, rounds=1, first=4)
    assert lg.delete_old_segments(now_ms=0) == 1
    assert old.exists() and int(old.stem) < lg.log_start_offset
    ProducerStateManager.open(lg, now_ms=0)
    assert not old.exists()
    lg.close()


# -- truncation and retention -----------------------------------------------------------------


def test_truncate_to_rebuilds_from_the_remaining_log(lg):
    manager = ProducerStateManager.open(lg, now_ms=0)
    fill(lg, manager, producers=(1,), rounds=3)
    middle = lg.log_end_offset
    manager.take_snapshot(middle)
    fill(lg, manager, producers=(2,), rounds=3)
    manager.take_snapshot(lg.log_end_offset)
    lg.truncate_to(middle + 2)
    manager.truncate_to(middle + 2, lg, now_ms=0)
    assert list_snapshots(lg.directory) == [middle, middle + 2]
    assert seq_ranges(manager.state.entry(1)) == [(4, 5)]  # from the snapshot: last batch only
    assert seq_ranges(manager.state.entry(2)) == [(0, 1)]  # replayed from the log
    assert manager.state.map_end_offset == lg.log_end_offset


def test_truncate_fully_and_start_at_forgets_everything(lg):
    manager = ProducerStateManager.open(lg, now_ms=0)
    fill(lg, manager, rounds=2)
    manager.take_snapshot(lg.log_end_offset)
    lg.truncate_fully_and_start_at(500)
    manager.truncate_fully_and_start_at(500)
    assert manager.state.producers == {} and manager.state.map_end_offset == 500
    assert list_snapshots(lg.directory) == []
    assert ProducerStateManager.open(lg, now_ms=0).state.producers == {}


def test_truncate_head_deletes_older_snapshots_and_keeps_producers(tmp_path):
    lg = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1024, segment_index_bytes=80,
                                              retention_bytes=1, retention_ms=-1))  # fmt: skip
    manager = ProducerStateManager.open(lg, now_ms=0)
    for pid in (1, 2, 3):
        fill(lg, manager, producers=(pid,), rounds=4)
        lg.roll()
        manager.take_snapshot(lg.log_end_offset)
    fill(lg, manager, producers=(4,), rounds=1)
    assert lg.delete_old_segments(now_ms=0) == 3
    start = lg.log_start_offset
    before = dict(manager.state.producers)
    manager.truncate_head(start)
    assert list_snapshots(lg.directory) == [start]
    assert dict(manager.state.producers) == before  # KIP-360: retention keeps producers
    # The snapshot at the log start keeps them across a restart too.
    assert set(ProducerStateManager.open(lg, now_ms=0).state.producers) == {1, 2, 3, 4}
    lg.close()
