"""MetadataCache applies UpdateMetadata as Kafka's ZooKeeper-mode brokers do: FULL replaces
every partition, INCREMENTAL replaces the partitions it names and removes those named with the
leader LEADER_DURING_DELETE; `ready` waits for a FULL one. The type travels on the wire."""

from __future__ import annotations

import pytest

from localcluster.broker.metadata_cache import MetadataCache
from localcluster.metadata_types import EndPoint
from localcluster.protocol import controller_requests as cr
from localcluster.protocol.wire import Reader

BROKERS = tuple(
    cr.MetadataBroker(b, (EndPoint("PLAINTEXT", "127.0.0.1", 9000 + b),), None, f"/tmp/{b}.sock")
    for b in (1, 2, 3)
)


def state(topic: str, partition: int, leader: int, leader_epoch: int = 0) -> cr.PartitionState:
    return cr.PartitionState(topic, partition, 1, leader, leader_epoch, (1, 2, 3), 0, (1, 2, 3))


def request(
    update_type: int, *states: cr.PartitionState, epoch: int = 1
) -> cr.UpdateMetadataRequest:
    return cr.UpdateMetadataRequest(
        1, epoch, states, tuple(() for _ in states), BROKERS, update_type
    )


def leaders(cache: MetadataCache) -> dict[tuple[str, int], int]:
    return {(t, p): c.leader for t in cache.topics() for p, c in cache.partitions_of(t).items()}


def test_incremental_updates_replace_what_they_name_and_remove_what_is_being_deleted():
    cache = MetadataCache()
    cache.update(request(cr.FULL, state("t", 0, 1), state("t", 1, 2), state("u", 0, 3)))
    cache.update(request(cr.INCREMENTAL, state("t", 1, 3, leader_epoch=1), state("v", 0, 1)))
    assert leaders(cache) == {("t", 0): 1, ("t", 1): 3, ("u", 0): 3, ("v", 0): 1}
    cache.update(request(cr.INCREMENTAL, state("u", 0, cr.LEADER_DURING_DELETE),
                         state("gone", 0, cr.LEADER_DURING_DELETE)))  # fmt: skip
    assert leaders(cache) == {("t", 0): 1, ("t", 1): 3, ("v", 0): 1}
    assert cache.topics() == ["t", "v"], "a topic whose last partition was removed is not listed"
    cache.update(request(cr.FULL, state("w", 0, 2)))
    assert leaders(cache) == {("w", 0): 2}, "a FULL update drops what it does not name"


def test_the_cache_is_ready_once_a_full_update_arrived():
    cache = MetadataCache()
    cache.update(request(cr.INCREMENTAL, state("t", 0, 1)))
    assert not cache.ready, "an INCREMENTAL update alone is part of a picture"
    cache.update(request(cr.FULL, state("t", 0, 1)))
    assert cache.ready


def test_an_update_from_an_older_controller_epoch_changes_nothing():
    cache = MetadataCache()
    cache.update(request(cr.FULL, state("t", 0, 1), epoch=3))
    assert cache.update(request(cr.INCREMENTAL, state("t", 0, 2), epoch=2)) != 0
    assert leaders(cache) == {("t", 0): 1}


@pytest.mark.parametrize("update_type", [cr.INCREMENTAL, cr.FULL])
def test_the_type_round_trips_through_the_wire(update_type):
    sent = request(update_type, state("t", 0, 1), state("t", 1, cr.LEADER_DURING_DELETE))
    assert cr.read_update_metadata(Reader(cr.write_update_metadata(sent), 0)) == sent


def test_an_unknown_type_is_refused_with_its_value():
    body = bytearray(cr.write_update_metadata(request(cr.FULL, state("t", 0, 1))))
    body[8] = 7  # the type follows controller_id and controller_epoch
    with pytest.raises(ValueError, match="type 7"):
        cr.read_update_metadata(Reader(bytes(body), 0))
