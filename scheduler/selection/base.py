"""The session-selection interface: a strategy orders the sessions of one priority band.

A strategy is ``order(entries, shares) -> Iterator[QueueEntry]``. It is lazy on purpose: the pass places (or not)
each yielded entry before asking for the next one, so a strategy that reads ``shares`` (DRF) sees the shares after
every placement made so far. Strategies never decide about blocking, pushing back or reservations: that
head-of-line policy is the same for all of them and lives in ``scheduler.selection.sequence``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduler.agents.vectors import Demand
from scheduler.pass_model import PendingSession

__all__ = ["QueueEntry", "SessionOrder", "ShareView"]


@dataclass(frozen=True, slots=True)
class QueueEntry:
    session: PendingSession
    created: float
    """``created_at`` as a POSIX timestamp: the precomputed age key."""
    demands: tuple[Demand, ...]
    """One summed demand (single-node) or one per kernel (multi-node), encoded for the group."""
    pushed_back: bool
    """Failed ``retries_to_skip`` attempts already: goes behind its band and blocks nobody."""


class ShareView(Protocol):
    def share(self, user: str) -> float: ...


class SessionOrder(Protocol):
    def __call__(self, entries: Sequence[QueueEntry], shares: ShareView) -> Iterator[QueueEntry]: ...
