"""localcluster's own Kafka client: producer, consumer (manual assignment or a consumer group)
and admin.

asyncio at the core (`AsyncProducer`, `AsyncConsumer`, `AsyncAdmin`), with synchronous
facades (`Producer`, `Consumer`, `Admin`) that run the same code on an event loop in a
background thread. Connect with `bootstrap_servers="127.0.0.1:9092"` (or `unix:/path.sock`)
or `cluster_dir=DIR`, which reads the broker registrations from DIR/store and talks to the
brokers over their Unix sockets. Settings use Kafka's names and defaults, as a dict
(`{"linger.ms": 5}`) or as keywords (`linger_ms=5`). See docs/client.md.
"""

from localcluster.client.admin import Admin, AsyncAdmin, ClusterDescription, TopicDescription
from localcluster.client.connection import (
    Address,
    BrokerConnection,
    KafkaConnectionError,
    KafkaError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
)
from localcluster.client.consumer import AsyncConsumer, Consumer, ConsumerRecord
from localcluster.client.group_consumer import CommitFailedError
from localcluster.client.metadata import BrokerInfo, PartitionInfo
from localcluster.client.producer import AsyncProducer, Producer, murmur2, partition_for_key
from localcluster.storage.record_batch import Record

__all__ = [
    "Admin", "AsyncAdmin", "ClusterDescription", "TopicDescription", "Address",
    "BrokerConnection", "KafkaConnectionError", "KafkaError", "OffsetOutOfRangeError",
    "RequestTimedOutError", "AsyncConsumer", "Consumer", "ConsumerRecord", "CommitFailedError",
    "BrokerInfo", "PartitionInfo", "AsyncProducer", "Producer", "murmur2", "partition_for_key", "Record",
]  # fmt: skip
