"""The session-selection interface: a strategy orders the sessions of one priority band.

A strategy is ``order(entries, shares) -> Iterator[QueueEntry]``. It is lazy on purpose: the pass places (or not)
each yielded entry before asking for the next one, so a strategy that reads ``shares`` (DRF) sees the shares after
every placement made so far. Strategies never decide about blocking, pushing back or reservations: that
head-of-line policy is the same for all of them and lives in ``scheduler.selection.sequence``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import attrgetter
from typing import Protocol

from scheduler.agents.vectors import Demand
from scheduler.pass_model import PendingSession

__all__ = ["QueueEntry", "SessionOrder", "ShareView", "by_age"]


class QueueEntry:
    """One pending session as the pass orders it (built once per session and pass; nothing changes it). A plain class
    with its own ``__init__``: compiled, a direct native constructor (a dataclass's generated ``__init__`` stays
    interpreted Python, about a tenth of a big pass's ``_entries``: bench/README.md)."""

    __slots__ = (
        "checked",
        "created",
        "demands",
        "id",
        "kernel_count",
        "priority",
        "project",
        "pushed_back",
        "role",
        "session",
        "user",
    )

    def __init__(
        self,
        session: PendingSession,
        created: float,
        demands: tuple[Demand, ...],
        pushed_back: bool,
        id: str,
        user: str,
        project: str | None,
        priority: int,
        kernel_count: int,
        role: str,
        checked: bool,
    ) -> None:
        self.session = session
        self.created = created
        """``created_at`` as a POSIX timestamp: the precomputed age key."""
        self.demands = demands
        """One summed demand (single-node) or one per kernel (multi-node), encoded for the group."""
        self.pushed_back = pushed_back
        """Failed ``retries_to_skip`` attempts already: goes behind its band and blocks nobody."""
        self.id = id
        self.user = user
        self.project = project
        self.priority = priority
        self.kernel_count = kernel_count
        self.role = role
        """The session's (its first kernel's role), copied: read several times per session in a pass (cheaper on
        this class, compiled or not)."""
        self.checked = checked
        """Some non-resource check may fail (``scheduler.wait_checks.may_fail``); False for most sessions."""


class ShareView:
    """What a strategy may ask about a user: its dominant share (DRF). This base answers 0 for everyone (what orders
    that never ask are given). A base class, not a Protocol: compiled (ops/build-native), a call through it is a direct
    one."""

    def share(self, user: str) -> float:
        return 0.0


class SessionOrder(Protocol):
    def __call__(self, entries: Sequence[QueueEntry], shares: ShareView) -> Iterator[QueueEntry]: ...


_created = attrgetter("created")


def by_age(entries: Sequence[QueueEntry], *, newest_first: bool, ids_descending: bool = False) -> list[QueueEntry]:
    """``entries`` by ``created`` (oldest first, or newest first), equal times by session id (ascending, or descending
    with ``ids_descending``). Creation times are nearly always distinct: then the float alone is the key (a tenth of
    the cost of a tuple key over 100k sessions) and the order is the same."""
    if len({entry.created for entry in entries}) == len(entries):
        return sorted(entries, key=_created, reverse=newest_first)
    if newest_first == ids_descending:
        return sorted(entries, key=lambda entry: (entry.created, entry.id), reverse=newest_first)
    sign = -1 if newest_first else 1
    return sorted(entries, key=lambda entry: (sign * entry.created, entry.id), reverse=ids_descending)
