"""``lifo``: newest first (ties by session id).

Blocking is the same as FIFO's (decided in ``scheduler.selection.sequence``): with ``retries_to_skip = 0`` the
newest session that is short of resources blocks every older one. That keeps "strict" meaning one thing for every
strategy; set ``retries_to_skip`` > 0 to let the others pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from scheduler.selection.base import QueueEntry, ShareView, by_age

__all__ = ["order"]


def order(entries: Sequence[QueueEntry], shares: ShareView) -> Iterator[QueueEntry]:
    return iter(by_age(entries, newest_first=True))
