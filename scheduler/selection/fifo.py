"""``fifo``: oldest first (ties by session id)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from scheduler.selection.base import QueueEntry, ShareView

__all__ = ["order"]


def order(entries: Sequence[QueueEntry], shares: ShareView) -> Iterator[QueueEntry]:
    return iter(sorted(entries, key=lambda entry: (entry.created, entry.session.id)))
