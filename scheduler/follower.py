"""Keeping sessions true to Nomad: the allocation event stream, and a periodic reconciliation.

The event stream gives changes as they happen (resuming from the last applied index after a
disconnect); reconciliation walks every live session and its job's allocations, so anything the
stream missed (Caravan was down, the event buffer wrapped) still converges.
"""

from __future__ import annotations

import logging
from typing import Any

from common.clock import utcnow
from common.errors import TransientError
from common.lifecycle import observe_kernel, transition
from common.model import KernelObservation, Session, SessionStatus
from common.store import Fence, SessionStore
from nomad_jobs.client import NomadClient, NomadNotFound
from nomad_jobs.meta import session_id_of
from nomad_jobs.observe import latest_per_group, observe_allocation

log = logging.getLogger(__name__)

S = SessionStatus
OBSERVED_STATUSES = frozenset({S.SCHEDULED, S.PREPARING, S.RUNNING, S.TERMINATING, S.ERROR})


class Follower:
    def __init__(self, store: SessionStore, nomad: NomadClient, fence: Fence | None) -> None:
        self.store = store
        self.nomad = nomad
        self.fence = fence
        self.prefix = nomad.settings.job_prefix

    async def apply(self, session_id: str, seen: KernelObservation) -> Session | None:
        def mutate(session: Session) -> Session | None:
            if session.status not in OBSERVED_STATUSES:
                return None
            return observe_kernel(session, seen, at=utcnow())

        return await self.store.update(session_id, mutate, fence=self.fence)

    async def on_allocation(self, alloc: dict[str, Any]) -> None:
        session_id = session_id_of(self.prefix, str(alloc.get("JobID", "")))
        if session_id:
            await self.apply(session_id, observe_allocation(alloc))

    async def follow_events(self) -> None:
        """Apply allocation events until the stream breaks (raises TransientError)."""
        index = int(await self.store.redis.get(self.store.keys.nomad_event_index) or 0)
        async for batch in self.nomad.event_stream(index=index + 1 if index else 0, topics=["Allocation"]):
            for event in batch.get("Events") or []:
                alloc = (event.get("Payload") or {}).get("Allocation")
                if alloc:
                    await self.on_allocation(alloc)
            if batch.get("Index"):
                await self.store.redis.set(self.store.keys.nomad_event_index, batch["Index"])

    async def reconcile(self) -> None:
        """One pass over every live session that has a job."""
        ids = sorted(await self.store.live_ids())
        submitting = await self.store.ids_to_submit()
        for session in await self.store.get_many(ids):
            if session is None or session.nomad_job_id is None or session.status not in OBSERVED_STATUSES:
                continue
            if session.id in submitting:
                continue  # the submitter owns it until registration is acknowledged
            try:
                allocs = await self.nomad.job_allocations(session.nomad_job_id)
                job = await self.nomad.job(session.nomad_job_id)
            except NomadNotFound:
                await self.store.update(session.id, _job_lost, fence=self.fence)
                continue
            except TransientError:
                raise
            for alloc in latest_per_group(allocs).values():
                await self.apply(session.id, observe_allocation(alloc))
            if job.get("Stop") and session.status is S.TERMINATING and not allocs:
                await self.store.update(session.id, _stopped, fence=self.fence)


def _job_lost(session: Session) -> Session | None:
    if session.status.is_terminal:
        return None
    if session.status is S.TERMINATING:
        return transition(session, S.TERMINATED, reason=session.status_info, at=utcnow())
    if session.status is S.ERROR:
        return None
    return transition(session, S.ERROR, reason="job-lost", at=utcnow())


def _stopped(session: Session) -> Session | None:
    if session.status is not S.TERMINATING:
        return None
    return transition(session, S.TERMINATED, reason=session.status_info, at=utcnow())
