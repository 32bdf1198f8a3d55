"""The per-process reader of event streams, against the real Redis: many followers on few connections, catching up
from a cursor without gaps or repeats, and a slow follower catching up from Redis instead of losing events."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from redis.asyncio import Redis

from core.keys import Keys
from core.settings import Settings
from stores import event_hub
from stores.event_hub import EventHub
from stores.events import SessionEvent


def entry(n: int) -> dict[str, str]:
    return {
        "event": json.dumps(
            {
                "sessionId": f"s{n}",
                "ownerId": "alice",
                "status": "PENDING",
                "reason": str(n),
                "at": "2026-01-01T00:00:00Z",
            }
        )
    }


async def take(stream: object, count: int) -> list[str]:
    reasons = []
    async for event in stream:  # type: ignore[attr-defined]
        reasons.append(event.reason)
        if len(reasons) == count:
            break
    return reasons


async def test_many_followers_share_one_reading_connection(redis_settings: Settings, keys: Keys) -> None:
    redis = Redis.from_url(redis_settings.redis.url, decode_responses=True, max_connections=8)
    hub = EventHub(redis, block_ms=200)
    streams = [keys.owner_events(f"user{i}") for i in range(10)]
    for stream in streams:
        await redis.xadd(stream, entry(0))
    followers = []
    for i in range(150):  # a pool of 8 would be long exhausted if each follower blocked in XREAD itself
        followed = hub.follow(streams[i % 10], "0-0")
        # its first event, caught up from Redis: it has joined, and the next waits for the hub's reader (one by one:
        # redis-py refuses, not queues, a command past the pool)
        assert (await anext(followed)).reason == "0"
        followers.append(asyncio.create_task(take(followed, 2)))
    for stream in streams:
        await redis.xadd(stream, entry(1))
        await redis.xadd(stream, entry(2))
    assert await asyncio.wait_for(asyncio.gather(*followers), 20) == [["1", "2"]] * 150
    await hub.aclose()
    await redis.aclose()


async def test_a_follower_catches_up_from_its_cursor_then_follows_live_without_repeats(
    redis: Redis, keys: Keys
) -> None:
    hub = EventHub(redis, block_ms=200)
    stream = keys.session_events("s1")
    ids = [await redis.xadd(stream, entry(n)) for n in range(1, 4)]
    followed = hub.follow(stream, ids[0])
    first = await anext(followed)  # caught up from Redis: 2 (then 3 is waiting)
    await redis.xadd(stream, entry(4))
    rest = [(await anext(followed)).reason for _ in range(2)]
    assert [first.reason, *rest] == ["2", "3", "4"]
    await followed.aclose()
    await hub.aclose()


async def test_a_slow_follower_rereads_from_redis_instead_of_losing_events(
    redis: Redis,
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(event_hub, "QUEUE_LENGTH", 3)
    hub = EventHub(redis, block_ms=200)
    stream = keys.owner_events("alice")
    followed = hub.follow(stream, "0-0")
    await redis.xadd(stream, entry(0))
    assert (await anext(followed)).reason == "0"
    async with hub.follower(stream) as witness:  # offered the same events: it falls behind when the other does
        for n in range(1, 21):  # while the follower reads nothing
            await redis.xadd(stream, entry(n))
        async with asyncio.timeout(10):
            while not witness.behind:
                await asyncio.sleep(0.01)
    assert [(await anext(followed)).reason for _ in range(20)] == [str(n) for n in range(1, 21)]
    await followed.aclose()
    await hub.aclose()


async def test_a_follower_waits_for_a_change_or_a_timeout(redis: Redis, keys: Keys) -> None:
    hub = EventHub(redis, block_ms=200)
    stream = keys.session_events("s2")
    async with hub.follower(stream) as follower:
        started = time.monotonic()
        await follower.wait(timeout=0.3)
        assert time.monotonic() - started >= 0.3
        asyncio.get_running_loop().call_later(0.1, lambda: asyncio.ensure_future(redis.xadd(stream, entry(1))))
        started = time.monotonic()
        await follower.wait(timeout=10)
        assert time.monotonic() - started < 5
    await hub.aclose()


async def test_a_waiting_follower_cancelled_as_an_event_arrives_stops(redis: Redis, keys: Keys) -> None:
    """Python 3.11's ``asyncio.wait_for`` returns the awaited result when a cancellation lands in the turn of the loop
    the result does: a follow of a kernel's log waiting for its kernel to start went on after its subscription ended."""
    hub = EventHub(redis, block_ms=200)
    stream = keys.session_events("s3")
    async with hub.follower(stream) as follower:
        waiting = asyncio.create_task(follower.wait(timeout=10))
        offer = follower.offer

        def offer_then_cancel(event: SessionEvent) -> None:  # fault injection: cancelled as the event arrives
            offer(event)
            waiting.cancel()

        follower.offer = offer_then_cancel  # type: ignore[method-assign]
        await asyncio.sleep(0.05)
        await redis.xadd(stream, entry(1))
        await asyncio.wait([waiting], timeout=5)
        assert waiting.cancelled()
    await hub.aclose()
