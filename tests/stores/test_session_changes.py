"""The change feed of session documents on a real Redis (``stores.session_changes``): each transaction that writes
session documents (a creation, a batch of creations, an update, an end) appends one entry naming them, and a write
that changes nothing appends none. The idle sweep reads only the sessions the feed names between two full reads
(``idle.sweeper``), so a write missing from it would leave a stale session judged."""

from __future__ import annotations

from datetime import timedelta

from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from domain.lifecycle import transition
from domain.model import SessionStatus
from stores import session_changes
from stores.session_changes import Cursor, Follower
from stores.sessions import SessionStore
from tests.stores.test_session_revisions import pending


async def test_each_write_of_session_documents_names_them_in_the_feed(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    assert await session_changes.latest(redis, keys) is None  # nothing written yet: no cursor to follow

    async def named_since(cursor: Cursor) -> tuple[Cursor, set[str]]:
        found = await session_changes.changes_since(redis, keys, cursor, limit=100)
        assert found is not None
        return found

    await store.create([pending("feed-a", "a"), pending("feed-b", "b")])
    cursor = await session_changes.latest(redis, keys)
    assert cursor is not None
    assert await named_since(cursor) == (cursor, set())  # nothing since

    await store.update("feed-a", lambda s: s)  # no change, no write
    assert await named_since(cursor) == (cursor, set())

    await store.update("feed-a", lambda s: transition(s, SessionStatus.SCHEDULED, reason="test", at=utcnow()))
    await store.request_termination("feed-b", reason="test", at=utcnow())
    cursor, named = await named_since(cursor)
    assert named == {"feed-a", "feed-b"}

    made = await store.create_each([([pending("feed-c", "c"), pending("feed-d", "d")], "token")])
    await store.create([pending("feed-e", "e")])
    cursor, named = await named_since(cursor)
    assert made == {"token": ["feed-c", "feed-d"]} and named == {"feed-c", "feed-d", "feed-e"}
    assert await redis.xlen(keys.session_changes) == 5  # one entry per transaction


async def test_a_cursor_whose_entry_is_gone_or_too_far_behind_is_refused(redis: Redis, keys: Keys) -> None:
    store = SessionStore(redis, keys)
    await store.create([pending("gone-a", "a")])
    cursor = await session_changes.latest(redis, keys)
    assert cursor is not None
    await store.create([pending("gone-b", "b")])
    await store.create([pending("gone-c", "c")])
    assert await session_changes.changes_since(redis, keys, cursor, limit=1) is None  # two writes since
    found = await session_changes.changes_since(redis, keys, cursor, limit=2)
    assert found is not None and found[1] == {"gone-b", "gone-c"}

    await redis.xtrim(keys.session_changes, maxlen=1, approximate=False)  # the cursor's entry trimmed away
    assert await session_changes.changes_since(redis, keys, cursor, limit=100) is None
    assert await session_changes.changes_since(redis, keys, found[0], limit=100) == (found[0], set())


async def test_a_follower_moves_past_what_it_named_only_once_the_reader_caught_up(redis: Redis, keys: Keys) -> None:
    """A reader whose read failed after :meth:`Follower.changed` asks again and is told the same sessions (the
    scheduler's pass and the idle sweep both read the documents after the feed answered)."""
    store = SessionStore(redis, keys)
    await store.create([pending("follow-a", "a")])
    follower = Follower(redis, keys, resync_every=timedelta(minutes=10), limit=100)
    now = utcnow()
    assert await follower.changed(now) is None
    await follower.resyncing(now)
    await store.create([pending("follow-b", "b")])  # after the cursor the whole read took
    assert await follower.changed(now) is None  # that whole read never finished: read everything again
    await follower.resyncing(now)
    follower.caught_up()
    await store.create([pending("follow-c", "c")])
    assert await follower.changed(now) == {"follow-c"}
    assert await follower.changed(now) == {"follow-c"}  # not caught up: named again
    follower.caught_up()
    assert await follower.changed(now) == set()
    assert follower.full_reads == 2
