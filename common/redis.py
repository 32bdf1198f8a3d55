"""Connecting to Redis."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.retry import backoff
from common.settings import RedisSettings


MAX_CONNECTIONS = 200
POOL_WAIT = 5.0
"""A command waits this long for a free pooled connection in a burst (redis-py's default pool refuses at once with
MaxConnectionsError), then fails as an outage (UNAVAILABLE)."""


def client(settings: RedisSettings) -> Redis:
    """A pooled client; commands fail fast when Redis is down and callers decide how to retry.

    A command on a pooled connection that broke (Redis was restarted) is retried on a fresh one, within about a
    second: without it, the first request on each stale connection failed after Redis was back (from_url leaves the
    client without redis-py's default retry). A WATCHed transaction is not retried here: it raises WatchError, and
    the store's optimistic loop runs it again.
    """
    pool = BlockingConnectionPool.from_url(
        settings.url,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_WAIT,
        decode_responses=True,
        socket_connect_timeout=2.0,
        socket_timeout=10.0,
        health_check_interval=15,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    redis = Redis(connection_pool=pool)
    redis.auto_close_connection_pool = True  # aclose() closes the pool, as with from_url
    return redis


async def connect(settings: RedisSettings, *, give_up_after: float = 30.0) -> Redis:
    """A client that has answered a PING, retried with backoff while Redis comes up."""
    redis = client(settings)
    async for attempt in backoff(give_up_after=give_up_after):
        with attempt:
            await redis.ping()
    return redis
