"""The app proxy's token cache (gateway/apps/token_cache.py) against a real Redis and the real revocation watch: a hit
costs no Redis call, a revocation or a deactivation drops the token as the watch reads it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from domain.users import Role, User, hash_token
from gateway.apps.token_cache import TokenCache
from gateway.revocations import RevocationWatch
from stores.users import UserStore


@pytest.fixture
async def setup(redis: Redis, keys: Keys) -> AsyncIterator[tuple[UserStore, RevocationWatch, TokenCache]]:
    users = UserStore(redis, keys)
    await users.create(User("alice", "Alice", Role.USER))
    watch = RevocationWatch(redis, keys, block_ms=100)
    yield users, watch, TokenCache(users, watch)
    await watch.aclose()


async def _token_checks(redis: Redis) -> int:
    """Token checks Redis has run (``UserStore.authenticate`` is one Lua script call)."""
    stats = await redis.info("commandstats")
    return sum(int(v.get("calls", 0)) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


async def _dropped(cache: TokenCache, token: str) -> None:
    for _ in range(200):
        if cache.lookup(hash_token(token), 0.0) is None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the revoked token stayed in the cache")


async def test_a_hit_asks_redis_nothing(redis: Redis, setup: tuple[UserStore, RevocationWatch, TokenCache]) -> None:
    users, _, cache = setup
    token = await users.issue_token("alice")
    first = await cache.authenticate(token, 0.0, utcnow())
    assert first is not None and first.user.id == "alice"
    before = await _token_checks(redis)
    again = await cache.authenticate(token, 1.0, utcnow())
    assert again == first and await _token_checks(redis) == before
    await cache.authenticate(token, cache.ttl, utcnow())  # the entry has aged out: asked again
    assert await _token_checks(redis) == before + 1
    assert await cache.authenticate("not-a-token", 0.0, utcnow()) is None


@pytest.mark.parametrize("how", ["revoke", "deactivate"])
async def test_a_revocation_drops_the_token(setup: tuple[UserStore, RevocationWatch, TokenCache], how: str) -> None:
    users, _, cache = setup
    token = await users.issue_token("alice")
    assert await cache.authenticate(token, 0.0, utcnow()) is not None
    if how == "revoke":
        [record] = await users.tokens_of("alice")
        await users.revoke_token(record.id)
    else:
        await users.deactivate("alice")
    await _dropped(cache, token)
    assert await cache.authenticate(token, 0.0, utcnow()) is None
