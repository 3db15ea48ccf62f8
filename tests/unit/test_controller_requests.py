"""The ZK-era controller requests: exact layouts, round trips, and garbage -> MalformedRequestError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcluster.protocol.controller_requests import (
    LeaderAndIsrRequest,
    PartitionErrors,
    PartitionState,
    StopReplicaRequest,
    read_controlled_shutdown,
    read_controlled_shutdown_response,
    read_leader_and_isr,
    read_partition_errors,
    read_stop_replica,
    write_controlled_shutdown,
    write_controlled_shutdown_response,
    write_leader_and_isr,
    write_partition_errors,
    write_stop_replica,
)
from localcluster.protocol.wire import MalformedRequestError, Reader

int32 = st.integers(-(2**31), 2**31 - 1)
int16 = st.integers(-(2**15), 2**15 - 1)
topics = st.text(max_size=20)
int32s = st.lists(int32, max_size=5).map(tuple)
partition_states = st.builds(PartitionState, topics, int32, int32, int32, int32, int32s, int32,
                             int32s, st.booleans())  # fmt: skip
leader_and_isr = st.builds(LeaderAndIsrRequest, int32, int32,
                           st.lists(partition_states, max_size=4).map(tuple), st.booleans())  # fmt: skip
stop_replica = st.builds(StopReplicaRequest, int32, int32, st.booleans(),
                         st.lists(st.tuples(topics, int32), max_size=5).map(tuple))  # fmt: skip
partition_errors = st.builds(PartitionErrors, int16,
                             st.lists(st.tuples(topics, int32, int16), max_size=5).map(tuple))  # fmt: skip


def read_all(read, data: bytes):
    r = Reader(data)
    value = read(r)
    assert r.remaining() == 0, "the reader must consume exactly what the writer wrote"
    return value


# -- exact layouts (design-docs/004) ------------------------------------------------------------------


def s(text: str) -> bytes:
    return struct.pack(">h", len(text.encode())) + text.encode()


def i32(*values: int) -> bytes:
    return b"".join(struct.pack(">i", v) for v in values)


def test_leader_and_isr_layout():
    request = LeaderAndIsrRequest(
        controller_id=1,
        controller_epoch=2,
        partitions=(PartitionState("t", 3, 2, 1, 7, (1, 2), 9, (1, 2, 0), is_new=True),),
        is_init=True,
    )
    expected = (
        i32(1, 2) + b"\x01" + i32(1)  # controller id, epoch, is_init, one partition
        + s("t") + i32(3, 2, 1, 7)  # topic, partition, controller epoch, leader, leader epoch
        + i32(2, 1, 2)  # isr
        + i32(9)  # zk version
        + i32(3, 1, 2, 0)  # replicas
        + b"\x01"  # is_new
    )  # fmt: skip
    assert write_leader_and_isr(request) == expected
    assert read_all(read_leader_and_isr, expected) == request


def test_stop_replica_layout():
    request = StopReplicaRequest(4, 5, True, (("a", 0), ("bb", 7)))
    expected = i32(4, 5) + b"\x01" + i32(2) + s("a") + i32(0) + s("bb") + i32(7)
    assert write_stop_replica(request) == expected
    assert read_all(read_stop_replica, expected) == request


def test_partition_errors_layout():
    response = PartitionErrors(0, (("t", 1, 6),))
    expected = b"\x00\x00" + i32(1) + s("t") + i32(1) + b"\x00\x06"
    assert write_partition_errors(response) == expected
    assert read_all(read_partition_errors, expected) == response


def test_controlled_shutdown_layouts():
    assert write_controlled_shutdown(3) == i32(3)
    assert read_all(read_controlled_shutdown, i32(3)) == 3
    data = write_controlled_shutdown_response(41, [("t", 0), ("u", 2)])
    assert data == b"\x00\x29" + i32(2) + s("t") + i32(0) + s("u") + i32(2)
    assert read_all(read_controlled_shutdown_response, data) == (41, [("t", 0), ("u", 2)])


def test_any_nonzero_flag_is_true():
    data = bytearray(write_stop_replica(StopReplicaRequest(1, 1, False, ())))
    data[8] = 0xFF
    assert read_stop_replica(Reader(bytes(data))).delete_partitions is True


def test_null_array_reads_as_empty():
    data = i32(1, 2) + b"\x00" + i32(-1)
    assert read_all(read_stop_replica, data) == StopReplicaRequest(1, 2, False, ())


# -- round trips -------------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(leader_and_isr)
def test_leader_and_isr_round_trip(request):
    assert read_all(read_leader_and_isr, write_leader_and_isr(request)) == request


@settings(max_examples=100, deadline=None)
@given(stop_replica)
def test_stop_replica_round_trip(request):
    assert read_all(read_stop_replica, write_stop_replica(request)) == request


@settings(max_examples=100, deadline=None)
@given(partition_errors)
def test_partition_errors_round_trip(response):
    assert read_all(read_partition_errors, write_partition_errors(response)) == response


@settings(max_examples=50, deadline=None)
@given(int32, int16, st.lists(st.tuples(topics, int32), max_size=5))
def test_controlled_shutdown_round_trip(broker_id, error, remaining):
    assert read_all(read_controlled_shutdown, write_controlled_shutdown(broker_id)) == broker_id
    data = write_controlled_shutdown_response(error, remaining)
    assert read_all(read_controlled_shutdown_response, data) == (error, remaining)


# -- garbage -----------------------------------------------------------------------------------------

READERS = [
    (read_leader_and_isr, write_leader_and_isr, leader_and_isr),
    (read_stop_replica, write_stop_replica, stop_replica),
    (read_partition_errors, write_partition_errors, partition_errors),
]


@pytest.mark.parametrize("read, write, strategy", READERS, ids=lambda x: getattr(x, "__name__", ""))
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_every_truncation_is_malformed(read, write, strategy, data):
    encoded = write(data.draw(strategy))
    for cut in range(len(encoded)):
        with pytest.raises(MalformedRequestError):
            read(Reader(encoded[:cut]))


@pytest.mark.parametrize("read", [read_leader_and_isr, read_stop_replica, read_partition_errors,
                                  read_controlled_shutdown, read_controlled_shutdown_response])  # fmt: skip
@settings(max_examples=100, deadline=None)
@given(garbage=st.binary(max_size=80))
def test_random_bytes_parse_or_are_malformed(read, garbage):
    try:
        read(Reader(garbage))
    except MalformedRequestError:
        pass  # the only way a frame may fail


def test_huge_array_count_is_malformed_not_a_memory_bomb():
    with pytest.raises(MalformedRequestError, match="cannot fit"):
        read_stop_replica(Reader(i32(1, 2) + b"\x00" + i32(2**31 - 1)))
    with pytest.raises(MalformedRequestError, match="cannot fit"):
        read_partition_errors(Reader(b"\x00\x00" + i32(1_000_000) + b"\x00" * 100))


def test_bad_topic_strings_are_malformed():
    with pytest.raises(MalformedRequestError, match="UTF-8"):
        read_stop_replica(Reader(i32(1, 2) + b"\x00" + i32(1) + b"\x00\x02\xff\xfe" + i32(0)))
    with pytest.raises(MalformedRequestError, match="null"):
        read_stop_replica(Reader(i32(1, 2) + b"\x00" + i32(1) + b"\xff\xff" + i32(0)))
