"""``Session.idleChecks``: the stored verdict of the idle checker's last sweep, read from Redis only
(never recomputed with Nomad calls in the request path)."""

from __future__ import annotations

from gateway.graphql.context import Info
from gateway.graphql.idle.types import IdleChecks, idle_checks_type
from idle.store import IdleStore


async def idle_checks_of(info: Info, session_id: str) -> IdleChecks | None:
    store = info.context.sessions
    stored = await IdleStore(store.redis, store.keys).verdict(session_id)
    return idle_checks_type(stored) if stored is not None else None
