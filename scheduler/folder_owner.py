"""The job owner's storage work: it creates the Nomad dynamic host volume of each new folder, and purges trashed
folders whose grace has passed (volume and data). The gateway only writes the folder and the request to Redis
(``stores.folders``), as it does for jobs: only the scheduler's token writes to Nomad.

Requests are removed only once done, so a crash repeats them: creation is idempotent (Nomad finds the volume by name
on the node), a delete of a missing volume is no error.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from core.clock import utcnow
from core.errors import PermanentError
from core.settings import StorageSettings
from domain.storage import Folder, FolderStatus
from nomad_jobs.client import Json, NomadClient
from stores.folders import FolderStore

log = logging.getLogger(__name__)

PURGE_RETRY = 60.0
"""Seconds before a purge Nomad refused (a session still mounts the volume) is tried again."""


class FolderOwner:
    def __init__(self, store: FolderStore, nomad: NomadClient, settings: StorageSettings) -> None:
        self.store = store
        self.nomad = nomad
        self.settings = settings

    async def act(self) -> None:
        """Carry out every folder request due now (an outage, a TransientError, ends the round: tried again)."""
        to_create, to_purge = await self.store.owner_work(utcnow())
        for folder in await self.store.many(sorted(to_create)):
            await self._create(folder)
        for folder in await self.store.many(sorted(to_purge)):
            await self._purge(folder)

    async def _create(self, folder: Folder) -> None:
        if folder.status is not FolderStatus.CREATING:  # done already: the request's removal was lost
            await self.store.set_state(folder)
            return
        try:
            node_id = await self._storage_node()
            volume = await self.nomad.create_host_volume(folder.volume_name, node_id)
        except PermanentError as exc:
            log.error("folder=%s volume refused: %s", folder.id, exc)
            await self.store.set_state(folder.evolve(status=FolderStatus.FAILED, status_info=str(exc)[:500]))
            return
        ready = folder.evolve(
            status=FolderStatus.READY,
            node_id=str(volume["NodeID"]),
            volume_id=str(volume["ID"]),
            host_path=str(volume["HostPath"]),
        )
        # the folder may have been renamed or shared meanwhile: only where it lives is ours to write
        current = await self.store.get(folder.id) or folder
        await self.store.set_state(
            current.evolve(
                status=FolderStatus.READY if current.status is FolderStatus.CREATING else current.status,
                node_id=ready.node_id,
                volume_id=ready.volume_id,
                host_path=ready.host_path,
            )
        )
        log.info("folder=%s volume %s on node %s at %s", folder.id, ready.volume_id, ready.node_id, ready.host_path)

    async def _purge(self, folder: Folder) -> None:
        if folder.status is not FolderStatus.TRASHED:  # restored meanwhile
            return
        if folder.volume_id:
            try:
                await self.nomad.delete_host_volume(folder.volume_id)
            except PermanentError as exc:  # e.g. a session still mounts it: tried again later, the rest goes on
                log.warning("folder=%s volume %s not deleted yet: %s", folder.id, folder.volume_id, exc)
                await self.store.postpone_purge(folder.id, utcnow() + timedelta(seconds=PURGE_RETRY))
                return
        await self.store.forget(folder)
        log.info("folder=%s purged (volume %s)", folder.id, folder.volume_id)

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
