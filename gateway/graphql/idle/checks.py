"""``Session.idleChecks`` (the stored verdict of the idle checker's last sweep, batched per request by
``Context.loaders``) and ``Session.utilization`` (the series the checker keeps), read from Redis only (never recomputed
with Nomad calls in the request path)."""

from __future__ import annotations

from datetime import UTC, datetime

from core.errors import InvalidInput
from gateway.graphql.context import Info
from gateway.graphql.idle.types import (
    IdleChecks,
    MetricValue,
    UtilizationPoint,
    UtilizationSeries,
    UtilizationThreshold,
    idle_checks_type,
)
from stores.idle import IdleStore


async def idle_checks_of(info: Info, session_id: str) -> IdleChecks | None:
    stored = await info.context.loaders.idle_verdicts.load(session_id)  # one MGET for a whole page
    return idle_checks_type(stored) if stored is not None else None


async def utilization_of(info: Info, session_id: str, kernel: str | None) -> UtilizationSeries:
    points = await IdleStore(info.context.sessions.redis, info.context.sessions.keys).series(session_id)
    kernels = sorted({name for p in points for name in p.kernels})
    chosen = kernel if kernel is not None else (kernels[0] if kernels else None)
    if kernel is not None and kernels and kernel not in kernels:
        raise InvalidInput(f"no utilization recorded for kernel {kernel!r}; kernels with samples: {kernels}")
    newest = points[-1].thresholds if points else {}
    return UtilizationSeries(
        kernel=chosen,
        kernels=kernels,
        points=[
            UtilizationPoint(
                at=datetime.fromtimestamp(p.at, UTC),
                until=datetime.fromtimestamp(p.until, UTC),
                sweeps=p.weight,
                values=[MetricValue.of(m, v) for m, v in sorted(p.kernels[chosen].items())],
            )
            for p in points
            if chosen in p.kernels
        ],
        thresholds=[UtilizationThreshold(metric=m, threshold=t) for m, t in sorted(newest.items())],
    )
