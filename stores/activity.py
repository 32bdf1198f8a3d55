"""User traffic to sessions, as the gateway records it and the idle checker reads it (Redis).

The network idle check needs two facts per session:

* **last activity**: when a user last did something with the session through the gateway. One ZSET
  (``Keys.idle_last_activity``) holds every session's timestamp; writes use ``ZADD GT``, so concurrent
  gateways and late requests can only move it forward.
* **open app connections**: a connection held open through the gateway (a terminal, a notebook) is
  continuous activity. Each is a member of one ZSET (``Keys.idle_open_connections``) scored by when it
  *lapses*: an open connection must be refreshed (``open_connection`` again) within ``ttl`` seconds, so a
  gateway that dies with connections open cannot keep a session alive for ever. Closing one is activity
  too: the idle timeout starts over from the close, not from when it was opened. The sweep reads the few
  connections not lapsed with one range read, whatever the number of sessions; the idle leader trims the
  lapsed ones now and then (:func:`forget_activity`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from redis.asyncio import Redis

from core.codec import MalformedDocument, decode, encode
from core.keys import Keys
from core.replies import ranked
from domain.idle.facts import Activity

log = logging.getLogger(__name__)

CONNECTION_TTL = 60.0
"""Seconds an open connection counts without being refreshed."""


async def record_activity(redis: Redis, keys: Keys, session_id: str, now: datetime) -> None:
    """A user acted on ``session_id`` at ``now`` (what every gateway path that acts on a session calls)."""
    await redis.zadd(keys.idle_last_activity, {session_id: now.timestamp()}, gt=True)


def _member(session_id: str, connection_id: str) -> str:
    return encode([session_id, connection_id]).decode()


async def open_connection(
    redis: Redis, keys: Keys, session_id: str, connection_id: str, now: datetime, *, ttl: float = CONNECTION_TTL
) -> None:
    """Count ``connection_id`` as open until ``now + ttl``; call again (same id) to keep it open longer."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.zadd(keys.idle_open_connections, {_member(session_id, connection_id): now.timestamp() + ttl})
        pipe.zadd(keys.idle_last_activity, {session_id: now.timestamp()}, gt=True)
        await pipe.execute()


async def close_connection(redis: Redis, keys: Keys, session_id: str, connection_id: str, now: datetime) -> None:
    async with redis.pipeline(transaction=True) as pipe:
        pipe.zrem(keys.idle_open_connections, _member(session_id, connection_id))
        pipe.zadd(keys.idle_last_activity, {session_id: now.timestamp()}, gt=True)
        await pipe.execute()


async def read_activity(redis: Redis, keys: Keys, session_ids: Sequence[str], now: datetime) -> dict[str, Activity]:
    """Every session's activity in one round trip."""
    if not session_ids:
        return {}
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zmscore(keys.idle_last_activity, list(session_ids))
        pipe.zrange(keys.idle_open_connections, f"({now.timestamp()!r}", "+inf", byscore=True)
        scores, members = await pipe.execute()
    open_now: dict[str, int] = {}
    for member in ranked(members):
        session_id = _session_of(member)
        if session_id is not None:
            open_now[session_id] = open_now.get(session_id, 0) + 1
    return {
        session_id: Activity(
            datetime.fromtimestamp(score, UTC) if score is not None else None, open_now.get(session_id, 0)
        )
        for session_id, score in zip(session_ids, scores, strict=True)
    }


def _session_of(member: str) -> str | None:
    try:
        session_id, _ = decode(member, tuple[str, str])
    except MalformedDocument:
        log.warning("ignoring a malformed open-connection record %r", member)
        return None
    return session_id


async def forget_activity(redis: Redis, keys: Keys, keep: set[str], now: datetime) -> None:
    """Drop the last-activity records of sessions not in ``keep`` (those that ended), and the connections that lapsed
    before ``now`` (their gateway stopped refreshing them)."""
    await redis.zremrangebyscore(keys.idle_open_connections, "-inf", now.timestamp())
    recorded = ranked(await redis.zrange(keys.idle_last_activity, 0, -1))
    gone = [session_id for session_id in recorded if session_id not in keep]
    if gone:
        await redis.zrem(keys.idle_last_activity, *gone)
