"""The job owner's storage work: it creates the Nomad dynamic host volume of each new folder, and purges trashed
folders whose grace has passed (volume and data). The gateway only writes the folder and the request to Redis
(``stores.folders``), as it does for jobs: only the scheduler's token writes to Nomad.

Requests are removed only once done, so a crash repeats them: creation is idempotent (Nomad finds the volume by name
on the node), a delete of a missing volume is no error.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from core.clock import utcnow
from core.errors import PermanentError
from core.lease import Fence
from core.settings import StorageSettings
from domain.storage import Folder, FolderStatus, purge_claim
from nomad_jobs.client import Json, NomadClient
from stores.folders import FolderStore

log = logging.getLogger(__name__)

PURGE_RETRY = 60.0
"""Seconds before a purge Nomad refused (a session still mounts the volume) is tried again."""


class FolderOwner:
    def __init__(
        self, store: FolderStore, nomad: NomadClient, settings: StorageSettings, fence: Fence | None = None
    ) -> None:
        self.store = store
        self.nomad = nomad
        self.settings = settings
        self.fence = fence
        """The leader's term: every write here holds only while it is current (``LostLease`` otherwise)."""

    async def act(self) -> None:
        """Carry out every folder request due now (an outage, a TransientError, ends the round: tried again)."""
        now = utcnow()
        to_create, to_purge = await self.store.owner_work(now)
        for folder in await self.store.many(sorted(to_create)):
            await self._create(folder)
        for folder in await self.store.many(sorted(to_purge)):
            await self._purge(folder, now)

    async def _create(self, folder: Folder) -> None:
        if folder.status is not FolderStatus.CREATING:  # done already, or trashed first: the request is dropped
            await self.store.settle(folder.id, lambda f: None, self.fence)
            return
        try:
            node_id = await self._storage_node()
            volume = await self.nomad.create_host_volume(folder.volume_name, node_id)
        except PermanentError as exc:
            log.error("folder=%s volume refused: %s", folder.id, exc)
            why = str(exc)[:500]
            await self.store.settle(
                folder.id,
                lambda f: f.evolve(status=FolderStatus.FAILED, status_info=why) if f.status is CREATING else None,
                self.fence,
            )
            return
        where = {
            "node_id": str(volume["NodeID"]),
            "volume_id": str(volume["ID"]),
            "host_path": str(volume["HostPath"]),
        }
        # renamed, shared or trashed meanwhile: that stays; where it lives is ours to write
        await self.store.settle(
            folder.id,
            lambda f: f.evolve(status=FolderStatus.READY if f.status is CREATING else f.status, **where),
            self.fence,
        )
        log.info(
            "folder=%s volume %s on node %s at %s", folder.id, where["volume_id"], where["node_id"], where["host_path"]
        )

    async def _purge(self, folder: Folder, now: datetime) -> None:
        """Delete a trashed folder whose grace has passed: first marked PURGING (from then on no restore can race
        the deletion), then its volume, then the document. A folder restored meanwhile is left alone."""
        claimed = await self.store.settle(folder.id, lambda f: purge_claim(f, self.settings, now), self.fence)
        if claimed is None or claimed.status is not FolderStatus.PURGING:
            return
        if claimed.volume_id:
            try:
                await self.nomad.delete_host_volume(claimed.volume_id)
            except PermanentError as exc:  # e.g. a session still mounts it: tried again later, the rest goes on
                log.warning("folder=%s volume %s not deleted yet: %s", folder.id, claimed.volume_id, exc)
                await self.store.postpone_purge(folder.id, now + timedelta(seconds=PURGE_RETRY), self.fence)
                return
        await self.store.forget(claimed, self.fence)
        log.info("folder=%s purged (volume %s)", folder.id, claimed.volume_id)

    async def _storage_node(self) -> str:
        """The node new folders go to: ``CARAVAN_STORAGE_NODE`` (id or name), else the first ready node by id."""
        nodes: list[Json] = await self.nomad.nodes()
        ready = sorted(
            (n for n in nodes if n.get("Status") == "ready" and not n.get("Drain")), key=lambda n: str(n["ID"])
        )
        wanted = self.settings.node
        for node in ready:
            if wanted is None or wanted in (node["ID"], node.get("Name")):
                return str(node["ID"])
        raise NoStorageNode(f"no ready Nomad node {'named ' + wanted if wanted else ''} to hold folders")


class NoStorageNode(PermanentError):
    pass


CREATING = FolderStatus.CREATING
