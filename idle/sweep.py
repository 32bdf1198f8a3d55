"""One idle sweep over the RUNNING sessions: gather the facts (I/O), then judge them (pure).

:func:`judge` records this sweep's sample into each session's utilization window (at most one sample
per sweep) and asks the arbiter for a verdict; :func:`check_once` gathers what it needs first: the
sessions' activity from Redis and, for sessions whose utilization is checked, their allocation stats
from Nomad. Acting on the verdicts is the service's job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from types import MappingProxyType
from typing import NamedTuple

from redis.asyncio import Redis

from core.keys import Keys
from devices.catalog import DeviceCatalog
from domain.idle.arbiter import Arbiter, SessionFacts, checked_thresholds, evaluate
from domain.idle.config import IdlePolicyConfig
from domain.idle.facts import Activity, SweptSession, checked_metrics, policy_for, requested_slots, started_at
from domain.idle.verdict import Verdict
from domain.idle.window import UtilizationWindow, record_sample
from domain.resource_policies import SessionLimits
from idle.collect import Sample, collect_samples
from nomad_jobs.client import NomadClient
from stores.activity import read_activity
from stores.resource_policies import PolicyStore


class Derived(NamedTuple):
    """What :func:`judge` derives from a session alone, reused while the sweep reads the same view object
    (``idle.views.ViewCache`` hands back the unchanged ones; views are immutable)."""

    session: SweptSession
    slots: dict[str, Decimal]
    """Its :func:`~domain.idle.facts.requested_slots`."""
    started: datetime
    """Its :func:`~domain.idle.facts.started_at`."""


class Sweep(NamedTuple):
    verdicts: dict[str, Verdict]
    """Session id -> verdict, for every session judged."""
    windows: dict[str, UtilizationWindow]
    """The windows after this sweep's samples: only sessions whose utilization is checked."""
    derived: Mapping[str, Derived] = MappingProxyType({})
    """Session id -> what was derived from it, for the next sweep's ``derived`` (every session judged)."""


def judge(
    *,
    now: datetime,
    sessions: Sequence[SweptSession],
    config: IdlePolicyConfig,
    windows: Mapping[str, UtilizationWindow],
    activity: Mapping[str, Activity],
    samples: Mapping[str, Sample],
    arbiter: Arbiter = evaluate,
    limits: Mapping[str, SessionLimits] = MappingProxyType({}),
    derived: Mapping[str, Derived] = MappingProxyType({}),
) -> Sweep:
    """``limits``: session id -> its owner's and project's resource-policy limits (:mod:`domain.idle.owner_limits`);
    ``derived``: the last sweep's :attr:`Sweep.derived` (used only for the very same session objects)."""
    verdicts: dict[str, Verdict] = {}
    updated: dict[str, UtilizationWindow] = {}
    kept: dict[str, Derived] = {}
    ts = now.timestamp()
    for session in sessions:
        session_id = session.id
        known = derived.get(session_id)
        if known is None or known.session is not session:
            known = Derived(session, requested_slots(session), started_at(session))
        kept[session_id] = known
        policy = policy_for(config, session, limits.get(session_id))
        utilization, window, metrics = policy.utilization, None, None
        if utilization is not None:
            metrics = checked_thresholds(utilization, known.slots)
            if metrics:
                window = updated[session_id] = record_sample(
                    windows.get(session_id),
                    ts=ts,
                    sample=samples.get(session_id, {}),
                    window_seconds=utilization.window,
                    interval=policy.check_interval,
                    metrics=metrics,
                )
        seen = activity.get(session_id)
        facts = SessionFacts(
            type=session.type,
            started_at=known.started,
            last_activity=seen.last if seen else None,
            open_connections=seen.open_connections if seen else 0,
            requested_slots=known.slots,
            window=window,
            checked=metrics,
        )
        verdicts[session_id] = arbiter(now=now, session=facts, policy=policy)
    return Sweep(verdicts, updated, kept)


async def check_once(
    *,
    now: datetime,
    sessions: Sequence[SweptSession],
    config: IdlePolicyConfig,
    windows: Mapping[str, UtilizationWindow],
    redis: Redis,
    keys: Keys,
    nomad: NomadClient,
    concurrency: int,
    arbiter: Arbiter = evaluate,
    devices: DeviceCatalog | None = None,
    derived: Mapping[str, Derived] = MappingProxyType({}),
) -> Sweep:
    """Verdicts on ``sessions`` (all RUNNING) at ``now``, with this sweep's samples recorded (``derived``: the last
    sweep's :attr:`Sweep.derived`)."""

    def slots(session: SweptSession) -> Mapping[str, Decimal]:
        known = derived.get(session.id)
        return known.slots if known is not None and known.session is session else requested_slots(session)

    # limits never touch utilization
    sampled = [s for s in sessions if checked_metrics(s, policy_for(config, s), slots(s))]
    samples, activity, limits = await asyncio.gather(
        collect_samples(nomad, sampled, concurrency=concurrency, devices=devices),
        read_activity(redis, keys, [s.id for s in sessions], now),
        PolicyStore(redis, keys).limits_of(sessions),
    )
    return judge(
        now=now,
        sessions=sessions,
        config=config,
        windows=windows,
        activity=activity,
        samples=samples,
        arbiter=arbiter,
        limits=limits,
        derived=derived,
    )
