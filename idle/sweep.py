"""One idle sweep over the RUNNING sessions: gather the facts (I/O), then judge them (pure).

:func:`judge` records this sweep's sample into each session's utilization window (at most one sample
per sweep) and asks the arbiter for a verdict; :func:`check_once` gathers what it needs first: the
sessions' activity from Redis and, for sessions whose utilization is checked, their allocation stats
from Nomad. Acting on the verdicts is the service's job.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from types import MappingProxyType
from typing import NamedTuple

from redis.asyncio import Redis

from core.keys import Keys
from devices.catalog import DeviceCatalog
from domain import sftp
from domain.idle.arbiter import (
    Arbiter,
    Batch,
    Judged,
    SessionFacts,
    batch_of,
    checked_thresholds,
    evaluate,
    evaluate_many,
)
from domain.idle.columns import WindowColumns
from domain.idle.config import IdlePolicyConfig
from domain.idle.facts import Activity, SweptSession, checked_metrics, policy_for, requested_slots, started_at
from domain.idle.metrics import requested_device_prefixes
from domain.idle.verdict import Verdict
from domain.idle.window import UtilizationWindow
from domain.resource_policies import SessionLimits
from idle.collect import Sample, collect_clients_seen, collect_samples
from nomad_jobs.client import NomadClient
from stores.activity import read_activity
from stores.resource_policies import PolicyStore

NO_ACTIVITY = Activity(None, 0)


class Derived(NamedTuple):
    """What :func:`judge` derives from a session alone, reused while the sweep reads the same view object
    (``idle.views.ViewCache`` hands back the unchanged ones; views are immutable)."""

    session: SweptSession
    slots: dict[str, Decimal]
    """Its :func:`~domain.idle.facts.requested_slots`."""
    started: datetime
    """Its :func:`~domain.idle.facts.started_at`."""
    started_ts: float
    """The same, unix seconds."""
    devices: frozenset[str]
    """The device prefixes of its slots (:func:`~domain.idle.metrics.requested_device_prefixes`)."""
    plan: Plan | None = None
    """How it was judged under the policy file of :attr:`Plan.config` (kept while that file is in force and the
    session's owner and project set no limits)."""

    @classmethod
    def of(cls, session: SweptSession) -> Derived:
        slots, started = requested_slots(session), started_at(session)
        return cls(session, slots, started, started.timestamp(), requested_device_prefixes(slots))


class Plan(NamedTuple):
    """How a session is judged under one policy file."""

    config: IdlePolicyConfig
    judged: Judged
    """What the verdicts take of the session under that file: its policy and the thresholds judged
    (:func:`~domain.idle.arbiter.evaluate_many`)."""
    window_key: tuple[str, tuple[float, float], tuple[str, ...]]
    """(session id, its window's (seconds, interval), the checked metrics: empty when it has no window): where its
    samples go (``WindowColumns.record_keyed``)."""

    @property
    def metrics(self) -> tuple[str, ...]:
        return self.window_key[2]


def _plan(config: IdlePolicyConfig, session: SweptSession, limits: SessionLimits | None, known: Derived) -> Plan:
    policy = policy_for(config, session, limits)
    utilization = policy.utilization
    if utilization is None:
        return Plan(config, Judged(session.type, known.started_ts, policy, None), (session.id, (0.0, 0.0), ()))
    checked = utilization.checked_by_devices.get(known.devices)
    if checked is None:
        checked = checked_thresholds(utilization, known.slots)
    shape = (utilization.window, policy.check_interval)
    return Plan(config, Judged(session.type, known.started_ts, policy, checked), (session.id, shape, tuple(checked)))


class Sweep(NamedTuple):
    verdicts: dict[str, Verdict]
    """Session id -> verdict, for every session judged."""
    windows: WindowColumns
    """The windows after this sweep's samples: only sessions whose utilization is checked."""
    derived: Mapping[str, Derived] = MappingProxyType({})
    """Session id -> what was derived from it, for the next sweep's ``derived`` (every session judged)."""
    batch: Batch | None = None
    """The sessions as the verdicts took them, for the next sweep's ``batch`` (:func:`~domain.idle.arbiter.batch_of`;
    None when another arbiter judged)."""


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
    batch: Batch | None = None,
) -> Sweep:
    """``windows``: the last sweep's :attr:`Sweep.windows` (recorded into in place, and returned) or any windows
    (copied into new columns); ``limits``: session id -> its owner's and project's resource-policy limits
    (:mod:`domain.idle.owner_limits`); ``derived``: the last sweep's :attr:`Sweep.derived` (used only for the very
    same session objects); ``batch``: the last sweep's :attr:`Sweep.batch` (used only for the same sessions).

    Every session's sample is recorded in one pass over the columns (:meth:`WindowColumns.record`, the rules of
    ``domain.idle.window.record_sample``), then each verdict is the arbiter's: :func:`evaluate`'s on the readings
    the columns hand back (:func:`~domain.idle.arbiter.evaluate_many`), another arbiter's on the session's
    window built from the columns."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    columns = WindowColumns.of(windows)
    ts = now.timestamp()
    kept: dict[str, Derived] = {}
    ids: list[str] = []
    facts: list[Judged] = []
    last_activity: list[float] = []
    open_connections: list[int] = []
    window_keys: list[tuple[str, tuple[float, float], tuple[str, ...]]] = []
    window_samples: list[Sample] = []
    no_sample: Sample = {}
    seen_of, nan = activity.get, math.nan
    for session in sessions:
        session_id = session.id
        known = derived.get(session_id)
        if known is None or known.session is not session:
            known = Derived.of(session)
        plan = known.plan
        session_limits = limits.get(session_id) if limits else None
        if plan is None or plan.config is not config or session_limits is not None:
            plan = _plan(config, session, session_limits, known)
            if session_limits is None:
                known = known._replace(plan=plan)
        kept[session_id] = known
        window_key = plan.window_key
        if window_key[2]:  # checked metrics: a window
            window_keys.append(window_key)
            window_samples.append(samples.get(session_id, no_sample))
        ids.append(session_id)
        facts.append(plan.judged)
        seen = seen_of(session_id)
        if seen is None:
            last_activity.append(nan)
            open_connections.append(0)
        else:
            moment, connections = seen
            last_activity.append(moment.timestamp() if moment is not None else nan)
            open_connections.append(connections)
    recorded = columns.record_keyed(ts, window_keys, window_samples)
    if arbiter is evaluate:
        batch = batch_of(facts, batch)
        verdicts = evaluate_many(ts, batch, last_activity, open_connections, recorded.averages, recorded.to_fill)
        return Sweep(dict(zip(ids, verdicts, strict=True)), columns, kept, batch)
    verdicts_of: dict[str, Verdict] = {}
    for session_id, one, connections in zip(ids, facts, open_connections, strict=True):
        seen = seen_of(session_id)
        session_facts = SessionFacts(
            type=one.type,
            started_at=kept[session_id].started,
            last_activity=seen.last if seen is not None else None,
            open_connections=connections,
            requested_slots=kept[session_id].slots,
            window=columns[session_id] if one.checked else None,
            checked=one.checked,
        )
        verdicts_of[session_id] = arbiter(now=now, session=session_facts, policy=one.policy)
    return Sweep(verdicts_of, columns, kept)


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
    batch: Batch | None = None,
) -> Sweep:
    """Verdicts on ``sessions`` (all RUNNING) at ``now``, with this sweep's samples recorded (``derived`` and
    ``batch``: the last sweep's :attr:`Sweep.derived` and :attr:`Sweep.batch`)."""

    def is_sampled(session: SweptSession) -> bool:
        """Is its utilization checked? Limits never touch utilization: the last sweep's plan says, when it was made
        of this very view under this policy file; otherwise the policy is resolved again."""
        known = derived.get(session.id)
        if known is None or known.session is not session:
            return bool(checked_metrics(session, policy_for(config, session)))
        if known.plan is not None and known.plan.config is config:
            return bool(known.plan.metrics)
        return bool(checked_metrics(session, policy_for(config, session), known.slots))

    sampled = [s for s in sessions if is_sampled(s)]
    in_flight = asyncio.Semaphore(concurrency)  # every Nomad request of the sweep, stats and SFTP activity alike
    samples, activity, limits, clients = await asyncio.gather(
        collect_samples(nomad, sampled, limit=in_flight, devices=devices),
        read_activity(redis, keys, [s.id for s in sessions], now),
        PolicyStore(redis, keys).limits_of(sessions),
        collect_clients_seen(nomad, sessions, limit=in_flight),
    )
    for session_id, seen_at in clients.items():  # SFTP traffic, seen by the session's own server
        known = activity.get(session_id, NO_ACTIVITY)
        activity[session_id] = known.with_client_seen(seen_at, now=now, connected_within=sftp.CONNECTED_WITHIN)
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
        batch=batch,
    )
