"""The producer load engine the benchmarks run (LoadPool, the Pacer, the latency histogram).

It lives in the package, localcluster/tools/load.py, because `localcluster perf produce` runs
the same engine and the package does not import bench/; this name stays for bench.commit,
bench.matrix and the tests.
"""

from localcluster.tools.load import (  # noqa: F401 (re-exported)
    BATCH_BYTES,
    CLIENTS,
    HISTOGRAM_MAX_US,
    PERCENTILES,
    Job,
    Latency,
    LoadPool,
    Pacer,
    Schedule,
    batch_records_for,
    curve,
    histogram,
    latency_summary,
    worker_main,
)
