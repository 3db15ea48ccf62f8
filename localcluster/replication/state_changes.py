"""How the replica core's state changes (ready.py: Leading, Following, Truncated, ...) read: one
sentence and a log level each, written once for the broker's state-change log and the
simulator's trace alike.

Pure text: no logger, file or clock here. `describe(change)` gives (level, message).
"""

from __future__ import annotations

import logging

from localcluster.replication import errors
from localcluster.replication import ready as r

DEBUG, INFO, WARNING = logging.DEBUG, logging.INFO, logging.WARNING


def _tp(tp) -> str:
    return f"{tp[0]}-{tp[1]}"


def _name(error: int) -> str:
    return errors.NAMES.get(error, str(error))


def _epoch_answered(c: r.EpochAnswered) -> str:
    then = "" if c.next_epoch is None else f", then asking about epoch {c.next_epoch}"
    return (f"{_tp(c.tp)}: leader {c.leader}: epoch {c.leader_epoch} ends at {c.end_offset} "
            f"(asked about {c.asked_epoch}); cut at {c.cut_at}{then}")  # fmt: skip


_MESSAGES = {
    r.Leading: (INFO, lambda c: f"leading {_tp(c.tp)} in epoch {c.leader_epoch}, ISR "
                f"{list(c.isr)}, offsets [{c.log_start_offset}, {c.log_end_offset}), HW "
                f"{c.high_watermark}"),
    r.Following: (INFO, lambda c: f"following {_tp(c.tp)}: leader {c.leader} in epoch "
                  f"{c.leader_epoch}, offsets [{c.log_start_offset}, {c.log_end_offset}), HW "
                  f"{c.high_watermark}"),
    r.Truncated: (INFO, lambda c: f"follower {_tp(c.tp)} truncated to {c.log_end_offset} (log "
                  f"end was {c.previous_end_offset})"),
    r.StartingOver: (WARNING, lambda c: f"{_tp(c.tp)}: leader {c.leader}'s log starts at "
                     f"{c.offset}, past our end {c.previous_end_offset}; starting over"),
    r.EpochAnswered: (DEBUG, _epoch_answered),
    r.TruncationDone: (INFO, lambda c: f"{_tp(c.tp)}: truncation against leader {c.leader} "
                       f"done, fetching from {c.log_end_offset}"),
    r.OutOfRange: (WARNING, lambda c: f"{_tp(c.tp)}: fetch offset outside leader {c.leader}'s "
                   "log; asking where it ends"),
    r.LeaderError: (INFO, lambda c: f"{_tp(c.tp)}: leader {c.leader} answered {c.request} with "
                    f"{_name(c.error)}; backing off"),
    r.AppendFailed: (WARNING, lambda c: f"{_tp(c.tp)}: fetched batches not appended "
                     f"({c.reason}); backing off"),
    r.IsrProposed: (INFO, lambda c: f"{c.update.topic}-{c.update.partition}: ISR {list(c.isr)} "
                    f"-> {list(c.update.isr)} ({c.update.reason})"),
    r.IsrChanged: (INFO, lambda c: f"{_tp(c.tp)}: ISR {list(c.isr)} written"),
    r.Stopped: (INFO, lambda c: f"stopped replica {_tp(c.tp)}"
                + (" and deleted its log" if c.deleted else "")),
    r.LeaderAndIsrRejected: (WARNING, lambda c: "rejected LeaderAndIsr in controller epoch "
                             f"{c.controller_epoch}: controller epoch "
                             f"{c.current_controller_epoch} is current"),
    r.PartitionStateIgnored: (INFO, lambda c: f"ignoring LeaderAndIsr for {_tp(c.tp)} in leader "
                              f"epoch {c.leader_epoch}: epoch {c.current_leader_epoch} is current"),
}  # fmt: skip


def describe(change) -> tuple[int, str]:
    """(log level, message) of one state change."""
    level, message = _MESSAGES[type(change)]
    return level, message(change)
