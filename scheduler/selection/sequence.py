"""The head-of-line policy shared by every strategy: priority bands, push-back and who is overdue for a reservation.

Attempt order: priority bands from highest to lowest; inside a band, first the sessions not pushed back, in the
strategy's order, then the pushed-back ones, in the strategy's order. A session is pushed back once it has failed
``retries_to_skip`` (> 0) attempts for lack of resources. The pass stops *attempting* at the first session that is
short of resources and not pushed back: everything after it in this order is blocked behind it (strict head-of-line
blocking, which is what ``retries_to_skip = 0`` means).

A pushed-back session older than ``reserve_after`` is overdue: before anything is placed it reserves the agent it fits
best (up to ``max_reservations`` per group, oldest first) and is attempted ahead of everyone else, so it cannot starve
forever (Backend.AI pushes back without bound). Others still use the reserved agent's slots it does not need, and
any amount beyond what it needs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from itertools import chain

from domain.scheduling_config import GroupConfig
from scheduler.pass_model import PendingSession
from scheduler.selection.base import QueueEntry, SessionOrder, ShareView

__all__ = ["attempt_order", "is_overdue", "is_pushed_back", "overdue_before"]


def is_pushed_back(session: PendingSession, config: GroupConfig) -> bool:
    return config.retries_to_skip > 0 and session.retries >= config.retries_to_skip


def overdue_before(config: GroupConfig, now: datetime) -> datetime | None:
    """A pushed-back session created before this instant is overdue (None: reservations are off)."""
    return None if config.reserve_after is None else now - config.reserve_after


def is_overdue(session: PendingSession, config: GroupConfig, now: datetime) -> bool:
    cutoff = overdue_before(config, now)
    return cutoff is not None and is_pushed_back(session, config) and session.created_at < cutoff


def attempt_order(entries: Sequence[QueueEntry], order: SessionOrder, shares: ShareView) -> Iterator[QueueEntry]:
    bands: dict[int, tuple[list[QueueEntry], list[QueueEntry]]] = {}
    for entry in entries:
        normal, pushed = bands.setdefault(entry.priority, ([], []))
        (pushed if entry.pushed_back else normal).append(entry)
    # chained, not yielded from: each entry then comes straight from the strategy's iterator
    return chain.from_iterable(
        order(part, shares) for priority in sorted(bands, reverse=True) for part in bands[priority]
    )
