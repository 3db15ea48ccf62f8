"""heap.py: with the settings of a broker and a load process, frames of varying sizes reuse freed heap
memory instead of faulting in fresh pages (each fault is a page the kernel zeroes)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from localcluster import heap

FRAMES = textwrap.dedent("""
    import random, resource, sys
    import numpy as np
    if sys.argv[1] == "broker":
        from localcluster.heap import keep_freed_memory
        assert keep_freed_memory()
    rng = random.Random(7)
    held = []
    def faults_over(frames):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(frames):  # frames of 64 KiB to 16 MiB, two in flight, as a follower's
            frame = np.empty(rng.randrange(64 << 10, 16 << 20), dtype=np.uint8)
            frame[::4096] = 1  # the socket's bytes land on every page
            held.append(frame)
            if len(held) > 2:
                held.pop(0)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    faults_over(50)  # warm-up: the heap grows to what the frames need
    print(faults_over(200))
""")


def page_faults(settings: str) -> int:
    done = subprocess.run([sys.executable, "-c", FRAMES, settings], capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    return int(done.stdout)


@pytest.mark.skipif(not heap.AVAILABLE,
                    reason="no glibc mallopt in this process")  # fmt: skip
def test_frames_reuse_freed_memory_with_the_broker_settings():
    broker = page_faults("broker")
    default = page_faults("default")
    # 200 frames of 8 MiB on average touch ~400,000 pages; with the settings almost none of
    # them is a fresh page after the warm-up, with glibc's defaults tens of thousands are.
    assert broker < 2_000, broker
    assert default > 4 * broker, (default, broker)


def test_a_load_process_takes_the_settings_too():
    # Our client builds each produce frame in fresh buffers: without the settings a 1 MB batch
    # paid 1.6 ms of page faults in the load process (bench/README.md).
    script = textwrap.dedent("""
        import queue
        from localcluster import heap
        taken = []
        heap.keep_freed_memory = lambda: taken.append(True) or True
        from localcluster.tools.load import worker_main
        jobs = queue.Queue()
        jobs.put(None)  # no job: the process starts and ends
        worker_main(0, jobs, None, None)
        print(taken)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "[True]", done.stdout + done.stderr
