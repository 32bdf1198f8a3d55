"""The Redis pool shrinks back after a burst: connections idle past ``idle_timeout`` are closed (counted in the real
Redis' CLIENT LIST), while a steady trickle keeps reusing the one connection it needs."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError

from core.redis import HiredisPacking, client
from core.settings import RedisSettings, Settings

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


ARGUMENTS = [
    ("SET", "key", "value"),
    ("CONFIG GET", "maxmemory"),
    (b"CLIENT LIST",),
    ("ZADD", "z", 1.5, "a", 0.1, "b", 1e-05, "c", 1e20, "d", 0.30000000000000004, "e", -3, "f"),
    ("SET", "k", "é \u2603 \U0001f600"),
    ("SET", "k", b"\x00\xff\r\n"),
    ("SET", "k", memoryview(b"view")),
    ("SET", "k", bytearray(b"array")),
    ("INCRBY", "k", 12345678901234567890),
]


@pytest.mark.parametrize("args", ARGUMENTS, ids=lambda a: str(a[0]))
def test_the_client_packs_with_hiredis_the_bytes_redis_py_packs(args: tuple[Any, ...]) -> None:
    pooled = client(RedisSettings(url="redis://127.0.0.1:1/0", prefix="t"))
    connection = pooled.connection_pool.make_connection()
    assert isinstance(connection, HiredisPacking)
    python = Connection()
    assert b"".join(connection.pack_command(*args)) == b"".join(python.pack_command(*args))
    assert b"".join(connection.pack_commands([args, args])) == b"".join(python.pack_commands([args, args]))


@pytest.mark.parametrize("bad", [None, True, [1]], ids=repr)
def test_what_redis_py_refuses_hiredis_packing_refuses_too(bad: object) -> None:
    pooled = client(RedisSettings(url="redis://127.0.0.1:1/0", prefix="t"))
    connection = pooled.connection_pool.make_connection()
    with pytest.raises(DataError):
        Connection().pack_command("SET", "k", bad)
    with pytest.raises(DataError):
        connection.pack_command("SET", "k", bad)


def test_a_write_to_a_connection_being_closed_is_a_connection_error_under_uvloop(redis_settings: Settings) -> None:
    """The services run on uvloop, where writing to a closed transport raises ``RuntimeError`` ("the handler is
    closed"). redis-py closes a connection's transport and then awaits its end with the transport still set (its
    ``disconnect``: the Sentinel pool's, of its idle connections when the Sentinels name a new primary), and a task
    writing on it meanwhile got that ``RuntimeError``: a ``createSession`` during a failover answered INTERNAL
    (bench/chaos). It is a connection error, so the caller sees an outage (UNAVAILABLE)."""
    import uvloop

    async def write_while_it_closes() -> None:
        pooled = client(redis_settings.redis)
        connection = await pooled.connection_pool.get_connection()
        try:
            closing = asyncio.ensure_future(connection.disconnect())
            await asyncio.sleep(0)  # the transport is closed; the disconnect awaits its end
            assert connection.is_connected
            with pytest.raises(RedisConnectionError):  # the old code: RuntimeError ... the handler is closed
                await connection.send_command("PING", check_health=False)
            await closing
        finally:
            await pooled.connection_pool.release(connection)
            await pooled.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(write_while_it_closes())
