"""The sessions the idle sweep reads, decoded only when their stored document changed.

Sessions rarely change between two sweeps (15 s apart by default), yet decoding 10,000 stored documents into
:class:`~domain.idle.facts.SessionView` costs more than the sweep's whole budget. :class:`ViewCache` keeps each
session's last stored document (text, as the Redis client hands it) and the view decoded from it; a document equal to
the last one (a ``memcmp``) gives back the same view object, so only the changed ones are decoded. Views are
immutable, so sharing them is safe, and the identity of an unchanged view lets :func:`idle.sweep.judge` reuse what it
derived from it (``idle.sweep.Derived``).
"""

from __future__ import annotations

from collections.abc import Sequence

from core.codec import decode
from domain.idle.facts import SessionView


class ViewCache:
    """Session id -> (its last stored document, the view read from it); holds only the sessions of the last read."""

    def __init__(self) -> None:
        self._read: dict[str, tuple[str | bytes, SessionView]] = {}

    def views(self, session_ids: Sequence[str], documents: Sequence[str | bytes | None]) -> list[SessionView | None]:
        """The views of ``documents`` (those of ``session_ids``, in order; None where a session has none), decoding
        only those whose text changed since the last call; raises ``core.codec.MalformedDocument`` as ``decode``."""
        last, kept = self._read, {}
        views: list[SessionView | None] = []
        for session_id, document in zip(session_ids, documents, strict=True):
            if document is None:
                views.append(None)
                continue
            before = last.get(session_id)
            view = before[1] if before is not None and before[0] == document else decode(document, SessionView)
            kept[session_id] = (document, view)
            views.append(view)
        self._read = kept
        return views
