"""The slot types any agent ever reported, kept in Redis: the scheduler adds to them, the gateway admits by them.

A request for a non-zero amount of a slot in none of them is refused at creation (``UNSUPPORTED_RESOURCE``): no agent
could ever run it. Like Backend.AI's, the set never shrinks, so a GPU node being away for a while does not turn GPU
requests into errors.
"""

from __future__ import annotations

from collections.abc import Mapping

from redis.asyncio import Redis

from core.keys import Keys
from domain.slots import INTRINSIC_SLOT_TYPES, SlotType

__all__ = ["known_slot_types", "record_slot_types"]


async def known_slot_types(redis: Redis, keys: Keys) -> dict[str, SlotType]:
    """The intrinsic slots (cpu, mem) and every slot recorded so far."""
    stored: dict[str, str] = await redis.hgetall(keys.known_slot_types)
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
