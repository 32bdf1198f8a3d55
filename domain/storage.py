"""Storage folders: data that outlives a session (pure). Kept in Redis by ``stores.folders``; made real on a storage
host by the scheduler's job owner (``scheduler.folder_owner``) as a Nomad dynamic host volume.

A folder belongs to its owner (and their project, whose admins reach it like any object of theirs). Its owner may
share it with other users or with a project, read-only (RO) or read-write (RW); whoever it is shared with sees it and
mounts it with at most the mode shared. Anyone else is told NOT_FOUND: a folder they may not see does not exist
for them. Only the owner (or an admin of its project) renames, shares, deletes it.

Lifecycle: CREATING (asked; the job owner creates the volume) -> READY (mountable; ``node_id`` and ``host_path`` are
known) -> TRASHED (deleted by its owner: invisible to mounts and shares, restorable for the grace period
``StorageSettings.trash_grace`` seconds) -> purged (the job owner deletes the volume and its data; the document goes).

Quotas: per user and per project, a number of folders (trashed ones count until purged) and bytes (the sum of the
folders' usage, enforced by the file API when it writes).
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from core.errors import InvalidInput, QuotaExceeded
from core.settings import StorageSettings
from domain.access import can_access
from domain.users import Role, User

FOLDER_NAME_RULE = re.compile(r"^[A-Za-z0-9_.-](?:[A-Za-z0-9_.-]{0,62}[A-Za-z0-9_.-])?$")
"""1-64 characters of letters, digits, ``_ . -``; not ``.`` or ``..`` (checked apart)."""
VOLUME_PREFIX = "caravan-folder-"
"""Nomad volume names of folders: this prefix, then the folder id."""


class FolderMode(StrEnum):
    RO = "RO"
    RW = "RW"

    def allows(self, wanted: FolderMode) -> bool:
        """Does having this mode allow a mount (or a share) in ``wanted`` mode?"""
        return self is FolderMode.RW or wanted is FolderMode.RO


class FolderStatus(StrEnum):
    CREATING = "CREATING"
    READY = "READY"
    TRASHED = "TRASHED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class Folder:
    id: str
    name: str
    owner_id: str
    project: str
    created_at: datetime
    status: FolderStatus = FolderStatus.CREATING
    status_info: str = ""
    """Why it FAILED (Nomad's refusal)."""
    node_id: str | None = None
    """The Nomad node (storage host) holding it, once READY: sessions mounting it are placed there."""
    volume_id: str | None = None
    """Nomad's id of its dynamic host volume."""
    host_path: str | None = None
    """Its directory on the storage host (the gateway's file API works there)."""
    shared_with_users: dict[str, FolderMode] = field(default_factory=dict)
    """User id -> the mode shared with them."""
    shared_with_projects: dict[str, FolderMode] = field(default_factory=dict)
    """Project -> the mode shared with its members."""
    trashed_at: datetime | None = None

    @property
    def volume_name(self) -> str:
        """The Nomad dynamic host volume's name (jobs mount it by name)."""
        return VOLUME_PREFIX + self.id

    def purge_at(self, quota: StorageSettings) -> datetime | None:
        """When a trashed folder's data goes for good."""
        return self.trashed_at + timedelta(seconds=quota.trash_grace) if self.trashed_at else None

    def evolve(self, **changes: Any) -> Folder:
        return replace(self, **changes)


# -- decisions (pure) --


def owns(viewer: User, folder: Folder) -> bool:
    """May ``viewer`` rename, share, delete ``folder``: its owner, its project's admins, a superadmin."""
    return can_access(viewer, folder.owner_id, folder.project)


def mode_for(viewer: User, folder: Folder) -> FolderMode | None:
    """The strongest mode ``viewer`` has on ``folder``; None: they may not see it (NOT_FOUND). A trashed folder
    is its owner's alone."""
    if owns(viewer, folder):
        return FolderMode.RW
    if folder.status is FolderStatus.TRASHED:
        return None
    modes = [folder.shared_with_users.get(viewer.id)]
    modes += [folder.shared_with_projects.get(p) for p in viewer.projects]
    given = [m for m in modes if m is not None]
    if not given:
        return None
    return FolderMode.RW if FolderMode.RW in given else FolderMode.RO


def check_folder_name(name: str, *, field_name: str = "name") -> str:
    """The name, NFC-normalised, if valid."""
    normal = unicodedata.normalize("NFC", name)
    if normal in (".", "..") or not FOLDER_NAME_RULE.match(normal):
        raise InvalidInput(
            "a folder name is 1-64 characters: letters, digits, '_', '.', '-' (not '.' or '..')", field=field_name
        )
    return normal


def check_count_quota(*, owned_by_user: int, in_project: int, quota: StorageSettings) -> None:
    """Raise QUOTA_EXCEEDED when one more folder would pass the user's or the project's number."""
    if owned_by_user >= quota.max_per_user:
        raise QuotaExceeded(f"you have {owned_by_user} folders, the most a user may have", field="name")
    if in_project >= quota.max_per_project:
        raise QuotaExceeded(f"the project has {in_project} folders, the most it may have", field="project")


def check_bytes_quota(*, user_bytes: int, project_bytes: int, adding: int, quota: StorageSettings) -> None:
    """Raise QUOTA_EXCEEDED when ``adding`` more bytes would pass the user's or the project's bytes."""
    if user_bytes + adding > quota.max_bytes_per_user:
        raise QuotaExceeded(
            f"the owner's folders hold {user_bytes} bytes; {adding} more would pass {quota.max_bytes_per_user}",
            field="bytes",
        )
    if project_bytes + adding > quota.max_bytes_per_project:
        raise QuotaExceeded(
            f"the project's folders hold {project_bytes} bytes; {adding} more would pass {quota.max_bytes_per_project}",
            field="bytes",
        )


def new_folder(*, name: str, owner: User, project: str, now: datetime) -> Folder:
    return Folder(
        id=str(uuid.uuid4()), name=check_folder_name(name), owner_id=owner.id, project=project, created_at=now
    )


def may_share_with(viewer: User, project: str) -> bool:
    """A project one may share with: one's own (a superadmin: any)."""
    return viewer.role is Role.SUPERADMIN or project in viewer.projects
