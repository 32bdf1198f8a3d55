"""The ``sessions`` Relay connection: its types, its filter input, and the pure checks of its arguments.

Follows the GraphQL Cursor Connections Specification: ``first``/``after`` page forwards, ``last``/``before``
backwards (``first`` with ``last`` is refused). A cursor is the order and the (time, id) position of one
session, base64-encoded: opaque to clients, and stable, since a position does not move when sessions are
created or change status. When a page starts from a cursor, the page it came from lies on the other side,
so ``hasPreviousPage`` (forwards) and ``hasNextPage`` (backwards) are then true, as the spec allows.
"""

from __future__ import annotations

import base64
import binascii
import functools
from dataclasses import dataclass
from datetime import datetime

import strawberry
from strawberry.relay import PageInfo

from core.errors import InvalidInput
from domain.listing import ListingFilter, ListingOrder, Position
from gateway.graphql.sessions.types import Session, SessionStatus, SessionType

DEFAULT_PAGE = 50
MAX_FILTER_TEXT = 256
"""Longest text a filter field takes (names are at most 64 characters; ids and projects are short)."""

# The domain's enums are the GraphQL enums: strawberry.enum marks the class itself (and returns it), so the
# aliases below are plain classes, usable as annotations.
SessionOrder = ListingOrder
strawberry.enum(
    SessionOrder,
    name="SessionOrder",
    description="CREATED_AT orders every session; TERMINATED_AT only those that ended (TERMINATED or CANCELLED).",
)


@strawberry.input(description="Every given condition must hold. Time bounds are exclusive and need a time zone.")
class SessionFilter:
    statuses: list[SessionStatus] | None = strawberry.field(default=None, description="Any one of these statuses.")
    type: SessionType | None = None
    name_contains: str | None = strawberry.field(default=None, description="Case-insensitive part of the name.")
    owner: str | None = strawberry.field(default=None, description="The owner's user id.")
    project: str | None = None
    resource_group: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    terminated_after: datetime | None = None
    terminated_before: datetime | None = None


@strawberry.type(description="A session and the cursor of its place in the listing.")
class SessionEdge:
    cursor: str
    node: Session


@strawberry.type(description="A page of sessions (Relay cursor connection).")
class SessionConnection:
    edges: list[SessionEdge]
    page_info: PageInfo
    total_count: int = strawberry.field(
        description="Sessions matching the filter in all pages (computed only when selected)."
    )


# -- cursors ----------------------------------------------------------------------------------------


def encode_cursor(order: ListingOrder, position: Position) -> str:
    if not position.score:  # 0.0 and -0.0 are one key of the cache, and two cursors
        return _cursor.__wrapped__(order.value, position.score, position.id)
    return _cursor(order.value, position.score, position.id)


@functools.lru_cache(maxsize=4096)
def _cursor(order: str, score: float, session_id: str) -> str:
    """Kept per worker: the same newest pages are listed again and again, and a position never changes."""
    raw = f"{order}|{score!r}|{session_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_cursor(cursor: str, order: ListingOrder, argument: str) -> Position:
    try:
        order_name, score, session_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 2)
        position = Position(float(score), session_id)
    except (ValueError, UnicodeError, binascii.Error):
        raise InvalidInput(f"{argument} is not a cursor of this listing", field=argument) from None
    if order_name != order.value:
        raise InvalidInput(f"{argument} is a cursor of another order ({order_name})", field=argument)
    if not session_id or position.score != position.score:  # NaN
        raise InvalidInput(f"{argument} is not a cursor of this listing", field=argument)
    return position


# -- arguments --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PageRequest:
    """One page to read: ``size`` sessions from ``start`` towards ``end``, forwards or backwards."""

    size: int
    backward: bool
    start: Position | None
    end: Position | None


def page_request(
    order: ListingOrder, max_page: int, *, first: int | None, after: str | None, last: int | None, before: str | None
) -> PageRequest:
    if first is not None and last is not None:
        raise InvalidInput("give first (forwards) or last (backwards), not both", field="last")
    for name, value in (("first", first), ("last", last)):
        if value is not None and not 0 <= value <= max_page:
            raise InvalidInput(f"{name} must be between 0 and {max_page}", field=name)
    after_at = decode_cursor(after, order, "after") if after is not None else None
    before_at = decode_cursor(before, order, "before") if before is not None else None
    if last is not None:
        return PageRequest(last, True, before_at, after_at)
    return PageRequest(first if first is not None else min(DEFAULT_PAGE, max_page), False, after_at, before_at)


def listing_filter(given: SessionFilter | None) -> ListingFilter:
    if given is None:
        return ListingFilter()
    for name in ("name_contains", "owner", "project", "resource_group"):
        text = getattr(given, name)
        if text is not None and len(text) > MAX_FILTER_TEXT:
            raise InvalidInput(
                f"{_camel(name)} is longer than {MAX_FILTER_TEXT} characters", field=f"filter.{_camel(name)}"
            )
    for name in ("created_after", "created_before", "terminated_after", "terminated_before"):
        moment = getattr(given, name)
        if moment is not None and moment.tzinfo is None:
            raise InvalidInput(f"{_camel(name)} needs a time zone (e.g. a trailing Z)", field=f"filter.{_camel(name)}")
    if given.statuses is not None and not given.statuses:
        raise InvalidInput("statuses must name at least one status (or be left out)", field="filter.statuses")
    return ListingFilter(
        statuses=frozenset(given.statuses or ()),
        type=given.type,
        name_contains=given.name_contains or None,
        owner=given.owner,
        project=given.project,
        resource_group=given.resource_group,
        created_after=given.created_after,
        created_before=given.created_before,
        terminated_after=given.terminated_after,
        terminated_before=given.terminated_before,
    )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
