"""The job owner's image work: for each committed image asked (``stores.images``), a short platform job on the
kernel's node runs ``docker commit`` (COMMITTING) or ``docker rmi`` (DELETING); its outcome is written back and the
job purged. The jobs go to the platform's namespace (``NomadSettings.platform_namespace``: raw_exec allowed there, and
only the scheduler's token writes there), never to the users' namespace, whose raw_exec may well be disabled.

A request is removed only once done, so a crash repeats it: registration is create-only (a repeat finds
the job and waits for it), ``docker commit`` to the same tag makes the same image again.
"""

from __future__ import annotations

import contextlib
import logging

from core.errors import PermanentError
from core.lease import Fence
from core.settings import NomadSettings
from domain.images import CommittedImage, ImageStatus
from nomad_jobs.client import JobExists, NomadClient, NomadNotFound
from nomad_jobs.commit_job import image_job_id, render_image_job
from stores.images import ImageStore

log = logging.getLogger(__name__)


class ImageOwner:
    def __init__(
        self, store: ImageStore, nomad: NomadClient, settings: NomadSettings, fence: Fence | None = None
    ) -> None:
        self.store = store
        self.nomad = nomad.in_namespace(settings.platform_namespace)
        self.settings = settings
        self.fence = fence
        """The leader's term: every write here holds only while it is current (``LostLease`` otherwise)."""

    async def act(self) -> None:
        for image in await self.store.to_act_on():
            await self._act_on(image)

    async def _act_on(self, image: CommittedImage) -> None:
        deleting = image.status is ImageStatus.DELETING
        if image.status not in (ImageStatus.COMMITTING, ImageStatus.DELETING):
            await self.store.done(image, image, self.fence)
            return
        action = "rmi" if deleting else "commit"
        job_id = image_job_id(self.settings.job_prefix, image.id, action)
        args = ["rmi", image.ref] if deleting else ["commit", image.container, image.ref]
        try:
            outcome = await self._outcome(job_id)
            if outcome is None:
                hcl = render_image_job(
                    job_id,
                    node_id=image.node_id,
                    args=args,
                    namespace=self.settings.platform_namespace,
                    datacenter=self.settings.datacenter,
                )
                with contextlib.suppress(JobExists):  # registered at an earlier round: still running
                    await self.nomad.register(await self.nomad.parse(hcl), source_hcl=hcl)
                return  # its outcome is read at a later round (the owner wakes at least every second)
        except PermanentError as exc:
            outcome = f"refused by Nomad: {exc}"
        await self.nomad.deregister(job_id, purge=True)
        if deleting:
            log.info("image=%s %s removed (%s)", image.id, image.ref, outcome or "ok")
            await self.store.done(image, None, self.fence)
        elif outcome == "":
            log.info("image=%s %s committed from %s", image.id, image.ref, image.container)
            await self.store.done(image, image.evolve(status=ImageStatus.READY, status_info=""), self.fence)
        else:
            log.warning("image=%s %s failed: %s", image.id, image.ref, outcome)
            failed = image.evolve(status=ImageStatus.FAILED, status_info=(outcome or "")[:500])
            await self.store.done(image, failed, self.fence)

    async def _outcome(self, job_id: str) -> str | None:
        """None: not registered yet, or still running; "": it succeeded; else why it failed."""
        try:
            allocs = await self.nomad.job_allocations(job_id)
        except NomadNotFound:
            return None
        for alloc in allocs:
            status = alloc.get("ClientStatus")
            if status == "complete":
                return ""
            if status in ("failed", "lost"):
                events = [
                    str(e.get("DisplayMessage", ""))
                    for state in (alloc.get("TaskStates") or {}).values()
                    for e in state.get("Events") or []
                ]
                return "; ".join(e for e in events if e)[-500:] or f"the docker job {status}"
        return None
