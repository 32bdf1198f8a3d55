"""core.replies: real Redis replies read as text, whichever command gave them, through the project's client."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from core.keys import Keys
from core.replies import (
    begin,
    optional_text,
    optional_texts,
    ranked,
    stream_entries,
    stream_reads,
    text,
    text_hash,
    text_set,
    texts,
)


async def test_each_reader_gives_text_from_a_real_reply(redis: Redis, keys: Keys) -> None:
    key = f"{keys.prefix}:replies"
    await redis.sadd(f"{key}:set", "a", "b")
    await redis.hset(f"{key}:hash", mapping={"f": "v", "g": "w"})
    await redis.zadd(f"{key}:zset", {"x": 2, "y": 1})
    await redis.rpush(f"{key}:list", "p", "q")
    await redis.set(f"{key}:value", "é")

    assert text_set(await redis.smembers(f"{key}:set")) == {"a", "b"}
    assert text_set(await redis.sunion([f"{key}:set", f"{key}:none"])) == {"a", "b"}
    assert text_hash(await redis.hgetall(f"{key}:hash")) == {"f": "v", "g": "w"}
    assert text_hash(await redis.hgetall(f"{key}:none")) == {}
    assert ranked(await redis.zrange(f"{key}:zset", 0, -1)) == ["y", "x"]
    assert ranked(await redis.zrevrange(f"{key}:zset", 0, -1)) == ["x", "y"]
    assert texts(await redis.lrange(f"{key}:list", 0, -1)) == ["p", "q"]
    assert optional_text(await redis.get(f"{key}:value")) == "é"
    assert optional_text(await redis.get(f"{key}:none")) is None
    assert optional_texts(await redis.mget([f"{key}:value", f"{key}:none"])) == ["é", None]
    assert optional_texts(await redis.hmget(f"{key}:hash", ["g", "nope"])) == ["w", None]


async def test_streams_read_by_range_and_by_xread(redis: Redis, keys: Keys) -> None:
    stream = f"{keys.prefix}:replies:stream"
    first = text(await redis.xadd(stream, {"event": "one"}))
    second = text(await redis.xadd(stream, {"event": "two", "more": "x"}))

    assert stream_entries(await redis.xrange(stream)) == [
        (first, {"event": "one"}),
        (second, {"event": "two", "more": "x"}),
    ]
    assert stream_entries(await redis.xrange(stream, min=f"({second}")) == []
    assert stream_reads(await redis.xread({stream: first})) == [(stream, [(second, {"event": "two", "more": "x"})])]
    assert stream_reads(await redis.xread({stream: second}, block=1)) == []  # nothing new: Redis answers nil


async def test_a_scored_range_is_refused_rather_than_read_as_members(redis: Redis, keys: Keys) -> None:
    key = f"{keys.prefix}:replies:scored"
    await redis.zadd(key, {"x": 1})
    with pytest.raises(TypeError, match="WITHSCORES"):
        ranked(await redis.zrange(key, 0, -1, withscores=True))


async def test_begin_starts_the_transaction_of_a_watched_pipeline(redis: Redis, keys: Keys) -> None:
    key = f"{keys.prefix}:replies:counter"
    async with redis.pipeline(transaction=True) as pipe:
        await pipe.watch(key)
        assert await pipe.get(key) is None  # immediate while watching
        begin(pipe)
        pipe.set(key, "1")
        pipe.incr(key)
        assert await pipe.execute() == [True, 2]
    assert optional_text(await redis.get(key)) == "2"


def test_bytes_are_decoded_as_a_client_without_decode_responses_would_give_them() -> None:
    assert text(b"caf\xc3\xa9") == "café"
    assert text_set([b"a", "b"]) == {"a", "b"}
    assert text_hash({b"f": b"v"}) == {"f": "v"}
    assert optional_texts([b"a", None]) == ["a", None]
