"""The resource groups sessions may be created in, kept in Redis: the scheduler adds to them, the gateway admits by them.

A group is known once the scheduler has seen a Nomad client in that node pool or found the group in its
configuration; ``default`` always is. A creation (or a template's spec) naming another group is refused
(``INVALID_INPUT`` on ``resourceGroup``): no agent could ever run it, and it would wait for ever. Like the known slot
types, the set never shrinks, so a node pool whose nodes are away for a while keeps taking (queued) sessions.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.asyncio import Redis

from core.keys import Keys
from domain.model import DEFAULT_GROUP

__all__ = ["known_resource_groups", "record_resource_groups"]



async def known_resource_groups(redis: Redis, keys: Keys, configured: Iterable[str] = ()) -> frozenset[str]:
    """``default``, the groups recorded so far, and ``configured`` (what the reader's copy of the configuration
    names: known even before the scheduler's first pass)."""
    stored: set[str] = await redis.smembers(keys.known_resource_groups)
    return frozenset({DEFAULT_GROUP, *stored, *configured})


async def record_resource_groups(redis: Redis, keys: Keys, groups: Iterable[str]) -> None:
    """Add ``groups`` to the known ones; one round trip."""
    names = sorted(set(groups))
    if names:
        await redis.sadd(keys.known_resource_groups, *names)
