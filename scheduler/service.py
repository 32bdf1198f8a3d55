"""The scheduler service: while it holds the lease it places pending sessions, submits their jobs,
follows Nomad, and reconciles. Each loop survives outages of Redis or Nomad by backing off."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from core.lease import Fence, Lease, lead_forever
from core.retry import forever
from core.settings import Settings
from domain.model import SessionResult
from domain.scheduling_config import load_scheduling_config
from nomad_jobs.client import NomadClient
from scheduler.autoscaler import Autoscaler
from scheduler.config import pass_config
from scheduler.folder_owner import FolderOwner
from scheduler.folder_usage import UsageRecounter
from scheduler.follower import Follower
from scheduler.image_owner import ImageOwner
from scheduler.job_owner import JobOwner
from scheduler.placer import Placer
from scheduler.schedules import ScheduleRunner
from stores.folders import FolderStore
from stores.images import ImageStore
from stores.sessions import SessionStore
from stores.usage import COMPACT_INTERVAL

log = logging.getLogger(__name__)

REPLICA_HEALTH_INTERVAL = 0.25
"""Seconds between reads of the checks of INFERENCE replicas not yet known healthy (a replica joins ``endpoints``
within about this long of passing; Nomad's event stream carries no check results). Each read costs a SINTER and an
MGET of the live INFERENCE sessions, and a Nomad call per replica not yet healthy: nothing of Nomad once every
replica is. It bounds a cold start from zero and each step of a scale-up or a rolling update: at 1 s, a woken
replica was routable 0.3-0.95 s after Nomad's own check passed (``bench/inference_serving``)."""


class Scheduler:
    def __init__(self, settings: Settings, redis: Redis, nomad: NomadClient) -> None:
        self.settings = settings
        self.keys = Keys(settings.redis.prefix)
        self.store = SessionStore(redis, self.keys, usage_retention=settings.usage_raw_retention)
        self.nomad = nomad
        self.lease = Lease(
            redis, self.keys.scheduler_lease, self.keys.scheduler_fence, ttl=settings.scheduler.lease_ttl
        )
        self.config = load_scheduling_config(settings.scheduler.config_path)  # a broken file stops us here,
        self.core = pass_config(self.config)  # and so does a strategy or selector nobody provides

    async def run_forever(self) -> None:
        try:
            await lead_forever("scheduler", self.lease, self.lead)
        finally:
            # stopped (SIGTERM, caravan.services.until_sigterm): a standby takes over at once, not after the TTL
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self.lease.release()

    async def lead(self, fence: Fence) -> None:
        if indexed := await self.store.ensure_listing_indexes():
            log.info("indexed %d stored sessions for listing", indexed)
        folders = FolderOwner(FolderStore(self.store.redis, self.keys), self.nomad, self.settings.storage, fence)
        images = ImageOwner(ImageStore(self.store.redis, self.keys), self.nomad, self.settings.nomad, fence)
        owner = JobOwner(self.store, self.nomad, fence, folders, images)
        usage = UsageRecounter(FolderStore(self.store.redis, self.keys), self.settings.storage)
        follower = Follower(self.store, self.nomad, fence, owner)
        placer = Placer(self.store, self.nomad, fence, self.settings, self.config, self.core)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(forever("schedule", lambda: self._schedule_once(placer, fence)))
            tasks.create_task(forever("jobs", owner.run_forever))
            tasks.create_task(forever("folder usage", usage.recount_due, pause=usage.tick))
            tasks.create_task(forever("usage compaction", self.compact_usage, pause=COMPACT_INTERVAL))
            tasks.create_task(forever("follow", follower.follow_events, pause=0.5))
            tasks.create_task(
                forever("reconcile", follower.reconcile, pause=self.settings.scheduler.reconcile_interval)
            )
            tasks.create_task(forever("replica health", follower.confirm_replica_health, pause=REPLICA_HEALTH_INTERVAL))
            runner = ScheduleRunner(
                self.store, self.settings, self.config, fence, history=self.settings.scheduler.schedule_history
            )
            tasks.create_task(forever("schedules", runner.run_forever))
            scaler = Autoscaler(self.store, self.nomad, fence, self.settings, self.config, self.core)
            tasks.create_task(forever("autoscaler", scaler.run_forever))

    async def _schedule_once(self, placer: Placer, fence: Fence) -> None:
        await placer.run_pass()
        await self.end_overdue_batches(fence)
        # Sleep until there is news (a session created or ended, a node changed) or the pass interval is over.
        await self.store.redis.blpop([self.keys.scheduler_wakeup], timeout=self.settings.scheduler.pass_interval)
        await self.store.redis.delete(self.keys.scheduler_wakeup)

    async def compact_usage(self) -> None:
        """The usage days written since their compact documents were built, built again off the reports' path."""
        if built := await self.store.usage.compact_written_days():
            log.debug("compacted the usage of %d days (%s … %s)", len(built), built[0], built[-1])

    async def end_overdue_batches(self, fence: Fence | None) -> None:
        """BATCH sessions past their batch timeout end FAILED with ``task-timeout``."""
        for session_id in await self.store.overdue_batch_sessions(utcnow().timestamp()):
            await self.store.request_termination(
                session_id, reason="task-timeout", at=utcnow(), result=SessionResult.FAILURE, fence=fence
            )
