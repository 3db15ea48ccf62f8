"""MetadataCache: a broker the controller stopped listing stays in Metadata's broker list for
DEPARTED_BROKER_LINGER_MS, and is never a leader meanwhile (why: the module's docstring,
librdkafka's stall after a leader's kill -9)."""

from __future__ import annotations

from localcluster.broker.metadata import ClusterMetadata
from localcluster.broker.metadata_cache import DEPARTED_BROKER_LINGER_MS, MetadataCache
from localcluster.broker.network import ListenerInfo
from localcluster.metadata_types import EndPoint
from localcluster.protocol.controller_requests import (
    MetadataBroker,
    PartitionState,
    UpdateMetadataRequest,
)

PLAINTEXT = ListenerInfo("PLAINTEXT", "PLAINTEXT")


def broker(broker_id: int) -> MetadataBroker:
    return MetadataBroker(broker_id, (EndPoint("PLAINTEXT", "127.0.0.1", 9000 + broker_id),),
                          None, f"/tmp/broker-{broker_id}.sock")  # fmt: skip


def update(epoch: int, leader: int, live: tuple[int, ...]) -> UpdateMetadataRequest:
    state = PartitionState("t", 0, epoch, leader, epoch, live, epoch, (1, 2, 3))
    offline = tuple(r for r in (1, 2, 3) if r not in live)
    return UpdateMetadataRequest(1, epoch, (state,), (offline,), tuple(broker(b) for b in live))


def test_a_departed_broker_is_listed_for_the_linger_time_then_forgotten():
    cache = MetadataCache()
    cache.update(update(1, 1, (1, 2, 3)), now_ms=1000)
    cache.update(update(2, 2, (2, 3)), now_ms=2000)  # broker 1 died, 2 leads
    assert set(cache.brokers) == {2, 3}
    assert set(cache.listed_brokers(now_ms=2000 + DEPARTED_BROKER_LINGER_MS - 1)) == {1, 2, 3}
    assert set(cache.listed_brokers(now_ms=2000 + DEPARTED_BROKER_LINGER_MS)) == {2, 3}
    assert not cache.departed


def test_a_broker_that_comes_back_is_live_again_and_no_longer_departed():
    cache = MetadataCache()
    cache.update(update(1, 1, (1, 2, 3)), now_ms=0)
    cache.update(update(2, 2, (2, 3)), now_ms=10)
    cache.update(update(3, 2, (1, 2, 3)), now_ms=20)
    assert not cache.departed and set(cache.listed_brokers(now_ms=20)) == {1, 2, 3}


class _NoStore:
    def cluster_id(self) -> str:
        return "test-cluster"


def test_metadata_lists_the_departed_broker_but_never_names_it_leader():
    cache = MetadataCache()
    cache.update(update(1, 1, (1, 2, 3)))
    cache.update(update(2, 1, (2, 3)))  # a moment where the cache still names the dead leader
    metadata = ClusterMetadata.__new__(ClusterMetadata)  # no store: the cache answers
    metadata.cache, metadata.zk = cache, _NoStore()
    answer = metadata._describe_from_cache(["t"], False, PLAINTEXT)
    assert [b["node_id"] for b in answer["brokers"]] == [1, 2, 3]
    (partition,) = answer["topics"][0]["partitions"]
    assert partition["leader_id"] == -1 and partition["error_code"] != 0
    assert partition["offline_replicas"] == [1]
    cache.update(update(3, 2, (2, 3)))
    (partition,) = metadata._describe_from_cache(["t"], False, PLAINTEXT)["topics"][0]["partitions"]
    assert partition["leader_id"] == 2 and partition["error_code"] == 0
