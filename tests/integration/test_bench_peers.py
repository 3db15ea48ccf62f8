"""bench.peers: each peer system comes up, takes acknowledged load, and leaves nothing behind.

Skipped when the peer's server is not installed (`make system-deps` installs both).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.peers import nats, redis


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains `text` (nats-server keeps its config path there)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (cmdline := _cmdline(int(entry))) and text.encode() in cmdline:
            pids.append(int(entry))
    return pids


@pytest.mark.parametrize("peer", [nats, redis], ids=["nats", "redis"])
def test_measure_acknowledges_records_and_cleans_up(peer):
    if reason := peer.unavailable():
        pytest.skip(reason)
    result = peer.measure(record_size=100, seconds=1.0)

    assert result["records"] > 0, result
    assert result["errors"] == 0, result["first_error"]
    assert result["latency_ms"]["count"] > 0
    assert result["records_per_s"] > 0 and result["load_processes"] == 1
    assert result["curve_ms"] and result["curve_ms"][-1][0] == 100.0
    assert result["system"].split()[0] in ("NATS", "Redis") and "?" not in result["system"]
    # Servers were killed and reaped (not just signalled), and the temporary directory is gone.
    assert len(result["server_pids"]) == 3
    for pid in result["server_pids"]:
        assert _cmdline(pid) is None, f"server pid {pid} still exists"
    assert not Path(result["temp_dir"]).exists()
    assert _processes_mentioning(result["temp_dir"]) == []
