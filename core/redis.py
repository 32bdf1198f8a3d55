"""Connecting to Redis."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Iterable
from typing import Any

import hiredis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.retry import backoff
from core.settings import RedisSettings

MAX_CONNECTIONS = 200
POOL_WAIT = 5.0
"""A command waits this long for a free pooled connection in a burst (redis-py's default pool refuses at once with
MaxConnectionsError), then fails as an outage (UNAVAILABLE)."""


class HiredisPacking(AbstractConnection):
    """Commands packed by hiredis's C packer, as redis-py's synchronous client packs them: its asyncio connection
    packs in Python, which was a quarter of the schedule runner's CPU (``bench/schedules``: 10,000 runs write large
    MSET and ZADD commands). Same bytes on the wire: str as UTF-8, floats as ``repr``, and what the Python packer
    refuses (None, bool, other types) is a ``DataError`` here too."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:  # a bytearray (which hiredis refuses) or a value no packer takes: look at each argument
            pass
        converted: tuple[Any, ...] = tuple(bytes(a) if isinstance(a, bytearray) else a for a in args)
        try:
            return [hiredis.pack_command(converted)]
        except TypeError as exc:
            raise DataError(str(exc)) from exc

    def pack_commands(self, commands: Iterable[Iterable[Any]]) -> list[bytes]:
        return [b"".join(self.pack_command(*command)[0] for command in commands)]


def with_hiredis_packing(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` (plain, TLS or Unix socket, as the URL chose) packing with hiredis."""
    return type(f"Hiredis{connection_class.__name__}", (HiredisPacking, connection_class), {})


class IdleClosingPool(BlockingConnectionPool):
    """redis-py's blocking pool, which keeps every connection it ever made (after a burst, hundreds sat idle): this
    one closes the connections idle longer than ``idle_timeout`` seconds, so the pool shrinks back to what the
    traffic uses. Idle connections are reused newest first, so under a steady load the oldest are the spare ones.
    """

    def __init__(self, *, idle_timeout: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.idle_timeout = idle_timeout
        self._idle_since: weakref.WeakKeyDictionary[AbstractConnection, float] = weakref.WeakKeyDictionary()
        self._sweep: asyncio.TimerHandle | None = None

    async def release(self, connection: AbstractConnection) -> None:
        self._idle_since[connection] = time.monotonic()  # before it can be taken again: never a stale time
        await super().release(connection)
        if self._sweep is None:
            self._sweep_in(self.idle_timeout)

    async def close_idle(self) -> int:
        """Close the connections idle for longer than ``idle_timeout`` now; how many."""
        now = time.monotonic()
        stale = []
        async with self._condition:  # as get_connection and release: none is taken while it is looked at
            available = self._available_connections  # the latest released last (and reused first)
            while available and now - self._idle_since.get(available[0], now) >= self.idle_timeout:
                stale.append(available.pop(0))
        await asyncio.gather(*(connection.disconnect() for connection in stale), return_exceptions=True)
        return len(stale)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        await super().disconnect(inuse_connections)

    def _sweep_in(self, delay: float) -> None:
        self._sweep = asyncio.get_running_loop().call_later(delay, lambda: asyncio.ensure_future(self._swept()))

    async def _swept(self) -> None:
        await self.close_idle()
        oldest = min((self._idle_since.get(c, time.monotonic()) for c in self._available_connections), default=None)
        self._sweep = None
        if oldest is not None:  # again when the oldest idle one is due
            self._sweep_in(max(0.05, oldest + self.idle_timeout - time.monotonic()))


def client(settings: RedisSettings) -> Redis:
    """A pooled client; commands fail fast when Redis is down and callers decide how to retry.

    A command on a pooled connection that broke (Redis was restarted) is retried on a fresh one, within about a
    second: without it, the first request on each stale connection failed after Redis was back (from_url leaves the
    client without redis-py's default retry). A WATCHed transaction is not retried here: it raises WatchError, and
    the store's optimistic loop runs it again. Connections idle longer than ``settings.idle_timeout`` are closed.
    """
    pool = IdleClosingPool.from_url(
        settings.url,
        idle_timeout=settings.idle_timeout,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_WAIT,
        decode_responses=True,
        socket_connect_timeout=2.0,
        socket_timeout=10.0,
        health_check_interval=15,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    pool.connection_class = with_hiredis_packing(pool.connection_class)
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
