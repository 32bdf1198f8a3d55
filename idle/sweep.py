"""One idle sweep's judgement, pure: this sweep's samples recorded into the windows, and every verdict.

:func:`judge` records this sweep's sample into each session's utilization window (at most one sample per sweep) and
judges every session at once (``domain.idle.arbiter.evaluate_many``); :func:`planned` works out how a session is judged
under the policy file in force, once per view and file, which also says whether its utilization is sampled. Gathering
the facts (Redis, Nomad) is :class:`idle.sweeper.Sweeper`'s job; acting on the verdicts is the service's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from types import MappingProxyType
from typing import NamedTuple

from domain.idle.arbiter import Batch, Judged, batch_of, checked_thresholds, evaluate_many
from domain.idle.columns import WindowColumns
from domain.idle.config import IdlePolicyConfig
from domain.idle.facts import Activity, SweptSession, policy_for, requested_slots, started_at
from domain.idle.metrics import requested_device_prefixes
from domain.idle.series import SeriesPoint, due, series_points
from domain.idle.verdict import Verdict
from domain.idle.window import UtilizationWindow
from domain.resource_policies import SessionLimits
from idle.collect import Sample


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
    """How it is judged under the policy file of :attr:`Plan.config` when its owner and project set no limits
    (:func:`planned`; kept while that file is in force)."""

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


def planned(config: IdlePolicyConfig, session: SweptSession, known: Derived | None) -> tuple[Derived, Plan]:
    """What is derived from ``session`` and how it is judged under ``config`` without limits: ``known`` (the last
    sweep's) reused when made of this very view, its plan when made under this very file. Limits never touch
    utilization: the plan's :attr:`~Plan.metrics` say whether the session's utilization is sampled."""
    if known is None or known.session is not session:
        known = Derived.of(session)
    plan = known.plan
    if plan is None or plan.config is not config:
        plan = _plan(config, session, None, known)
        known = known._replace(plan=plan)
    return known, plan


class Sweep(NamedTuple):
    verdicts: dict[str, Verdict]
    """Session id -> verdict, for every session judged."""
    windows: WindowColumns
    """The windows after this sweep's samples: only sessions whose utilization is checked."""
    derived: Mapping[str, Derived]
    """Session id -> what was derived from it, for the next sweep's ``derived`` (every session judged)."""
    batch: Batch
    """The sessions as the verdicts took them, for the next sweep's ``batch``
    (:func:`~domain.idle.arbiter.batch_of`)."""


def judge(
    *,
    now: datetime,
    sessions: Sequence[SweptSession],
    config: IdlePolicyConfig,
    windows: Mapping[str, UtilizationWindow],
    activity: Mapping[str, Activity],
    samples: Mapping[str, Sample],
    limits: Mapping[str, SessionLimits] = MappingProxyType({}),
    derived: Mapping[str, Derived] = MappingProxyType({}),
    batch: Batch | None = None,
) -> Sweep:
    """``windows``: the last sweep's :attr:`Sweep.windows` (recorded into in place, and returned) or any windows
    (copied into new columns); ``limits``: session id -> its owner's and project's resource-policy limits
    (:mod:`domain.idle.owner_limits`); ``derived``: the last sweep's :attr:`Sweep.derived`, or this sweep's
    :func:`planned` (used only for the very same session objects); ``batch``: the last sweep's :attr:`Sweep.batch`
    (used only for the same sessions).

    Every session's sample is recorded in one pass over the columns (:meth:`WindowColumns.record`, the rules of
    ``domain.idle.window.record_sample``), then every verdict is worked out at once on the readings the columns hand
    back (:func:`~domain.idle.arbiter.evaluate_many`, the judgement of :func:`~domain.idle.arbiter.evaluate`; the
    per-session path is the tests' oracle, ``tests/idle/test_judge_columns.py``)."""
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
        known, plan = planned(config, session, derived.get(session_id))
        session_limits = limits.get(session_id) if limits else None
        if session_limits is not None:
            plan = _plan(config, session, session_limits, known)
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
    batch = batch_of(facts, batch)
    verdicts = evaluate_many(ts, batch, last_activity, open_connections, recorded.averages, recorded.to_fill)
    return Sweep(dict(zip(ids, verdicts, strict=True)), columns, kept, batch)


def chart_points(
    sweep: int, now: datetime, per_kernel: Mapping[str, dict[str, Sample]], plans: Mapping[str, tuple[Derived, Plan]]
) -> dict[str, SeriesPoint]:
    """The points of the sessions' utilization series at the term's ``sweep``-th sweep (``now``): each sampled session
    whose turn it is (``domain.idle.series.due``), its kernels' samples (``per_kernel``, as ``idle.collect`` fills it)
    and the thresholds its plan judges."""
    turn = {i: kernels for i, kernels in per_kernel.items() if due(i, sweep)}
    return series_points(now.timestamp(), turn, {i: plans[i][1].judged.checked or {} for i in turn})
