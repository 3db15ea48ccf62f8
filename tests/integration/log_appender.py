"""Child process for tests/integration/test_log_crash.py: append to a Log until killed.

    python log_appender.py <log_dir> <events_file> <seed> <leader_epoch> <segment_bytes>

Opens the Log (recovering it if it was not closed cleanly, from the recovery point in
<log_dir>/../recovery-point-offset-checkpoint), then loops forever: mostly appends a batch of
random records, sometimes truncates the tail, sometimes flushes and checkpoints the recovery
point, sometimes applies retention. Every step is reported to <events_file> with one os.write of one line (O_APPEND, on
tmpfs: the line survives SIGKILL the moment the call returns):

    S                                          about to open the log
    O <log_start_offset> <log_end_offset>      opened
    W <records_count> <checksum>               about to append this batch
    A <first_offset> <last_offset> <checksum>  the append returned
    T <offset>                                 about to truncate_to(offset)
    t <log_end_offset>                         truncate_to returned
    R                                          about to apply retention (retention.bytes)
    r <log_start_offset>                       retention returned

The checksum is batch_checksum() of the records, which the parent recomputes from the log.
"""

from __future__ import annotations

import os
import random
import sys
import zlib
from pathlib import Path

from localcluster.storage import (
    RECOVERY_POINT_OFFSET_CHECKPOINT,
    Log,
    LogConfig,
    Record,
    encode_batch,
    read_partition_offsets,
    write_partition_offsets,
)

PARTITION = ("crash", 0)


def batch_checksum(records) -> int:
    """CRC-32 over each record's key and value (lengths included), in order."""
    crc = 0
    for record in records:
        for part in (record.key, record.value):
            part = part or b""
            crc = zlib.crc32(len(part).to_bytes(4, "big") + part, crc)
    return crc


def config(segment_bytes: int) -> LogConfig:
    return LogConfig(segment_bytes=segment_bytes, segment_index_bytes=8 * 16,
                     retention_bytes=8 * segment_bytes, retention_ms=-1)  # fmt: skip


def checkpoint_path(log_dir: Path) -> Path:
    return log_dir.parent / RECOVERY_POINT_OFFSET_CHECKPOINT


def recovery_point(log_dir: Path) -> int:
    return read_partition_offsets(checkpoint_path(log_dir)).get(PARTITION, 0)


def main() -> None:
    log_dir, events, seed, epoch, segment_bytes = sys.argv[1:6]
    log_dir = Path(log_dir)
    rng = random.Random(int(seed))
    fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def report(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    report("S")
    log = Log.open(log_dir, config(int(segment_bytes)), recovery_point=recovery_point(log_dir))
    report(f"O {log.log_start_offset} {log.log_end_offset}")
    sequence = 0
    while True:
        roll = rng.random()
        if roll < 0.04 and log.log_end_offset > log.log_start_offset:
            offset = rng.randint(max(log.log_start_offset, log.log_end_offset - 12),
                                 log.log_end_offset)  # fmt: skip
            report(f"T {offset}")
            log.truncate_to(offset)
            report(f"t {log.log_end_offset}")
        elif roll < 0.08:  # often enough that later segments reuse the retired ones' files
            report("R")
            log.delete_old_segments(now_ms=0)
            report(f"r {log.log_start_offset}")
        elif roll < 0.13:
            write_partition_offsets(checkpoint_path(log_dir), {PARTITION: log.flush()})
        else:
            sequence += 1
            records = [
                Record(
                    value=rng.randbytes(rng.randint(0, 600)),
                    key=b"%d-%d" % (sequence, i),
                    timestamp=1_000_000 + sequence,
                )  # fmt: skip
                for i in range(rng.randint(1, 5))
            ]
            checksum = batch_checksum(records)
            report(f"W {len(records)} {checksum}")
            info = log.append(encode_batch(records), leader_epoch=int(epoch))
            report(f"A {info.first_offset} {info.last_offset} {checksum}")


if __name__ == "__main__":
    main()
