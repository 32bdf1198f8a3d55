"""Resource presets: named bundles of slots (and /dev/shm) a creation may name instead of listing resources.

Everyone may list them and name one; they are global, so only a SUPERADMIN writes them. A preset's slots sit under a
request's explicit resources: ``defaults ⊕ preset ⊕ explicit``, slot by slot. Slots are stored normalized (exact
decimal strings, bytes for ``mem``), as sessions store theirs; whether a slot exists is checked when the preset is
written and again at every creation that names it.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from core.codec import decode, encode
from core.keys import Keys
from core.replies import begin, text_hash
from core.transactions import transact
from domain.presets import ResourcePreset


class PresetStore:
    """All presets in one HASH (name -> JSON): a handful, read whole."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def all(self) -> list[ResourcePreset]:
        raws = text_hash(await self.redis.hgetall(self.keys.resource_presets))
        return sorted((decode(raw, ResourcePreset) for raw in raws.values()), key=lambda p: p.name)

    async def get(self, name: str) -> ResourcePreset | None:
        raw = await self.redis.hget(self.keys.resource_presets, name)
        return decode(raw, ResourcePreset) if raw else None

    async def named(self, name: str | None) -> dict[str, ResourcePreset]:
        """``{name: preset}`` when it exists; empty for None or an unknown name (what ``check_request`` takes)."""
        preset = await self.get(name) if name is not None else None
        return {preset.name: preset} if preset else {}

    async def put(self, preset: ResourcePreset, *, create: bool) -> bool:
        """Store ``preset``; with ``create`` only when the name is free, else only when it exists. False otherwise."""
        if create:
            return bool(await self.redis.hsetnx(self.keys.resource_presets, preset.name, encode(preset)))

        async def attempt(pipe: Pipeline) -> bool:
            await pipe.watch(self.keys.resource_presets)
            if not await pipe.hexists(self.keys.resource_presets, preset.name):
                return False
            begin(pipe)
            pipe.hset(self.keys.resource_presets, preset.name, encode(preset))
            await pipe.execute()
            return True

        return await transact(self.redis, attempt)

    async def delete(self, name: str) -> bool:
        return bool(await self.redis.hdel(self.keys.resource_presets, name))
