"""The bytes of storage folders, recounted on the storage node: the file API counts what it writes, but sessions
write through their mounts too. Every ``StorageSettings.recount_interval`` seconds each READY folder's directory is
walked from a descriptor of it (``core.tree_bytes``: no symlink followed, no path resolved again, so a session
swapping a directory for a link meanwhile leads the walk nowhere) and its usage replaced by the total, unless the
file API counted something in it during the walk (then it is walked again at the next look), so
``usageBytes``, ``folderUsage`` and the bytes quotas (new uploads refused past them) see those writes within about
that long.

It runs with the scheduler leader, which must then run where the folders' directories are (the dev stack: the one
node). A folder whose directory is not here is skipped, and said so once.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from pathlib import Path

from core.clock import utcnow
from core.settings import StorageSettings
from core.tree_bytes import folder_bytes
from domain.storage import folders_to_recount
from stores.folders import FolderStore

log = logging.getLogger(__name__)

MAX_TICK = 5.0
"""Seconds at most between looks for folders due a recount (a new folder is counted within this long)."""


class UsageRecounter:
    def __init__(self, store: FolderStore, settings: StorageSettings) -> None:
        self.store = store
        self.settings = settings
        self.last_counted: dict[str, datetime] = {}
        """Folder id -> when this leader last counted it."""
        self.absent: set[str] = set()
        """Folders whose directory is not on this machine (said once)."""

    @property
    def tick(self) -> float:
        """Seconds between looks: a quarter of the interval, 0.1 s to :data:`MAX_TICK`."""
        return min(MAX_TICK, max(0.1, self.settings.recount_interval / 4))

    async def recount_due(self) -> None:
        """Recount every READY folder due now; one walk at a time, in a thread."""
        ready = {f.id: f for f in await self.store.ready()}
        self.last_counted = {i: at for i, at in self.last_counted.items() if i in ready}
        now = utcnow()
        for folder_id in folders_to_recount(ready, self.last_counted, now=now, interval=self.settings.recount_interval):
            self.last_counted[folder_id] = now
            host_path = ready[folder_id].host_path
            if host_path is None or not await asyncio.to_thread(Path(host_path).is_dir):
                if folder_id not in self.absent:
                    self.absent.add(folder_id)
                    log.warning(
                        "folder=%s directory %s is not on this machine: usage not recounted", folder_id, host_path
                    )
                continue
            mark = await self.store.usage_mark(folder_id)
            total = await asyncio.to_thread(folder_bytes, host_path)
            if not await self.store.recounted(folder_id, total, mark):
                self.last_counted.pop(folder_id, None)  # written to meanwhile: counted again at the next look
