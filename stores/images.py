"""Committed images in Redis: documents, by owner and project, and the job owner's requests (commit, remove), each
written in the transaction that asks (``domain.images``)."""

from __future__ import annotations

from redis.asyncio import Redis

from core.codec import decode, encode
from core.keys import Keys
from core.replies import text_set
from domain.images import CommittedImage, may_use_image
from domain.users import User

WAKEUP_BACKLOG = 8


class ImageStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def get(self, image_id: str) -> CommittedImage | None:
        raw = await self.redis.get(self.keys.image(image_id))
        return decode(raw, CommittedImage) if raw else None

    async def ask(self, image: CommittedImage) -> None:
        """Store ``image`` (COMMITTING or DELETING) and ask the job owner to act on it, in one transaction."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.image(image.id), encode(image))
            pipe.sadd(self.keys.images_of_owner(image.owner_id), image.id)
            pipe.sadd(self.keys.images_of_project(image.project), image.id)
            pipe.sadd(self.keys.images_to_act_on, image.id)
            pipe.rpush(self.keys.job_owner_wakeup, "image")
            pipe.ltrim(self.keys.job_owner_wakeup, -WAKEUP_BACKLOG, -1)
            await pipe.execute()

    async def done(self, image: CommittedImage) -> None:
        """The job owner's write: the image READY or FAILED, its request done."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.image(image.id), encode(image))
            pipe.srem(self.keys.images_to_act_on, image.id)
            await pipe.execute()

    async def forget(self, image: CommittedImage) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.image(image.id))
            pipe.srem(self.keys.images_of_owner(image.owner_id), image.id)
            pipe.srem(self.keys.images_of_project(image.project), image.id)
            pipe.srem(self.keys.images_to_act_on, image.id)
            await pipe.execute()

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
