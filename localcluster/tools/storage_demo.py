"""`localcluster demo` (storage stage): append, read back, kill -9 a writer, recover.

The writer is a real child process appending to a real memory-mapped log; it prints each
acknowledged append, and the parent SIGKILLs it at a random moment. Reopening the log must keep
every acknowledged batch and cut only the torn tail. Run as a module (`child DIR`) it is that
writer.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from localcluster.storage import BatchSpec, Log, LogConfig, Record, encode_batch, iter_batches
from localcluster.storage import record_batch as rb
from localcluster.tools.cluster_view import console as shared_console

RECORD_BYTES = 100
RECORDS_PER_BATCH = 100
DEMO_CONFIG = LogConfig(segment_bytes=16 << 20)


def _batch(sequence: int) -> bytes:
    """A batch whose records carry `sequence`, so a reader can check order and gaps."""
    value = f"{sequence:012d}".encode().ljust(RECORD_BYTES, b".")
    records = [Record(value=value, key=b"demo") for _ in range(RECORDS_PER_BATCH)]
    return encode_batch(records, BatchSpec(base_timestamp=int(time.time() * 1000)))


def _sequences(log: Log) -> list[int]:
    """The sequence number of each batch in the log, read back through `Log.read`."""
    found, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 8 << 20).tobytes()
        for position, header in iter_batches(data):
            record = next(rb.iter_records(memoryview(data)[position : position + header.size]))
            found.append(int(record.value[:12]))
            offset = header.next_offset
    return found


def run_demo(records: int, kills: int, directory: Path | None = None) -> int:
    console = shared_console()
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="localcluster-demo-", dir=base) as tmp:
        root = directory or Path(tmp)
        ok = _append_and_read(console, root / "demo-0", records)
        ok &= _kill_and_recover(console, root / "demo-1", kills)
    console.print(
        "[bold green]storage demo passed[/]" if ok else "[bold red]storage demo FAILED[/]"
    )
    return 0 if ok else 1


def _append_and_read(console: Console, directory: Path, records: int) -> bool:
    console.rule("1. append and read back")
    log = Log.open(directory, DEMO_CONFIG)
    batches = -(-records // RECORDS_PER_BATCH)
    payloads = [_batch(i) for i in range(min(batches, 64))]
    started = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("appending", total=batches)
        for i in range(batches):
            payload = payloads[i] if i < len(payloads) else _batch(i)
            log.append(payload, leader_epoch=0)
            if i % 256 == 0:
                progress.update(task, completed=i)
    elapsed = time.perf_counter() - started
    appended = batches * RECORDS_PER_BATCH
    console.print(f"appended {appended:,} records of {RECORD_BYTES} bytes in {batches:,} batches "
                  f"in {elapsed:.2f} s ({appended / elapsed:,.0f} records/s) into "
                  f"{len(log.segments)} segment(s) under {directory}")  # fmt: skip
    sequences = _sequences(log)
    ok = sequences == list(range(batches)) and log.log_end_offset == appended
    console.print(f"read back {len(sequences):,} batches, log end offset {log.log_end_offset:,}: "
                  + ("[green]all present, in order[/]" if ok else "[red]MISMATCH[/]"))  # fmt: skip
    log.close()
    return ok


def _kill_and_recover(console: Console, directory: Path, kills: int) -> bool:
    console.rule(f"2. kill -9 a writer {kills} times, recover each time")
    table = Table("kill", "acknowledged batches", "batches after recovery", "bytes cut",
                  "acknowledged lost", "verdict")  # fmt: skip
    rng = random.Random()
    ok = True
    for kill in range(1, kills + 1):
        acknowledged = _run_writer_and_kill(directory, rng.randint(50, 400))
        log = _reopen(directory)
        sequences = _sequences(log)
        cut = sum(c.bytes_cut for c in log.cuts)
        lost = max(0, acknowledged - len(sequences))
        good = sequences == list(range(len(sequences))) and lost == 0
        ok &= good
        table.add_row(str(kill), f"{acknowledged:,}", f"{len(sequences):,}", f"{cut:,}",
                      str(lost), "[green]ok[/]" if good else "[red]LOST[/]")  # fmt: skip
        log.close()
    console.print(table)
    console.print("Acknowledged = appends the writer reported complete before SIGKILL. Recovery "
                  "may keep one more (written, not yet reported) and cuts a torn tail.")  # fmt: skip
    return ok


def _reopen(directory: Path) -> Log:
    return Log.open(directory, DEMO_CONFIG)


def _run_writer_and_kill(directory: Path, after_acks: int) -> int:
    """Start the writer, SIGKILL it after `after_acks` more acknowledgements; return the
    highest acknowledged sequence + 1 (the batches that must survive)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "localcluster.tools.storage_demo", "child", str(directory)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    acknowledged = 0
    try:
        seen = 0
        for line in child.stdout:
            acknowledged = int(line) + 1
            seen += 1
            if seen >= after_acks:
                break
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    return acknowledged


def _child(directory: str) -> None:
    log = Log.open(directory, DEMO_CONFIG)
    sequence = sum(1 for _ in _sequences(log))
    out = sys.stdout
    while True:
        log.append(_batch(sequence), leader_epoch=0)
        out.write(f"{sequence}\n")
        out.flush()
        sequence += 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        _child(sys.argv[2])
    else:
        sys.exit(f"usage: {sys.argv[0]} child DIRECTORY (the demo's writer process)")
