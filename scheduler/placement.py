"""One scheduling pass: read pending sessions, decide, and mark the chosen ones SCHEDULED with their job.

The decision itself is pure (see :mod:`scheduler.scheduling_pass`); this module is the I/O edge
that builds its input from Redis and Nomad and writes its output back.
"""

from __future__ import annotations

import logging

from common.clock import utcnow
from common.lifecycle import transition
from common.model import Session, SessionStatus
from common.settings import Settings
from common.store import Fence, SessionStore
from nomad_jobs.client import NomadClient
from nomad_jobs.session_job import JobContext, render_session_job

log = logging.getLogger(__name__)


class Placer:
    def __init__(self, store: SessionStore, nomad: NomadClient, fence: Fence | None, settings: Settings) -> None:
        self.store = store
        self.nomad = nomad
        self.fence = fence
        self.settings = settings

    async def _mhz_per_core(self) -> int:
        for node in await self.nomad.nodes():
            cpu = ((node.get("NodeResources") or {}).get("Cpu")) or {}
            if cpu.get("TotalCpuCores"):
                return max(1, int(cpu["CpuShares"]) // int(cpu["TotalCpuCores"]))
        return 1000

    async def run_pass(self) -> int:
        placed = 0
        groups = await self.store.resource_groups()
        mhz = None
        for group in sorted(groups):
            sessions = [s for s in await self.store.get_many(await self.store.pending_ids(group)) if s]
            if not sessions:
                continue
            mhz = mhz or await self._mhz_per_core()
            ctx = JobContext(
                job_prefix=self.settings.nomad.job_prefix,
                datacenter=self.settings.nomad.datacenter,
                namespace=self.settings.nomad.namespace,
                mhz_per_core=mhz,
            )
            for session in sessions:
                if await self.store.update(session.id, lambda s: _schedule(s, ctx), fence=self.fence):
                    placed += 1
        return placed


def _schedule(session: Session, ctx: JobContext) -> Session | None:
    if session.status is not SessionStatus.PENDING:
        return None
    rendered = render_session_job(session, ctx)
    scheduled = session.evolve(nomad_job_id=rendered.job_id, job_hcl=rendered.hcl)
    return transition(scheduled, SessionStatus.SCHEDULED, reason="scheduled", at=utcnow())
