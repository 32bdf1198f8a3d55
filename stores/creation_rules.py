"""The configuration a new session is checked against (``domain.session_requests.CreationRules``), read from Redis
and the settings for one creation: by the gateway's ``createSession`` and by the scheduler's schedule runner."""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from core.keys import Keys
from core.settings import Settings
from domain.scheduling_config import SchedulingConfig
from domain.session_requests import CreationRules
from domain.storage import at_bytes_quota
from stores.folders import FolderStore
from stores.images import ImageStore
from stores.known_resources import known_resource_groups, known_slot_types
from stores.presets import PresetStore


async def read_creation_rules(
    redis: Redis,
    keys: Keys,
    settings: Settings,
    config: SchedulingConfig,
    *,
    resource_group: str,
    preset: str | None,
    folders: Sequence[str] = (),
    images: Sequence[str] = (),
    users: Sequence[str] = (),
) -> CreationRules:
    """The rules for a session in ``resource_group`` with ``preset``: known slots and groups, images, the preset, the
    group's allowed drivers and default resources in the scheduling configuration ``config``, and the storage
    ``folders`` it mounts (and which of them are full: their owner or project at a bytes quota), and the committed
    ``images`` it names (``ImageStore.named``, for the ``users`` who ask)."""
    store = FolderStore(redis, keys)
    mounted = {f.id: f for f in await store.many(dict.fromkeys(folders))}
    full = set()
    for folder in mounted.values():
        user_bytes, project_bytes = await store.bytes_of(folder.owner_id, folder.project)
        if at_bytes_quota(user_bytes=user_bytes, project_bytes=project_bytes, quota=settings.storage):
            full.add(folder.id)
    return CreationRules(
        known_slots=await known_slot_types(redis, keys),
        default_image=settings.default_image,
        docker_images=settings.docker_images,
        presets=await PresetStore(redis, keys).named(preset),
        qemu_images=settings.qemu_images,
        allowed_drivers=config.drivers_allowed(resource_group),
        known_groups=await known_resource_groups(redis, keys, configured=config.groups),
        default_resources=config.default_resources(resource_group),
        folders=mounted,
        full_folders=frozenset(full),
        committed_images=await ImageStore(redis, keys).named(images, users),
    )
