"""Where a new follower cuts its log before fetching: two protocols. Pure functions.

`hw-truncation` (Kafka 0.8, the design documents): cut to the local high watermark. It can lose
committed records (KIP-101 scenario 1: a follower's HW lags the leader's by one fetch) and
leave replicas diverged (scenario 2).

`leader-epoch` (KIP-101, KIP-279): ask the leader, with OffsetForLeaderEpoch, where the
follower's latest epoch ends in the leader's log, and cut at the first offset where the two
logs can differ. When the leader answers with an epoch the follower does not have, the
follower cuts to the end of its own largest earlier epoch and asks again (KIP-279), until both
name an epoch they share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


@dataclass(frozen=True, slots=True)
class Truncation:
    """Cut the log to `offset`; when not `done`, ask the leader about `next_epoch`."""

    offset: int
    done: bool
    next_epoch: int = UNDEFINED_EPOCH


def hw_truncation(high_watermark: int, log_end_offset: int) -> Truncation:
    return Truncation(min(high_watermark, log_end_offset), done=True)


def first_epoch_to_ask(latest_epoch: int) -> int | None:
    """The epoch a follower asks about first; None means it has no epoch history."""
    return None if latest_epoch == UNDEFINED_EPOCH else latest_epoch


def leader_epoch_truncation(leader_epoch: int, leader_end_offset: int,
                            local_end_offset_for: Callable[[int], tuple[int, int]],
                            log_end_offset: int, high_watermark: int) -> Truncation:  # fmt: skip
    """Decide from the leader's OffsetForLeaderEpoch answer (epoch, end offset).

    `local_end_offset_for(epoch)` is the follower's own answer for an epoch (its leader epoch
    cache with its log end offset): (largest local epoch <= epoch, where that epoch ends).
    """
    if leader_end_offset == UNDEFINED_EPOCH_OFFSET:
        # The leader knows no epoch <= ours: nothing to compare; fall back to the HW.
        return Truncation(min(high_watermark, log_end_offset), done=True)
    if leader_epoch == UNDEFINED_EPOCH:
        return Truncation(min(leader_end_offset, log_end_offset), done=True)
    local_epoch, local_end = local_end_offset_for(leader_epoch)
    if local_epoch == UNDEFINED_EPOCH or local_end == UNDEFINED_EPOCH_OFFSET:
        # We hold no epoch <= the leader's: everything we have may diverge past its end.
        return Truncation(min(leader_end_offset, log_end_offset), done=True)
    if local_epoch != leader_epoch:
        # KIP-279: the leader named an epoch we never had. Cut to the end of our largest
        # earlier epoch and ask about that one.
        return Truncation(min(local_end, log_end_offset), done=False, next_epoch=local_epoch)
    return Truncation(min(leader_end_offset, local_end, log_end_offset), done=True)
