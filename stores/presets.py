"""Resource presets: named bundles of slots (and /dev/shm) a creation may name instead of listing resources.

Everyone may list them and name one; they are global, so only a SUPERADMIN writes them. A preset's slots sit under a request's explicit
resources: ``defaults ⊕ preset ⊕ explicit``, slot by slot. Slots are stored normalized (exact decimal strings, bytes
for ``mem``), as sessions store theirs; whether a slot exists is checked when the preset is written and again at
every creation that names it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import WatchError

from core.errors import InvalidInput
from core.keys import Keys

PRESET_NAME_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class ResourcePreset:
    name: str
    resources: dict[str, str] = field(default_factory=dict)
    """Slot -> exact amount (cores, bytes, devices)."""
    shared_memory: str | None = None
    """Bytes of /dev/shm, exact; a request's own ``sharedMemory`` wins."""

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "resources": self.resources, "shared_memory": self.shared_memory})

    @classmethod
    def from_json(cls, text: str | bytes) -> ResourcePreset:
        doc = json.loads(text)
        return cls(doc["name"], dict(doc.get("resources") or {}), doc.get("shared_memory"))


def check_preset_name(name: str) -> None:
    if not PRESET_NAME_RULE.match(name):
        raise InvalidInput("a preset name is 1-64 characters: letters, digits, '_', '.', '-', not first", field="name")


class PresetStore:
    """All presets in one HASH (name -> JSON): a handful, read whole."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def all(self) -> list[ResourcePreset]:
        raws: dict[str, str] = await self.redis.hgetall(self.keys.resource_presets)
        return sorted((ResourcePreset.from_json(raw) for raw in raws.values()), key=lambda p: p.name)

    async def get(self, name: str) -> ResourcePreset | None:
        raw = await self.redis.hget(self.keys.resource_presets, name)
        return ResourcePreset.from_json(raw) if raw else None

    async def named(self, name: str | None) -> dict[str, ResourcePreset]:
        """``{name: preset}`` when it exists; empty for None or an unknown name (what ``check_request`` takes)."""
        preset = await self.get(name) if name is not None else None
        return {preset.name: preset} if preset else {}

    async def put(self, preset: ResourcePreset, *, create: bool) -> bool:
        """Store ``preset``; with ``create`` only when the name is free, else only when it exists. False otherwise."""
        if create:
            return bool(await self.redis.hsetnx(self.keys.resource_presets, preset.name, preset.to_json()))
        while True:
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(self.keys.resource_presets)
                    if not await pipe.hexists(self.keys.resource_presets, preset.name):
                        return False
                    pipe.multi()
                    pipe.hset(self.keys.resource_presets, preset.name, preset.to_json())
                    await pipe.execute()
                    return True
                except WatchError:
                    continue  # another write in between: look again

    async def delete(self, name: str) -> bool:
        return bool(await self.redis.hdel(self.keys.resource_presets, name))
