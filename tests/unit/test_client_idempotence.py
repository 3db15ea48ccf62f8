"""The idempotent producer: the sequence bookkeeping of client/idempotence.py on its own (numbering
per partition, the wrap at Int.MaxValue, at most 5 unresolved, retries in order, epoch bumps,
batches of unknown fate, the config rules, stamping prebuilt batches), then AsyncProducer
against the fake broker of test_client_producer.py, which checks sequences as a broker does."""

from __future__ import annotations

import itertools
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from localcluster.client import AsyncProducer, KafkaError
from localcluster.client.idempotence import (
    INT16_MAX,
    INT32_MAX,
    MAX_IN_FLIGHT_PER_PARTITION,
    Idempotence,
    ProducerIdAndEpoch,
    increment_sequence,
    last_sequence,
    stamp_producer_state,
)
from localcluster.client.producer import DEFAULTS, ProducerBatch
from localcluster.storage.record_batch import (
    Record,
    encode_batch,
    iter_records,
    read_header,
    validate_batch,
)
from tests.unit.test_client_producer import LOSE_ANSWER, run_with_fake

P0, P1 = ("t", 0), ("t", 1)
_ORDER = itertools.count()
OUT_OF_ORDER = ErrorCode.out_of_order_sequence_number


def batch(tp=P0, count: int = 1) -> ProducerBatch:
    b = ProducerBatch(tp, next(_ORDER), 0.0, 1.0)
    b.count = count
    return b


def started(producer_id: int = 7, epoch: int = 0) -> Idempotence:
    idempotence = Idempotence()
    idempotence.set_producer_id_and_epoch(producer_id, epoch)
    return idempotence


def numbered(idempotence: Idempotence, *batches: ProducerBatch) -> list[ProducerBatch]:
    for b in batches:
        assert idempotence.can_send(b)
        idempotence.number(b)
    return list(batches)


def fields(b: ProducerBatch) -> tuple[int, int, int]:
    return b.producer_id, b.producer_epoch, b.base_sequence


# -- the bookkeeping on its own -----------------------------------------------------------------


def test_nothing_is_sent_before_the_producer_id():
    idempotence = Idempotence()
    assert not idempotence.has_producer_id and not idempotence.can_send(batch())


def test_sequences_count_records_per_partition():
    idempotence = started()
    a, b, c = numbered(idempotence, batch(P0, 3), batch(P1, 2), batch(P0, 4))
    assert [fields(x) for x in (a, b, c)] == [(7, 0, 0), (7, 0, 0), (7, 0, 3)]
    assert idempotence.partitions[P0].next_sequence == 7
    assert idempotence.partitions[P1].next_sequence == 2
    idempotence.completed(c)  # answers may come out of order: the last acknowledged is c's
    idempotence.completed(a)
    assert idempotence.partitions[P0].last_acked_sequence == 6


@given(st.integers(0, INT32_MAX), st.integers(0, INT32_MAX))
def test_increment_sequence_wraps_at_int_max(sequence, increment):
    assert increment_sequence(sequence, increment) == (sequence + increment) % 2**31


def test_a_batch_across_int_max_wraps_to_zero():
    idempotence = started()
    idempotence.completed(*numbered(idempotence, batch(P0)))
    idempotence.partitions[P0].next_sequence = INT32_MAX - 1
    across, after = numbered(idempotence, batch(P0, 3), batch(P0, 2))
    assert across.base_sequence == INT32_MAX - 1 and last_sequence(across) == 0
    assert after.base_sequence == 1
    idempotence.completed(across)
    idempotence.completed(after)
    assert idempotence.partitions[P0].last_acked_sequence == 2  # after the wrap is later


def test_at_most_five_unresolved_per_partition_and_retries_go_first_in_order():
    idempotence = started()
    first = numbered(idempotence, *(batch() for _ in range(MAX_IN_FLIGHT_PER_PARTITION)))
    assert not idempotence.can_send(batch())  # a sixth waits
    assert idempotence.can_send(batch(P1))  # other partitions do not
    # Two came back for a retry: only the first unresolved one may go out.
    assert idempotence.can_send(first[0]) and not idempotence.can_send(first[1])
    idempotence.completed(first[0])
    assert idempotence.can_send(first[1]) and idempotence.can_send(batch())


def test_out_of_order_behind_a_failed_batch_is_retried_as_it_is():
    idempotence = started()
    a, b, c = numbered(idempotence, batch(), batch(), batch())
    assert idempotence.can_retry(a, ErrorCode.not_enough_replicas, True, 0)
    assert idempotence.can_retry(b, OUT_OF_ORDER, False, 0)  # b follows a, which failed
    assert idempotence.can_retry(c, OUT_OF_ORDER, False, 0)
    assert not idempotence.epoch_bump_required
    assert [fields(x) for x in (a, b, c)] == [(7, 0, 0), (7, 0, 1), (7, 0, 2)]


def test_a_gap_bumps_the_epoch_and_renumbers_the_partition_from_zero():
    idempotence = started()
    first, gap, behind = numbered(idempotence, batch(P0, 2), batch(P0, 3), batch(P0, 1))
    other = numbered(idempotence, batch(P1))[0]
    idempotence.completed(first)
    # `gap` is the next after the last acknowledged: the broker lacks what came before.
    assert idempotence.can_retry(gap, OUT_OF_ORDER, False, 0)
    assert idempotence.epoch_bump_required
    idempotence.maybe_bump_epoch()
    assert idempotence.producer == ProducerIdAndEpoch(7, 1)
    assert [fields(gap), fields(behind)] == [(7, 1, 0), (7, 1, 3)]
    assert gap.sequence_reset and behind.sequence_reset
    assert idempotence.partitions[P0].next_sequence == 4
    # `behind`'s own OUT_OF_ORDER answer (sent under epoch 0) is retried, not bumped again.
    assert idempotence.can_retry(behind, OUT_OF_ORDER, False, 0)
    assert not idempotence.epoch_bump_required
    # P1 moves to the new epoch at sequence 0 once its epoch-0 batch is resolved.
    assert not idempotence.can_send(batch(P1))
    idempotence.completed(other)
    assert fields(numbered(idempotence, batch(P1))[0]) == (7, 1, 0)


def test_a_batch_failed_for_good_after_it_was_sent_bumps_the_epoch():
    idempotence = started()
    failed, behind = numbered(idempotence, batch(), batch())
    idempotence.failed(failed, "MESSAGE_TOO_LARGE")
    idempotence.maybe_bump_epoch()
    assert fields(behind) == (7, 1, 0)
    assert idempotence.can_retry(behind, ErrorCode.invalid_producer_epoch, False, 0) is False


def test_unknown_producer_id_is_retried_with_a_new_epoch():
    idempotence = started()
    b = numbered(idempotence, batch())[0]
    assert idempotence.can_retry(b, ErrorCode.unknown_producer_id, False, -1)
    assert not idempotence.epoch_bump_required  # no log start offset yet: retry as it is
    assert idempotence.can_retry(b, ErrorCode.unknown_producer_id, False, 0)
    assert idempotence.epoch_bump_required


def test_the_last_epoch_asks_for_a_new_producer_id_and_renumbers_then():
    idempotence = started(7, INT16_MAX)
    b = numbered(idempotence, batch())[0]
    idempotence.request_epoch_bump(P0, "a test")
    idempotence.maybe_bump_epoch()
    assert not idempotence.has_producer_id and not idempotence.can_send(b)
    idempotence.set_producer_id_and_epoch(8, 0)
    assert fields(b) == (8, 0, 0) and idempotence.can_send(b)


def test_an_expired_batch_holds_new_batches_until_its_fate_shows():
    idempotence = started()
    expired, later = numbered(idempotence, batch(), batch())
    idempotence.expired(expired)
    assert not idempotence.can_send(batch())
    idempotence.completed(later)  # the broker took the sequence after it: it was written
    idempotence.maybe_resolve_sequences()
    assert not idempotence.epoch_bump_required and idempotence.can_send(batch())
    alone = numbered(idempotence, batch())[0]
    idempotence.expired(alone)  # nothing after it: unknown, so a new epoch
    idempotence.maybe_resolve_sequences()
    assert idempotence.epoch_bump_required
    idempotence.maybe_bump_epoch()
    assert fields(numbered(idempotence, batch())[0]) == (7, 1, 0)


def test_stamping_a_prebuilt_batch_sets_the_fields_and_a_valid_crc():
    records = [Record(f"v{i}".encode(), b"k", (("h", b"x"),), 1_700_000_000_000 + i) for i in range(5)]  # fmt: skip
    raw = encode_batch(records)
    stamped = stamp_producer_state(raw, 123456789, 3, INT32_MAX - 2)
    header = validate_batch(stamped, 0, check_crc=True)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        123456789,
        3,
        INT32_MAX - 2,
    )
    assert [r.value for r in iter_records(bytes(stamped))] == [r.value for r in records]  # fmt: skip
    assert read_header(raw).producer_id == -1  # bytes are copied, never changed
    again = stamp_producer_state(stamped, 123456789, 4, 0)
    assert again is stamped  # a bytearray is numbered in place
    validate_batch(again, 0, check_crc=True)


@pytest.mark.parametrize(
    "settings, error",
    [
        ({"acks": 1}, "acks=1"),
        ({"acks": 0}, "acks=0"),
        ({"max_in_flight_requests_per_connection": 6}, "max.in.flight.requests.per.connection=6"),
        ({"retries": 0}, "retries=0"),
    ],
)
def test_config_that_idempotence_does_not_go_with(settings, error, caplog):
    with pytest.raises(ValueError, match=error):
        AsyncProducer(bootstrap_servers="127.0.0.1:9", enable_idempotence=True, **settings)
    with caplog.at_level(logging.INFO, logger="localcluster.client.idempotence"):
        producer = AsyncProducer(bootstrap_servers="127.0.0.1:9", **settings)
    assert not producer.idempotent  # the default gives way, saying so
    assert error in caplog.text and "left at its default" in caplog.text


def test_idempotence_is_the_default_and_can_be_turned_off():
    assert DEFAULTS["enable.idempotence"] is True
    assert AsyncProducer(bootstrap_servers="127.0.0.1:9").idempotent
    assert not AsyncProducer({"enable.idempotence": "false"}, bootstrap_servers="127.0.0.1:9").idempotent  # fmt: skip
    assert not AsyncProducer(bootstrap_servers="127.0.0.1:9", enable_idempotence=False).idempotent


# -- AsyncProducer against the fake broker ------------------------------------------------------


def headers_of(fake, partition: int) -> list[tuple[int, int, int, int]]:
    return [(h.producer_id, h.producer_epoch, h.base_sequence, h.records_count)
            for h in fake.appended[partition]]  # fmt: skip


def test_batches_carry_the_producer_id_and_contiguous_sequences_per_partition():
    async def body(producer):
        futures = [await producer.send("t", f"v{i}".encode(), partition=i % 2) for i in range(12)]
        return [await f for f in futures], producer.producer_id_and_epoch

    fake, (results, pid) = run_with_fake([], body, linger_ms=0, batch_size=100)
    assert pid == (1000, 0)
    assert sorted(results) == [(p, o) for p in (0, 1) for o in range(6)]
    for p in (0, 1):
        assert fake.log[p] == [f"v{i}".encode() for i in range(p, 12, 2)]
        sequences, expected = [], 0
        for producer_id, epoch, base, count in headers_of(fake, p):
            assert (producer_id, epoch) == (1000, 0)
            sequences.append(base)
            assert base == expected
            expected += count
        assert expected == 6


def test_prebuilt_batches_are_numbered_with_a_valid_crc_and_the_callers_bytes_kept():
    raw = encode_batch([Record(f"r{i}".encode()) for i in range(3)])
    kept = bytes(raw)

    async def body(producer):
        return [await (await producer.send_batch("t", 0, raw)) for _ in range(3)]

    fake, results = run_with_fake([], body, linger_ms=0)
    assert results == [(0, 0), (0, 3), (0, 6)]
    assert raw == kept
    for sent, base in zip(fake.raw[0], (0, 3, 6), strict=True):
        header = validate_batch(sent, 0, check_crc=True)
        assert (header.producer_id, header.producer_epoch, header.base_sequence) == (1000, 0, base)
        assert sent[61:] == raw[61:]  # the records as they were


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_prebuilt_batch_given_a_timestamp_goes_out_dated_with_a_valid_crc(idempotent):
    raw = encode_batch([Record(b"a", timestamp=5), Record(b"b", timestamp=7)])
    kept = bytes(raw)

    async def body(producer):
        return [await (await producer.send_batch("t", 0, raw, timestamp_ms=1_796_000_000_000 + i))
                for i in range(2)]  # fmt: skip

    fake, results = run_with_fake([], body, linger_ms=0, enable_idempotence=idempotent)
    assert results == [(0, 0), (0, 2)] and raw == kept
    for i, sent in enumerate(fake.raw[0]):
        header = validate_batch(sent, 0, check_crc=True)
        assert (header.base_timestamp, header.max_timestamp) == (
            1_796_000_000_000 + i, 1_796_000_000_002 + i)  # fmt: skip
        assert header.producer_id == (1000 if idempotent else -1)
        assert sent[61:] == raw[61:]


def test_without_idempotence_batches_go_out_as_before():
    raw = encode_batch([Record(b"x")])

    async def body(producer):
        await (await producer.send("t", b"v", partition=0))
        return await (await producer.send_batch("t", 0, raw))

    fake, _ = run_with_fake([], body, linger_ms=0, enable_idempotence=False)
    assert [h[:3] for h in headers_of(fake, 0)] == [(-1, -1, -1)] * 2
    assert fake.raw[0][1] == raw  # verbatim


def test_a_lost_answer_is_retried_and_the_duplicate_answer_completes_it():
    async def body(producer):
        first = await (await producer.send("t", b"v0", partition=0))
        again = await (await producer.send("t", b"v1", partition=0))  # its answer is lost
        return first, again, await (await producer.send("t", b"v2", partition=0))

    fake, results = run_with_fake([0, LOSE_ANSWER], body, linger_ms=0)
    assert results == ((0, 0), (0, 1), (0, 2))  # the retry got the original offset
    assert fake.log[0] == [b"v0", b"v1", b"v2"]  # once
    attempts = [(h.producer_epoch, h.base_sequence) for h in fake.batches[0]]
    assert attempts == [(0, 0), (0, 1), (0, 1), (0, 2)]  # the retry kept its sequence


def test_batches_behind_a_failed_one_are_retried_in_order():
    async def body(producer, fake):
        await (await producer.send("t", b"v0", partition=0))
        fake.hold = 4  # the next four go out before any of them is answered
        futures = [await producer.send("t", f"v{i}".encode(), partition=0) for i in range(1, 5)]
        return [await f for f in futures]

    errors = [0, ErrorCode.not_enough_replicas]  # v1 fails; v2-v4 then follow a gap
    fake, results = run_with_fake(errors, body, linger_ms=0, batch_size=1, pass_fake=True)
    assert results == [(0, i) for i in range(1, 5)]
    assert fake.log[0] == [f"v{i}".encode() for i in range(5)]
    assert fake.answers[0][1:5] == [ErrorCode.not_enough_replicas] + [OUT_OF_ORDER] * 3
    assert [h.base_sequence for h in fake.appended[0]] == [0, 1, 2, 3, 4]
    assert all(h.producer_epoch == 0 for h in fake.batches[0])  # no bump: the gap was explained


def test_a_gap_at_the_broker_bumps_the_epoch_and_the_batch_is_written_under_it():
    async def body(producer):
        results = [await (await producer.send("t", f"v{i}".encode(), partition=0)) for i in range(3)]  # fmt: skip
        return results, producer.producer_id_and_epoch

    # v1 is the next sequence, yet the broker answers OUT_OF_ORDER: it lacks what came before.
    fake, (results, pid) = run_with_fake([0, OUT_OF_ORDER], body, linger_ms=0)
    assert results == [(0, 0), (0, 1), (0, 2)] and pid == (1000, 1)
    assert [h[:3] for h in headers_of(fake, 0)] == [(1000, 0, 0), (1000, 1, 0), (1000, 1, 1)]


def test_invalid_producer_epoch_fails_the_batch_clearly_and_the_next_uses_a_new_epoch():
    async def body(producer):
        future = await producer.send("t", b"lost", partition=0)
        with pytest.raises(KafkaError, match="INVALID_PRODUCER_EPOCH") as error:
            await future
        return error.value, await (await producer.send("t", b"next", partition=0))

    fake, (error, result) = run_with_fake([ErrorCode.invalid_producer_epoch], body, linger_ms=0)
    assert "producer 1000 epoch 0 sequence 0" in str(error) and "not written" in str(error)
    assert result == (0, 0) and fake.log[0] == [b"next"]
    assert [h[:3] for h in headers_of(fake, 0)] == [(1000, 1, 0)]


def test_sequences_wrap_at_int_max_on_the_wire():
    async def body(producer, fake):
        await (await producer.send("t", b"v0", partition=0))
        # Move both sides to just before the wrap: the client's next and the broker's last.
        producer._idempotence.partitions[P0].next_sequence = INT32_MAX - 1  # noqa: SLF001
        fake.producers[(0, 1000)][1][-1] = (INT32_MAX - 2, INT32_MAX - 2, 0)
        across = [Record(b"a"), Record(b"b"), Record(b"c")]
        return (await (await producer.send_batch("t", 0, across)),
                await (await producer.send("t", b"after", partition=0)))  # fmt: skip

    fake, results = run_with_fake([], body, linger_ms=0, pass_fake=True)
    assert results == ((0, 1), (0, 4))
    assert [h[2] for h in headers_of(fake, 0)] == [0, INT32_MAX - 1, 1]


def test_a_broker_without_init_producer_id(caplog):
    async def body(producer):
        return producer.idempotent, await (await producer.send("t", b"v", partition=0))

    with caplog.at_level(logging.WARNING, logger="localcluster.client.producer"):
        fake, (idempotent, result) = run_with_fake([], body, offer_init_producer_id=False)
    assert not idempotent and result == (0, 0)
    assert "does not offer InitProducerId" in caplog.text
    assert [h[:3] for h in headers_of(fake, 0)] == [(-1, -1, -1)]
    with pytest.raises(KafkaError, match="enable.idempotence=true: the broker .* does not offer"):
        run_with_fake([], body, offer_init_producer_id=False, enable_idempotence=True)


def test_duplicate_sequence_number_completes_without_an_offset():
    async def body(producer):
        return await (await producer.send("t", b"v", partition=0))

    fake, result = run_with_fake([ErrorCode.duplicate_sequence_number], body, linger_ms=0)
    assert result == (0, -1) and fake.log[0] == []
