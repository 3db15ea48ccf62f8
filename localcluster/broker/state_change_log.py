"""The broker's log lines for the replica core's state changes (replication/ready.py), in the
words of replication/state_changes.py (the simulator's trace uses the same).

One line per change; `localcluster chaos` (tools/chaos_check.py) reads "leading ...",
"following ..." and "follower ... truncated to" back.
"""

from __future__ import annotations

import logging

from localcluster.replication.state_changes import describe

log = logging.getLogger("localcluster.broker.replica_manager")


def log_state_change(change) -> None:
    level, message = describe(change)
    log.log(level, "%s", message)
