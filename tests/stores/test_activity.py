"""User activity as the gateway records it and the idle checker reads it, on a real Redis."""

from __future__ import annotations

from datetime import timedelta

from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from domain.idle.facts import Activity
from stores.activity import close_connection, forget_activity, open_connection, read_activity, record_activity


async def test_unknown_sessions_have_no_activity(redis: Redis, keys: Keys) -> None:
    assert await read_activity(redis, keys, ["a", "b"], utcnow()) == {"a": Activity(None, 0), "b": Activity(None, 0)}
    assert await read_activity(redis, keys, [], utcnow()) == {}


async def test_last_activity_only_moves_forward(redis: Redis, keys: Keys) -> None:
    now = utcnow()
    await record_activity(redis, keys, "s", now)
    await record_activity(redis, keys, "s", now - timedelta(seconds=30))  # a late, slow request
    [(last, _)] = (await read_activity(redis, keys, ["s"], now)).values()
    assert last is not None and abs((last - now).total_seconds()) < 1e-3
    await record_activity(redis, keys, "s", now + timedelta(seconds=5))
    [(later, _)] = (await read_activity(redis, keys, ["s"], now)).values()
    assert later is not None and later > last


async def test_an_open_connection_counts_until_it_lapses_or_closes(redis: Redis, keys: Keys) -> None:
    now = utcnow()
    await open_connection(redis, keys, "s", "c1", now, ttl=10)
    await open_connection(redis, keys, "s", "c2", now, ttl=10)
    assert (await read_activity(redis, keys, ["s"], now))["s"].open_connections == 2
    assert (await read_activity(redis, keys, ["s"], now + timedelta(seconds=11)))["s"].open_connections == 0

    await open_connection(redis, keys, "s", "c1", now + timedelta(seconds=8), ttl=10)  # refreshed
    assert (await read_activity(redis, keys, ["s"], now + timedelta(seconds=11)))["s"].open_connections == 1

    closed_at = now + timedelta(seconds=9)
    await close_connection(redis, keys, "s", "c1", closed_at)
    activity = (await read_activity(redis, keys, ["s"], now + timedelta(seconds=9)))["s"]
    assert activity.open_connections == 1  # c2 until it lapses
    assert activity.last is not None and abs((activity.last - closed_at).total_seconds()) < 1e-3


async def test_connection_key_expires_with_its_last_connection(redis: Redis, keys: Keys) -> None:
    now = utcnow()
    await open_connection(redis, keys, "s", "long", now, ttl=100)
    await open_connection(redis, keys, "s", "short", now, ttl=5)
    assert await redis.ttl(keys.idle_connections("s")) > 90  # the shorter one did not cut the longer one's life


async def test_forget_drops_ended_sessions_only(redis: Redis, keys: Keys) -> None:
    now = utcnow()
    for session_id in ("live", "ended"):
        await record_activity(redis, keys, session_id, now)
    await forget_activity(redis, keys, keep={"live"})
    found = await read_activity(redis, keys, ["live", "ended"], now)
    assert found["live"].last is not None and found["ended"].last is None
