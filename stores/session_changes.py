"""The feed of session document writes: which sessions changed since a reader's cursor, without reading them all.

Every transaction that writes session documents (``stores.sessions``: a creation, a batch of creations, an update)
appends one entry to one Redis stream (``Keys.session_changes``) in its MULTI, naming the sessions it wrote. A reader
that keeps decoded sessions between passes (the idle checker's ``idle.sweeper``) remembers where it stopped reading
(a :class:`Cursor`) and next time reads only the entries after it, then only the documents they name: at 100,000
live sessions, a few hundred entries instead of every live id and every revision.

The stream is capped (:data:`FEED_LENGTH` entries, about), so a reader's cursor can fall off its head, and a Redis
restarted without its data, or a replica promoted without the last writes, may have lost the cursor's entry.
:func:`changes_since` answers None (read everything again) whenever it cannot vouch that it saw every entry after the
cursor: the cursor's own entry is no longer in the stream (the stream is only ever trimmed from its head, so while
that entry is there every later one is), or more than ``limit`` entries came since (reading everything is then as
cheap). What it cannot see: a failover that loses a write which the reader read after its cursor (a transaction
no replica acknowledged, ``core.redis``), or a restart from a snapshot older than documents it read; the reader
then keeps a document newer than the one stored until that session is written again or it reads everything again
(the idle sweep does every ``idle.sweeper.RESYNC_INTERVAL``). Its components' Redis users may not run ``INFO``
(``caravan.stack.redis_acl``), so the server's identity is not compared.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import NamedTuple

from redis.asyncio import Redis

from core.keys import Keys
from core.replies import stream_entries
from stores.coalesced import Coalesced

FEED_LENGTH = 100_000
"""Entries kept in the stream (about: trimmed as Redis finds cheap). One entry per transaction, so this many writes
may come between two reads of a reader before it must read everything again (a 15 s sweep: 6,000 writes a second)."""


class Cursor(NamedTuple):
    """Where a reader stopped: the last stream entry it read."""

    entry: str


def record(pipe: Redis | Coalesced, keys: Keys, session_ids: Iterable[str]) -> None:
    """In the MULTI of a write of these sessions' documents."""
    pipe.xadd(keys.session_changes, {"ids": " ".join(session_ids)}, maxlen=FEED_LENGTH, approximate=True)


async def latest(redis: Redis, keys: Keys) -> Cursor | None:
    """The cursor of a reader about to read everything (take it first: a write after it is seen by the next
    :func:`changes_since`); None when the stream is empty (the next read reads everything again)."""
    entries = stream_entries(await redis.xrevrange(keys.session_changes, count=1))
    return Cursor(entries[0][0]) if entries else None


async def changes_since(redis: Redis, keys: Keys, cursor: Cursor, *, limit: int) -> tuple[Cursor, set[str]] | None:
    """The sessions written since ``cursor`` and the cursor to read from next time; None when the reader must read
    everything again (the cursor's entry is gone, or more than ``limit`` entries came)."""
    # from the cursor's own entry (XRANGE's bounds are inclusive): its presence vouches for every entry after it
    entries = stream_entries(await redis.xrange(keys.session_changes, min=cursor.entry, count=limit + 2))
    if not entries or entries[0][0] != cursor.entry or len(entries) > limit + 1:
        return None
    changed: set[str] = set()
    for _, fields in entries[1:]:
        changed.update(fields.get("ids", "").split())
    return Cursor(entries[-1][0]), changed


class Follower:
    """A reader's place in the feed, for a reader that keeps decoded sessions between reads: :meth:`changed` before
    each read says which sessions to read again, or None to read everything (then :meth:`resyncing` first), and
    :meth:`caught_up` after the read moves the place past what they named.

    The place moves only then: a read that fails after :meth:`changed` (Redis gone mid-read) would otherwise leave
    what the feed named unread until the next full read, minutes later (a session created then stayed PENDING,
    unseen by the scheduler's pass, after a Redis restart). Asked again, the feed names it again."""

    def __init__(self, redis: Redis, keys: Keys, *, resync_every: timedelta, limit: int) -> None:
        """``resync_every``: read everything at least this often; ``limit``: more writes than this since the last
        read, read everything instead."""
        self.redis, self.keys = redis, keys
        self.resync_every, self.limit = resync_every, limit
        self.cursor: Cursor | None = None
        """Where the last read stopped (None: nothing read yet, or the stream was empty)."""
        self.resynced_at: datetime | None = None
        """When everything was last read."""
        self.full_reads = 0
        """Reads of everything so far (begun)."""
        self._reading: tuple[Cursor | None, datetime | None] | None = None
        """Where the read under way will have left the reader, and when it last read everything: set by
        :meth:`changed` and :meth:`resyncing`, taken by :meth:`caught_up`."""

    async def changed(self, now: datetime) -> set[str] | None:
        """The sessions written since the last read (``now``: the reader's clock), or None to read everything."""
        self._reading = None
        if self.cursor is None or self.resynced_at is None or now - self.resynced_at >= self.resync_every:
            return None
        found = await changes_since(self.redis, self.keys, self.cursor, limit=self.limit)
        if found is None:
            return None
        cursor, changed = found
        self._reading = (cursor, self.resynced_at)
        return changed

    async def resyncing(self, now: datetime) -> None:
        """The reader is about to read everything: the cursor taken first (a write after it is in the next
        :meth:`changed`)."""
        self.full_reads += 1
        self._reading = (await latest(self.redis, self.keys), now)

    def caught_up(self) -> None:
        """The reader read what :meth:`changed` named (or everything, after :meth:`resyncing`): the next read starts
        after it."""
        if self._reading is not None:
            self.cursor, self.resynced_at = self._reading
            self._reading = None
