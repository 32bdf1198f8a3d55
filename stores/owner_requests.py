"""The job owner's request queue: what the gateway, the idle checker, the follower and the stores ask the scheduler's
job owner (``scheduler.job_owner``, the one writer of Nomad jobs) to do, and how it is woken.

Requests are Redis sets and hashes keyed by session (``Keys.work_to_submit``, ``jobs_to_stop``, ``jobs_to_restart``),
so asking twice is asking once; ``Keys.job_owner_wakeup`` is a short list the owner blocks on. A request that goes with
a session's new state is written in the caller's MULTI (:func:`ask_to_submit`, :func:`ask_to_stop`, :func:`wake_owner`:
``stores.sessions``, ``stores.folders``, ``stores.images``); the rest are :class:`OwnerRequests`' own transactions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from redis.asyncio import Redis

from core.keys import Keys

WAKEUP_BACKLOG = 64
"""The wakeup list only signals 'there is work'; a few entries are as good as many."""

StopMode = Literal["stop", "purge"]
"""How the job owner stops a session's job: ``stop`` keeps it in Nomad (its allocations' logs stay readable),
``purge`` removes it (a forced destroy)."""

_FORGET_IF_UNCHANGED = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""


def wake_owner(pipe: Redis, keys: Keys, reason: str = "work", *, backlog: int = WAKEUP_BACKLOG) -> None:
    """Wake the job owner (in the caller's pipeline)."""
    pipe.rpush(keys.job_owner_wakeup, reason)
    pipe.ltrim(keys.job_owner_wakeup, -backlog, -1)


def ask_to_submit(pipe: Redis, keys: Keys, session_id: str) -> None:
    """Ask the job owner to register the session's job as stored now (in the caller's MULTI)."""
    pipe.sadd(keys.work_to_submit, session_id)
    wake_owner(pipe, keys)


def forget_submission(pipe: Redis, keys: Keys, session_id: str) -> None:
    """An ended session's job is never registered (in the caller's MULTI)."""
    pipe.srem(keys.work_to_submit, session_id)


def ask_to_stop(pipe: Redis, keys: Keys, session_id: str, mode: StopMode) -> None:
    """Ask the job owner to stop the session's job (in the caller's MULTI): a purge replaces a plain stop asked
    before; a plain stop never weakens a purge."""
    if mode == "purge":
        pipe.hset(keys.jobs_to_stop, session_id, mode)
    else:
        pipe.hsetnx(keys.jobs_to_stop, session_id, mode)
    wake_owner(pipe, keys)


class OwnerRequests:
    """The queue's own transactions: asked alone, and the job owner's side (read, settle, wait)."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def request_stop(self, session_id: str) -> None:
        """Ask the job owner to stop the job of a session that ended (reconciliation's safety net)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            ask_to_stop(pipe, self.keys, session_id, "stop")
            await pipe.execute()

    async def request_restart(self, session_id: str, at: datetime) -> None:
        """Ask the job owner to restart the running kernels of a session in place."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.jobs_to_restart, session_id, repr(at.timestamp()))
            wake_owner(pipe, self.keys)
            await pipe.execute()

    async def owner_work(self) -> tuple[set[str], dict[str, StopMode], set[str]]:
        """What the job owner has to do, in one round trip: sessions to register, to stop (how), to restart."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.smembers(self.keys.work_to_submit)
            pipe.hgetall(self.keys.jobs_to_stop)
            pipe.hkeys(self.keys.jobs_to_restart)
            submit, stop, restart = await pipe.execute()
        return set(submit), {k: ("purge" if v == "purge" else "stop") for k, v in stop.items()}, set(restart)

    async def mark_submitted(self, session_id: str) -> None:
        await self.redis.srem(self.keys.work_to_submit, session_id)

    async def stopped(self, session_id: str, mode: StopMode) -> None:
        """The job owner stopped the session's job as asked: forget the request, unless a stronger one (a purge
        asked meanwhile) replaced it."""
        await self.redis.eval(_FORGET_IF_UNCHANGED, 1, self.keys.jobs_to_stop, session_id, mode)

    async def restarted(self, session_id: str) -> None:
        await self.redis.hdel(self.keys.jobs_to_restart, session_id)

    async def wait_for_owner_work(self, timeout: float) -> None:
        """Block until the job owner is woken (new work), at most ``timeout`` seconds."""
        await self.redis.blpop([self.keys.job_owner_wakeup], timeout=timeout)
        await self.redis.delete(self.keys.job_owner_wakeup)
