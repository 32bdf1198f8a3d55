"""The one writer of sessions' Nomad jobs: it registers, stops and restarts them; everyone else asks.

The gateway (destroy, restart), the idle checker (reclaim) and the scheduler's own follower (a batch's main kernel
ended, a timeout, reconciliation) only write the session's new state to Redis, and in the same transaction a request
for the owner (``stores.sessions``: ``work_to_submit``, ``jobs_to_stop``, ``jobs_to_restart``), which wakes it. The
owner runs in the scheduler while it holds the lease, and handles each session's requests in one coroutine, reading
the session as it is now: a session destroyed before its job was registered is never registered (only marked
submitted), so "destroyed while registering" cannot happen; a registration asked again of a session already
past SCHEDULED (Redis lost the request's removal) touches nothing in Nomad; a restart asked of a session that is
being stopped is dropped. Requests are removed only once done, so a crash repeats them (every action is
idempotent: registration is create-only, a stop of a stopped or missing job is no error).

Nomad writes anywhere else in Caravan are a bug: the gateway's and the idle checker's Nomad tokens may not write
(``caravan.stack.nomad_acl``). Jobs without a session at all (Redis lost it) are stopped through :meth:`stop_orphan`.
"""

from __future__ import annotations

import asyncio
import logging

from core.clock import utcnow
from core.errors import PermanentError
from core.lease import Fence
from core.retry import stop_if_cancelled
from domain.inference import is_inference
from domain.model import Session, SessionStatus
from domain.start_retry import awaits_start_retry
from domain.termination import STOPPING
from nomad_jobs.client import NomadClient
from nomad_jobs.meta import TASK_NAME
from scheduler.folder_owner import FolderOwner
from scheduler.image_owner import ImageOwner
from scheduler.submitter import place_again, resubmit, submit
from stores.owner_requests import StopMode
from stores.sessions import SessionStore

log = logging.getLogger(__name__)

CONCURRENCY = 32
"""Sessions acted on at once (each by one coroutine, so one session's actions never overlap)."""
IDLE_WAIT = 1.0
"""Seconds the owner waits for news when it has nothing to do (requests wake it at once)."""
ENDED = STOPPING | {SessionStatus.CANCELLED}
RESCALABLE = frozenset({SessionStatus.PREPARING, SessionStatus.RUNNING})
"""A live INFERENCE session's job is registered again as stored now when its replicas change."""


class JobOwner:
    def __init__(
        self,
        store: SessionStore,
        nomad: NomadClient,
        fence: Fence | None,
        folders: FolderOwner | None = None,
        images: ImageOwner | None = None,
    ) -> None:
        self.store = store
        self.requests = store.requests
        """Its queue (``stores.owner_requests``): what it is asked to register, stop, restart."""
        self.nomad = nomad
        self.fence = fence
        self.folders = folders
        """Storage folders' volumes (``scheduler.folder_owner``), created and purged in the same rounds."""
        self.images = images
        """Committed images' docker jobs (``scheduler.image_owner``), in the same rounds."""

    async def run_forever(self) -> None:
        while True:
            stop_if_cancelled()  # a stop lost inside redis-py (core.retry) would otherwise loop here for ever
            await self.act()
            if self.folders is not None:
                await self.folders.act()
            if self.images is not None:
                await self.images.act()
            await self.requests.wait_for_owner_work(IDLE_WAIT)

    async def act(self) -> None:
        """Carry out every request stored now, one coroutine per session."""
        to_submit, to_stop, to_restart = await self.requests.owner_work()
        limit = asyncio.Semaphore(CONCURRENCY)

        async def one(session_id: str) -> None:
            async with limit:
                await self._act_on(
                    session_id, session_id in to_submit, to_stop.get(session_id), session_id in to_restart
                )

        await asyncio.gather(*(one(i) for i in sorted(to_submit | to_stop.keys() | to_restart)))

    async def _act_on(self, session_id: str, register: bool, stop: StopMode | None, restart: bool) -> None:
        session = await self.store.get(session_id)
        if session is None or session.nomad_job_id is None:  # gone, or it never had a job: nothing to act on
            await self._forget(session_id, register, stop, restart)
            return
        if stop is not None or session.status in ENDED:
            if register:
                await self.requests.mark_submitted(session_id)  # ended before its job was registered: never register
            await self._stop(session, stop or "stop")
            if restart:
                await self.requests.restarted(session_id)
            return
        if register:
            if session.status is SessionStatus.SCHEDULED:
                await submit(self.store, self.nomad, session, self.fence)
            elif is_inference(session) and session.status in RESCALABLE:
                await resubmit(self.store, self.nomad, session)  # its replicas changed (scheduler.autoscaler)
            elif awaits_start_retry(session):
                await place_again(self.store, self.nomad, session)  # its set-up failed (domain.start_retry)
            else:  # registered already (only the registration moves it on): the request's removal was lost
                await self.requests.mark_submitted(session_id)
        if restart:
            await self._restart(session)

    async def _stop(self, session: Session, mode: StopMode) -> None:
        assert session.nomad_job_id
        try:
            await self.nomad.deregister(session.nomad_job_id, purge=mode == "purge")
        except PermanentError as exc:  # refused: kept, and tried again at the next request or reconciliation
            log.error("session=%s job=%s could not be stopped: %s", session.id, session.nomad_job_id, exc)
            return
        log.info(
            "session=%s job=%s %s (%s)",
            session.id,
            session.nomad_job_id,
            "purged" if mode == "purge" else "stopping",
            session.status_info,
        )
        await self.requests.stopped(session.id, mode)

    async def _restart(self, session: Session) -> None:
        if session.status is SessionStatus.RUNNING:
            for kernel in session.kernels:
                if kernel.alloc_id and kernel.status is SessionStatus.RUNNING:
                    try:  # an outage (TransientError) ends this round: the request is kept and tried again
                        await self.nomad.restart_allocation(kernel.alloc_id, TASK_NAME)
                    except PermanentError as exc:  # the allocation is gone or stopping meanwhile
                        log.warning("session=%s kernel=%s not restarted: %s", session.id, kernel.hostname, exc)
            log.info("session=%s restarted in place at %s", session.id, utcnow().isoformat())
        await self.requests.restarted(session.id)

    async def _forget(self, session_id: str, register: bool, stop: StopMode | None, restart: bool) -> None:
        if register:
            await self.requests.mark_submitted(session_id)
        if stop is not None:
            await self.requests.stopped(session_id, stop)
        if restart:
            await self.requests.restarted(session_id)

    async def stop_orphan(self, job_id: str) -> None:
        """Stop a Caravan job that has no session at all (Redis lost it): nothing to ask through the store."""
        await self.nomad.deregister(job_id)
