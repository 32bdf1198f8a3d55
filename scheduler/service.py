"""The scheduler service: while it holds the lease it places pending sessions, submits their jobs,
follows Nomad, and reconciles. Each loop survives outages of Redis or Nomad by backing off."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from common.errors import TransientError
from common.keys import Keys
from common.retry import TRANSIENT
from common.settings import Settings
from common.store import Fence, LostLease, SessionStore
from nomad_jobs.client import NomadClient
from scheduler.follower import Follower
from scheduler.lease import Lease
from scheduler.placement import Placer
from scheduler.submitter import submit

log = logging.getLogger(__name__)

SUBMIT_CONCURRENCY = 32


class Scheduler:
    def __init__(self, settings: Settings, redis: Redis, nomad: NomadClient) -> None:
        self.settings = settings
        self.keys = Keys(settings.redis.prefix)
        self.store = SessionStore(redis, self.keys)
        self.nomad = nomad
        self.lease = Lease(redis, self.keys.scheduler_lease, self.keys.scheduler_fence, ttl=settings.scheduler.lease_ttl)

    async def run_forever(self) -> None:
        while True:
            fence = await _with_backoff("acquire lease", self.lease.acquire)
            log.info("scheduler leading (fencing token %d)", fence.token)
            try:
                await self.lead(fence)
            except* LostLease:
                log.warning("scheduler lost its lease; standing by")

    async def lead(self, fence: Fence) -> None:
        follower = Follower(self.store, self.nomad, fence)
        placer = Placer(self.store, self.nomad, fence, self.settings)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._hold_lease())
            tasks.create_task(_forever("schedule", lambda: self._schedule_once(placer, fence)))
            tasks.create_task(_forever("follow", follower.follow_events, pause=0.5))
            tasks.create_task(
                _forever("reconcile", follower.reconcile, pause=self.settings.scheduler.reconcile_interval)
            )

    async def _hold_lease(self) -> None:
        await self.lease.hold()
        raise LostLease("lease expired or taken")

    async def _schedule_once(self, placer: Placer, fence: Fence) -> None:
        await placer.run_pass()
        await self.submit_pending(fence)
        # Sleep until there is news (a created or ended session) or a second passes.
        await self.store.redis.blpop([self.keys.scheduler_wakeup], timeout=1)
        await self.store.redis.delete(self.keys.scheduler_wakeup)

    async def submit_pending(self, fence: Fence | None) -> None:
        ids = sorted(await self.store.ids_to_submit())
        limit = asyncio.Semaphore(SUBMIT_CONCURRENCY)

        async def one(session_id: str) -> None:
            async with limit:
                session = await self.store.get(session_id)
                if session is None or session.nomad_job_id is None:
                    await self.store.mark_submitted(session_id)
                    return
                await submit(self.store, self.nomad, session, fence)

        await asyncio.gather(*(one(i) for i in ids))


async def _forever(name: str, step: Callable[[], Awaitable[None]], *, pause: float = 0.0) -> None:
    """Run ``step`` again and again; transient failures back off, a lost lease ends the loop."""
    delay = 0.2
    while True:
        try:
            await step()
            delay = 0.2
            if pause:
                await asyncio.sleep(pause)
        except LostLease:
            raise
        except (TransientError, *TRANSIENT) as exc:
            log.warning("%s: %s; retrying in %.1fs", name, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def _with_backoff(name: str, step: Callable[[], Awaitable[Fence]]) -> Fence:
    delay = 0.2
    while True:
        try:
            return await step()
        except TRANSIENT as exc:
            log.warning("%s: %s; retrying in %.1fs", name, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
