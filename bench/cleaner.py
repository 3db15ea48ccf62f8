"""Log cleaner benchmark: cleaning throughput, and acks=all produce latency with and without the
cleaner running, in one run.

What is measured:
- storage: `cleaner.clean_log` in this process on a log of 100-byte values over 10,000 keys
  (16 records a batch, 1 MiB segments, on /dev/shm): MB of dirty log per second, offset map
  and rewrite included; uncompressed and lz4 (an lz4 batch that loses records is decompressed
  and re-encoded with lz4).
- broker: 3 brokers; topic `load` (RF 3, cleanup.policy=delete) takes a paced acks=all stream
  of 100-byte records from confluent-kafka twice, each window the same length. Beforehand a
  compacted topic `dirty` (RF 3) is filled with overwrites whose record timestamps all lie at
  one moment a little ahead, with min.compaction.lag.ms 1: no cleaner touches it until that
  moment passes, then every broker's cleaner has all of it to clean at once. The first window
  ends before that moment (no cleaning), the second starts when it passes (every replica
  cleaning). Each broker's cleaner log lines give the MB cleaned, its busy time and how much
  of it overlapped the second window.

Results: bench/results/cleaner.json. Every broker and temporary directory is removed, also on
Ctrl-C.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.common import mb_per_s, median, print_note, print_table, write_results
from localcluster.storage import (
    BatchSpec,
    Log,
    LogConfig,
    Record,
    cleaner,
    compression,
    encode_batch,
)

KEYS = 10_000
VALUE_BYTES = 100
CLEANED = re.compile(r"^(\S+ \S+) broker-(\d+) INFO .*log cleaner: (\S+) cleaned up to offset \d+: "
                     r"(\d+) -> (\d+) bytes, (\d+) records removed, ([\d.]+) MB of dirty log in ([\d.]+) s")  # fmt: skip
SCALES = {  # storage MB, broker prefill MB, window s, produce rate/s
    "quick": (8, 12, 3.0, 300),
    "full": (64, 48, 10.0, 1000),
}


# -- storage ------------------------------------------------------------------------------------


def storage_throughput(megabytes: int, codec: int) -> dict:
    directory = Path(tempfile.mkdtemp(prefix="bench-cleaner-", dir="/dev/shm"))
    try:
        lg = Log.open(directory / "t-0", LogConfig(segment_bytes=1 << 20))
        rng = random.Random(1)
        offset = 0
        while lg.size_in_bytes < megabytes * 1_000_000:
            records = [Record(b"%07d" % (offset + i) * (VALUE_BYTES // 7), key=b"key-%05d" % rng.randrange(KEYS),
                              timestamp=1000) for i in range(16)]  # fmt: skip
            lg.append(encode_batch(records, BatchSpec(attributes=codec)), leader_epoch=0)
            offset += 16
        lg.roll()
        before = lg.size_in_bytes
        started = time.perf_counter()
        result = cleaner.clean_log(lg, None, cleaner.CleanerSettings(0, 86_400_000, 0.0), 2000)
        seconds = time.perf_counter() - started
        lg.close()
        return {"codec": compression.CODEC_NAMES[codec], "records": offset, "dirty_bytes": result.dirty_bytes_read,
                "bytes_before": before, "bytes_after": result.bytes_after, "records_removed": result.records_removed,
                "seconds": seconds, "mb_per_s": mb_per_s(result.dirty_bytes_read, seconds)}  # fmt: skip
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- brokers ------------------------------------------------------------------------------------


def produce_paced(bootstrap: str, topic: str, seconds: float, rate: int) -> dict:
    """acks=all records at `rate`/s for `seconds`; latency from produce() to the delivery report."""
    import confluent_kafka

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0}
    )
    latencies, errors = [], []

    def report(sent_at):
        return lambda e, m: (
            errors.append(e) if e else latencies.append(time.perf_counter() - sent_at)
        )

    wall_started = time.time()
    started = time.perf_counter()
    count = int(seconds * rate)
    for i in range(count):
        while (wait := started + i / rate - time.perf_counter()) > 0:
            producer.poll(min(wait, 0.005))
        producer.produce(topic, b"x" * VALUE_BYTES, on_delivery=report(time.perf_counter()))
        producer.poll(0)
    producer.flush(30)
    window = (wall_started, time.time())
    latencies.sort()

    def pick(q):
        return (
            latencies[min(int(q * len(latencies)), len(latencies) - 1)] * 1000
            if latencies
            else None
        )

    return {"records": count, "acknowledged": len(latencies), "errors": len(errors), "window": window,
            "latency_ms": {"p50": pick(0.5), "p99": pick(0.99), "max": pick(1.0)}}  # fmt: skip


def prefill(bootstrap: str, megabytes: int, timestamp_ms: int) -> int:
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5,
                                         "batch.size": 256 * 1024})  # fmt: skip
    rng, sent = random.Random(2), 0
    while sent < megabytes * 1_000_000:
        producer.produce(
            "dirty",
            b"v" * VALUE_BYTES,
            key=b"key-%05d" % rng.randrange(KEYS),
            timestamp=timestamp_ms,
        )
        sent += VALUE_BYTES + 9
        if sent % (1 << 20) < VALUE_BYTES + 9:
            producer.poll(0)
    assert producer.flush(60) == 0
    return sent


def _log_bytes(broker, name: str) -> int:
    return sum(p.stat().st_size for p in (broker.data_dir / name).glob("*.log"))


def cleaner_lines(brokers) -> list[dict]:
    out = []
    for broker in brokers:
        for line in list(broker.output):
            match = CLEANED.match(line.strip())
            if match and match.group(3).startswith("dirty-"):
                end = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                busy = float(match.group(8))
                out.append({"broker": int(match.group(2)), "mb": float(match.group(7)), "busy_s": busy,
                            "start": end - busy, "end": end})  # fmt: skip
    return out


def broker_run(prefill_mb: int, window_s: float, rate: int) -> dict:
    from confluent_kafka.admin import AdminClient, NewTopic

    from bench.broker import Cluster

    cluster = Cluster({"log.cleaner.backoff.ms": "100"})
    try:
        brokers = cluster.start([1, 2, 3])
        boot = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": boot})
        topics = [NewTopic("load", 1, 3, config={"min.insync.replicas": "2"}),
                  NewTopic("dirty", 1, 3, config={"cleanup.policy": "compact", "segment.bytes": str(1 << 20),
                                                  "min.cleanable.dirty.ratio": "0.01",
                                                  "min.compaction.lag.ms": "1"})]  # fmt: skip
        for name, future in admin.create_topics(topics, operation_timeout=10).items():
            assert future.exception(30) is None, name
        # cleanable once the wall clock passes this: after the prefill and the first window
        fill_started = time.time()
        hold_until_ms = int((fill_started + 3 * window_s + 15) * 1000)
        filled = prefill(boot, prefill_mb, hold_until_ms)
        fill_s = time.time() - fill_started
        # the followers' copies complete (acks=1 left them behind) before anything is timed
        deadline = time.monotonic() + 20  # bounded: segment boundaries may differ a little
        while time.monotonic() < deadline and len({_log_bytes(b, "dirty-0") for b in brokers}) > 1:
            time.sleep(0.1)
        without = produce_paced(boot, "load", window_s, rate)
        while time.time() * 1000 < hold_until_ms + 50:  # the scheduled start of the cleaning
            time.sleep(0.01)
        with_cleaner = produce_paced(boot, "load", window_s, rate)
        deadline = time.monotonic() + 120
        while (
            time.monotonic() < deadline and len({c["broker"] for c in cleaner_lines(brokers)}) < 3
        ):
            time.sleep(0.2)
        cleanings = cleaner_lines(brokers)
    finally:
        cluster.close()
    w0, w1 = with_cleaner["window"]
    # cleaner-seconds inside the second window (its log lines carry wall-clock ends)
    overlap_s = sum(max(0.0, min(c["end"], w1) - max(c["start"], w0)) for c in cleanings)
    total_mb = sum(c["mb"] for c in cleanings)
    busy_s = sum(c["busy_s"] for c in cleanings)
    return {"prefill_bytes": filled, "prefill_s": fill_s, "window_s": w1 - w0, "cleaner_s_in_window": overlap_s, "rate_per_s": rate,
            "without_cleaner": {k: v for k, v in without.items() if k != "window"},
            "with_cleaner": {k: v for k, v in with_cleaner.items() if k != "window"},
            "cleanings": cleanings, "cleaned_mb": total_mb, "cleaner_busy_s": busy_s,
            "broker_mb_per_s": total_mb / busy_s if busy_s else None}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cleaner", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="smaller logs, 3 s windows")
    parser.add_argument(
        "--repeats", type=int, default=3, help="storage runs per codec (best is shown)"
    )
    args = parser.parse_args(argv)
    storage_mb, prefill_mb, window_s, rate = SCALES["quick" if args.quick else "full"]
    repeats = 1 if args.quick else max(args.repeats, 1)
    storage = []
    for codec in (compression.NONE, compression.LZ4):
        runs = [storage_throughput(storage_mb, codec) for _ in range(repeats)]
        pick = max(runs, key=lambda r: r["mb_per_s"])
        pick["mb_per_s_median"] = median([r["mb_per_s"] for r in runs])
        storage.append(pick)
    print_table("log cleaner, in process (clean_log of a wholly dirty log)",
                ("codec", "dirty MB", "after MB", "records removed", "seconds", "MB/s"),
                [(r["codec"], f"{r['dirty_bytes'] / 1e6:.1f}", f"{r['bytes_after'] / 1e6:.2f}",
                  f"{r['records_removed']:,}", f"{r['seconds']:.2f}", f"{r['mb_per_s']:.1f}") for r in storage])  # fmt: skip
    broker = broker_run(prefill_mb, window_s, rate)
    rows = [(label, f"{d['acknowledged']:,}", d["errors"], f"{d['latency_ms']['p50']:.2f}",
             f"{d['latency_ms']['p99']:.2f}", f"{d['latency_ms']['max']:.2f}")
            for label, d in (("without the cleaner", broker["without_cleaner"]),
                             ("while every replica cleans", broker["with_cleaner"]))]  # fmt: skip
    print_table(f"acks=all produce, {rate} records/s of {VALUE_BYTES} B, {window_s:g} s each, 3 brokers",
                ("window", "acknowledged", "errors", "p50 ms", "p99 ms", "max ms"), rows,
                note=f"{broker['cleaned_mb']:.1f} MB of dirty log cleaned over the 3 brokers in "
                     f"{broker['cleaner_busy_s']:.2f} cleaner-seconds "
                     f"({broker['broker_mb_per_s'] or 0:.1f} MB/s per cleaner), "
                     f"{broker['cleaner_s_in_window']:.2f} of them inside the second window")  # fmt: skip
    results = {"storage": storage, "broker": broker, "quick": args.quick,
               "storage_mb_per_s_best": max(r["mb_per_s"] for r in storage)}  # fmt: skip
    path = write_results("cleaner", results)
    print_note(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
