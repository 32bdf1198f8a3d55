"""Which Redis indexes answer a session listing, and in what order: pure planning, no I/O.

A listing is the sessions a viewer may see (:func:`domain.access.listing_scope`), narrowed by a
:class:`ListingFilter`, in a :class:`ListingOrder`. Every order is a total order on (time, id), so a
:class:`Position` (the time and id of one session) is a stable place to resume from, whatever is
created meanwhile. :func:`plan_listing` turns a listing into a :class:`Plan` over the indexes that
``SessionStore`` keeps (see ``core.keys``); ``stores.session_listing`` runs it.

What each filter costs (N = sessions in the viewer's scope, P = page size):

- none, as a USER or SUPERADMIN (one ordered index): O(log N + P), no scan;
- none, as an ADMIN (own + project indexes, merged): O(k·(log N + P)) for k indexes; its ``totalCount`` by
  inclusion-exclusion over ZCARD and ZINTERCARD (``Plan.disjoint``: only the own index meets a project's), O(k·own);
- ``owner`` / ``project`` as a SUPERADMIN: O(log N + P) (that owner's or project's own index);
- ``createdAfter/Before`` under the created order, ``terminatedAfter/Before`` under the terminated
  order: a score range of the ordered index, O(log N + P);
- ``statuses``, ``type``, ``resourceGroup``, and ``owner``/``project`` within a narrower scope: one
  set intersection in Redis (ZINTERSTORE into a scratch key), O(smallest input · inputs) per page;
- the other time range (created under the terminated order and back): a range copied out of the
  other ordered index (ZRANGESTORE), O(log N + matches), then intersected as above;
- ``nameContains``: not indexable; candidates are scanned in bounded batches
  (:data:`NAME_SCAN_BATCH` names per round trip, read from a name hash, not whole documents)
  until the page is full: O(sessions scanned). ``totalCount`` with it scans every candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from core.keys import Keys
from domain.access import Scope
from domain.model import SessionStatus, SessionType

NAME_SCAN_BATCH = 256
"""Names read per round trip while scanning for ``nameContains``."""


class ListingOrder(Enum):
    CREATED_AT_ASC = "CREATED_AT_ASC"
    CREATED_AT_DESC = "CREATED_AT_DESC"
    TERMINATED_AT_ASC = "TERMINATED_AT_ASC"
    TERMINATED_AT_DESC = "TERMINATED_AT_DESC"

    @property
    def descending(self) -> bool:
        return self in (ListingOrder.CREATED_AT_DESC, ListingOrder.TERMINATED_AT_DESC)

    @property
    def by_terminated(self) -> bool:
        return self in (ListingOrder.TERMINATED_AT_ASC, ListingOrder.TERMINATED_AT_DESC)


@dataclass(frozen=True)
class ListingFilter:
    """Every given condition must hold; ``statuses`` matches any one of them. Time bounds are exclusive."""

    statuses: frozenset[SessionStatus] = frozenset()
    type: SessionType | None = None
    name_contains: str | None = None
    """Case-insensitive substring of the session name."""
    owner: str | None = None
    project: str | None = None
    resource_group: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    terminated_after: datetime | None = None
    terminated_before: datetime | None = None


@dataclass(frozen=True, order=True)
class Position:
    """One session's place in an order: its order time (unix seconds, as stored in the index) and id."""

    score: float
    id: str


@dataclass(frozen=True)
class ScoreRange:
    """Inclusive-or-exclusive bounds on an index's scores."""

    low: float = float("-inf")
    low_open: bool = False
    high: float = float("inf")
    high_open: bool = False

    @classmethod
    def between(cls, after: datetime | None, before: datetime | None) -> ScoreRange:
        return cls(
            low=after.timestamp() if after else float("-inf"),
            low_open=after is not None,
            high=before.timestamp() if before else float("inf"),
            high_open=before is not None,
        )

    @property
    def unbounded(self) -> bool:
        return self.low == float("-inf") and self.high == float("inf")

    @property
    def empty(self) -> bool:
        return self.low > self.high or (self.low == self.high and (self.low_open or self.high_open))

    def redis_low(self) -> str:
        return _bound(self.low, self.low_open)

    def redis_high(self) -> str:
        return _bound(self.high, self.high_open)

    def from_position(self, position: Position, descending: bool) -> ScoreRange:
        """This range cut to the scores at or past ``position`` (the position's own ties included)."""
        if descending:
            if position.score < self.high or (position.score == self.high and not self.high_open):
                return ScoreRange(self.low, self.low_open, position.score, False)
            return self
        if position.score > self.low or (position.score == self.low and not self.low_open):
            return ScoreRange(position.score, False, self.high, self.high_open)
        return self


def _bound(value: float, open_: bool) -> str:
    if value == float("inf"):
        return "+inf"
    if value == float("-inf"):
        return "-inf"
    return ("(" if open_ else "") + repr(value)


@dataclass(frozen=True)
class Plan:
    """Sessions = (union of ``sources``) ∩ each union in ``filters`` ∩ ``other_range``, scores in ``scores``.

    ``sources`` are ZSETs scored by the order's time; ``filters`` may be SETs or ZSETs (their scores
    are ignored). ``name_contains`` is checked afterwards, on names.
    """

    sources: tuple[str, ...]
    filters: tuple[tuple[str, ...], ...]
    scores: ScoreRange
    descending: bool
    other_range: tuple[str, ScoreRange] | None = None
    """A ZSET of the other time and the range its score must be in."""
    name_contains: str | None = None
    disjoint: tuple[tuple[str, ...], ...] = ()
    """Groups of ``sources`` no two of which share a session: owners' indexes, projects' indexes (a session has one
    owner and one project). Counting their union skips the intersections that are empty by this."""

    @property
    def empty(self) -> bool:
        return not self.sources or self.scores.empty or (self.other_range is not None and self.other_range[1].empty)

    @property
    def direct(self) -> bool:
        """One index answers it as it is: no combining in Redis, no merging here."""
        return len(self.sources) == 1 and not self.filters and self.other_range is None

    @property
    def merged(self) -> bool:
        """Several indexes, merged page by page here (a union needs no scratch key)."""
        return len(self.sources) > 1 and not self.filters and self.other_range is None


def plan_listing(keys: Keys, scope: Scope, wanted: ListingFilter, order: ListingOrder) -> Plan:
    filters: list[tuple[str, ...]] = []
    owner_key = keys.sessions_of_owner(wanted.owner) if wanted.owner is not None else None
    project_key = keys.sessions_of_project(wanted.project) if wanted.project is not None else None
    # the scope's indexes (scored by creation time)
    if scope.everything:
        narrowest = owner_key or project_key
        scope_keys: tuple[str, ...] = (narrowest,) if narrowest else (keys.sessions_by_created,)
        if owner_key and project_key:
            filters.append((project_key,))
    else:
        scope_keys = tuple(keys.sessions_of_owner(o) for o in scope.owners) + tuple(
            keys.sessions_of_project(p) for p in scope.projects
        )
        filters += [(k,) for k in (owner_key, project_key) if k]
    if wanted.statuses:
        filters.append(tuple(keys.sessions_with_status(s.value) for s in sorted(wanted.statuses)))
    if wanted.type is not None:
        filters.append((keys.sessions_of_type(wanted.type.value),))
    if wanted.resource_group is not None:
        filters.append((keys.sessions_in_group(wanted.resource_group),))
    created = ScoreRange.between(wanted.created_after, wanted.created_before)
    terminated = ScoreRange.between(wanted.terminated_after, wanted.terminated_before)
    name = wanted.name_contains.casefold() if wanted.name_contains else None
    if order.by_terminated:
        # only ended sessions have a place in this order; the scope (unless it is everything) filters it
        other = None if created.unbounded else (keys.sessions_by_created, created)
        if scope_keys != (keys.sessions_by_created,):
            filters.insert(0, scope_keys)
        return Plan((keys.sessions_by_terminated,), tuple(filters), terminated, order.descending, other, name)
    other = None if terminated.unbounded else (keys.sessions_by_terminated, terminated)
    disjoint = (
        ()
        if scope.everything
        else tuple(g for g in (scope_keys[: len(scope.owners)], scope_keys[len(scope.owners) :]) if g)
    )
    return Plan(scope_keys, tuple(filters), created, order.descending, other, name, disjoint)


def past(position: Position, cursor: Position, descending: bool) -> bool:
    """Is ``position`` strictly after ``cursor`` in the order?"""
    return position < cursor if descending else position > cursor
