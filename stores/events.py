"""Session status events: written to Redis Streams with the status change, read back without gaps.

Pub/sub drops whatever is published while a subscriber is not listening (not yet subscribed, slow,
reconnecting). So every status change (and every new reason of a PREPARING session, ``domain.lifecycle.restate``:
each entry of its status history) is appended to two Redis Streams *in the same MULTI as the
change itself* (``SessionStore._publish``): one per session (its whole short history; expires a
while after the session ends) and one per owner (capped at about ``OWNER_STREAM_LENGTH`` entries).
A reader reads from a cursor, the id of the last entry it delivered (``stores.event_hub`` blocks on
``XREAD`` for a whole process). Stream ids grow with every append, so "after this id" is exactly "what
I have not seen yet", on any gateway replica, across reconnects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import NotRequired, TypedDict

from redis.asyncio import Redis

from core import codec
from core.keys import Keys
from core.replies import stream_entries
from domain.model import Session, SessionStatus

OWNER_STREAM_LENGTH = 1000
"""About this many of an owner's latest events are kept (``XADD MAXLEN ~``): how far back a resume reaches."""
SESSION_STREAM_LENGTH = 200
"""A session's events are kept whole in practice (a session changes status a handful of times)."""
SESSION_STREAM_TTL = 24 * 3600
"""Seconds a session's stream is kept after the session ends (a late subscriber still gets its history)."""
BLOCK_MS = 5000
"""Longest single ``XREAD BLOCK``; shorter than the Redis client's socket timeout, then the read repeats."""
BEGINNING = "0-0"
"""The cursor before every event."""

_CURSOR = re.compile(r"\d{1,20}-\d{1,20}")


@dataclass(frozen=True)
class KernelState:
    hostname: str
    status: SessionStatus


@dataclass(frozen=True)
class SessionEvent:
    """One status change of one session (or a new reason of a PREPARING one): an entry of its status history."""

    id: str
    """The stream entry id: the cursor to resume after this event."""
    session_id: str
    owner_id: str
    status: SessionStatus
    reason: str
    at: datetime
    kernels: tuple[KernelState, ...]
    detail: str | None = None
    """Why, for a person (``StatusChange.detail``)."""


class EventDoc(TypedDict):
    """An event as a stream entry keeps it (its ``event`` field), in GraphQL's camelCase."""

    sessionId: str
    ownerId: str
    status: SessionStatus
    reason: str
    detail: NotRequired[str | None]
    at: datetime
    kernels: NotRequired[list[KernelState]]


def is_cursor(text: str) -> bool:
    """Is ``text`` a stream entry id (``<milliseconds>-<sequence>``)?"""
    return _CURSOR.fullmatch(text) is not None


def event_fields(session: Session) -> dict[str, bytes]:
    """The stream entry of ``session``'s latest status change (pure)."""
    change = session.status_history[-1] if session.status_history else None
    doc: EventDoc = {
        "sessionId": session.id,
        "ownerId": session.owner_id,
        "status": session.status,
        "reason": session.status_info,
        "detail": session.status_detail,
        "at": change.at if change else session.created_at,
        "kernels": [KernelState(k.hostname, k.status) for k in session.kernels],
    }
    return {"event": codec.encode(doc)}


def decode(entry_id: str, fields: Mapping[str, str | bytes]) -> SessionEvent:
    """The event of a stream entry (``entry_id`` and its fields)."""
    doc = codec.decode(fields["event"], EventDoc)
    return SessionEvent(
        id=entry_id,
        session_id=doc["sessionId"],
        owner_id=doc["ownerId"],
        status=doc["status"],
        reason=doc["reason"],
        at=doc["at"],
        kernels=tuple(doc.get("kernels", ())),
        detail=doc.get("detail"),
    )


def latest_of(session: Session) -> SessionEvent:
    """The session's current status as an event, for a session whose stream has expired (cursor: the beginning)."""
    fields = event_fields(session)
    return decode(BEGINNING, fields)


def append(pipe: Redis, keys: Keys, session: Session) -> None:
    """Queue the appends of ``session``'s latest status change on ``pipe`` (inside the caller's MULTI)."""
    fields = event_fields(session)
    session_stream = keys.session_events(session.id)
    pipe.xadd(session_stream, fields, maxlen=SESSION_STREAM_LENGTH, approximate=True)  # type: ignore[arg-type]
    owner_stream = keys.owner_events(session.owner_id)
    pipe.xadd(owner_stream, fields, maxlen=OWNER_STREAM_LENGTH, approximate=True)  # type: ignore[arg-type]
    if session.status.is_terminal:
        pipe.expire(session_stream, SESSION_STREAM_TTL)


async def last_id(redis: Redis, stream: str) -> str:
    """The id of ``stream``'s newest entry (the cursor of "from now on"); the beginning if it is empty."""
    newest = await redis.xrevrange(stream, count=1)
    return str(newest[0][0]) if newest else BEGINNING


def order(cursor: str) -> tuple[int, int]:
    milliseconds, sequence = cursor.split("-")
    return int(milliseconds), int(sequence)


async def is_kept(redis: Redis, stream: str, after: str) -> bool:
    """Does ``stream`` still hold the entry ``after``, so that reading after it misses nothing? (False once the
    cap trimmed it away: entries after it may have gone too.)"""
    oldest = await redis.xrange(stream, count=1)
    return after == BEGINNING or not oldest or order(after) >= order(str(oldest[0][0]))


async def read_after(redis: Redis, stream: str, after: str) -> list[SessionEvent]:
    """Every entry of ``stream`` after ``after`` that is there now, without waiting."""
    entries = stream_entries(await redis.xrange(stream, min=f"({after}", max="+"))
    return [decode(entry_id, fields) for entry_id, fields in entries]
