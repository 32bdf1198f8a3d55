"""The sessions the idle sweep reads, read and decoded only when their stored document changed.

Sessions rarely change between two sweeps (15 s apart by default), yet reading 10,000 stored documents (about 6 KB
each: 60 MB a sweep out of Redis) and decoding them into :class:`~domain.idle.facts.SessionView` costs more than the
sweep's whole budget. Every write of a session document changes its revision (``Keys.session_revisions``, a token per
live session): the sweep reads the revisions, then only the documents whose revision changed (:meth:`ViewCache.stale`),
and :class:`ViewCache` hands back the same view object for every other session. A session with no revision (stored
before revisions existed) is read every sweep and compared as text (a ``memcmp``), as before them. Views are
immutable, so sharing them is safe, and the identity of an unchanged view lets :func:`idle.sweep.judge` reuse what it
derived from it (``idle.sweep.Derived``).

At 100,000 live sessions, reading every live id and every revision is itself 2-3 s. Between two full reads the sweep
follows the change feed instead (``stores.session_changes``): :meth:`ViewCache.apply` takes the few sessions written
since the last sweep, read as their revision and document, and keeps every other view as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from core.codec import decode
from core.collector import collector_paused
from domain.idle.facts import SessionView
from domain.model import SessionStatus


class Kept(NamedTuple):
    revision: str | None
    document: str | bytes | None
    """The text it was read from, kept only without a revision (compared as text at the next read)."""
    view: SessionView


class ViewCache:
    """Session id -> its revision, the view read from its document (and the document's text, for a session without
    a revision); holds only the sessions of the last read."""

    def __init__(self) -> None:
        self._read: dict[str, Kept] = {}
        self._running: dict[str, SessionView] = {}
        """The RUNNING ones among them (the sessions a sweep judges), kept as the reads change them: a sweep that
        follows the feed does not look at every live session to find them."""

    def stale(self, session_ids: Sequence[str], revisions: Sequence[str | None]) -> list[str]:
        """Those of ``session_ids`` whose document must be read (``revisions``: theirs, in order, as
        ``SessionStore.revisions`` reads them): not seen last time, of another revision, or with none."""
        last = self._read
        stale = []
        for session_id, revision in zip(session_ids, revisions, strict=True):
            kept = last.get(session_id)
            if revision is None or kept is None or kept.revision != revision:
                stale.append(session_id)
        return stale

    def views(
        self,
        session_ids: Sequence[str],
        documents: Sequence[str | bytes | None],
        revisions: Sequence[str | None] | None = None,
    ) -> list[SessionView | None]:
        """The views of ``session_ids``, in order; None where a session has no document. ``documents``: theirs, in
        order; with ``revisions``, only those of the :meth:`stale` sessions are read (the caller need not have read
        the others: they are given back their last view). Decodes only documents whose text changed since the last
        call; raises ``core.codec.MalformedDocument`` as ``decode``."""
        last, kept_now = self._read, {}
        if revisions is None:
            revisions = [None] * len(session_ids)
        views: list[SessionView | None] = []
        with collector_paused():  # many views, no cycles (core.collector)
            for session_id, document, revision in zip(session_ids, documents, revisions, strict=True):
                before = last.get(session_id)
                if revision is not None and before is not None and before.revision == revision:
                    kept_now[session_id] = before
                    views.append(before.view)
                    continue
                if document is None:
                    views.append(None)
                    continue
                if before is not None and before.document is not None and before.document == document:
                    view = before.view
                else:
                    view = decode(document, SessionView)
                kept_now[session_id] = Kept(revision, document if revision is None else None, view)
                views.append(view)
        self._read = kept_now
        self._running = {i: kept.view for i, kept in kept_now.items() if kept.view.status is SessionStatus.RUNNING}
        return views

    def apply(
        self, session_ids: Sequence[str], revisions: Sequence[str | None], documents: Sequence[str | bytes | None]
    ) -> None:
        """The sessions written since the last read, with their revisions and then their documents (in order): a
        session with neither (ended: its revision goes in the MULTI that ends it) or whose document has ended is
        forgotten, one of another revision decoded again, every session not named kept as it was."""
        kept, running = self._read, self._running
        for session_id, revision, document in zip(session_ids, revisions, documents, strict=True):
            before = kept.get(session_id)
            if revision is None or document is None:
                kept.pop(session_id, None)
                running.pop(session_id, None)
            elif before is None or before.revision != revision:
                view = decode(document, SessionView)
                if view.status.is_terminal:  # ended after its revision was read
                    kept.pop(session_id, None)
                else:
                    kept[session_id] = Kept(revision, None, view)
                if view.status is SessionStatus.RUNNING:
                    running[session_id] = view
                else:
                    running.pop(session_id, None)

    def live(self) -> tuple[list[str], list[SessionView]]:
        """The sessions kept (every live one, as last read): their ids and the views of the RUNNING ones."""
        return list(self._read), list(self._running.values())
