"""Committed images in Redis: documents, by owner and project, by reference (one image per reference), and the job
owner's requests (commit, remove), each written in the transaction that asks (``domain.images``)."""

from __future__ import annotations

from collections.abc import Iterable

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from core.codec import decode, encode
from core.errors import Conflict, InvalidInput
from core.keys import Keys
from core.lease import Fence, watch_fenced
from core.replies import begin, text, text_set
from core.transactions import transact
from domain.images import LEGACY, CommittedImage, ImageStatus, committed_key, may_use_image
from domain.users import User
from stores.owner_requests import wake_owner

WAKEUP_BACKLOG = 8


class ImageStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def get(self, image_id: str) -> CommittedImage | None:
        raw = await self.redis.get(self.keys.image(image_id))
        return decode(raw, CommittedImage) if raw else None

    async def ask(self, image: CommittedImage) -> None:
        """Store a new ``image`` (COMMITTING), claiming its reference, and ask the job owner to act on it, in one
        transaction; INVALID_INPUT (on ``tag``) if an image has the reference already."""
        claim = self.keys.image_by_ref(image.ref)

        async def attempt(pipe: Pipeline) -> None:
            await pipe.watch(claim)
            if await pipe.exists(claim):
                raise InvalidInput(f"{image.ref} exists already: delete it or use another tag", field="tag")
            begin(pipe)
            pipe.set(claim, image.id)
            self._ask(pipe, image)
            await pipe.execute()

        await transact(self.redis, attempt)

    async def named(self, references: Iterable[str], owners: Iterable[str]) -> dict[str, list[CommittedImage]]:
        """The records of the committed images ``references`` name (``domain.images.committed_key``), by ref: the one
        that claimed it; for a reference from before the claims, the records of ``owners`` (the users asking) with
        it. No Redis call when none is in the committed namespace."""
        wanted = sorted({key for r in references if (key := committed_key(r)) is not None})
        if not wanted:
            return {}
        claims = await self.redis.mget([self.keys.image_by_ref(k) for k in wanted])
        found: dict[str, list[CommittedImage]] = {}
        for image in await self._many({text(c) for c in claims if c}):
            found.setdefault(image.ref, []).append(image)
        legacy = {k for k in wanted if k.startswith(LEGACY) and k not in found}
        if legacy and (sets := [self.keys.images_of_owner(o) for o in sorted(set(owners))]):
            for image in await self._many(text_set(await self.redis.sunion(sets))):
                if image.ref in legacy:
                    found.setdefault(image.ref, []).append(image)
        return found

    def _ask(self, pipe: Redis, image: CommittedImage) -> None:
        pipe.set(self.keys.image(image.id), encode(image))
        pipe.sadd(self.keys.images_of_owner(image.owner_id), image.id)
        pipe.sadd(self.keys.images_of_project(image.project), image.id)
        pipe.sadd(self.keys.images_to_act_on, image.id)
        wake_owner(pipe, self.keys, "image", backlog=WAKEUP_BACKLOG)

    async def ask_delete(self, image_id: str) -> CommittedImage | None:
        """Mark the image DELETING and ask the job owner to remove it, in one transaction on the image as stored now;
        None: there is none. CONFLICT while it is still being committed (its ``docker commit`` would race the
        ``docker rmi``); an image DELETING already is returned as it is."""
        key = self.keys.image(image_id)

        async def attempt(pipe: Pipeline) -> CommittedImage | None:
            await pipe.watch(key)
            raw = await pipe.get(key)
            if raw is None:
                return None
            image = decode(raw, CommittedImage)
            if image.status is ImageStatus.COMMITTING:
                raise Conflict("the image is still being committed: delete it once it is READY or FAILED")
            if image.status is ImageStatus.DELETING:
                return image
            deleting = image.evolve(status=ImageStatus.DELETING)
            begin(pipe)
            self._ask(pipe, deleting)
            await pipe.execute()
            return deleting

        return await transact(self.redis, attempt)

    async def done(self, acted: CommittedImage, result: CommittedImage | None, fence: Fence | None) -> bool:
        """The job owner's write once it acted on ``acted`` (as it read it): ``result`` stored (None: the image is
        forgotten) and the request dropped, under the leader's ``fence`` (``LostLease`` once a newer term began).
        Only if the image is still as acted on: if it was asked something else meanwhile, nothing is written and the
        request stays for the next round (False)."""
        key, claim = self.keys.image(acted.id), self.keys.image_by_ref(acted.ref)

        async def attempt(pipe: Pipeline) -> bool:
            await watch_fenced(pipe, fence, key, claim)
            raw = await pipe.get(key)
            if raw is None or decode(raw, CommittedImage).status is not acted.status:
                return False
            claimed = await pipe.get(claim)
            begin(pipe)
            if result is None:
                pipe.delete(key)
                if claimed is not None and text(claimed) == acted.id:
                    pipe.delete(claim)
                pipe.srem(self.keys.images_of_owner(acted.owner_id), acted.id)
                pipe.srem(self.keys.images_of_project(acted.project), acted.id)
            else:
                pipe.set(key, encode(result))
            pipe.srem(self.keys.images_to_act_on, acted.id)
            await pipe.execute()
            return True

        return await transact(self.redis, attempt)

    async def to_act_on(self) -> list[CommittedImage]:
        return await self._many(text_set(await self.redis.smembers(self.keys.images_to_act_on)))

    async def usable_by(self, viewer: User) -> list[CommittedImage]:
        sets = [self.keys.images_of_owner(viewer.id), *(self.keys.images_of_project(p) for p in viewer.projects)]
        found = await self._many(text_set(await self.redis.sunion(sets)))
        return sorted((i for i in found if may_use_image(viewer, i)), key=lambda i: (i.ref, i.id))

    async def _many(self, ids: set[str]) -> list[CommittedImage]:
        ordered = sorted(ids)
        if not ordered:
            return []
        raws = await self.redis.mget([self.keys.image(i) for i in ordered])
        return [decode(raw, CommittedImage) for raw in raws if raw]
