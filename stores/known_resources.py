"""What the platform has ever offered, kept in Redis: the scheduler adds to it at each pass, the gateway admits
creations by it. Both sets only grow, so a node pool or a GPU node away for a while does not turn requests into
errors (as in Backend.AI).

- **Slot types** any agent reported: a request for a non-zero amount of a slot in none of them is refused at creation
  (``UNSUPPORTED_RESOURCE``): no agent could ever run it. ``cpu`` and ``mem`` are always known.
- **Resource groups** the scheduler has seen a Nomad client in (its node pool) or found in its configuration;
  ``default`` always is. A creation (or a template's spec) naming another group is refused (``INVALID_INPUT`` on
  ``resourceGroup``): nothing could ever run it, and it would wait for ever.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from redis.asyncio import Redis

from core.keys import Keys
from core.replies import text_hash, text_set
from domain.model import DEFAULT_GROUP
from domain.slots import INTRINSIC_SLOT_TYPES, SlotType

__all__ = ["known_resource_groups", "known_slot_types", "record_resource_groups", "record_slot_types"]


async def known_slot_types(redis: Redis, keys: Keys) -> dict[str, SlotType]:
    """The intrinsic slots (cpu, mem) and every slot recorded so far."""
    stored = text_hash(await redis.hgetall(keys.known_slot_types))
    found = {slot: SlotType(kind) for slot, kind in stored.items() if kind in SlotType._value2member_map_}
    return {**found, **INTRINSIC_SLOT_TYPES}


async def record_slot_types(redis: Redis, keys: Keys, slot_types: Mapping[str, SlotType]) -> None:
    """Add slots not recorded yet (a slot's first recorded type stays); one round trip."""
    if not slot_types:
        return
    async with redis.pipeline(transaction=False) as pipe:
        for slot, kind in slot_types.items():
            pipe.hsetnx(keys.known_slot_types, slot, kind.value)
        await pipe.execute()


async def known_resource_groups(redis: Redis, keys: Keys, configured: Iterable[str] = ()) -> frozenset[str]:
    """``default``, the groups recorded so far, and ``configured`` (what the reader's copy of the configuration
    names: known even before the scheduler's first pass)."""
    stored = text_set(await redis.smembers(keys.known_resource_groups))
    return frozenset({DEFAULT_GROUP, *stored, *configured})


async def record_resource_groups(redis: Redis, keys: Keys, groups: Iterable[str]) -> None:
    """Add ``groups`` to the known ones; one round trip."""
    names = sorted(set(groups))
    if names:
        await redis.sadd(keys.known_resource_groups, *names)
