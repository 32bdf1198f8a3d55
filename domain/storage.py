"""Storage folders: data that outlives a session (pure). Kept in Redis by ``stores.folders``; made real on a storage
host by the scheduler's job owner (``scheduler.folder_owner``) as a Nomad dynamic host volume.

A folder belongs to its owner (and their project, whose admins reach it like any object of theirs). Its owner may
share it with other users or with a project, read-only (RO) or read-write (RW); whoever it is shared with sees it and
mounts it with at most the mode shared. Anyone else is told NOT_FOUND: a folder they may not see does not exist
for them. Only the owner (or an admin of its project) renames, shares, deletes it.

Lifecycle: CREATING (asked; the job owner creates the volume) -> READY (mountable; ``node_id`` and ``host_path`` are
known) -> TRASHED (deleted by its owner: invisible to mounts and shares, restorable for the grace period
``StorageSettings.trash_grace`` seconds) -> PURGING (the grace passed: the job owner deletes the volume and its data,
and nothing brings it back) -> purged (the document goes). A folder trashed before its volume was made goes back to
CREATING when restored.

Quotas: per user and per project, a number of folders (trashed ones count until purged) and bytes (the sum of the
folders' usage, enforced by the file API when it writes). The file API counts its own writes as it makes them; the
storage node recounts each READY folder every ``StorageSettings.recount_interval`` seconds (``folders_to_recount``),
so what sessions write through a mount counts too.
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from core.errors import Forbidden, InvalidInput, NotFound, QuotaExceeded
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
    PURGING = "PURGING"
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


def purge_claim(folder: Folder, settings: StorageSettings, now: datetime) -> Folder | None:
    """The job owner's claim on a purge: a trashed folder whose grace has passed at ``now`` becomes PURGING (no restore
    from then on); any other is left as it is (None: restored, trashed again later with a new grace, or PURGING
    already after a crash)."""
    purge_at = folder.purge_at(settings)
    if folder.status is FolderStatus.TRASHED and purge_at is not None and purge_at <= now:
        return folder.evolve(status=FolderStatus.PURGING)
    return None


def owns(viewer: User, folder: Folder) -> bool:
    """May ``viewer`` rename, share, delete ``folder``: its owner, its project's admins, a superadmin."""
    return can_access(viewer, folder.owner_id, folder.project)


def mode_for(viewer: User, folder: Folder) -> FolderMode | None:
    """The strongest mode ``viewer`` has on ``folder``; None: they may not see it (NOT_FOUND). A trashed folder
    (or being purged) is its owner's alone."""
    if owns(viewer, folder):
        return FolderMode.RW
    if folder.status in (FolderStatus.TRASHED, FolderStatus.PURGING):
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


def folders_to_recount(
    ready: Iterable[str], last_counted: Mapping[str, datetime], *, now: datetime, interval: float
) -> list[str]:
    """Which of the ``ready`` folders' bytes are due a recount at ``now``: those never counted, then those last
    counted ``interval`` seconds ago or more, the longest waiting first (pure; the clock passed in)."""
    due_by = now - timedelta(seconds=interval)
    due = [f for f in ready if f not in last_counted or last_counted[f] <= due_by]
    return sorted(due, key=lambda f: (f in last_counted, last_counted.get(f, now), f))


def at_bytes_quota(*, user_bytes: int, project_bytes: int, quota: StorageSettings) -> bool:
    """Do a folder owner's ``user_bytes`` or its project's ``project_bytes`` reach their quotas (no more may be
    written: new uploads and RW mounts are refused)?"""
    return user_bytes >= quota.max_bytes_per_user or project_bytes >= quota.max_bytes_per_project


def new_folder(*, name: str, owner: User, project: str, now: datetime) -> Folder:
    return Folder(
        id=str(uuid.uuid4()), name=check_folder_name(name), owner_id=owner.id, project=project, created_at=now
    )


def may_share_with(viewer: User, project: str) -> bool:
    """A project one may share with: one's own (a superadmin: any)."""
    return viewer.role is Role.SUPERADMIN or project in viewer.projects


# -- mounts --

MAX_MOUNTS = 8
"""Folders one session may mount."""
MOUNT_PATH_RULE = re.compile(r"^(/[A-Za-z0-9_.-]{1,64}){1,8}$")
"""An absolute path of 1-8 parts of letters, digits, ``_ . -`` (no ``..``, no empty part; checked apart)."""
RESERVED_MOUNT_ROOTS = frozenset(
    {"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin", "sys", "usr", "var"}
    | {"alloc", "local", "secrets", "tmp"}  # Nomad's task directories
)
"""First parts a mount path may not start with: the system's directories and Nomad's task directories."""


@dataclass(frozen=True)
class MountRequest:
    """A folder a creation asks to mount, as the user gave it."""

    folder: str
    """The folder's id."""
    path: str
    """Where the kernel sees it: an absolute path such as ``/data`` (``/home/work/data``)."""
    mode: FolderMode = FolderMode.RW


@dataclass(frozen=True)
class Mount:
    """A folder mounted into a session's kernels, resolved at creation."""

    folder_id: str
    volume_name: str
    """The Nomad dynamic host volume the job asks for."""
    path: str
    read_only: bool
    node_id: str
    """The storage node holding the folder: the session runs there."""


def check_mounts(requests: tuple[MountRequest, ...] | list[MountRequest]) -> None:
    """The mount paths of a request (pure; the folders are resolved by :func:`resolve_mounts`)."""
    if len(requests) > MAX_MOUNTS:
        raise InvalidInput(f"at most {MAX_MOUNTS} folders may be mounted", field="mounts")
    seen: set[str] = set()
    for i, mount in enumerate(requests):
        where = f"mounts.{i}.path"
        path = unicodedata.normalize("NFC", mount.path)
        parts = path.split("/")[1:]
        if not MOUNT_PATH_RULE.match(path) or any(p in (".", "..") for p in parts):
            raise InvalidInput(
                "a mount path is absolute, 1-8 parts of letters, digits, '_', '.', '-' (no '.' or '..')", field=where
            )
        if parts[0] in RESERVED_MOUNT_ROOTS:
            raise InvalidInput(f"a folder cannot be mounted under /{parts[0]}", field=where)
        if any(path == other or path.startswith(other + "/") or other.startswith(path + "/") for other in seen):
            raise InvalidInput(f"mount path {path} overlaps another mount", field=where)
        seen.add(path)


def resolve_mounts(
    requests: tuple[MountRequest, ...] | list[MountRequest],
    folders: dict[str, Folder],
    owner: User,
    *,
    full: Collection[str] = frozenset(),
) -> tuple[Mount, ...]:
    """The mounts of ``owner``'s new sessions: each folder visible to them (else NOT_FOUND), READY, mounted with at
    most the mode they have (an RO share asked RW: FORBIDDEN), all on one storage node. A folder in ``full`` (its
    owner or project at or past a bytes quota, :func:`at_bytes_quota`) is mounted RO only: RW is QUOTA_EXCEEDED."""
    check_mounts(requests)
    mounts = []
    for i, request in enumerate(requests):
        folder = folders.get(request.folder)
        have = mode_for(owner, folder) if folder is not None else None
        if folder is None or have is None:
            raise NotFound(f"no folder {request.folder[:80]}", field=f"mounts.{i}.folder")
        if folder.status is not FolderStatus.READY or folder.node_id is None:
            raise InvalidInput(f"folder {folder.name} is {folder.status.value}, not READY", field=f"mounts.{i}.folder")
        if not have.allows(request.mode):
            raise Forbidden(f"folder {folder.name} is shared read-only: mount it RO", field=f"mounts.{i}.mode")
        if request.mode is FolderMode.RW and folder.id in full:
            raise QuotaExceeded(
                f"folder {folder.name}'s owner or project holds its bytes quota: mount it RO, or free space first",
                field=f"mounts.{i}.folder",
            )
        path = unicodedata.normalize("NFC", request.path)
        mounts.append(Mount(folder.id, folder.volume_name, path, request.mode is FolderMode.RO, folder.node_id))
    if len({m.node_id for m in mounts}) > 1:
        raise InvalidInput("the folders live on different storage nodes: a session mounts one node's", field="mounts")
    return tuple(mounts)
