"""Idle partitions (issue 19): what thousands of partitions that carry no records cost brokers.

```
.venv/bin/python -m bench.idle_partitions                     # this checkout, 1,000 and 3,000
  --partitions 1000,3000 --seconds 30 --settle 10
  --trees BASE OTHER --rounds 2                               # two trees, alternating
```

Per cell: three brokers running a tree's code (`PYTHONPATH=<tree>` for the brokers only), one
topic of N partitions with RF 3 written into the store (as bench.scaling's cells, until a
Metadata response names a leader and a full ISR for every partition), `--settle` seconds, then
`--seconds` of nothing: the brokers' CPU seconds per second from /proc/<pid>/stat (a figure the
machine's other work moves much less than wall-clock rates) and the ISR changes the leaders
proposed meanwhile (state-change.log: a quiet cluster proposes none). Trees alternate A B, B A
per round, a fresh cluster per cell.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.broker import Cluster
from bench.common import print_table
from bench.scaling import SETTINGS, new_topic
from localcluster.tools.load import cpu_seconds

HERE = Path(__file__).resolve().parent.parent


def isr_proposals(cluster: Cluster) -> int:
    total = 0
    for path in cluster.cluster_dir.rglob("state-change.log"):
        total += sum(1 for line in path.read_text().splitlines() if '"isr_proposed"' in line)
    return total


def measure(tree: Path, partitions: int, seconds: float, settle_s: float) -> dict:
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)  # the brokers' code; this process keeps its own
    cluster = Cluster(SETTINGS)
    try:
        cluster.start(range(3))
        create_s = new_topic(cluster, "idle", partitions, timeout_s=120 + partitions / 5)
        time.sleep(settle_s)
        pids = [b.pid for b in cluster.brokers.values()]
        before, proposed_before = [cpu_seconds(p) or 0.0 for p in pids], isr_proposals(cluster)
        started = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - started
        cpu = [((cpu_seconds(p) or 0.0) - b) / elapsed for p, b in zip(pids, before, strict=True)]
        return {"tree": str(tree), "partitions": partitions, "create_s": round(create_s, 2),
                "cpu_per_s": [round(c, 3) for c in cpu], "cpu_per_s_total": round(sum(cpu), 3),
                "isr_proposals": isr_proposals(cluster) - proposed_before,
                "load_average": os.getloadavg()[0]}  # fmt: skip
    finally:
        cluster.close()
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="1000,3000")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--trees", type=Path, nargs="+", default=[HERE])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.partitions.split(",")]
    trees = [t.resolve() for t in args.trees]
    results = []
    for round_index in range(args.rounds):
        for count in counts:
            order = trees if round_index % 2 == 0 else trees[::-1]
            for tree in order:
                result = measure(tree, count, args.seconds, args.settle)
                results.append(result)
                print(json.dumps(result), flush=True)
    rows = [[r["tree"], f"{r['partitions']:,}", f"{r['create_s']:.1f}",
             " / ".join(f"{c:.2f}" for c in r["cpu_per_s"]), f"{r['cpu_per_s_total']:.2f}",
             str(r["isr_proposals"]), f"{r['load_average']:.1f}"] for r in results]  # fmt: skip
    print_table(f"idle partitions, RF 3 on 3 brokers, {args.seconds:g} s after {args.settle:g} s",
                ["tree", "partitions", "create s", "broker CPU s/s", "total", "ISR proposals",
                 "load"], rows)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
