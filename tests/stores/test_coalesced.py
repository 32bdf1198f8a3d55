"""The coalescing pipeline facade: what it writes through its merged commands and its batch script is what the same
commands written one by one would leave in Redis."""

from __future__ import annotations

from redis.asyncio import Redis

from core.keys import Keys
from stores.coalesced import Coalesced


async def test_batched_one_key_writes_land_as_plain_commands_in_their_order(redis: Redis, keys: Keys) -> None:
    base = keys.schedule_runs("coalesced")
    async with redis.pipeline(transaction=True) as pipe:
        merged = Coalesced(pipe)
        merged.lpush(f"{base}:list", "a", "b")
        merged.lpush(f"{base}:list", "c")
        merged.ltrim(f"{base}:list", 0, 1)  # after the pushes: keeps c, b
        merged.xadd(f"{base}:stream", {"event": b'{"x":1}', "n": 2}, maxlen=5, approximate=False)
        merged.xadd(f"{base}:stream", {"event": "second"})
        merged.expire(f"{base}:stream", 60)
        merged.set(f"{base}:plain", "v")
        merged.zadd(f"{base}:zset", {"m1": 1.5})
        merged.zadd(f"{base}:zset", {"m2": 2.0})
        merged.flush()
        replies = await pipe.execute()
    assert replies[-1] == 6  # the batch script ran the six one-key commands
    assert await redis.lrange(f"{base}:list", 0, -1) == ["c", "b"]
    entries = await redis.xrange(f"{base}:stream")
    assert [fields for _, fields in entries] == [{"event": '{"x":1}', "n": "2"}, {"event": "second"}]
    assert 0 < await redis.ttl(f"{base}:stream") <= 60
    assert await redis.get(f"{base}:plain") == "v"
    assert await redis.zrange(f"{base}:zset", 0, -1, withscores=True) == [("m1", 1.5), ("m2", 2.0)]


async def test_an_exact_cap_trims_the_stream(redis: Redis, keys: Keys) -> None:
    stream = keys.session_events("coalesced-cap")
    async with redis.pipeline(transaction=True) as pipe:
        merged = Coalesced(pipe)
        for i in range(5):
            merged.xadd(stream, {"i": i}, maxlen=2, approximate=False)
        merged.flush()
        await pipe.execute()
    assert [fields["i"] for _, fields in await redis.xrange(stream)] == ["3", "4"]
