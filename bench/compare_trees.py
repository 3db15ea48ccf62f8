"""Two source trees' brokers under the same acks=all load, in one run, alternating.

```
.venv/bin/python -m bench.compare_trees BASE [OTHER]     # OTHER defaults to this checkout
  --rounds N --records N --partitions N --idempotence --throughput RECORDS_PER_S
  --batch-size BYTES
```

A change to the broker is judged against the commit before it (issue 17: "no worse than
before the change, same-run comparison"): check the older commit out beside this one
(`git worktree add ../base <commit>`) and name it as BASE. Every run starts a fresh cluster
of three brokers with the tree's own CLI (`PYTHONPATH=<tree> python -m localcluster up`, so
the brokers run that tree's code), creates a topic of `--partitions` partitions with RF 3 and
min.insync.replicas=2, warms it up with a tenth of the records, times one load and removes
the cluster (`down --purge`): no run inherits another's logs, tmpfs pages or page cache, and
only one cluster is up at a time. (Clusters kept for the whole comparison slowed run by run as
their logs grew, and main read 0.85 of itself.) The load is this checkout's `localcluster perf
produce` (our client, 100-byte records, prebuilt ~64 KiB batches or `--batch-size`), in the order A B B A B A A B,
so each side takes every place in a group of four equally often; idempotence is off unless `--idempotence` (a
tree from before the idempotent producer has no InitProducerId).

Per run: acknowledged records/s, the three brokers' CPU seconds per record from
/proc/<pid>/stat (a cost that moves far less with other work on the machine than records/s
does) and the load's p99 latency. At full speed a slower broker fetches bigger chunks and
spends less per record, and records/s spread 363k-536k between runs of one tree; with
`--throughput` (below both trees' capacity) every run carries the same load, so CPU per record
and p99 compare like with like. Printed: each side's runs and medians and OTHER as a fraction
of BASE. Run BASE against itself first (`compare_trees X X`): the fraction it reads is the
resolution.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import median, print_table
from localcluster.tools.load import cpu_seconds

HERE = Path(__file__).resolve().parent.parent


class TreeCluster:
    """A cluster of three brokers running one source tree's code."""

    def __init__(self, tree: Path, directory: Path, partitions: int):
        self.tree, self.directory = tree, directory
        self.env = {**os.environ, "PYTHONPATH": str(tree), "LOCALCLUSTER_DIR": str(directory)}
        self._cli("up", "-n", "3", "--detach")  # a fresh cluster: `down --purge` removes it
        try:
            self._cli("topic", "create", "t", "--partitions", str(partitions),
                      "--replication-factor", "3", "--config", "min.insync.replicas=2")  # fmt: skip
        except BaseException:
            self.stop()  # no cluster is left running for a caller that never got this object
            raise

    def _cli(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "localcluster", *args], env=self.env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"localcluster {' '.join(args)} in {self.tree} failed:\n{done.stderr}")
        return done.stdout

    def broker_pids(self) -> list[int]:
        return [int((d / "broker.pid").read_text()) for d in sorted(self.directory.glob("broker-*"))
                if (d / "broker.pid").exists()]  # fmt: skip

    def produce(self, records: int, idempotence: bool, throughput: float = -1,
                batch_size: int | None = None) -> dict:  # fmt: skip
        """One timed run of this checkout's load: records/s and broker CPU µs per record."""
        pids = self.broker_pids()
        before = [cpu_seconds(p) or 0.0 for p in pids]
        env = {**os.environ, "PYTHONPATH": str(HERE), "LOCALCLUSTER_DIR": str(self.directory)}
        done = subprocess.run([sys.executable, "-m", "localcluster", "perf", "produce", "--topic", "t",
                               "--num-records", str(records), "--record-size", "100", "--json",
                               "--throughput", str(throughput),
                               "--producer-config", f"enable.idempotence={str(idempotence).lower()}",
                               *(("--producer-config", f"batch.size={batch_size}") if batch_size else ())],
                              env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        cpu = sum((cpu_seconds(p) or 0.0) - b for p, b in zip(pids, before, strict=True))
        if done.returncode != 0:
            raise SystemExit(f"perf produce against {self.tree} failed:\n{done.stderr}")
        result = json.loads(done.stdout)
        acked = result["records_acked"]
        return {"records_per_s": result["records_per_s"], "errors": result["errors"],
                "p99_ms": result["latency_ms"]["p99"],
                "broker_cpu_us_per_record": cpu / acked * 1e6 if acked else None}  # fmt: skip

    def stop(self) -> None:
        try:
            self._cli("down", "--purge")
        except (SystemExit, subprocess.TimeoutExpired) as e:
            print(f"stopping the cluster of {self.tree}: {e}; killing its brokers", file=sys.stderr)
            for pid in self.broker_pids():
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path, help="the tree to compare against (e.g. a worktree)")
    parser.add_argument("other", type=Path, nargs="?", default=HERE, help="default: this checkout")
    parser.add_argument(
        "--rounds", type=int, default=8, help="runs per side (a multiple of 4: A B B A B A A B ...)"
    )
    parser.add_argument("--records", type=int, default=1_500_000, help="records per run")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--idempotence", action="store_true", help="the load is idempotent")
    parser.add_argument("--throughput", type=float, default=-1,
                        help="records/s to offer (default -1: full speed)")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=None,
                        help="the load's batch.size in bytes (default: the load's, ~64 KiB)")  # fmt: skip
    args = parser.parse_args(argv)
    trees = {"base": args.base.resolve(), "other": args.other.resolve()}
    for name, tree in trees.items():
        if not (tree / "localcluster" / "broker").is_dir():
            parser.error(f"{name} {tree} is not a localcluster source tree")
    runs: dict[str, list[dict]] = {"base": [], "other": []}
    # A B B A B A A B: each tree takes every place in a group of four equally often. A control
    # in the order A B B A (a tree against itself) read 8-11% more CPU per record in places 2
    # and 3 of every four than in places 1 and 4, in four runs of 16-24 runs each.
    order = ["base", "other", "other", "base", "other", "base", "base", "other"]
    with tempfile.TemporaryDirectory(prefix="compare-trees-") as tmp:
        for i in range(args.rounds * 2):
            name = order[i % 8]
            cluster = TreeCluster(trees[name], Path(tmp) / f"{name}-{i}", args.partitions)
            try:
                load = (args.idempotence, args.throughput, args.batch_size)
                cluster.produce(max(args.records // 10, 1), *load)  # warm-up
                runs[name].append(cluster.produce(args.records, *load))
            finally:
                cluster.stop()
            print(f"{name}: {runs[name][-1]}", file=sys.stderr)
    rows, medians = [], {}
    for name in ("base", "other"):
        rate = median([r["records_per_s"] for r in runs[name]])
        cpu = median([r["broker_cpu_us_per_record"] for r in runs[name]])
        medians[name] = (rate, cpu)
        rows.append([f"{name} ({trees[name]})", " / ".join(f"{r['records_per_s'] / 1e3:.0f}k" for r in runs[name]),
                     f"{rate:,.0f}", f"{cpu:.2f}", f"{median([r['p99_ms'] for r in runs[name]]):.1f}",
                     str(sum(r["errors"] for r in runs[name]))])  # fmt: skip
    print_table("acks=all RF 3, 100-byte records, same run", ["tree", "runs (records/s)",
                "median records/s", "median broker CPU µs/record", "median p99 ms", "errors"], rows)  # fmt: skip
    (base_rate, base_cpu), (other_rate, other_cpu) = medians["base"], medians["other"]
    print(f"other / base: records/s {other_rate / base_rate:.3f}, "
          f"broker CPU per record {other_cpu / base_cpu:.3f}")  # fmt: skip
    print(json.dumps({"trees": {k: str(v) for k, v in trees.items()}, "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
