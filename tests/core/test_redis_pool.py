"""The Redis pool shrinks back after a burst: connections idle past ``idle_timeout`` are closed (counted in the real
Redis' CLIENT LIST), while a steady trickle keeps reusing the one connection it needs."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace

from redis.asyncio import Redis

from core.redis import client
from core.settings import Settings

BURST = 60


async def connections_named(redis: Redis, name: str) -> int:
    return sum(1 for entry in await redis.client_list() if entry.get("name") == name)


async def until_at_most(redis: Redis, name: str, count: int, timeout: float) -> float:
    """Seconds until Redis lists at most ``count`` connections named ``name``."""
    started = time.monotonic()
    while (found := await connections_named(redis, name)) > count:
        assert time.monotonic() - started < timeout, f"{found} connections named {name} after {timeout} s"
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def test_connections_idle_past_the_timeout_are_closed_after_a_burst(
    redis_settings: Settings, redis: Redis
) -> None:
    name = "pool-" + uuid.uuid4().hex[:8]
    url = f"{redis_settings.redis.url}{'&' if '?' in redis_settings.redis.url else '?'}client_name={name}"
    pooled = client(replace(redis_settings.redis, url=url, idle_timeout=1.0))
    try:
        key = f"{redis_settings.redis.prefix}:burst"
        await asyncio.gather(*(pooled.blpop([key], timeout=0.2) for _ in range(BURST)))  # each holds a connection
        assert await connections_named(redis, name) == BURST
        for _ in range(10):  # a trickle, one command at a time, for about 2 idle timeouts
            await pooled.ping()
            await asyncio.sleep(0.2)
        assert await until_at_most(redis, name, 1, timeout=5) < 5
        assert await pooled.ping()  # the one kept still serves
        assert await until_at_most(redis, name, 0, timeout=5) < 5  # quiet (the pool is not used): the last one goes too
        assert await pooled.ping()  # and a new one is made when needed
        assert await connections_named(redis, name) == 1
    finally:
        await pooled.aclose()
