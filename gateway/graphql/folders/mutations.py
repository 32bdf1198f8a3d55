"""Folder mutations: create, rename, delete (to the trash) and restore, share and unshare. Only the owner (or an
admin of its project) changes a folder; anyone else who sees it is FORBIDDEN, anyone who does not is NOT_FOUND.
The volume itself is made and purged by the scheduler's job owner (``scheduler.folder_owner``)."""

from __future__ import annotations

import strawberry

from core.clock import utcnow
from core.errors import Forbidden, InvalidInput, NotFound
from domain.storage import Folder, FolderStatus, check_folder_name, may_share_with, new_folder, owns
from domain.users import Role, User
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from gateway.graphql.folders.queries import folder_of_viewer, folder_store, folder_view
from gateway.graphql.folders.types import FolderMode, StorageFolder
from stores.folders import Mutation


@strawberry.input
class CreateFolderInput:
    name: str
    project: str | None = strawberry.field(default=None, description="One of your projects (default: your first).")


@strawberry.input(description="Whom to share with: exactly one of user and project.")
class FolderShareInput:
    folder: strawberry.ID
    user: str | None = None
    project: str | None = None
    mode: FolderMode = FolderMode.RO


async def _owned(ctx: Context, folder_id: str, viewer: User) -> Folder:
    folder, _ = await folder_of_viewer(ctx, folder_id, viewer)
    if not owns(viewer, folder):
        raise Forbidden("only the folder's owner (or its project's admins) changes it", field="id")
    return folder


def _project_of(viewer: User, project: str | None) -> str:
    if project is None:
        return viewer.projects[0]
    if project not in viewer.projects and viewer.role is not Role.SUPERADMIN:
        raise NotFound(f"no project {project[:80]!r} of yours", field="project")
    return project


@strawberry.type
class FolderMutations:
    @fields.mutation(
        description="Create a storage folder (CREATING until the scheduler has made its volume: then READY)."
    )
    async def create_folder(self, info: Info, input: CreateFolderInput) -> StorageFolder:
        ctx = info.context
        viewer = ctx.viewer
        folder = new_folder(name=input.name, owner=viewer, project=_project_of(viewer, input.project), now=utcnow())
        await folder_store(ctx).create(folder, ctx.settings.storage)
        return await folder_view(ctx, folder, FolderMode.RW)

    @fields.mutation(description="Rename a folder (mounts name it by id: running sessions keep it).")
    async def rename_folder(self, info: Info, id: strawberry.ID, name: str) -> StorageFolder:
        ctx = info.context
        folder = await _owned(ctx, str(id), ctx.viewer)
        new_name = check_folder_name(name)
        return await _change(ctx, folder, lambda f: f.evolve(name=new_name))

    @fields.mutation(
        description="Move a folder to the trash: no new mounts or shares see it; restorable until its purgeAt "
        "(CARAVAN_FOLDER_TRASH_GRACE), then its data is deleted."
    )
    async def delete_folder(self, info: Info, id: strawberry.ID) -> StorageFolder:
        ctx = info.context
        folder = await _owned(ctx, str(id), ctx.viewer)
        now = utcnow()
        return await _change(
            ctx, folder, lambda f: None if f.status in GONE else f.evolve(status=TRASHED, trashed_at=now)
        )

    @fields.mutation(description="Take a folder out of the trash before its purgeAt.")
    async def restore_folder(self, info: Info, id: strawberry.ID) -> StorageFolder:
        ctx = info.context
        return await _change(ctx, await _owned(ctx, str(id), ctx.viewer), _restored)

    @fields.mutation(
        description="Share a folder with a user or a project, read-only or read-write (replaces the mode)."
    )
    async def share_folder(self, info: Info, input: FolderShareInput) -> StorageFolder:
        ctx = info.context
        viewer = ctx.viewer
        folder = await _owned(ctx, str(input.folder), viewer)
        if (input.user is None) == (input.project is None):
            raise InvalidInput("give exactly one of user and project", field="user")
        mode = input.mode
        if input.user is not None:
            target = await ctx.users.get(input.user)
            if target is None or not target.active:
                raise NotFound(f"no user {input.user[:80]!r}", field="user")
            if target.id == folder.owner_id:
                raise InvalidInput("the owner has the folder already", field="user")
            user = target.id
            return await _change(
                ctx, folder, lambda f: _shareable(f).evolve(shared_with_users={**f.shared_with_users, user: mode})
            )
        project = input.project
        assert project is not None
        if not may_share_with(viewer, project):
            raise NotFound(f"no project {project[:80]!r} of yours", field="project")
        return await _change(
            ctx, folder, lambda f: _shareable(f).evolve(shared_with_projects={**f.shared_with_projects, project: mode})
        )

    @fields.mutation(description="Stop sharing a folder with a user or a project (mounts already made stay).")
    async def unshare_folder(
        self, info: Info, folder: strawberry.ID, user: str | None = None, project: str | None = None
    ) -> StorageFolder:
        ctx = info.context
        found = await _owned(ctx, str(folder), ctx.viewer)
        if (user is None) == (project is None):
            raise InvalidInput("give exactly one of user and project", field="user")
        return await _change(
            ctx,
            found,
            lambda f: f.evolve(
                shared_with_users={u: m for u, m in f.shared_with_users.items() if u != user},
                shared_with_projects={p: m for p, m in f.shared_with_projects.items() if p != project},
            ),
        )


TRASHED = FolderStatus.TRASHED
GONE = (FolderStatus.TRASHED, FolderStatus.PURGING)
"""Statuses of a deleted folder: in the trash, or past its grace with its data being deleted."""


async def _change(ctx: Context, folder: Folder, mutate: Mutation) -> StorageFolder:
    """Apply ``mutate`` to ``folder`` as stored now (another request or the job owner may have changed it since it
    was read: ``mutate`` sees the newer one); NOT_FOUND if it was purged meanwhile."""
    stored = await folder_store(ctx).update(folder.id, mutate, ctx.settings.storage)
    if stored is None:
        raise NotFound(f"no folder {folder.id}", field="id")
    return await folder_view(ctx, stored, FolderMode.RW)


def _restored(folder: Folder) -> Folder:
    if folder.status is FolderStatus.PURGING:
        raise InvalidInput("the folder's grace has passed: its data is being deleted", field="id")
    if folder.status is not FolderStatus.TRASHED:
        raise InvalidInput("the folder is not in the trash", field="id")
    # a folder trashed before its volume was made is made now
    return folder.evolve(status=FolderStatus.READY if folder.volume_id else FolderStatus.CREATING, trashed_at=None)


def _shareable(folder: Folder) -> Folder:
    if folder.status in GONE:
        raise InvalidInput("a trashed folder cannot be shared: restore it first", field="folder")
    return folder
