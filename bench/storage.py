"""Storage benchmark: `Log.append` and `Log.read`+sendfile against the raw limits of the machine.

What is measured, per filesystem (/dev/shm and a disk-backed directory):

Append (100-byte record values, batches of 16 KiB and 1 MiB built once with `encode_batch`;
each append is `Log.append(batch, leader_epoch=0)`: validate headers and CRC-32C, assign the
offset, write into the segment file with pwrite, add an index entry):
- raw copy, pages resident: the same bytes copied batch by batch into an mmap of the same size
  whose pages were populated (MADV_POPULATE_WRITE) before timing. This is the limit, the
  figure the log is compared with, and it excludes page allocation.
- raw write, fresh pages: the same bytes written batch by batch with pwrite(2) into a new file,
  as the log writes: the limit when page allocation is paid.
- raw copy, fresh map: the same bytes stored into an mmap of a new file; every page faults on
  its first store and the kernel zeroes it before the copy. It shows why the log writes
  instead (until Dec 2026 it stored through the map, with pages populated ahead).
- log, fresh segment: a new log with the default `LogConfig`: the sustained rate a broker sees,
  with page allocation included.
- log, pages resident: the same log code with every data page already populated, so the figure
  compares like for like with the raw resident copy (see `time_log_append`).

Why both: on tmpfs, allocating (zeroing) a fresh page costs far more than copying into one that
exists (~2.5 GB/s vs ~14 GB/s on the reference machine), so "fresh" figures are bounded by the
kernel's page allocator, not by the log.

Read (a log of 16 KiB batches): every byte is fetched with `Log.read(offset, max_bytes)` and each
returned slice is sent with `os.sendfile(socket, slice.fd, slice.position, slice.length)` to a
Unix stream socket drained by a reader process; the raw figure sends the same file in the very
same (position, length) chunks with plain `os.sendfile`. Timing ends when the reader has
received every byte.

Goals (issue 2), printed with a pass/miss mark and not asserted: the 1 MiB append rate at least
50% of the raw resident copy; at least 2,000,000 records/s with 16 KiB batches.

Figures are the best of several runs, variants interleaved run by run so drift hits them all
alike; ratios only ever combine figures from the same run. Results: bench/results/storage.json.
Disk appends go to the page cache and are never flushed (as a broker's appends are not); every
temporary file is removed, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing
import os
import shutil
import signal
import socket
import struct
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import (
    MiB,
    Timer,
    best,
    console,
    filesystem_of,
    mb_per_s,
    median,
    print_note,
    print_table,
    write_results,
)
from localcluster.storage import Log, LogConfig, Record, encode_batch, reservation

MADV_POPULATE_WRITE = 23  # Linux 5.14+
RECORD_VALUE_BYTES = 100
BATCH_TARGETS = {"16 KiB": 16 << 10, "1 MiB": 1 << 20}
READ_BATCH = "16 KiB"
# Log.read max_bytes per fetch; 1 MiB is replica.fetch.max.bytes.
READ_CHUNKS = {"64 KiB": 64 << 10, "1 MiB": 1 << 20}
GOAL_RAW_RATIO = 0.50
GOAL_RECORDS_PER_S = 2_000_000


@dataclass(frozen=True)
class Scale:
    append_bytes: int  # bytes appended per measurement
    read_bytes: int  # bytes of log read per measurement
    repeats: int


FULL = Scale(append_bytes=384 * MiB, read_bytes=256 * MiB, repeats=5)
QUICK = Scale(append_bytes=32 * MiB, read_bytes=32 * MiB, repeats=2)


@dataclass(frozen=True)
class Workload:
    label: str
    batch: bytes
    records_per_batch: int
    batches: int  # appended per measurement

    @property
    def total_bytes(self) -> int:
        return len(self.batch) * self.batches

    @property
    def total_records(self) -> int:
        return self.records_per_batch * self.batches


# -- workloads --------------------------------------------------------------------------------


def build_batch(target_bytes: int) -> tuple[bytes, int]:
    """The largest batch of 100-byte-value records that is at most `target_bytes` long."""
    value = b"v" * RECORD_VALUE_BYTES

    def encode(n: int) -> bytes:
        return encode_batch([Record(value=value)] * n)

    n = max(1, (target_bytes - 61) // (RECORD_VALUE_BYTES + 10))
    while len(encode(n + 1)) <= target_bytes:
        n += 1
    while n > 1 and len(encode(n)) > target_bytes:
        n -= 1
    return encode(n), n


def build_workloads(volume_bytes: int) -> dict[str, Workload]:
    workloads = {}
    for label, target in BATCH_TARGETS.items():
        batch, records = build_batch(target)
        workloads[label] = Workload(label, batch, records, max(1, volume_bytes // len(batch)))
    return workloads


# -- append measurements (each returns the seconds it timed) ----------------------------------


def time_raw_copy(directory: Path, work: Workload, populated: bool) -> float:
    """Store the batches back to back into a fresh mmap'd file of the same size; with
    `populated`, every page is populated before timing."""
    size = work.total_bytes
    fd, name = tempfile.mkstemp(dir=directory, prefix="raw-", suffix=".bin")
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mm:
            if populated:
                mm.madvise(MADV_POPULATE_WRITE, 0, size)
            batch, n = work.batch, len(work.batch)
            position = 0
            with Timer() as timer:
                for _ in range(work.batches):
                    end = position + n
                    mm[position:end] = batch
                    position = end
            return timer.seconds
    finally:
        os.close(fd)
        os.unlink(name)


def time_raw_write(directory: Path, work: Workload) -> float:
    """pwrite the batches back to back into a new file (sparse to its size, as a segment)."""
    fd, name = tempfile.mkstemp(dir=directory, prefix="raw-", suffix=".bin")
    try:
        os.ftruncate(fd, work.total_bytes)
        batch, n, pwrite = work.batch, len(work.batch), os.pwrite
        position = 0
        with Timer() as timer:
            for _ in range(work.batches):
                pwrite(fd, batch, position)
                position += n
        return timer.seconds
    finally:
        os.close(fd)
        os.unlink(name)


def time_log_append(directory: Path, work: Workload, resident: bool) -> float:
    """Append the batches to a new log; with `resident`, its data pages exist beforehand.

    Pages resident: the active segment's blocks for everything this run will write are
    allocated (fallocate) before timing, so the timed appends never allocate a data page. The
    alternatives are wrong: truncating a log frees its pages again, and a second log over the
    same files would not be the code path a broker runs. Index pages (8 + 8 bytes per batch)
    still fault in during timing, as they do for a broker.
    """
    log_dir = Path(tempfile.mkdtemp(dir=directory, prefix="log-"))
    try:
        config = LogConfig()
        log = Log.open(log_dir, config)
        try:
            if resident:
                needed = work.batches * len(work.batch)
                assert needed <= config.segment_bytes, "resident run would roll to a fresh segment"
                reservation.reserve(log.active_segment.fileno(), 0, needed)
            append, batch = log.append, work.batch
            with Timer() as timer:
                for _ in range(work.batches):
                    append(batch, leader_epoch=0)
            return timer.seconds
        finally:
            log.delete()  # unlinks without flushing: nothing is written back to a disk
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


APPEND_VARIANTS: dict[str, Callable[[Path, Workload], float]] = {
    "raw copy, pages resident": lambda d, w: time_raw_copy(d, w, populated=True),
    "raw write, fresh pages": time_raw_write,
    "raw copy, fresh map": lambda d, w: time_raw_copy(d, w, populated=False),
    "log, fresh segment": lambda d, w: time_log_append(d, w, resident=False),
    "log, pages resident": lambda d, w: time_log_append(d, w, resident=True),
}
RAW_LIMIT = "raw copy, pages resident"


def interleaved(variants: dict, run: int) -> list:
    """Every variant once per run, in reverse order every other run, so drift and whatever
    one variant leaves behind (page cache, freed pages) touch them all alike."""
    items = list(variants.items())
    return items if run % 2 == 0 else items[::-1]


def measure_appends(directory: Path, fs_label: str, workloads: dict[str, Workload],
                    repeats: int) -> list[dict]:  # fmt: skip
    rows = []
    for work in workloads.values():
        samples: dict[str, list[float]] = {name: [] for name in APPEND_VARIANTS}
        for run in range(repeats):
            for name, measure in interleaved(APPEND_VARIANTS, run):
                samples[name].append(measure(directory, work))
        raw_seconds = best(samples[RAW_LIMIT])
        for name, secs in samples.items():
            seconds = best(secs)
            rows.append({
                "filesystem": fs_label, "batch": work.label, "variant": name,
                "batch_bytes": len(work.batch), "records_per_batch": work.records_per_batch,
                "batches": work.batches, "bytes": work.total_bytes,
                "samples_s": secs, "best_s": seconds, "median_s": median(secs),
                "mb_per_s": mb_per_s(work.total_bytes, seconds),
                "records_per_s": work.total_records / seconds,
                "ratio_vs_raw_resident": raw_seconds / seconds,
            })  # fmt: skip
    return rows


# -- read path --------------------------------------------------------------------------------


def _drain(data: socket.socket, control: socket.socket) -> None:
    """Reader process: told how many bytes to expect, reads them, answers b"k" when it got
    exactly that many (b"x" when more arrived: the sender sent the wrong bytes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    buffer = bytearray(1 << 20)
    while True:
        header = control.recv(8, socket.MSG_WAITALL)
        if len(header) < 8:
            return
        (expected,) = struct.unpack("<q", header)
        if expected == 0:
            return
        while expected > 0:
            got = data.recv_into(buffer)
            if not got:
                return
            expected -= got
        control.sendall(b"k" if expected == 0 else b"x")


class Reader:
    """A process draining a Unix socketpair, so the sender has a real peer on another core."""

    def __init__(self):
        self.data, data_peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control, control_peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ctx = multiprocessing.get_context("fork")
        self.process = ctx.Process(target=_drain, args=(data_peer, control_peer), daemon=True)
        self.process.start()
        data_peer.close()
        control_peer.close()

    def socket_buffers(self) -> dict:
        return {"so_sndbuf": self.data.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)}

    def time_send(self, total_bytes: int, send: Callable[[int], None]) -> float:
        """Seconds from the first byte sent until the reader holds all `total_bytes`."""
        self.control.sendall(struct.pack("<q", total_bytes))
        with Timer() as timer:
            send(self.data.fileno())
            answer = self.control.recv(1)
        assert answer == b"k", "reader process died" if not answer else "sent too many bytes"
        return timer.seconds

    def close(self) -> None:
        try:
            self.control.sendall(struct.pack("<q", 0))
        except OSError:
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.data.close()
        self.control.close()


def sendfile_all(out_fd: int, in_fd: int, position: int, length: int) -> None:
    while length:
        sent = os.sendfile(out_fd, in_fd, position, length)
        position += sent
        length -= sent


def fetch_chunks(log: Log, work: Workload, max_bytes: int) -> list[tuple[int, int]]:
    """The (position, length) of every slice `Log.read` returns when fetching the whole log."""
    chunks = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        for piece in log.read(offset, max_bytes).slices:
            chunks.append((piece.position, piece.length))
            offset += piece.length // len(work.batch) * work.records_per_batch
    return chunks


def send_log(log: Log, work: Workload, max_bytes: int, out_fd: int) -> None:
    """What a broker does per fetch: Log.read, then sendfile each slice.

    The next fetch offset is derived from the slice length (every batch here has the same
    size and record count); a client would read it from the last batch's header.
    """
    offset, end = log.log_start_offset, log.log_end_offset
    batch_bytes, records = len(work.batch), work.records_per_batch
    while offset < end:
        for piece in log.read(offset, max_bytes).slices:
            sendfile_all(out_fd, piece.fd, piece.position, piece.length)
            offset += piece.length // batch_bytes * records


def send_raw(fd: int, chunks: list[tuple[int, int]], out_fd: int) -> None:
    for position, length in chunks:
        sendfile_all(out_fd, fd, position, length)


def measure_reads(directory: Path, fs_label: str, work: Workload, repeats: int,
                  reader: Reader) -> list[dict]:  # fmt: skip
    rows = []
    log_dir = Path(tempfile.mkdtemp(dir=directory, prefix="read-"))
    try:
        log = Log.open(log_dir)
        try:
            for _ in range(work.batches):
                log.append(work.batch, leader_epoch=0)
            assert len(log.segments) == 1 and log.active_segment.size == work.total_bytes
            fd = log.active_segment.fileno()
            for label, max_bytes in READ_CHUNKS.items():
                chunks = fetch_chunks(log, work, max_bytes)
                assert sum(length for _, length in chunks) == work.total_bytes
                variants = {
                    "raw sendfile": lambda out, c=chunks: send_raw(fd, c, out),
                    "Log.read + sendfile": lambda out, m=max_bytes: send_log(log, work, m, out),
                }
                samples: dict[str, list[float]] = {name: [] for name in variants}
                for run in range(repeats):
                    for name, send in interleaved(variants, run):
                        samples[name].append(reader.time_send(work.total_bytes, send))
                raw_seconds = best(samples["raw sendfile"])
                for name, secs in samples.items():
                    seconds = best(secs)
                    rows.append({
                        "filesystem": fs_label, "max_bytes": label, "variant": name,
                        "chunks": len(chunks), "bytes": work.total_bytes,
                        "samples_s": secs, "best_s": seconds, "median_s": median(secs),
                        "mb_per_s": mb_per_s(work.total_bytes, seconds),
                        "ratio_vs_raw": raw_seconds / seconds,
                    })  # fmt: skip
        finally:
            log.delete()
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    return rows


# -- goals and printing -----------------------------------------------------------------------


def evaluate_goals(appends: list[dict]) -> list[dict]:
    goals = []
    for row in appends:
        if not row["variant"].startswith("log"):
            continue
        if row["batch"] == "1 MiB":
            goals.append({
                "goal": f">= {GOAL_RAW_RATIO:.0%} of raw resident copy, 1 MiB batches",
                "filesystem": row["filesystem"], "variant": row["variant"],
                "value": row["ratio_vs_raw_resident"], "shown": f"{row['ratio_vs_raw_resident']:.0%}",
                "met": row["ratio_vs_raw_resident"] >= GOAL_RAW_RATIO,
            })  # fmt: skip
        if row["batch"] == "16 KiB":
            goals.append({
                "goal": f">= {GOAL_RECORDS_PER_S:,} records/s, 16 KiB batches",
                "filesystem": row["filesystem"], "variant": row["variant"],
                "value": row["records_per_s"], "shown": f"{row['records_per_s']:,.0f}",
                "met": row["records_per_s"] >= GOAL_RECORDS_PER_S,
            })  # fmt: skip
    return goals


def print_appends(rows: list[dict], filesystems: dict[str, dict], scale: Scale) -> None:
    batches = {r["batch"]: r for r in rows}
    note = "; ".join(
        f"{label} batch = {r['batch_bytes']:,} bytes, {r['records_per_batch']} records"
        for label, r in batches.items()
    ) + (f". {scale.append_bytes // MiB} MiB appended per run, best of {scale.repeats} runs; "
         "MB = 10^6 bytes.")  # fmt: skip
    for fs_label, fs in filesystems.items():
        table_rows = []
        for row in (r for r in rows if r["filesystem"] == fs_label):
            if table_rows and row["variant"] == RAW_LIMIT:
                table_rows.append(None)
            table_rows.append((
                row["batch"], row["variant"], f"{row['mb_per_s']:,.0f}",
                f"{row['records_per_s']:,.0f}", f"{row['ratio_vs_raw_resident']:.0%}",
            ))  # fmt: skip
        print_table(
            f"Append on {fs_label}: {fs['path']} ({fs['type']}, {fs['device']})",
            ["batch", "variant", "MB/s", "records/s", "vs raw resident"],
            table_rows,
            text_columns=2,
            note=note,
        )


def print_reads(rows: list[dict], scale: Scale) -> None:
    table_rows = []
    for row in rows:
        if table_rows and row["variant"] == "raw sendfile":
            table_rows.append(None)
        table_rows.append((
            row["filesystem"], row["max_bytes"], row["variant"], f"{row['chunks']:,}",
            f"{row['mb_per_s']:,.0f}", f"{row['ratio_vs_raw']:.0%}",
        ))  # fmt: skip
    print_table(
        f"Read: a {READ_BATCH}-batch log sent with sendfile to a Unix socket (reader process)",
        ["filesystem", "max_bytes", "variant", "slices", "MB/s", "vs raw"],
        table_rows,
        text_columns=3,
        note=f"{scale.read_bytes // MiB} MiB sent per run, best of {scale.repeats} runs; "
        "page cache warm; both variants send the same (position, length) chunks.",
    )


def print_goals(goals: list[dict]) -> None:
    rows = [
        (g["goal"], g["filesystem"], g["variant"], g["shown"],
         "[green]pass[/]" if g["met"] else "[red]miss[/]")
        for g in goals
    ]  # fmt: skip
    print_table("Goals (issue 2; reported, not asserted)",
                ["goal", "filesystem", "measured on", "figure", "mark"], rows, text_columns=3,
                note="'pages resident' compares like for like with the raw copy; 'fresh segment' "
                "also pays the kernel's page allocation, which the raw resident copy does not.")  # fmt: skip


# -- main -------------------------------------------------------------------------------------


def pick_filesystems(shm_dir: str, disk_dir: str) -> dict[str, dict]:
    chosen = {}
    for label, path in (("shm", shm_dir), ("disk", disk_dir)):
        if not os.path.isdir(path):
            print_note(f"[yellow]skipping {label}: {path} is not a directory[/]")
            continue
        chosen[label] = {"path": path, **filesystem_of(path)}
    return chosen


def run(scale: Scale, filesystems: dict[str, dict], show_progress: bool = True) -> dict:
    append_work = build_workloads(scale.append_bytes)
    read_work = build_workloads(scale.read_bytes)[READ_BATCH]
    appends, reads = [], []
    reader = Reader()
    try:
        for fs_label, fs in filesystems.items():
            with tempfile.TemporaryDirectory(dir=fs["path"], prefix="localcluster-bench-") as d:
                if show_progress:
                    print_note(f"[dim]measuring {fs_label} ({fs['type']}) in {d} ...[/]")
                appends += measure_appends(Path(d), fs_label, append_work, scale.repeats)
                reads += measure_reads(Path(d), fs_label, read_work, scale.repeats, reader)
        socket_buffers = reader.socket_buffers()
    finally:
        reader.close()
    return {
        "config": {
            **asdict(scale),
            "record_value_bytes": RECORD_VALUE_BYTES,
            "log_config": asdict(LogConfig()),
            "read_batch": READ_BATCH,
            "read_socket": {"family": "AF_UNIX", "type": "SOCK_STREAM", **socket_buffers},
            "statistic": "best of repeats (median_s and samples_s kept)",
        },
        "filesystems": filesystems,
        "append": appends,
        "read": reads,
        "goals": evaluate_goals(appends),
    }


def warn_if_busy() -> list[float]:
    """Other work on the machine skews every figure here; say so when it is visible."""
    load = list(os.getloadavg())
    cores = os.cpu_count() or 1
    if load[0] >= cores / 2:
        print_note(f"[yellow]load average {load[0]:.2f} on {cores} cores before the run: "
                   "other work is running, figures will be low and noisy[/]")  # fmt: skip
    return load


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through the temp-dir cleanups


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.storage", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a few seconds in all (make demo)")
    parser.add_argument("--json", action="store_true", help="also print the JSON to stdout")
    parser.add_argument("--shm-dir", default="/dev/shm", help="tmpfs directory (default /dev/shm)")
    parser.add_argument("--disk-dir", default="/var/tmp", help="disk directory (default /var/tmp)")
    parser.add_argument("--repeats", type=int, help="runs per measurement (the best is reported)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    console(stderr=args.json)  # with --json, stdout carries only the JSON
    scale = QUICK if args.quick else FULL
    if args.repeats:
        scale = Scale(scale.append_bytes, scale.read_bytes, args.repeats)
    filesystems = pick_filesystems(args.shm_dir, args.disk_dir)
    load_before = warn_if_busy()
    results = run(scale, filesystems)
    results["config"]["load_average_before"] = load_before
    print_appends(results["append"], filesystems, scale)
    print_reads(results["read"], scale)
    print_goals(results["goals"])
    path = write_results("storage", results, to_stdout=args.json)
    print_note(f"[dim]results: {path}[/]")


if __name__ == "__main__":
    main()
