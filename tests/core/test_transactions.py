"""``core.transactions.transact`` on a real Redis: a write that lands between an attempt's read and its EXEC makes the
attempt run again on what is stored now; an attempt that refuses, or decides not to write, ends the transaction."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from core.replies import begin
from core.settings import Settings
from core.transactions import transact


async def test_a_conflicting_write_makes_the_attempt_run_again_on_the_new_value(
    redis: Redis, redis_settings: Settings
) -> None:
    key = f"{redis_settings.redis.prefix}:tx:counter"
    await redis.set(key, 10)
    seen: list[int] = []

    async def double(pipe: Pipeline) -> int:
        await pipe.watch(key)
        value = int(await pipe.get(key))
        seen.append(value)
        if len(seen) == 1:
            await redis.set(key, 20)  # another writer, on another connection, between the read and the EXEC
        begin(pipe)
        pipe.set(key, value * 2)
        await pipe.execute()
        return value * 2

    assert await transact(redis, double) == 40
    assert seen == [10, 20]
    assert int(await redis.get(key)) == 40


async def test_concurrent_increments_are_none_of_them_lost(redis: Redis, redis_settings: Settings) -> None:
    key = f"{redis_settings.redis.prefix}:tx:shared"
    await redis.set(key, 0)

    async def increment(pipe: Pipeline) -> None:
        await pipe.watch(key)
        value = int(await pipe.get(key))
        await asyncio.sleep(0)  # let the others read the same value: their EXECs conflict
        begin(pipe)
        pipe.set(key, value + 1)
        await pipe.execute()

    await asyncio.gather(*(transact(redis, increment) for _ in range(20)))
    assert int(await redis.get(key)) == 20


async def test_an_attempt_that_refuses_or_writes_nothing_ends_the_transaction(
    redis: Redis, redis_settings: Settings
) -> None:
    key = f"{redis_settings.redis.prefix}:tx:untouched"
    await redis.set(key, "kept")
    runs = 0

    async def refuse(pipe: Pipeline) -> None:
        nonlocal runs
        runs += 1
        await pipe.watch(key)
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        await transact(redis, refuse)

    async def nothing(pipe: Pipeline) -> str | None:
        nonlocal runs
        runs += 1
        await pipe.watch(key)
        return await pipe.get(key)

    assert await transact(redis, nothing) == "kept"
    assert runs == 2
    assert await redis.get(key) == "kept"
