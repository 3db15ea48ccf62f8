"""`localcluster log dump` shows each batch's producer id, epoch and sequences."""

from __future__ import annotations

from localcluster.storage import Log
from localcluster.storage.record_batch import BatchSpec, Record, encode_batch
from localcluster.tools import log_dump


def test_idempotent_batches_show_their_producer_and_sequences(tmp_path, capsys):
    log = Log.open(tmp_path / "t-0")
    try:
        log.append(encode_batch([Record(b"a"), Record(b"b"), Record(b"c")],
                                BatchSpec(producer_id=4001, producer_epoch=2, base_sequence=7)), 0)  # fmt: skip
        log.append(encode_batch([Record(b"plain")]), 0)
        log.flush()
    finally:
        log.close()
    assert log_dump.dump(tmp_path / "t-0") == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "│" in line]
    idempotent = next(r for r in rows if "4001" in r)
    cells = [c.strip() for c in idempotent.split("│") if c.strip()]
    assert cells[-3:] == ["4001", "2", "7-9"]
    plain = next(r for r in rows if r.split("│")[1].strip() == "3")
    assert [c.strip() for c in plain.split("│") if c.strip()][-3:] == ["-", "-", "-"]
