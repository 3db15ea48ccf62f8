"""Commit-path benchmark: acks=all, replication factor 3 on 3 brokers, 100-byte records.

What is measured, in one run:
- raw 3-copy limit: a minimal chain written here, no broker code: a producer process
  `sendfile`s prebuilt batches (from a tmpfs file) over a Unix socket to a leader process,
  which `recv_into`s them into a prefaulted mmap of a /dev/shm file and `sendfile`s each
  received range from that file to two follower processes over Unix sockets; followers
  `recv_into` their own prefaulted mmaps and acknowledge cumulative byte counts; the leader
  acknowledges the minimum of the two to the producer. Timed from the first byte sent to the
  last acknowledgement: three copies of every byte and the acks, on the same cores.
- acks=all, full speed; acks=all rate-limited to half the acks=all rate just measured;
  acks=1, full speed (last: its followers end behind by seconds of records, and a run after
  it measured their catching up; every run starts once the high watermarks stopped moving).
  Load: --producers processes of our client, each sending prebuilt batches
  (`encode_batch`, built once) with `AsyncProducer.send_batch` round-robin over the topic's
  partitions (one leader per broker), a bounded number of batches outstanding. Latency is
  per batch (every record of a batch is acknowledged at the same moment): from the moment
  the batch was due (rate-limited: its slot on the schedule, so a stall is not hidden by the
  sender waiting; full speed: the send_batch call) to its acknowledgement, in an
  HdrHistogram per process, merged. records/s counts acknowledged records over the timed
  window (first send to last acknowledgement). The topic keeps 256 MiB a partition in 64 MiB
  segments and the brokers check retention every 250 ms (bench.broker's BOUNDED_TOPIC_CONFIG),
  as a long-running cluster with retention.bytes does: a run's memory on /dev/shm stays near
  3.4 GB however many records it writes, and new segments reuse the deleted ones' files. Without
  it a run wrote every byte into fresh pages, and past a few GB this VM backs fresh pages 7x
  slower: a 60M-record 1 MB run measured 2.0M records/s unbounded against 4.9-5.4M bounded
  (bench/README.md, "bench.commit's memory bounded by retention").
- first, untimed, on each fresh cluster (bench.broker's fill_past_retention): acks=all in 1 MB
  batches until each partition has written its retention and two segments more and retention
  has deleted from every one (the steady state: each roll reuses a deleted segment's file);
  then WARM_UP_S of acks=all in the runs' own batches; the runs then follow each other
  without deleting records between them. Without a warm-up
  the runs after the first timed one measured 12-51% above it in 5 of 6 quick runs, whatever
  their transport; with the 1 s one used until Dec 2026, a half-rate 1 MB run on a fresh
  cluster had p95 0.5 s where one after the fill had 3.1-3.6 ms (this VM's fresh memory).
- transports (issue 13), each an acks=all full-speed run beside the one above, with its ratio
  to it: replication over TCP loopback with SASL PLAIN (a second cluster of 3 brokers with
  `inter.broker.listener.name` BROKER and `inter.broker.unix.socket.enable=false`, measured right
  after the Unix-socket run; the brokers' "reaches broker" log lines prove the route), and
  clients over SASL_PLAINTEXT (the load on the same brokers' SASL_PLAINTEXT listener).
- idempotence (issue 14): the acks=all full-speed row is our client with `enable.idempotence=true`
  (its default, set explicitly so a conflicting setting is an error, not a silent fallback);
  then the same load twice with `enable.idempotence=false` and once more with it (A B B A, so
  neither side gains from its place in the run), and the ratio of the two sides' records/s.
- batch size (issue 19): our client's acks=all at full speed and at half that rate for each
  `batch.size` in BATCH_SIZES (the 64 KiB rows are the ones above), with the three brokers' CPU
  per record fitted to `per record + per batch / records per batch` (which of the two costs a
  bigger batch saves); and the floor: 16 KiB batches at 100 batches/s, the commit's latency on
  a cluster with nothing else to do.
- the machine's latency floor (issue 19), after the clusters stopped: a bare chain (producer ->
  leader -> two followers -> leader over Unix socketpairs, each process pwrite-ing the batch into
  a /dev/shm file whose pages it already holds, as the brokers' reused segment files, and doing
  nothing else) at the floor run's batch size and rate and at the
  best batch.size's half rate, beside the brokers' latency in those runs (`raw_chain_latency`).
- CPU: each broker's CPU seconds from /proc/<pid>/stat over the timed window, and each load
  process's own (os.times), shown in cores (1.00 = one core busy all the time).

Goals, printed with pass/miss and not asserted: >= 1,000,000 records/s at acks=all and p99 <= 5
ms at half that rate (issue 5); replication over TCP >= 80% of the Unix-socket figure (issue
13); idempotent acks=all >= 95% of non-idempotent acks=all (issue 14); >= 3,000,000 records/s
from our client at its best batch size, with the fraction of the raw 3-copy limit beside it,
and p99 <= 2 ms at half that rate (issue 19). Brokers, load processes and the raw chain all share this machine's cores (the table note says how many); every process started is killed by process
group at the end and every temporary directory is removed, also on Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.broker import (
    BOUNDED_BROKER_SETTINGS,
    BOUNDED_TOPIC_CONFIG,
    CLIENT_SASL,
    RECORD_VALUE_BYTES,
    SASL_CLIENT_LISTENER,
    Cluster,
    _cpu,
    build_batch,
    create_topic,
    fill_past_retention,
    install_sigterm,
    kill_workers,
    settled_end_offsets,
)
from bench.common import MB, print_goals, print_note, print_table, write_results
from bench.load import BATCH_BYTES, LoadPool, batch_records_for
from bench.plots import percentile_spectrum
from localcluster.client.frames import widen_send_buffer

MADV_POPULATE_WRITE = 23
GOAL_RECORDS_PER_S = 1_000_000
GOAL_P99_MS = 5.0
# After the fill, 1 s of acks=all in the runs' own batches. With the fill alone, the first
# timed run (acks=all, idempotent) read 5-10% below the two non-idempotent runs after it in 3
# of 6 full runs, as every first run did before the 1 s warm-up was added (bench/README.md).
WARM_UP_S = 1.0
GOAL_TCP_RATIO = 0.8  # issue 13: replication over TCP vs the Unix sockets
GOAL_IDEMPOTENT_RATIO = 0.95  # issue 14: enable.idempotence=true vs false, acks=all
IDEMPOTENT = {"enable.idempotence": "true"}
NOT_IDEMPOTENT = {"enable.idempotence": "false"}
TOPIC = "bench-commit"
BROKERS = (0, 1, 2)
PERCENTILES = (50.0, 99.0, 99.9)
# Issue 19: our client's batch.size against records/s and latency. 16 KiB is the Java client's
# default, 1,000,000 librdkafka's (under the brokers' message.max.bytes, 1,048,588).
BATCH_SIZES = (16 << 10, BATCH_BYTES, 256 << 10, 1_000_000)
GOAL_SCALED_RECORDS_PER_S = 3_000_000
GOAL_SCALED_PIPE_FRACTION = 0.22
GOAL_SCALED_P99_MS = 2.0
FLOOR_BATCH_BYTES = 16 << 10
FLOOR_BATCHES_PER_S = 100
CHAIN_SECONDS_MAX = 5.0  # each bare-chain run (the machine's latency floor): at most this long
CHAIN_LOG_BYTES = 64 << 20  # each chain process's file (_ChainLog): one bench segment


@dataclass(frozen=True)
class Scale:
    run_s: float  # seconds of load per broker run
    raw_bytes: int  # bytes through the raw chain


FULL = Scale(run_s=15.0, raw_bytes=1 << 30)
QUICK = Scale(run_s=3.0, raw_bytes=128 << 20)


# -- raw 3-copy chain -------------------------------------------------------------------------

CHUNK = 1 << 20
ACK = struct.Struct("<q")


def _prefaulted(directory: Path, name: str, size: int) -> tuple[int, mmap.mmap]:
    fd = os.open(directory / name, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)
    mm.madvise(MADV_POPULATE_WRITE, 0, size)
    return fd, mm


def _recv_all_into(sock: socket.socket, mm: mmap.mmap, size: int, after_each) -> None:
    view, position = memoryview(mm), 0
    while position < size:
        got = sock.recv_into(view[position : min(size, position + CHUNK)])
        if not got:
            raise ConnectionError("peer closed early")
        after_each(position, got)
        position += got
    view.release()


def _raw_follower(directory: Path, name: str, size: int, upstream: socket.socket, ready) -> None:
    fd, mm = _prefaulted(directory, name, size)
    ready.set()
    _recv_all_into(upstream, mm, size, lambda pos, n: upstream.sendall(ACK.pack(pos + n)))
    mm.close()
    os.close(fd)


def _raw_leader(directory: Path, size: int, producer: socket.socket, followers: list[socket.socket],
                ready) -> None:  # fmt: skip
    fd, mm = _prefaulted(directory, "leader.log", size)
    acked = [0] * len(followers)

    def acknowledge() -> None:
        """Reads followers' cumulative acks as they come (never blocking on one follower while
        the other's acks pile up); tells the producer the minimum when it grows."""
        import selectors

        selector = selectors.DefaultSelector()
        pending = {}
        for i, follower in enumerate(followers):
            selector.register(follower, selectors.EVENT_READ, i)
            pending[i] = b""
        told = 0
        while told < size:
            for key, _ in selector.select():
                i = key.data
                data = pending[i] + key.fileobj.recv(1 << 16)
                whole = len(data) // ACK.size * ACK.size
                if whole:
                    acked[i] = max(acked[i], ACK.unpack_from(data, whole - ACK.size)[0])
                pending[i] = data[whole:]
            low = min(acked)
            if low > told:
                producer.sendall(ACK.pack(low))
                told = low
        selector.close()

    def replicate(position: int, got: int) -> None:
        for follower in followers:
            _sendfile_all(follower.fileno(), fd, position, got)

    thread = threading.Thread(target=acknowledge, daemon=True)
    thread.start()
    ready.set()
    _recv_all_into(producer, mm, size, replicate)
    thread.join()
    mm.close()
    os.close(fd)


def _read_ack(sock: socket.socket) -> int:
    data = sock.recv(ACK.size, socket.MSG_WAITALL)
    if len(data) < ACK.size:
        raise ConnectionError("peer closed early")
    return ACK.unpack(data)[0]


def _sendfile_all(out_fd: int, in_fd: int, position: int, length: int) -> None:
    while length:
        sent = os.sendfile(out_fd, in_fd, position, length)
        position += sent
        length -= sent


def raw_three_copy(batch: bytes, records_per_batch: int, total_bytes: int) -> dict:
    """Producer (this process) -> leader -> two followers; returns seconds, records, bytes."""
    batches = max(1, total_bytes // len(batch))
    size = batches * len(batch)
    directory = Path(tempfile.mkdtemp(prefix="bench-commit-raw-", dir="/dev/shm"))
    ctx = multiprocessing.get_context("fork")
    workers = []
    try:
        source_fd, source = _prefaulted(directory, "source.bin", size)
        for i in range(batches):  # the producer's prebuilt batches, resident
            source[i * len(batch) : (i + 1) * len(batch)] = batch
        to_leader, leader_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        ready = [ctx.Event() for _ in range(3)]
        for i, (_, follower_end) in enumerate(pairs):
            workers.append(ctx.Process(target=_raw_follower, daemon=True,
                                       args=(directory, f"follower-{i}.log", size, follower_end, ready[i])))  # fmt: skip
        workers.append(ctx.Process(target=_raw_leader, daemon=True,
                                   args=(directory, size, leader_in, [p[0] for p in pairs], ready[2])))  # fmt: skip
        for worker in workers:
            worker.start()
        for event in ready:
            if not event.wait(60):
                raise RuntimeError("raw chain: a process did not get ready")
        cpu0 = _cpu()
        start = time.perf_counter()
        sender = threading.Thread(
            target=_sendfile_all, args=(to_leader.fileno(), source_fd, 0, size)
        )
        sender.start()
        told = 0
        while told < size:
            told = _read_ack(to_leader)
        seconds = time.perf_counter() - start
        cpu_s = _cpu() - cpu0
        sender.join()
        for worker in workers:
            worker.join(30)
        source.close()
        os.close(source_fd)
        return {"seconds": seconds, "records": batches * records_per_batch, "bytes": size,
                "producer_cpu_s": cpu_s}  # fmt: skip
    finally:
        kill_workers(workers)
        shutil.rmtree(directory, ignore_errors=True)


# -- the bare chain's latency: the machine's floor under one batch --------------------------------

FRAME = struct.Struct(">i")


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    if sock.recv_into(view, len(view), socket.MSG_WAITALL) < len(view):
        raise ConnectionError("peer closed early")


class _ChainLog:
    """What a chain process keeps of each frame: a pwrite into a /dev/shm file of CHAIN_LOG_BYTES
    whose pages were written once before the run, wrapping at its end, as the brokers' segments
    are written at their steady state (bench.commit's warm-up: each roll reuses a deleted
    segment's file, whose pages the file already holds). Until Dec 2026 the chain wrote fresh
    pages and freed them after the run; on this VM, once it had written a few GB, fresh pages
    cost 7x more, and two runs' 1 MB chains read p99 0.9 and 1.8 s."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        zeros = bytes(1 << 20)
        for offset in range(0, CHAIN_LOG_BYTES, len(zeros)):
            os.pwrite(self.fd, zeros, offset)
        self.position = 0

    def append(self, data: memoryview) -> None:
        if self.position + len(data) > CHAIN_LOG_BYTES:
            self.position = 0
        self.position += os.pwrite(self.fd, data, self.position)


def _chain_receive(sock: socket.socket, buffer: memoryview) -> memoryview:
    head = bytearray(FRAME.size)
    _recv_exactly(sock, memoryview(head))
    body = buffer[: FRAME.unpack(head)[0]]
    _recv_exactly(sock, body)
    return body


def _chain_follower(
    directory: Path, name: str, upstream: socket.socket, largest: int, ready
) -> None:
    log, buffer = _ChainLog(directory / name), memoryview(bytearray(largest))
    ready.set()
    while True:
        body = _chain_receive(upstream, buffer)
        log.append(body)
        upstream.sendall(ACK.pack(len(body)))


def _chain_leader(directory: Path, producer: socket.socket, followers: list[socket.socket],
                  largest: int, ready) -> None:  # fmt: skip
    log, buffer = _ChainLog(directory / "leader.log"), memoryview(bytearray(largest))
    ready.set()
    while True:
        body = _chain_receive(producer, buffer)
        log.append(body)
        head = FRAME.pack(len(body))
        for follower in followers:
            follower.sendall(head)
            follower.sendall(body)
        for follower in followers:
            _read_ack(follower)
        producer.sendall(ACK.pack(len(body)))


def raw_chain_latency(batch: bytes, batches_per_s: float, seconds: float) -> dict:
    """A floor for the commit of one batch on this machine: producer (this process) -> leader ->
    two followers -> leader -> producer over Unix socketpairs, one batch at a time on a
    schedule, each process receiving into a preallocated buffer and pwrite-ing the batch into
    a /dev/shm file whose pages it holds (_ChainLog, as the brokers' steady state) before passing it on
    or acknowledging it: no parsing, no event loop, no log index. Latency from when a batch was
    due, as the load measures it. Returns the count and percentiles in ms."""
    import numpy as np

    from localcluster.tools.load import least_timer_slack

    count = max(1, int(batches_per_s * seconds))
    directory = Path(tempfile.mkdtemp(prefix="bench-commit-chain-", dir="/dev/shm"))
    ctx = multiprocessing.get_context("fork")
    workers, sockets = [], []
    try:
        to_leader, leader_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        sockets = [to_leader, leader_in, *(end for pair in pairs for end in pair)]
        for sock in sockets:
            widen_send_buffer(sock)  # as the brokers' Unix sockets are
        ready = [ctx.Event() for _ in range(3)]
        for i, (_, follower_end) in enumerate(pairs):
            workers.append(ctx.Process(target=_chain_follower, daemon=True,
                                       args=(directory, f"follower-{i}.log", follower_end, len(batch), ready[i])))  # fmt: skip
        workers.append(ctx.Process(target=_chain_leader, daemon=True,
                                   args=(directory, leader_in, [p[0] for p in pairs], len(batch), ready[2])))  # fmt: skip
        for worker in workers:
            worker.start()
        for event in ready:
            if not event.wait(60):
                raise RuntimeError("bare chain: a process did not get ready")
        least_timer_slack()
        head, latencies = FRAME.pack(len(batch)), np.empty(count)
        start = time.monotonic() + 0.01
        for i in range(count):
            due = start + i / batches_per_s
            while (left := due - time.monotonic()) > 0:
                time.sleep(left)
            to_leader.sendall(head)
            to_leader.sendall(batch)
            _read_ack(to_leader)
            latencies[i] = time.monotonic() - due
        p50, p99, p999 = np.percentile(latencies * 1000, [50, 99, 99.9])
        return {"batch_bytes": len(batch), "batches_per_s": batches_per_s, "batches": count,
                "latency_ms": {"p50": float(p50), "p99": float(p99), "p99.9": float(p999),
                               "max": float(latencies.max() * 1000)}}  # fmt: skip
    finally:
        kill_workers(workers)  # they serve until killed: every process holds every socket's ends
        for sock in sockets:
            sock.close()
        shutil.rmtree(directory, ignore_errors=True)


def plot(runs: list[dict], path: Path, title: str) -> Path | None:
    return percentile_spectrum([(run["label"], run["curve_ms"]) for run in runs], path, title,
                               "produce latency (ms)", GOAL_P99_MS, f"goal p99 {GOAL_P99_MS:g} ms (half rate)")  # fmt: skip


def start_cluster(cluster: Cluster, partitions: int) -> dict[int, int]:
    """Three brokers, the topic (RF 3, min.insync.replicas 2, memory bounded by retention:
    BOUNDED_TOPIC_CONFIG) with full ISRs; its leaders."""
    cluster.start(BROKERS)
    create_topic(cluster.bootstrap, TOPIC, partitions, 3,
                 {"min.insync.replicas": "2", **BOUNDED_TOPIC_CONFIG})  # fmt: skip
    cluster.wait_until(lambda: all(len(cluster.partition_state(TOPIC, p).isr) == 3
                                   for p in range(partitions)), 30, "full ISRs")  # fmt: skip
    return {p: cluster.partition_state(TOPIC, p).leader for p in range(partitions)}


def replication_routes(cluster: Cluster) -> dict:
    """Which path each broker took to each other broker (its "reaches broker" log lines; a
    broker's requests to itself as controller are left out) and whether every one went the
    cluster's way (cluster.replication: "unix" or "tcp")."""
    routes = [r for r in cluster.routes() if r[0] != r[1]]
    pairs = {(a, b) for a in BROKERS for b in BROKERS if a != b}
    seen = {(a, b) for a, b, _, _ in routes}
    wrong = [
        f"{a}->{b} over {how} {rest}" for a, b, how, rest in routes if how != cluster.replication
    ]
    return {"expected": cluster.replication, "routes": [list(r) for r in routes],
            "missing": sorted(f"{a}->{b}" for a, b in pairs - seen), "wrong": wrong,
            "ok": not wrong and seen >= pairs}  # fmt: skip


def cores(run: dict) -> tuple[str, str, str]:
    """(brokers, load, machine) CPU in cores over the run's timed window."""
    brokers = sum(v or 0 for v in run["other_cores"].values())
    return (
        f"{brokers:.2f}",
        f"{sum(run['load_cores'].values()):.2f}",
        f"{run['machine_busy_cores']:.2f}",
    )


def broker_cpu_us_per_record(run: dict) -> float | None:
    """The three brokers' CPU per acknowledged record (µs): how the paths compare in cost,
    less sensitive to other people's work than records/s."""
    if not run["records"]:
        return None
    brokers = sum(v or 0 for v in run["other_cores"].values())
    return brokers * run["seconds"] / run["records"] * 1e6


def transport_rows(base: dict, others: list[dict]) -> list[dict]:
    """The transport runs beside the Unix-socket/PLAINTEXT acks=all run: ratios for the JSON."""
    out = []
    for run in [base, *others]:
        out.append({"label": run["label"], "records_per_s": run["records_per_s"],
                    "ratio": run["records_per_s"] / base["records_per_s"] if base["records_per_s"] else None,
                    "p50_ms": run["latency_ms"]["p50"], "p99_ms": run["latency_ms"]["p99"],
                    "brokers_cores": sum(v or 0 for v in run["other_cores"].values()),
                    "broker_cpu_us_per_record": broker_cpu_us_per_record(run)})  # fmt: skip
    return out


def idempotence_rows(idempotent: list[dict], not_idempotent: list[dict]) -> list[dict]:
    """The acks=all runs with and without idempotence, each side's runs together (records over
    seconds, the worst p50/p99, CPU per record over all of them), and the idempotent side's
    records/s as a fraction of the other's."""

    def side(runs: list[dict], label: str, flag: bool) -> dict:
        records, seconds = sum(r["records"] for r in runs), sum(r["seconds"] for r in runs)
        cpu = [broker_cpu_us_per_record(r) for r in runs]
        return {"label": label, "idempotent": flag, "runs": len(runs),
                "records_per_s": records / seconds if seconds else 0.0,
                "runs_records_per_s": [r["records_per_s"] for r in runs],
                "p50_ms": max(r["latency_ms"]["p50"] for r in runs),
                "p99_ms": max(r["latency_ms"]["p99"] for r in runs),
                "broker_cpu_us_per_record": None if None in cpu else sum(c * r["records"] for c, r in zip(cpu, runs, strict=True)) / records}  # fmt: skip

    rows = [side(not_idempotent, "acks=all, enable.idempotence=false", False),
            side(idempotent, "acks=all, enable.idempotence=true", True)]  # fmt: skip
    base = rows[0]["records_per_s"]
    for row in rows:
        row["ratio"] = row["records_per_s"] / base if base else None
    return rows


def batch_size_rows(sweep: dict[int, tuple[dict, dict]], raw: dict) -> list[dict]:
    """One row per batch.size: the full-speed run and the half-rate run after it."""
    rows = []
    for size, (at_full, at_half) in sorted(sweep.items()):
        rows.append({"batch_bytes": size, "batch_records": at_full["batch_records"],
                     "records_per_s": at_full["records_per_s"],
                     "pipe_fraction": at_full["records_per_s"] / raw["records_per_s"],
                     "latency_ms": at_full["latency_ms"], "broker_cpu_us_per_record": broker_cpu_us_per_record(at_full),
                     "half": {"records_per_s": at_half["records_per_s"], "latency_ms": at_half["latency_ms"]},
                     "errors": at_full["errors"] + at_half["errors"]})  # fmt: skip
    return rows


def cost_split(rows: list[dict]) -> dict | None:
    """The brokers' CPU per record fitted (least squares) to per_record + per_batch / records per
    batch: µs every record costs wherever it is, and µs every batch costs (its requests, responses
    and wake-ups) over the three brokers."""
    import numpy as np

    points = [
        (1 / r["batch_records"], r["broker_cpu_us_per_record"])
        for r in rows
        if r["broker_cpu_us_per_record"]
    ]
    if len({x for x, _ in points}) < 2:
        return None
    xs, ys = np.array(points).T
    per_batch, per_record = np.polyfit(xs, ys, 1)
    return {"per_record_us": float(per_record), "per_batch_us": float(per_batch)}


def bare_chains(rows: list[dict], floor: dict, seconds: float) -> list[dict]:
    """`raw_chain_latency` for the floor run's batches and rate, and for the best batch.size at
    its half rate, each beside the brokers' latency in that run."""
    best = max(rows, key=lambda r: r["records_per_s"])
    cases = [(FLOOR_BATCH_BYTES, FLOOR_BATCHES_PER_S, floor["latency_ms"]),
             (best["batch_bytes"], best["half"]["records_per_s"] / best["batch_records"], best["half"]["latency_ms"])]  # fmt: skip
    chains = []
    for batch_bytes, batches_per_s, brokers in cases:
        batch = build_batch(batch_records_for(RECORD_VALUE_BYTES, batch_bytes))
        chain = raw_chain_latency(batch, batches_per_s, seconds)
        chain["brokers_latency_ms"] = {k: brokers[k] for k in ("p50", "p99", "p99.9")}
        chains.append(chain)
    return chains


def scaled_goals(rows: list[dict]) -> list[dict]:
    """Issue 19's goals from the batch-size rows: the best records/s (with its fraction of the raw
    3-copy limit) and p99 at half that rate, at the same batch.size."""
    best = max(rows, key=lambda r: r["records_per_s"])
    half = best["half"]
    p99, p999 = half["latency_ms"]["p99"], half["latency_ms"]["p99.9"]
    throughput = {"goal": f">= {GOAL_SCALED_RECORDS_PER_S:,} records/s at acks=all from our client (best batch.size)",
                  "value": best["records_per_s"], "met": best["records_per_s"] >= GOAL_SCALED_RECORDS_PER_S,
                  "shown": f"{best['records_per_s']:,.0f} at batch.size {best['batch_bytes']:,} "
                           f"({best['pipe_fraction']:.1%} of the raw 3-copy limit; {GOAL_SCALED_PIPE_FRACTION:.0%} asked)",
                  "issue": 19}  # fmt: skip
    latency = {"goal": f"p99 <= {GOAL_SCALED_P99_MS:g} ms at half that rate",
               "value": p99, "met": p99 <= GOAL_SCALED_P99_MS, "issue": 19,
               "shown": f"{p99:.2f} ms (p99.9 {p999:.2f}) at {half['records_per_s']:,.0f}/s"}  # fmt: skip
    if best["records_per_s"] < GOAL_SCALED_RECORDS_PER_S:
        latency["note"] = "at half of the best rate reached, not of the goal's"
    return [throughput, latency]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.commit", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="a few seconds per run, rougher figures"
    )
    parser.add_argument("--json", action="store_true", help="also print the JSON to stdout")
    parser.add_argument("--seconds", type=float, help="seconds of load per broker run")
    parser.add_argument("--producers", type=int, default=2, help="load processes (default 2)")
    parser.add_argument("--partitions", type=int, default=3, help="topic partitions (default 3)")
    parser.add_argument(
        "--outstanding", type=int, default=16, help="batches outstanding per process"
    )
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    run_s = args.seconds or scale.run_s
    if args.json:
        from bench.common import console

        console(stderr=True)
    install_sigterm()

    batch_records = batch_records_for(RECORD_VALUE_BYTES)
    batch = build_batch(batch_records)
    load_before = os.getloadavg()
    if load_before[0] > 1.0:
        print_note(f"[yellow]load average {load_before[0]:.2f} before the run on {os.cpu_count()} cores: "
                   f"other work competes for the CPU and the figures will be low[/]")  # fmt: skip
    t0 = time.perf_counter()
    raw = raw_three_copy(batch, batch_records, scale.raw_bytes)  # before any broker runs
    raw["records_per_s"] = raw["records"] / raw["seconds"]
    raw["mb_per_s"] = raw["records"] * RECORD_VALUE_BYTES / raw["seconds"] / MB
    settings = {"auto.create.topics.enable": "false", "auto.leader.rebalance.enable": "false",
                **BOUNDED_BROKER_SETTINGS}  # fmt: skip
    # The Unix-socket cluster also has a SASL_PLAINTEXT client listener, so the SASL clients'
    # row runs on the very brokers, topic and leaders of the PLAINTEXT row. Replication over
    # TCP is a broker setting: a second cluster, idle (brokers long-polling) except in its run.
    cluster = Cluster(settings, sasl_clients=True)
    tcp_cluster = Cluster(settings, replication="tcp")
    pool = LoadPool(args.producers)
    warm_up: list[dict] = []
    try:
        pool.start()
        leaders = start_cluster(cluster, args.partitions)
        tcp_leaders = start_cluster(tcp_cluster, args.partitions)

        def job(on: Cluster, bootstrap: str | None = None, **extra) -> dict:
            return dict(client="own", bootstrap=bootstrap or on.bootstrap, topic=TOPIC,
                        partitions=list(range(args.partitions)), record_size=RECORD_VALUE_BYTES,
                        seconds=run_s, outstanding=args.outstanding,
                        cpu_of={f"broker {b.broker_id}": b.pid for b in on.brokers.values()}, **extra)  # fmt: skip

        def settle(on: Cluster) -> None:
            """The high watermarks stopped moving (retention bounds what the runs keep)."""
            settled_end_offsets(
                bootstrap=on.bootstrap, topic=TOPIC, partitions=args.partitions, timeout_s=120
            )

        # acks=1 last: its followers end seconds behind, and a run after it would measure
        # their catching up; every run starts once the high watermarks stopped moving. The
        # transport runs come right after the row they are compared with.
        for on in (cluster, tcp_cluster):
            warm_up.append(fill_past_retention(pool, on.bootstrap, TOPIC, args.partitions))
            # and the runs' own batches: the fill's are 1 MB (see WARM_UP_S)
            warm_up.append(pool.measure(acks="all", **(job(on) | {"seconds": WARM_UP_S})))
            settle(on)
        full = pool.measure(acks="all", **job(cluster, client_config=IDEMPOTENT))
        settle(cluster)
        # Idempotence: A B B A (full, then two runs without, then one with again), so neither
        # side gains from coming later (the first timed run of a cluster measures low).
        plain = [pool.measure(acks="all", **job(cluster, client_config=NOT_IDEMPOTENT))]
        settle(cluster)
        plain.append(pool.measure(acks="all", **job(cluster, client_config=NOT_IDEMPOTENT)))
        settle(cluster)
        again = pool.measure(acks="all", **job(cluster, client_config=IDEMPOTENT))
        settle(cluster)
        tcp = pool.measure(acks="all", **job(tcp_cluster))
        tcp_routes = replication_routes(tcp_cluster)
        tcp_isr_after = {
            p: list(tcp_cluster.partition_state(TOPIC, p).isr) for p in range(args.partitions)
        }
        # The runs below as before: three brokers on the machine. Its 3.4 GB of files stay until
        # the end: freed here, this VM reported them to its host during the next runs (quick
        # runs' 64 KiB half-rate p99 22-26 ms, against 4.6-9.8 with the cluster left running).
        tcp_cluster.stop()
        sasl = pool.measure(acks="all", **job(cluster, cluster.client_bootstrap(SASL_CLIENT_LISTENER),
                                               client_config=CLIENT_SASL))  # fmt: skip
        settle(cluster)
        half = pool.measure(acks="all", rate=full["records_per_s"] / 2,
                            **job(cluster, client_config=IDEMPOTENT))  # fmt: skip
        settle(cluster)
        sweep = {BATCH_BYTES: (full, half)}
        for size in BATCH_SIZES:
            if size in sweep:
                continue
            config = IDEMPOTENT | {"batch.size": str(size)}
            at_full = pool.measure(acks="all", **job(cluster, client_config=config))
            settle(cluster)
            at_half = pool.measure(acks="all", rate=at_full["records_per_s"] / 2,
                                   **job(cluster, client_config=config))  # fmt: skip
            settle(cluster)
            sweep[size] = (at_full, at_half)
        floor_config = IDEMPOTENT | {"batch.size": str(FLOOR_BATCH_BYTES)}
        floor = pool.measure(acks="all", rate=FLOOR_BATCHES_PER_S * batch_records_for(RECORD_VALUE_BYTES, FLOOR_BATCH_BYTES),
                             **job(cluster, client_config=floor_config))  # fmt: skip
        settle(cluster)
        acks1 = pool.measure(acks=1, **job(cluster))
        isr_after = {p: list(cluster.partition_state(TOPIC, p).isr) for p in range(args.partitions)}
        unix_routes = replication_routes(cluster)
    finally:
        pool.close()
        cluster.close()
        tcp_cluster.close()
    elapsed = time.perf_counter() - t0

    acks1["label"], full["label"] = "acks=1, full speed", "acks=all, full speed"
    for i, run in enumerate(plain):
        run["label"] = f"acks=all, full speed, enable.idempotence=false ({i + 1})"
    again["label"] = "acks=all, full speed (again, after those)"
    tcp["label"] = "acks=all, replication over TCP+SASL"
    sasl["label"] = "acks=all, clients over SASL_PLAINTEXT"
    half["label"] = f"acks=all, {half['target_records_per_s']:,.0f}/s"
    runs = [acks1, full, *plain, again, tcp, sasl, half]

    def lat(run, key):
        return f"{run['latency_ms'][key]:.2f}"

    rows = [("raw 3-copy limit", f"{raw['records_per_s']:,.0f}",
             f"{raw['mb_per_s']:,.1f}", "100%", "", "", "", "", "", "")]  # fmt: skip
    for run in runs:
        broker_c, load_c, machine_c = cores(run)
        rows.append((run["label"], f"{run['records_per_s']:,.0f}", f"{run['mb_per_s']:,.1f}",
                     f"{run['records_per_s'] / raw['records_per_s']:.1%}", lat(run, "p50"), lat(run, "p99"),
                     lat(run, "p99.9"), broker_c, load_c, machine_c))  # fmt: skip
    print_table(
        f"acks=all commit path: RF 3 on 3 brokers, {args.partitions} partitions, {RECORD_VALUE_BYTES}-byte records, {run_s:g} s per run",
        ["run", "records/s", "MB/s", "vs raw", "p50 ms", "p99 ms", "p99.9 ms", "brokers CPU", "load CPU", "machine CPU"],
        rows,
        note=(f"Load: {args.producers} processes of our client, send_batch of prebuilt {batch_records}-record "
              f"batches ({len(batch):,} bytes), at most {args.outstanding} batches outstanding per process; "
              f"latency per batch from when it was due to its acknowledgement. Leaders: {leaders} "
              f"(TCP cluster: {tcp_leaders}). "
              f"Everything shares {os.cpu_count()} cores: 3 brokers + {args.producers} load processes "
              f"(CPU in cores = CPU seconds per wall second over the timed window: 'brokers' all three from /proc, "
              f"'load' the load processes (os.times), 'machine' every process on the box from /proc/stat, "
              f"so machine - brokers - load is other people's work); the raw "
              f"chain ran alone before the brokers started (4 processes: producer, leader, 2 followers). "
              f"Errors: acks=1 {acks1['errors']}, all {full['errors']}, not idempotent {sum(r['errors'] for r in plain)}, again {again['errors']}, TCP {tcp['errors']}, "
              f"SASL {sasl['errors']}, half {half['errors']}. ISR after: {isr_after} (TCP cluster: {tcp_isr_after})."),
    )  # fmt: skip
    transports = transport_rows(full, [tcp, sasl])
    print_table(
        "Transports: acks=all RF 3 at full speed, beside the Unix-socket replication / PLAINTEXT clients row",
        ["run", "records/s", "vs Unix/PLAINTEXT", "p50 ms", "p99 ms", "brokers CPU", "broker CPU µs/record"],
        [(t["label"], f"{t['records_per_s']:,.0f}", f"{t['ratio']:.0%}", f"{t['p50_ms']:.2f}", f"{t['p99_ms']:.2f}",
          f"{t['brokers_cores']:.2f}", f"{t['broker_cpu_us_per_record']:.2f}") for t in transports],
        note=("TCP+SASL: a second cluster of 3 brokers replicating over TCP loopback (inter.broker.listener.name "
              "BROKER, SASL_PLAINTEXT with PLAIN; SASL costs only at connection setup, the data path is plain TCP), "
              "measured right after the acks=all row; routes from the brokers' logs: "
              + ("all over TCP" if tcp_routes["ok"] else f"[red]NOT all over TCP: {tcp_routes}[/]")
              + ". SASL_PLAINTEXT clients: the load connects to the same brokers' SASL_PLAINTEXT listener "
              "(PLAIN as User:client). 'broker CPU µs/record': the three brokers' CPU seconds per "
              "acknowledged record, the path's cost with less of the machine's noise than records/s."),
    )  # fmt: skip
    tcp_ratio = transports[1]["ratio"] or 0.0
    idempotence = idempotence_rows([full, again], plain)
    print_table(
        "Idempotence: acks=all RF 3 at full speed, our client with and without enable.idempotence",
        ["run", "records/s", "vs not idempotent", "p50 ms", "p99 ms", "broker CPU µs/record"],
        [(r["label"], f"{r['records_per_s']:,.0f}", f"{r['ratio']:.1%}" if r["ratio"] else "-",
          f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['broker_cpu_us_per_record'] or 0:.2f}")
         for r in idempotence],
        note=("Each side is two runs on the same brokers, topic and leaders, in the order with, without, without, "
              "with (records over seconds of both; the worse p50 and p99). Idempotent: every batch "
              "carries the producer id, epoch and sequence (InitProducerId before the first), the leader "
              "checks them against the partition's producer state, and at most 5 batches per partition are "
              "in flight."),
    )  # fmt: skip
    idempotent_ratio = idempotence[1]["ratio"] or 0.0
    goals = [
        {"goal": f">= {GOAL_RECORDS_PER_S:,} records/s at acks=all", "value": full["records_per_s"],
         "met": full["records_per_s"] >= GOAL_RECORDS_PER_S, "shown": f"{full['records_per_s']:,.0f}"},
        {"goal": f"p99 <= {GOAL_P99_MS:g} ms at half rate ({half['records_per_s']:,.0f}/s)",
         "value": half["latency_ms"]["p99"], "met": half["latency_ms"]["p99"] <= GOAL_P99_MS,
         "shown": f"{half['latency_ms']['p99']:.2f} ms"},
    ]  # fmt: skip
    note = None
    if full["records_per_s"] < GOAL_RECORDS_PER_S:
        note = (f"The goal's half rate, {GOAL_RECORDS_PER_S // 2:,}/s, was above this run's acks=all maximum; "
                f"p99 is reported at half of what was reached.")  # fmt: skip
        goals[1]["note"] = note
    print_goals("Goals (issue 5)", goals, note=note)
    tcp_goal = {"goal": f"acks=all RF 3, replication over TCP+SASL >= {GOAL_TCP_RATIO:.0%} of the Unix-socket figure",
                "value": tcp_ratio, "met": tcp_ratio >= GOAL_TCP_RATIO and tcp_routes["ok"],
                "shown": f"{tcp_ratio:.0%} ({tcp['records_per_s']:,.0f} vs {full['records_per_s']:,.0f}/s)"}  # fmt: skip
    if not tcp_routes["ok"]:
        tcp_goal["note"] = (
            "replication did not go over TCP on every route; the figure is not the TCP path's"
        )
    print_goals("Goals (issue 13)", [tcp_goal], note=tcp_goal.get("note"))
    goals.append(tcp_goal)
    idempotent_goal = {"goal": f"acks=all RF 3, idempotent >= {GOAL_IDEMPOTENT_RATIO:.0%} of not idempotent",
                       "value": idempotent_ratio, "met": idempotent_ratio >= GOAL_IDEMPOTENT_RATIO,
                       "shown": f"{idempotent_ratio:.1%} ({idempotence[1]['records_per_s']:,.0f} vs {idempotence[0]['records_per_s']:,.0f}/s)"}  # fmt: skip
    print_goals("Goals (issue 14)", [idempotent_goal])
    goals.append(idempotent_goal)
    batch_sizes = batch_size_rows(sweep, raw)
    split = cost_split(batch_sizes)
    floor_latency = floor["latency_ms"]
    print_table(
        "Batch size: our client's acks=all at full speed and at half that rate, per batch.size",
        ["batch.size", "records/batch", "records/s", "vs raw", "p99 ms", "broker CPU µs/record",
         "half rate", "p50 ms", "p99 ms", "p99.9 ms"],
        [(f"{r['batch_bytes']:,}", f"{r['batch_records']:,}", f"{r['records_per_s']:,.0f}", f"{r['pipe_fraction']:.1%}",
          f"{r['latency_ms']['p99']:.2f}", f"{r['broker_cpu_us_per_record'] or 0:.2f}", f"{r['half']['records_per_s']:,.0f}",
          f"{r['half']['latency_ms']['p50']:.2f}", f"{r['half']['latency_ms']['p99']:.2f}",
          f"{r['half']['latency_ms']['p99.9']:.2f}") for r in batch_sizes],
        note=("The 65,536 row is the acks=all and half-rate runs above; the others ran after them, each "
              "full speed then half of it. "
              + (f"The brokers' CPU per record fits {split['per_record_us']:.2f} µs per record + "
                 f"{split['per_batch_us']:,.0f} µs per batch (three brokers together): what a bigger batch saves "
                 "is the second. " if split else "")
              + f"Floor: {FLOOR_BATCH_BYTES:,}-byte batches at {FLOOR_BATCHES_PER_S} batches/s "
                f"({floor['records_per_s']:,.0f} records/s) took p50 {floor_latency['p50']:.2f}, p99 {floor_latency['p99']:.2f}, "
                f"p99.9 {floor_latency['p99.9']:.2f} ms: the commit's latency with nothing else to do. "
              f"Errors: {sum(r['errors'] for r in batch_sizes) + floor['errors']}."),
    )  # fmt: skip
    scaled = scaled_goals(batch_sizes)
    try:
        chains = bare_chains(batch_sizes, floor, min(run_s, CHAIN_SECONDS_MAX))
    except (OSError, RuntimeError) as e:  # ConnectionError is an OSError
        print_note(f"[yellow]the bare chain (the machine's latency floor) failed: {e}; the other "
                   f"results stand, and are written below without it[/]")  # fmt: skip
        chains = []
    if chains:
        print_table(
            "The machine's floor under one commit: a bare chain at the batch sizes and rates above",
            ["batch bytes", "batches/s", "bare chain p50 ms", "p99 ms", "p99.9 ms", "brokers p50 ms", "p99 ms"],
            [(f"{c['batch_bytes']:,}", f"{c['batches_per_s']:,.0f}", f"{c['latency_ms']['p50']:.2f}",
              f"{c['latency_ms']['p99']:.2f}", f"{c['latency_ms']['p99.9']:.2f}",
              f"{c['brokers_latency_ms']['p50']:.2f}", f"{c['brokers_latency_ms']['p99']:.2f}") for c in chains],
            note=("Producer -> leader -> two followers -> leader -> producer over Unix socketpairs, one batch at "
                  "a time on the schedule, each process pwrite-ing the batch into a 64 MiB /dev/shm file whose pages "
                  "it wrote once before (wrapping at its end, as the brokers reuse segment files) and nothing "
                  "else: no parsing, event loop or index. Run after the "
                  f"clusters stopped, {min(run_s, CHAIN_SECONDS_MAX):g} s each. Rows: the floor run's batches and "
                  "rate, and the best batch.size at its half rate (issue 19's latency goal)."),
        )  # fmt: skip
        scaled[1]["note"] = " ".join(filter(None, [scaled[1].get("note"), (
            f"the bare chain at that batch size and rate: p99 {chains[1]['latency_ms']['p99']:.2f} ms")]))  # fmt: skip
    print_goals("Goals (issue 19)", scaled, note=scaled[1].get("note"))
    goals += scaled
    for run in [*runs, floor, *(r for pair in sweep.values() for r in pair)]:
        for worker in run["workers"]:
            worker.pop("histogram", None)
    path = write_results("commit", {
        "config": {"run_s": run_s, "producers": args.producers, "partitions": args.partitions,
                   "batch_records": batch_records, "batch_bytes": len(batch), "outstanding": args.outstanding,
                   "record_value_bytes": RECORD_VALUE_BYTES, "raw_bytes": raw["bytes"], "leaders": leaders,
                   "tcp_leaders": tcp_leaders, "elapsed_s": elapsed, "load_average_before": load_before},
        "raw_three_copy": raw, "runs": runs, "transports": transports, "idempotence": idempotence,
        "routes": {"unix": unix_routes, "tcp": tcp_routes}, "goals": goals, "isr_after": isr_after,
        "tcp_isr_after": tcp_isr_after, "batch_sizes": batch_sizes, "cost_split": split,
        "bare_chains": chains,
        "floor": {"batch_bytes": FLOOR_BATCH_BYTES, "batches_per_s": FLOOR_BATCHES_PER_S,
                  "records_per_s": floor["records_per_s"], "latency_ms": floor_latency, "errors": floor["errors"]},
        "warm_up": [{k: w[k] for k in ("records", "records_per_s", "errors")} for w in warm_up],
    }, to_stdout=args.json)  # fmt: skip
    png = plot(runs, path.with_suffix(".png"),
               f"produce latency, RF 3, 3 brokers, {args.producers} load processes, {os.cpu_count()} cores")  # fmt: skip
    print_note(f"results: {path}" + (f", plot: {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
