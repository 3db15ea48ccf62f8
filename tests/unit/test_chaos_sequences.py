"""chaos's checker: an idempotent producer's sequences in a log are contiguous and unique."""

from __future__ import annotations

from localcluster.storage.record_batch import BatchSpec, Record, encode_batch, read_header
from localcluster.tools.chaos_check import check_sequences


def header(offset: int, producer_id: int, epoch: int, sequence: int, records: int = 2):
    batch = encode_batch([Record(b"x")] * records,
                         BatchSpec(base_offset=offset, producer_id=producer_id,
                                   producer_epoch=epoch, base_sequence=sequence))  # fmt: skip
    return read_header(batch)


def test_contiguous_sequences_new_epochs_and_plain_batches_pass():
    headers = [header(0, 7, 0, 0), header(2, 8, 0, 5), header(4, 7, 0, 2),
               header(6, 7, 1, 0), header(8, -1, -1, -1), header(9, 7, 1, 2)]  # fmt: skip
    assert check_sequences(headers) == []


def test_a_wrapped_sequence_continues_at_zero():
    assert check_sequences([header(0, 7, 0, 2**31 - 2), header(2, 7, 0, 0)]) == []


def test_a_gap_and_a_repeat_are_named_with_their_offsets():
    problems = check_sequences([header(0, 7, 0, 0), header(2, 7, 0, 4), header(4, 7, 0, 4)])
    assert any("offset 2" in p and "expected 2" in p for p in problems), problems
    assert any("offset 4" in p and "in the log twice" in p for p in problems), problems
    assert check_sequences([header(0, 7, 0, 0), header(2, 7, 1, 3)])[0].endswith("expected 0")
