"""Kafka's error codes, as the replication cores answer them (the cores do not import kio).

The numbers are Kafka's (org.apache.kafka.common.protocol.Errors); the runtime puts them on the
wire as they are.
"""

NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
STALE_CONTROLLER_EPOCH = 11
NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
KAFKA_STORAGE_ERROR = 56
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75

NAMES = {value: name for name, value in globals().items() if name.isupper() and name != "NAMES"}
