"""GraphQL types of storage folders."""

from __future__ import annotations

from datetime import datetime
from typing import NewType

import strawberry

from core.settings import StorageSettings
from domain import storage
from domain.users import User

Bytes = NewType("Bytes", int)
"""A number of bytes, a GraphQL scalar of its own (``BYTES_SCALAR``, in the schema's ``scalar_map``): Int stops at
2^31 - 1."""
BYTES_SCALAR = strawberry.scalar(
    name="Bytes",
    serialize=int,
    parse_value=int,
    description="A number of bytes: a JSON integer (GraphQL's Int stops at 2^31 - 1).",
)

FolderMode = storage.FolderMode
strawberry.enum(FolderMode, name="FolderMode", description="RO: read-only; RW: read-write.")
FolderStatus = storage.FolderStatus
strawberry.enum(
    FolderStatus,
    name="FolderStatus",
    description="CREATING: its volume is being made; READY: mountable; TRASHED: deleted, restorable until purgeAt; "
    "PURGING: its data is being deleted for good (no restore); FAILED: Nomad refused its volume (statusInfo).",
)


@strawberry.type
class UserShare:
    user_id: str
    mode: FolderMode


@strawberry.type
class ProjectShare:
    project: str
    mode: FolderMode


@strawberry.type(description="A storage folder: data that outlives sessions, mounted into them.")
class StorageFolder:
    id: strawberry.ID
    name: str
    owner_id: str
    project: str
    status: FolderStatus
    status_info: str
    my_mode: FolderMode = strawberry.field(description="What you may do with it: RW (yours, or shared RW) or RO.")
    node_id: str | None = strawberry.field(description="The Nomad node (storage host) holding it, once READY.")
    shared_with_users: list[UserShare] = strawberry.field(description="Owners only: empty for others.")
    shared_with_projects: list[ProjectShare] = strawberry.field(description="Owners only: empty for others.")
    usage_bytes: Bytes = strawberry.field(description="Bytes it holds, as the file API counted them.")
    created_at: datetime
    trashed_at: datetime | None
    purge_at: datetime | None = strawberry.field(description="TRASHED: when its data goes for good.")


@strawberry.type(description="Your folders against your quotas (trashed folders count until purged).")
class FolderUsage:
    folders: int
    max_folders: int
    bytes: Bytes
    max_bytes: Bytes = strawberry.field(description="Bytes all your folders may hold.")


def folder_type_of(
    f: storage.Folder, viewer: User, mode: storage.FolderMode, usage: int, settings: StorageSettings
) -> StorageFolder:
    owner = storage.owns(viewer, f)
    return StorageFolder(
        id=strawberry.ID(f.id),
        name=f.name,
        owner_id=f.owner_id,
        project=f.project,
        status=f.status,
        status_info=f.status_info,
        my_mode=mode,
        node_id=f.node_id,
        shared_with_users=[UserShare(user_id=u, mode=m) for u, m in sorted(f.shared_with_users.items())]
        if owner
        else [],
        shared_with_projects=[ProjectShare(project=p, mode=m) for p, m in sorted(f.shared_with_projects.items())]
        if owner
        else [],
        usage_bytes=Bytes(usage),
        created_at=f.created_at,
        trashed_at=f.trashed_at,
        purge_at=f.purge_at(settings),
    )
