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
from types import MappingProxyType
from typing import NamedTuple

from redis.asyncio import Redis

from core.keys import Keys
from devices.catalog import DeviceCatalog
from domain.idle.arbiter import Arbiter, evaluate
from domain.idle.config import IdlePolicyConfig
from domain.idle.facts import Activity, SweptSession, checked_metrics, policy_for, requested_slots, session_facts
from domain.idle.verdict import Verdict
from domain.idle.window import UtilizationWindow, record_sample
from domain.resource_policies import SessionLimits
from idle.collect import Sample, collect_samples
from nomad_jobs.client import NomadClient
from stores.activity import read_activity
from stores.resource_policies import PolicyStore


class Sweep(NamedTuple):
    verdicts: dict[str, Verdict]
    """Session id -> verdict, for every session judged."""
    windows: dict[str, UtilizationWindow]
    """The windows after this sweep's samples: only sessions whose utilization is checked."""


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
) -> Sweep:
    """``limits``: session id -> its owner's and project's resource-policy limits (:mod:`domain.idle.owner_limits`)."""
    verdicts: dict[str, Verdict] = {}
    updated: dict[str, UtilizationWindow] = {}
    for session in sessions:
        policy = policy_for(config, session, limits.get(session.id))
        slots = requested_slots(session)
        metrics = checked_metrics(session, policy, slots)
        window = None
        if metrics and policy.utilization is not None:
            window = updated[session.id] = record_sample(
                windows.get(session.id),
                ts=now.timestamp(),
                sample=samples.get(session.id, {}),
                window_seconds=policy.utilization.window,
                interval=policy.check_interval,
                metrics=metrics,
            )
        facts = session_facts(session, activity.get(session.id), window, slots)
        verdicts[session.id] = arbiter(now=now, session=facts, policy=policy)
    return Sweep(verdicts, updated)


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
) -> Sweep:
    """Verdicts on ``sessions`` (all RUNNING) at ``now``, with this sweep's samples recorded."""
    sampled = [s for s in sessions if checked_metrics(s, policy_for(config, s))]  # limits never touch utilization
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
    )
