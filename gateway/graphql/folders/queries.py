"""Folder queries: what the viewer sees, and their usage against the quotas."""

from __future__ import annotations

import strawberry

from core.errors import NotFound
from domain.storage import Folder, FolderMode, mode_for
from domain.users import User
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.folders.types import Bytes, FolderUsage, StorageFolder, folder_type_of
from stores.folders import FolderStore


def folder_store(ctx: Context) -> FolderStore:
    return FolderStore(ctx.sessions.redis, ctx.sessions.keys)


async def folder_of_viewer(ctx: Context, folder_id: str, viewer: User, field: str = "id") -> tuple[Folder, FolderMode]:
    """The folder and the viewer's mode on it; NOT_FOUND (on ``field``) when it does not exist or is not theirs."""
    found = await folder_store(ctx).get(folder_id)
    mode = mode_for(viewer, found) if found is not None else None
    if found is None or mode is None:
        raise NotFound(f"no folder {folder_id[:80]}", field=field)
    return found, mode


async def folder_view(ctx: Context, folder: Folder, mode: FolderMode) -> StorageFolder:
    usage = await folder_store(ctx).usage([folder.id])
    return folder_type_of(folder, ctx.viewer, mode, usage[folder.id], ctx.settings.storage)


@strawberry.type
class FolderQueries:
    @fields.field(
        description="The storage folders you see: yours (trashed ones too), those shared with you or your "
        "projects (admins: their projects' folders), by name."
    )
    async def folders(self, info: Info) -> list[StorageFolder]:
        ctx = info.context
        viewer = ctx.viewer
        store = folder_store(ctx)
        found = await store.visible_to(viewer)
        usage = await store.usage(f.id for f in found)
        views = []
        for f in found:
            mode = mode_for(viewer, f)
            assert mode is not None  # visible_to keeps only those
            views.append(folder_type_of(f, viewer, mode, usage[f.id], ctx.settings.storage))
        return views

    @fields.field(description="One folder; NOT_FOUND when it does not exist or you may not see it.")
    async def folder(self, info: Info, id: strawberry.ID) -> StorageFolder:
        folder, mode = await folder_of_viewer(info.context, str(id), info.context.viewer)
        return await folder_view(info.context, folder, mode)

    @fields.field(description="Your folders' number and bytes against your quotas.")
    async def folder_usage(self, info: Info) -> FolderUsage:
        ctx = info.context
        viewer = ctx.viewer
        store = folder_store(ctx)
        owned, used = await store.owned(viewer.id)
        quota = ctx.settings.storage
        return FolderUsage(
            folders=owned, max_folders=quota.max_per_user, bytes=Bytes(used), max_bytes=Bytes(quota.max_bytes_per_user)
        )
