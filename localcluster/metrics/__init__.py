"""Shared-memory metrics: brokers write counters into a per-cluster board, the CLI reads them.

See board.py. The broker's calls: `MetricsBoard.open_writer(cluster_dir, broker_id)` once at
start, then `record_produce`, `record_fetch`, `record_isr_change`, `update_replicas`.
Names are loaded on first use, so `localcluster.metrics.segment` (create and remove the
segment: what `up` and `down` need) does not import numpy.
"""

__all__ = ["MetricsBoard", "BrokerMetricsWriter", "NullMetricsWriter", "MetricsReader",
           "BrokerMetrics", "BrokerRates", "rates"]  # fmt: skip


def __getattr__(name: str):
    if name in __all__:
        from localcluster.metrics import board

        return getattr(board, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
