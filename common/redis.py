"""Connecting to Redis."""

from __future__ import annotations

from redis.asyncio import Redis

from common.retry import backoff
from common.settings import RedisSettings


def client(settings: RedisSettings) -> Redis:
    """A pooled client; commands fail fast when Redis is down and callers decide how to retry."""
    return Redis.from_url(
        settings.url,
        decode_responses=True,
        socket_connect_timeout=2.0,
        socket_timeout=10.0,
        health_check_interval=15,
    )


async def connect(settings: RedisSettings, *, give_up_after: float = 30.0) -> Redis:
    """A client that has answered a PING, retried with backoff while Redis comes up."""
    redis = client(settings)
    async for attempt in backoff(give_up_after=give_up_after):
        with attempt:
            await redis.ping()
    return redis
