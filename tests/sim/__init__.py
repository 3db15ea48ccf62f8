"""The deterministic simulator: the replication and controller cores of several brokers, run
over an in-memory network with a manual clock and real on-disk logs, driven by one seed."""
