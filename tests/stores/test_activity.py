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


async def test_lapsed_connections_are_trimmed_and_live_ones_kept(redis: Redis, keys: Keys) -> None:
    now = utcnow()
    await open_connection(redis, keys, "s", "long", now, ttl=100)
    await open_connection(redis, keys, "s", "short", now, ttl=5)
    await open_connection(redis, keys, "t", "short", now, ttl=5)
    await forget_activity(redis, keys, keep={"s", "t"}, now=now + timedelta(seconds=6))
    assert await redis.zcard(keys.idle_open_connections) == 1  # the shorter ones went, the longer one stays
    found = await read_activity(redis, keys, ["s", "t"], now + timedelta(seconds=6))
    assert (found["s"].open_connections, found["t"].open_connections) == (1, 0)


async def test_connections_are_counted_per_session_among_many(redis: Redis, keys: Keys) -> None:
    """One range read counts the open connections of every session, with ids that look like separators."""
    now = utcnow()
    sessions = [f"s-{i}" for i in range(300)] + ['a"b', "c/d", "e,f"]
    for i, session_id in enumerate(sessions):
        for c in range(i % 3):
            await open_connection(redis, keys, session_id, f"c{c}", now, ttl=30)
    await redis.zadd(keys.idle_open_connections, {"not json": now.timestamp() + 30})  # ignored, with a warning
    found = await read_activity(redis, keys, sessions, now)
    assert [found[s].open_connections for s in sessions] == [i % 3 for i in range(len(sessions))]


async def test_forget_drops_ended_sessions_only(redis: Redis, keys: Keys) -> None:
    now = utcnow()
    for session_id in ("live", "ended"):
        await record_activity(redis, keys, session_id, now)
    await forget_activity(redis, keys, keep={"live"}, now=now)
    found = await read_activity(redis, keys, ["live", "ended"], now)
    assert found["live"].last is not None and found["ended"].last is None
