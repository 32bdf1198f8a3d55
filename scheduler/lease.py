"""One active scheduler across processes: a Redis lease with a fencing token.

Whoever holds the lease key is the leader; each new term takes the next fencing number, and
every write of a leader carries it (see :class:`common.store.Fence`), so a paused old leader
that wakes up after losing the lease cannot write.
"""

from __future__ import annotations

import asyncio
import uuid

from redis.asyncio import Redis

from common.store import Fence

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Lease:
    def __init__(self, redis: Redis, key: str, fence_key: str, *, ttl: float) -> None:
        self.redis = redis
        self.key = key
        self.fence_key = fence_key
        self.ttl_ms = int(ttl * 1000)
        self.holder = uuid.uuid4().hex

    async def try_acquire(self) -> Fence | None:
        if not await self.redis.set(self.key, self.holder, nx=True, px=self.ttl_ms):
            return None
        token = int(await self.redis.incr(self.fence_key))
        return Fence(key=self.fence_key, token=token)

    async def acquire(self, *, poll: float = 0.5) -> Fence:
        while (fence := await self.try_acquire()) is None:
            await asyncio.sleep(poll)
        return fence

    async def renew(self) -> bool:
        return bool(await self.redis.eval(_RENEW, 1, self.key, self.holder, str(self.ttl_ms)))

    async def release(self) -> None:
        await self.redis.eval(_RELEASE, 1, self.key, self.holder)

    async def hold(self) -> None:
        """Renew until the lease is lost (then return); the caller stops leading."""
        while await self.renew():
            await asyncio.sleep(self.ttl_ms / 3000)
