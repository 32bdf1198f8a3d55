"""``fifo``: oldest first (ties by session id)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from scheduler.selection.base import QueueEntry, ShareView, by_age

__all__ = ["order"]


def order(entries: Sequence[QueueEntry], shares: ShareView) -> Iterator[QueueEntry]:
    return iter(by_age(entries, newest_first=False))
