"""Shared-memory metrics: brokers write counters into a per-cluster board, the CLI reads them.

See board.py. The broker's calls: `MetricsBoard.open_writer(cluster_dir, broker_id)` once at
start, then `record_produce`, `record_fetch`, `record_isr_change`, `update_replicas`.
"""

from localcluster.metrics.board import (
    BrokerMetrics,
    BrokerMetricsWriter,
    BrokerRates,
    MetricsBoard,
    MetricsReader,
    NullMetricsWriter,
    rates,
)

__all__ = ["MetricsBoard", "BrokerMetricsWriter", "NullMetricsWriter", "MetricsReader",
           "BrokerMetrics", "BrokerRates", "rates"]  # fmt: skip
