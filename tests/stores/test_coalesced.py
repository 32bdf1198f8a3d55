"""The coalescing pipeline facade: what it writes through its merged commands and its batch script is what the same
commands written one by one would leave in Redis; a guarded batch writes all or nothing; racing creations."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from redis.asyncio import Redis

from core.errors import Conflict
from core.keys import Keys
from domain.model import Driver, Kernel, Session, SessionType
from stores.coalesced import Coalesced, guard_failed
from stores.sessions import SessionStore


def session_named(name: str, session_id: str) -> Session:
    kernel = Kernel(role="main", index=1, hostname="main1", image="", resources={"cpu": "1"})
    return Session(id=session_id, name=name, owner_id="alice", type=SessionType.BATCH, driver=Driver.EXEC, image="",
                   resources={"cpu": "1"}, kernels=(kernel,), created_at=datetime(2026, 1, 1, tzinfo=UTC))  # fmt: skip


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


async def test_a_guarded_batch_writes_nothing_when_a_claimed_key_exists(redis: Redis, keys: Keys) -> None:
    base = keys.schedule_runs("guarded")
    await redis.set(f"{base}:taken", "someone")
    for claims, expect_written in (([f"{base}:free", f"{base}:taken"], False), ([f"{base}:free"], True)):
        async with redis.pipeline(transaction=False) as pipe:
            merged = Coalesced(pipe, guarded=True)
            merged.require_absent(*claims)
            merged.set(f"{base}:free", "mine")
            merged.zadd(f"{base}:zset", {f"m{i}": float(i) for i in range(2500)})  # more than one piece
            merged.sadd(f"{base}:set", *(f"s{i}" for i in range(2500)))
            merged.hset(f"{base}:hash", "f", "v")
            merged.incr(f"{base}:version")
            merged.lpush(f"{base}:list", "x")
            merged.flush()
            [reply] = await pipe.execute()
        assert guard_failed(reply) is not expect_written
        assert (await redis.get(f"{base}:free") == "mine") is expect_written
        assert await redis.zcard(f"{base}:zset") == (2500 if expect_written else 0)
        assert await redis.scard(f"{base}:set") == (2500 if expect_written else 0)
        assert await redis.hget(f"{base}:hash", "f") == ("v" if expect_written else None)
        assert await redis.get(f"{base}:version") == ("1" if expect_written else None)
        assert await redis.lrange(f"{base}:list", 0, -1) == (["x"] if expect_written else [])
    assert await redis.zscore(f"{base}:zset", "m2499") == 2499.0


async def test_racing_creations_with_the_same_tokens_store_each_run_once(redis: Redis, keys: Keys) -> None:
    """Many stores creating the same runs at once (each its own sessions, same tokens): one creation per token wins
    and every caller is told its ids; the others' writes are refused whole by the guard and decided again."""
    runs = [f"schedule:race-{i}:due:x" for i in range(50)]

    async def creating(attempt: int) -> dict[str, list[str] | Conflict]:
        batches = [([session_named(f"race-{i}-run", f"{attempt}-{i}")], token) for i, token in enumerate(runs)]
        return await SessionStore(redis, keys).create_each(batches)

    outcomes = await asyncio.gather(*(creating(a) for a in range(6)))
    for token in runs:
        assert len({tuple(o[token]) for o in outcomes if isinstance(o[token], list)}) == 1
    assert len(await SessionStore(redis, keys).session_ids(owner_id="alice")) == len(runs)
