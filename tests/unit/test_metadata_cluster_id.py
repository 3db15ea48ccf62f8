"""broker/metadata.py: the cluster id is read from the store once, as Kafka's broker reads it at
start-up, not once per Metadata answer (each such read waited for the store's lock)."""

from __future__ import annotations

from localcluster.broker.metadata import ClusterMetadata
from localcluster.broker.metadata_cache import MetadataCache


class CountingZk:
    def __init__(self, answers):
        self.answers = list(answers)
        self.reads = 0

    def cluster_id(self) -> str:
        self.reads += 1
        return self.answers.pop(0)


def metadata_over(zk) -> ClusterMetadata:
    metadata = ClusterMetadata(None, 1, None, MetadataCache())
    metadata.zk = zk
    return metadata


def test_the_cluster_id_is_read_once():
    zk = CountingZk(["abc"])
    metadata = metadata_over(zk)
    assert [metadata.cluster_id() for _ in range(3)] == ["abc"] * 3
    assert zk.reads == 1


def test_an_unreadable_cluster_id_is_read_again():
    zk = CountingZk(["unknown", "abc"])
    metadata = metadata_over(zk)
    assert metadata.cluster_id() == "unknown"
    assert [metadata.cluster_id() for _ in range(2)] == ["abc"] * 2
    assert zk.reads == 2
