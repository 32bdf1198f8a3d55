"""The environment catalog in Redis: one hash, image reference -> catalog entry (``domain.environments``). Small (an
entry per registered image), so each creation reads it whole, in one call."""

from __future__ import annotations

from collections.abc import Callable

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from core.codec import decode, encode
from core.errors import Conflict, NotFound
from core.keys import Keys
from core.replies import begin, text, text_hash
from core.transactions import transact
from domain.environments import EnvironmentImage


class EnvironmentStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def all(self) -> dict[str, EnvironmentImage]:
        """Every catalog entry, retired ones included, by image reference."""
        raw = text_hash(await self.redis.hgetall(self.keys.environments))
        return {ref: decode(doc, EnvironmentImage) for ref, doc in sorted(raw.items())}

    async def register(self, entry: EnvironmentImage) -> EnvironmentImage:
        """Add ``entry``, or bring back a retired entry of the same image with its new labels; CONFLICT (on
        ``image``) when the image is registered and in use."""

        def change(found: EnvironmentImage | None) -> EnvironmentImage:
            if found is not None and not found.retired:
                raise Conflict(f"{entry.image} is registered already (as {found.name} {found.tag})", field="image")
            return entry

        return await self._update(entry.image, change)

    async def set_retired(self, image: str, retired: bool) -> EnvironmentImage:
        """Retire an entry (new sessions may no longer use it) or bring it back; NOT_FOUND (on ``image``) if absent."""

        def change(found: EnvironmentImage | None) -> EnvironmentImage:
            if found is None:
                raise NotFound(f"no environment image {image[:80]}", field="image")
            return found.evolve(retired=retired)

        return await self._update(image, change)

    async def _update(
        self, image: str, change: Callable[[EnvironmentImage | None], EnvironmentImage]
    ) -> EnvironmentImage:
        key = self.keys.environments

        async def attempt(pipe: Pipeline) -> EnvironmentImage:
            await pipe.watch(key)
            raw = await pipe.hget(key, image)
            updated = change(decode(text(raw), EnvironmentImage) if raw else None)
            begin(pipe)
            pipe.hset(key, image, encode(updated))
            await pipe.execute()
            return updated

        return await transact(self.redis, attempt)
