"""The broker's log lines for the replica core's state changes (replication/ready.py).

One line per change, in the words `localcluster chaos` (tools/chaos_check.py) reads back:
keep "leading ...", "following ..." and "follower ... truncated to" as they are.
"""

from __future__ import annotations

import logging

from localcluster.replication import errors
from localcluster.replication import ready as r

log = logging.getLogger("localcluster.broker.replica_manager")


def _name(error: int) -> str:
    return errors.NAMES.get(error, str(error))


_LINES = {
    r.Leading: lambda c: (logging.INFO, "leading %s-%d in epoch %d, ISR %s, offsets [%d, %d), HW %d",
                          *c.tp, c.leader_epoch, list(c.isr), c.log_start_offset,
                          c.log_end_offset, c.high_watermark),
    r.Following: lambda c: (logging.INFO, "following %s-%d: leader %d in epoch %d, offsets [%d, %d), "
                            "HW %d", *c.tp, c.leader, c.leader_epoch, c.log_start_offset,
                            c.log_end_offset, c.high_watermark),
    r.Truncated: lambda c: (logging.INFO, "follower %s-%d truncated to %d (log end was %d)", *c.tp,
                            c.log_end_offset, c.previous_end_offset),
    r.StartingOver: lambda c: (logging.WARNING, "%s-%d: leader %d's log starts at %d, past our end "
                               "%d; starting over", *c.tp, c.leader, c.offset, c.previous_end_offset),
    r.EpochAnswered: lambda c: (logging.DEBUG, "%s-%d: leader %d: epoch %d ends at %d (asked about "
                                "%d); cut at %d", *c.tp, c.leader, c.leader_epoch, c.end_offset,
                                c.asked_epoch, c.cut_at),
    r.TruncationDone: lambda c: (logging.INFO, "%s-%d: truncation against leader %d done, fetching "
                                 "from %d", *c.tp, c.leader, c.log_end_offset),
    r.OutOfRange: lambda c: (logging.WARNING, "%s-%d: fetch offset outside leader %d's log; asking "
                             "where it ends", *c.tp, c.leader),
    r.LeaderError: lambda c: (logging.INFO, "%s-%d: leader %d answered %s with %s; backing off",
                              *c.tp, c.leader, c.request, _name(c.error)),
    r.AppendFailed: lambda c: (logging.WARNING, "%s-%d: fetched batches not appended (%s); "
                               "backing off", *c.tp, c.reason),
    r.IsrProposed: lambda c: (logging.INFO, "%s-%d: ISR %s -> %s (%s)", c.update.topic,
                              c.update.partition, list(c.isr), list(c.update.isr), c.update.reason),
    r.IsrChanged: lambda c: (logging.INFO, "%s-%d: ISR %s written", *c.tp, list(c.isr)),
    r.Stopped: lambda c: (logging.INFO, "stopped replica %s-%d%s", *c.tp,
                          " and deleted its log" if c.deleted else ""),
    r.LeaderAndIsrRejected: lambda c: (logging.WARNING, "rejected LeaderAndIsr in controller epoch "
                                       "%d: controller epoch %d is current", c.controller_epoch,
                                       c.current_controller_epoch),
    r.PartitionStateIgnored: lambda c: (logging.INFO, "ignoring LeaderAndIsr for %s-%d in leader "
                                        "epoch %d: epoch %d is current", *c.tp, c.leader_epoch,
                                        c.current_leader_epoch),
}  # fmt: skip


def log_state_change(change) -> None:
    level, message, *args = _LINES[type(change)](change)
    log.log(level, message, *args)
