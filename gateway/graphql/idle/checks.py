"""``Session.idleChecks``: the stored verdict of the idle checker's last sweep, read from Redis only
(never recomputed with Nomad calls in the request path), batched per request by ``Context.loaders``."""

from __future__ import annotations

from gateway.graphql.context import Info
from gateway.graphql.idle.types import IdleChecks, idle_checks_type


async def idle_checks_of(info: Info, session_id: str) -> IdleChecks | None:
    stored = await info.context.loaders.idle_verdicts.load(session_id)  # one MGET for a whole page
    return idle_checks_type(stored) if stored is not None else None
