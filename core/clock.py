"""The one place Caravan reads the wall clock, so tests and pure code can take time as an argument."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def from_iso(text: str) -> datetime:
    """An ISO 8601 moment; one with an offset comes back in UTC, like every moment Caravan holds (``core.codec`` then
    writes it with a trailing ``Z``). One without an offset comes back naive: callers that need a zone refuse it."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment.astimezone(UTC) if moment.tzinfo is not None and moment.tzinfo is not UTC else moment


def from_unix(seconds: str | float) -> datetime:
    """A moment given as unix seconds (a number, or its text as Redis keeps it), in UTC."""
    return datetime.fromtimestamp(float(seconds), UTC)
