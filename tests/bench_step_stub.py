"""A stand-in benchmark step for the tests of bench.suite (the suite is what they test).

`python -m tests.bench_step_stub fail` prints a line and exits 3. `... hang` starts a child
process, writes both pids to $BENCH_RESULTS_DIR/hang.pids and sleeps: the suite must stop both.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    if sys.argv[1] == "fail":
        print("failing on purpose", flush=True)
        sys.exit(3)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (Path(os.environ["BENCH_RESULTS_DIR"]) / "hang.pids").write_text(f"{os.getpid()} {child.pid}")
    time.sleep(600)
