"""localcluster: Apache Kafka's replication protocol as real processes on one host.

Layers (imports point down only): faces (cli, supervisor, tools) -> runtime (broker) ->
sans-I/O cores (replication, controller) -> base (storage, coord, protocol, client).
See docs/ARCHITECTURE.md.
"""

__version__ = "0.1.0"
