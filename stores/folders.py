"""Storage folders in Redis: documents, their indexes (owner, project, shares), name claims, usage counters, and the
job owner's requests (volumes to create, trashed folders to purge), each written in the transaction that asks.

Who may see and change which folder is decided in ``domain.storage``; this store keeps the indexes a listing and the
quotas need in step with the documents.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from core.codec import decode, encode
from core.errors import Conflict, QuotaExceeded
from core.keys import Keys
from core.lease import Fence, watch_fenced, write_fenced
from core.replies import begin, text_set
from core.settings import StorageSettings
from core.transactions import transact
from domain.storage import Folder, FolderStatus, check_bytes_quota, check_count_quota, mode_for
from domain.users import Role, User
from stores.owner_requests import wake_owner

WAKEUP_BACKLOG = 8

Mutation = Callable[[Folder], Folder | None]
"""A pure change of one folder: the folder changed, or None for no change. It may run more than once (when another
writer got there first) and may raise a typed error about the folder as it is now (INVALID_INPUT, CONFLICT...)."""


class FolderStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def get(self, folder_id: str) -> Folder | None:
        raw = await self.redis.get(self.keys.folder(folder_id))
        return decode(raw, Folder) if raw else None

    async def create(self, folder: Folder, quota: StorageSettings) -> None:
        """Store a new CREATING folder, claim its name, and ask the job owner for its volume, in one transaction;
        CONFLICT when the owner has a folder of that name, QUOTA_EXCEEDED past the number quotas."""
        owner_key = self.keys.folders_of_owner(folder.owner_id)
        project_key = self.keys.folders_of_project(folder.project)
        name_key = self.keys.folder_name(folder.owner_id, folder.name)

        async def attempt(pipe: Pipeline) -> None:
            await pipe.watch(owner_key, project_key, name_key)
            if await pipe.exists(name_key):
                raise Conflict(f"you have a folder named {folder.name!r} already", field="name")
            check_count_quota(
                owned_by_user=await pipe.scard(owner_key),
                in_project=await pipe.scard(project_key),
                quota=quota,
            )
            begin(pipe)
            pipe.set(name_key, folder.id)
            self._write(pipe, folder)
            pipe.sadd(self.keys.folders, folder.id)
            pipe.sadd(owner_key, folder.id)
            pipe.sadd(project_key, folder.id)
            pipe.sadd(self.keys.folders_to_create, folder.id)
            self._wake_owner(pipe)
            await pipe.execute()
            return

        return await transact(self.redis, attempt)

    async def update(self, folder_id: str, mutate: Mutation, storage: StorageSettings) -> Folder | None:
        """The gateway's write: apply ``mutate`` to the folder as stored now, in one transaction that holds only if
        nobody else wrote it meanwhile (else ``mutate`` runs again on the newer folder). The name claim and share
        indexes follow; a folder newly TRASHED is queued for its purge at ``Folder.purge_at(storage)``, a restored one
        taken off, and one restored to CREATING (trashed before its volume was made) asks the job owner again.
        Returns the folder as stored (None: there is none); CONFLICT if the new name is taken."""
        return await self._change(folder_id, mutate, None, storage)

    async def settle(self, folder_id: str, mutate: Mutation, fence: Fence | None) -> Folder | None:
        """The job owner's write, under its leader's ``fence`` (``LostLease`` once a newer term began): ``mutate``
        applied to the folder as stored now (the gateway may have renamed, shared or trashed it since the owner read
        it), and the volume request dropped unless the folder is (again) CREATING. Returns the folder as stored."""
        return await self._change(folder_id, mutate, fence, None)

    async def _change(
        self, folder_id: str, mutate: Mutation, fence: Fence | None, storage: StorageSettings | None
    ) -> Folder | None:
        key = self.keys.folder(folder_id)

        async def attempt(pipe: Pipeline) -> Folder | None:
            await watch_fenced(pipe, fence, key)
            raw = await pipe.get(key)
            if raw is None:
                return None
            before = decode(raw, Folder)
            changed = mutate(before)
            after = before if changed is None else changed
            assert after.id == before.id and after.owner_id == before.owner_id
            if after == before and fence is None:
                return before
            new_name = self.keys.folder_name(after.owner_id, after.name)
            if after.name != before.name:
                await pipe.watch(new_name)
                if await pipe.exists(new_name):
                    raise Conflict(f"you have a folder named {after.name!r} already", field="name")
            begin(pipe)
            if after != before:
                self._reindex(pipe, before, after, new_name, storage)
            if fence is not None and after.status is not FolderStatus.CREATING:
                pipe.srem(self.keys.folders_to_create, folder_id)
            await pipe.execute()
            return after

        return await transact(self.redis, attempt)

    def _reindex(
        self, pipe: Redis, before: Folder, after: Folder, new_name: str, storage: StorageSettings | None
    ) -> None:
        if after.name != before.name:
            pipe.delete(self.keys.folder_name(before.owner_id, before.name))
            pipe.set(new_name, after.id)
        for user in before.shared_with_users.keys() - after.shared_with_users.keys():
            pipe.srem(self.keys.folders_shared_with_user(user), after.id)
        for project in before.shared_with_projects.keys() - after.shared_with_projects.keys():
            pipe.srem(self.keys.folders_shared_with_project(project), after.id)
        self._write(pipe, after)
        purge_at = after.purge_at(storage) if storage is not None else None
        if after.status is FolderStatus.TRASHED and before.status is not FolderStatus.TRASHED and purge_at:
            pipe.zadd(self.keys.folders_to_purge, {after.id: purge_at.timestamp()})
            self._wake_owner(pipe)
        elif after.status not in (FolderStatus.TRASHED, FolderStatus.PURGING):
            pipe.zrem(self.keys.folders_to_purge, after.id)
        if after.status is FolderStatus.CREATING and before.status is not FolderStatus.CREATING:
            pipe.sadd(self.keys.folders_to_create, after.id)
            self._wake_owner(pipe)

    async def forget(self, folder: Folder, fence: Fence | None) -> None:
        """The job owner purged the folder's volume: the document, its indexes, its name and usage go (under the
        leader's ``fence``)."""

        def write(pipe: Pipeline) -> None:
            pipe.delete(self.keys.folder(folder.id), self.keys.folder_usage(folder.id))
            pipe.delete(self.keys.folder_name(folder.owner_id, folder.name))
            pipe.srem(self.keys.folders, folder.id)
            pipe.srem(self.keys.folders_of_owner(folder.owner_id), folder.id)
            pipe.srem(self.keys.folders_of_project(folder.project), folder.id)
            for user in folder.shared_with_users:
                pipe.srem(self.keys.folders_shared_with_user(user), folder.id)
            for project in folder.shared_with_projects:
                pipe.srem(self.keys.folders_shared_with_project(project), folder.id)
            pipe.srem(self.keys.folders_to_create, folder.id)
            pipe.zrem(self.keys.folders_to_purge, folder.id)

        await self._write_as_owner(write, fence)

    async def postpone_purge(self, folder_id: str, until: datetime, fence: Fence | None) -> None:
        """Try a refused purge again at ``until`` (under the leader's ``fence``)."""
        await self._write_as_owner(
            lambda pipe: pipe.zadd(self.keys.folders_to_purge, {folder_id: until.timestamp()}, xx=True), fence
        )

    async def _write_as_owner(self, write: Callable[[Pipeline], object], fence: Fence | None) -> None:
        if fence is not None:
            await write_fenced(self.redis, fence, write)
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            write(pipe)
            await pipe.execute()

    async def owner_work(self, now: datetime) -> tuple[set[str], set[str]]:
        """Folders whose volume the job owner creates, and trashed folders whose grace has passed (to purge)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.smembers(self.keys.folders_to_create)
            pipe.zrangebyscore(self.keys.folders_to_purge, "-inf", now.timestamp())
            create, purge = await pipe.execute()
        return text_set(create), text_set(purge)

    async def visible_to(self, viewer: User) -> list[Folder]:
        """The folders ``viewer`` sees (their own, their projects' for an admin, those shared with them), by name."""
        if viewer.role is Role.SUPERADMIN:
            ids = text_set(await self.redis.smembers(self.keys.folders))
        else:
            sets = [self.keys.folders_of_owner(viewer.id), self.keys.folders_shared_with_user(viewer.id)]
            sets += [self.keys.folders_shared_with_project(p) for p in viewer.projects]
            if viewer.role is Role.ADMIN:
                sets += [self.keys.folders_of_project(p) for p in viewer.projects]
            ids = text_set(await self.redis.sunion(sets))
        found = await self.many(sorted(ids))
        return sorted((f for f in found if mode_for(viewer, f) is not None), key=lambda f: (f.name, f.id))

    async def many(self, ids: Iterable[str]) -> list[Folder]:
        ordered = list(ids)
        if not ordered:
            return []
        raws = await self.redis.mget([self.keys.folder(i) for i in ordered])
        return [decode(raw, Folder) for raw in raws if raw]

    # -- usage (bytes), counted by the file API and recounted on the storage node --

    async def usage(self, folder_ids: Iterable[str]) -> dict[str, int]:
        ordered = list(folder_ids)
        if not ordered:
            return {}
        raws = await self.redis.mget([self.keys.folder_usage(i) for i in ordered])
        return {i: int(raw or 0) for i, raw in zip(ordered, raws, strict=True)}

    async def add_usage(self, folder_id: str, delta: int) -> None:
        await self.redis.incrby(self.keys.folder_usage(folder_id), delta)

    async def reserve(self, folder: Folder, adding: int, *, credit: int, quota: StorageSettings) -> None:
        """Count ``adding`` bytes an upload is about to write in the folder's usage, if its owner's and its project's
        bytes stay within ``quota`` (``credit``: the bytes of a file the upload replaces); QUOTA_EXCEEDED otherwise,
        nothing counted. The increment comes first and the check reads the totals after it, so of two uploads that
        together pass a quota the later check sees both: they never pass it together (both may be refused)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.incrby(self.keys.folder_usage(folder.id), adding)
        pipe.smembers(self.keys.folders_of_owner(folder.owner_id))
        pipe.smembers(self.keys.folders_of_project(folder.project))
        _, owner_index, project_index = await pipe.execute()
        owned, in_project = text_set(owner_index) | {folder.id}, text_set(project_index) | {folder.id}
        usage = await self.usage(sorted(owned | in_project))
        try:
            check_bytes_quota(
                user_bytes=sum(usage[i] for i in owned) - credit - adding,
                project_bytes=sum(usage[i] for i in in_project) - credit - adding,
                adding=adding,
                quota=quota,
            )
        except QuotaExceeded:
            await self.add_usage(folder.id, -adding)
            raise

    async def set_usage(self, folder_id: str, total: int) -> None:
        await self.redis.set(self.keys.folder_usage(folder_id), total)

    async def usage_mark(self, folder_id: str) -> bytes | str | None:
        """The folder's usage as stored now, for :meth:`recounted` to tell whether it changed meanwhile."""
        raw: bytes | str | None = await self.redis.get(self.keys.folder_usage(folder_id))
        return raw

    async def recounted(self, folder_id: str, total: int, mark: bytes | str | None) -> bool:
        """A recount's total (``scheduler.folder_usage``), stored only while the folder is (a purge that forgot it
        meanwhile leaves no usage behind) and only if its usage is still ``mark``, as :meth:`usage_mark` read it
        before the walk: an upload's reservation or a delete counted during the walk would be overwritten by a total
        that may not hold it (an upload then passed the quota: its reservation counted, checked against a usage the
        recount had just set back). False when not stored: the next recount counts it."""
        folder_key, usage_key = self.keys.folder(folder_id), self.keys.folder_usage(folder_id)

        async def attempt(pipe: Pipeline) -> bool:
            await pipe.watch(folder_key, usage_key)
            if not await pipe.exists(folder_key) or await pipe.get(usage_key) != mark:
                return False
            begin(pipe)
            pipe.set(usage_key, total)
            await pipe.execute()
            return True

        return await transact(self.redis, attempt)

    async def ready(self) -> list[Folder]:
        """Every READY folder (the usage recount's work)."""
        found = await self.many(sorted(text_set(await self.redis.smembers(self.keys.folders))))
        return [f for f in found if f.status is FolderStatus.READY]

    async def owned(self, owner_id: str) -> tuple[int, int]:
        """How many folders one user owns, and the bytes they hold."""
        owned = text_set(await self.redis.smembers(self.keys.folders_of_owner(owner_id)))
        return len(owned), sum((await self.usage(sorted(owned))).values())

    async def bytes_of(self, owner_id: str, project: str) -> tuple[int, int]:
        """Bytes held by all of one owner's folders, and by all of one project's."""
        owned = text_set(await self.redis.smembers(self.keys.folders_of_owner(owner_id)))
        in_project = text_set(await self.redis.smembers(self.keys.folders_of_project(project)))
        usage = await self.usage(sorted(owned | in_project))
        return sum(usage[i] for i in owned), sum(usage[i] for i in in_project)

    def _write(self, pipe: Redis, folder: Folder) -> None:
        pipe.set(self.keys.folder(folder.id), encode(folder))
        for user in folder.shared_with_users:
            pipe.sadd(self.keys.folders_shared_with_user(user), folder.id)
        for project in folder.shared_with_projects:
            pipe.sadd(self.keys.folders_shared_with_project(project), folder.id)

    def _wake_owner(self, pipe: Redis) -> None:
        wake_owner(pipe, self.keys, "folder", backlog=WAKEUP_BACKLOG)
