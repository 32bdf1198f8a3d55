"""The idle arbiter: a pure, keyword-only judgement of one running session at a given ``now``.

Like jupyterhub-idle-culler's ``default_cull_arbiter``, it reads no clock and does no I/O; the idle
service gathers :class:`SessionFacts`, resolves the :class:`~domain.idle.config.EffectivePolicy` and acts on
the :class:`~domain.idle.verdict.Verdict`.

Semantics (a deadline is reached *at* its instant: "expired" means ``remaining <= 0``):

* **session_lifetime** — expired once ``now >= started_at + max_session_lifetime``. The clock starts when
  the session became RUNNING, not when it was created: Backend.AI counts from creation and so charges
  time spent queued to the user. BATCH sessions are exempt (their batch timeout bounds them).
* **network_timeout** — expired once ``now >= baseline + network_idle_timeout``, baseline = the last user
  activity the gateway recorded (the start time if none, and never before it). An open app connection
  counts as continuous activity: never idle. BATCH and INFERENCE sessions are exempt.
* **utilization** — no verdict before ``started_at + grace_period``, nor until every checked metric has a
  full, fresh window (see :mod:`domain.idle.window`; samples taken during the grace period count, the grace
  period only guarantees no termination). Checked metrics = thresholds of the policy whose device the
  session requested (:mod:`domain.idle.metrics`). A metric is *below* when its window average is strictly less
  than its threshold (equal is enough utilization). Operator ``all``: idle when every checked metric is
  below; ``any``: when one is. No checked metric, or no samples, means no verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from domain.idle.config import CheckName, EffectivePolicy, ThresholdOperator, UtilizationPolicy
from domain.idle.metrics import ALWAYS_APPLICABLE, SlotAmounts, metric_applies, requested_device_prefixes
from domain.idle.verdict import CheckReport, MetricReading, RemainingBasis, TerminationReason, Verdict
from domain.idle.window import UtilizationWindow
from domain.model import SessionType

NETWORK_EXEMPT = frozenset({SessionType.BATCH, SessionType.INFERENCE})
LIFETIME_EXEMPT = frozenset({SessionType.BATCH})


@dataclass(frozen=True, slots=True)
class SessionFacts:
    """What the idle service knows about one RUNNING session at sweep time (timezone-aware datetimes)."""

    type: SessionType
    started_at: datetime
    """When the session became RUNNING."""
    last_activity: datetime | None = None
    """Last user traffic recorded by the gateway; None if none yet."""
    open_connections: int = 0
    """App connections open through the gateway right now."""
    requested_slots: SlotAmounts = field(default_factory=dict)
    """Slot -> amount per the session's request; which devices it uses."""
    window: UtilizationWindow | None = None
    """Recent utilization samples, already normalized by allocated cores and memory (:mod:`idle.samples`)."""
    checked: Mapping[str, float] | None = None
    """Metric -> threshold judged for the session under the policy it is judged by (:func:`checked_thresholds` of
    that policy's utilization and ``requested_slots``), when the caller has them already; None: worked out here."""

    def __post_init__(self) -> None:
        for moment in (self.started_at, self.last_activity):
            if moment is not None and moment.tzinfo is None:
                raise ValueError("SessionFacts needs timezone-aware datetimes")


def evaluate(*, now: datetime, session: SessionFacts, policy: EffectivePolicy) -> Verdict:
    """Judge ``session`` at ``now`` under ``policy``; reports come in precedence order."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    at, started = now.timestamp(), session.started_at.timestamp()
    return Verdict.of_ordered(
        (
            check_lifetime(now=at, started=started, session=session, limit=policy.max_session_lifetime),
            check_network(now=at, started=started, session=session, timeout=policy.network_idle_timeout),
            check_utilization(
                now=at, started=started, session=session, policy=policy.utilization, interval=policy.check_interval
            ),
        )
    )


class Judged(NamedTuple):
    """What :func:`evaluate_many` takes of one session that stays the same from sweep to sweep under one policy (the
    idle sweep keeps it with the session's plan)."""

    type: SessionType
    started: float
    """When it became RUNNING, unix seconds."""
    policy: EffectivePolicy
    checked: Mapping[str, float] | None
    """Metric -> threshold judged; None or empty when its utilization is not checked."""


class Batch(NamedTuple):
    """Sessions as :func:`evaluate_many` judges them, with what stays the same from sweep to sweep worked out: the
    idle sweep keeps the last sweep's and reuses it while its sessions are the same (:func:`batch_of`)."""

    sessions: list[Judged]
    started: npt.NDArray[np.float64]
    lifetime_limit: npt.NDArray[np.float64]
    """Per session, seconds (nan: no limit)."""
    network_timeout: npt.NDArray[np.float64]
    """Per session, seconds (nan: no timeout)."""
    grace_period: npt.NDArray[np.float64]
    """Per session, seconds (nan: utilization not checked)."""
    metrics: list[str]
    """The checked metrics of every session whose utilization is checked, one session after the other."""
    thresholds: list[float]
    """Their thresholds, in the same order."""
    widths: list[int]
    """How many checked metrics each such session has."""


def batch_of(sessions: Sequence[Judged], last: Batch | None = None) -> Batch:
    """``sessions`` as a :class:`Batch`: ``last`` itself when it holds equal sessions (in the steady state, the very
    same objects: one comparison of identities per session)."""
    if last is not None and last.sessions == sessions:
        return last
    ids: dict[int, int] = {}
    distinct: list[EffectivePolicy] = []
    policy_at: list[int] = []
    metrics: list[str] = []
    thresholds: list[float] = []
    widths: list[int] = []
    for judged in sessions:
        policy = judged.policy
        slot = ids.get(id(policy))
        if slot is None:
            slot = ids[id(policy)] = len(distinct)
            distinct.append(policy)
        policy_at.append(slot)
        if judged.checked and policy.utilization is not None:
            metrics.extend(judged.checked)
            thresholds.extend(judged.checked.values())
            widths.append(len(judged.checked))
    at = np.array(policy_at, np.intp)
    return Batch(
        list(sessions),
        np.array([judged.started for judged in sessions], np.float64),
        _per_policy(distinct, _lifetime_limit)[at],
        _per_policy(distinct, _network_timeout)[at],
        _per_policy(distinct, _grace_period)[at],
        metrics,
        thresholds,
        widths,
    )


def evaluate_many(
    now: float,
    sessions: Batch | Sequence[Judged],
    last_activity: Sequence[float],
    open_connections: Sequence[int],
    averages: Sequence[float | None],
    to_fill: Sequence[float],
) -> list[Verdict]:
    """:func:`evaluate` of many sessions at once, at ``now`` (unix seconds): the same verdicts on the same facts (the
    reference, kept as it was), the deadlines worked out as arrays and only the records built per session.

    Per session, in the order of ``sessions`` (a :class:`Batch` of them, or the sessions themselves):
    ``last_activity``, its last user traffic in unix seconds (nan if none yet), and ``open_connections``, its app
    connections open now. ``averages``: the checked metrics' window averages of every session whose utilization is
    checked, one session after the other (each in the order of its ``checked``); ``to_fill``: per such session, the
    seconds until every one of its metrics' window is full and fresh. Every sum and difference is the one
    :func:`evaluate` computes, in the same order, in the same float64: the countdowns are equal to the last bit."""
    batch = sessions if isinstance(sessions, Batch) else batch_of(sessions)
    count = len(batch.sessions)
    if not count:
        return []
    if len(last_activity) != count or len(open_connections) != count:
        raise ValueError("one last activity and one count of open connections per session")
    if len(averages) != len(batch.thresholds) or len(to_fill) != len(batch.widths):
        raise ValueError("one average per checked metric, one to_fill per session checked")
    started, judged = batch.started, batch.sessions
    lifetime_left = started + batch.lifetime_limit - now
    last = np.array(last_activity, np.float64)
    since = np.where(np.isnan(last), started, np.maximum(last, started))
    network_left = batch.network_timeout - np.maximum(0.0, now - since)
    grace_left = started + batch.grace_period - now
    below = np.array([math.nan if a is None else a for a in averages]) < np.array(batch.thresholds)
    lifetimes = _lifetime_reports(judged, lifetime_left.tolist())
    networks = _network_reports(judged, network_left.tolist(), open_connections)
    readings = list(map(MetricReading, batch.metrics, averages, batch.thresholds))
    usages = _utilization_reports(judged, grace_left.tolist(), readings, to_fill, below, batch.widths)
    verdicts: list[Verdict] = []
    append = verdicts.append
    for reports in zip(lifetimes, networks, usages, strict=True):
        lifetime, network, usage = reports
        if lifetime.expired:
            append(Verdict(True, _ENDS_LIFETIME, reports))
        elif network.expired:
            append(Verdict(True, _ENDS_IDLE, reports))
        elif usage.expired:
            append(Verdict(True, _ENDS_UNUSED, reports))
        else:
            append(Verdict(False, None, reports))
    return verdicts


def _lifetime_reports(sessions: Sequence[Judged], left: list[float]) -> list[CheckReport]:
    """``left``: each session's ``started + limit - now`` (nan without a limit)."""
    reports: list[CheckReport] = []
    append = reports.append
    for session, life in zip(sessions, left, strict=True):
        if session.type in LIFETIME_EXEMPT:
            append(_BATCH_TIMEOUT)
        elif life != life:  # nan: no limit
            append(_NO_LIFETIME)
        else:  # max(life, 0.0) as evaluate takes it (nan and -0.0 kept)
            append(CheckReport(_LIFETIME, life <= 0, 0.0 if life < 0.0 else life, _BY_LIFETIME))
    return reports


def _network_reports(
    sessions: Sequence[Judged], left: list[float], open_connections: Sequence[int]
) -> list[CheckReport]:
    """``left``: each session's ``timeout - max(0, now - max(activity, started))`` (nan without a timeout)."""
    reports: list[CheckReport] = []
    append = reports.append
    for session, idle, connections in zip(sessions, left, open_connections, strict=True):
        kind = session.type
        if kind in NETWORK_EXEMPT:
            append(_NETWORK_EXEMPT[kind])
        elif idle != idle:  # nan: no timeout
            append(_NO_NETWORK_TIMEOUT)
        elif connections > 0:
            timeout = session.policy.network_idle_timeout
            append(CheckReport(_NETWORK, False, timeout, _BY_IDLENESS, "app connections open"))
        else:
            append(CheckReport(_NETWORK, idle <= 0, 0.0 if idle < 0.0 else idle, _BY_IDLENESS))
    return reports


def _utilization_reports(
    sessions: Sequence[Judged],
    grace_left: list[float],
    readings: list[MetricReading],
    to_fill: Sequence[float],
    below: np.ndarray,
    widths: list[int],
) -> list[CheckReport]:
    """``readings`` and ``below`` (each checked metric's average under its threshold): every checked session's one
    after the other, ``widths`` of them each."""
    all_below: list[bool] = []
    any_below: list[bool] = []
    if widths:
        starts = np.cumsum([0] + widths[:-1])
        all_below = np.logical_and.reduceat(below, starts).tolist()
        any_below = np.logical_or.reduceat(below, starts).tolist()
    reports: list[CheckReport] = []
    append = reports.append
    entry = first = 0
    for (_, _, policy, checked), grace in zip(sessions, grace_left, strict=True):
        utilization = policy.utilization
        if utilization is None:
            append(_UTILIZATION_OFF)
            continue
        if not checked:
            append(_NO_THRESHOLD)
            continue
        width, operator = widths[entry], utilization.operator
        its = (readings[first],) if width == 1 else tuple(readings[first : first + width])
        if grace > 0:
            append(CheckReport(_UTILIZATION, False, grace, _GRACE, "in grace period", operator, its))
        elif (fill := to_fill[entry]) > 0:
            append(CheckReport(_UTILIZATION, False, fill, _WINDOW, "collecting samples", operator, its))
        elif all_below[entry] if operator is _ALL else any_below[entry]:
            append(CheckReport(_UTILIZATION, True, 0.0, _WINDOW, "below thresholds", operator, its))
        else:
            append(CheckReport(_UTILIZATION, False, None, _WINDOW, "utilized", operator, its))
        first, entry = first + width, entry + 1
    return reports


def _lifetime_limit(policy: EffectivePolicy) -> float | None:
    return policy.max_session_lifetime


def _network_timeout(policy: EffectivePolicy) -> float | None:
    return policy.network_idle_timeout


def _grace_period(policy: EffectivePolicy) -> float | None:
    return policy.utilization.grace_period if policy.utilization is not None else None


def _per_policy(policies: Sequence[EffectivePolicy], read: Callable[[EffectivePolicy], float | None]) -> np.ndarray:
    """``read`` of each policy as a float64 array, nan for None."""
    return np.array([math.nan if (value := read(p)) is None else value for p in policies], np.float64)


# enum members as module constants: a member read from its class costs a lookup through the enum's metaclass
_LIFETIME, _NETWORK, _UTILIZATION = CheckName.SESSION_LIFETIME, CheckName.NETWORK_TIMEOUT, CheckName.UTILIZATION
_BY_LIFETIME, _BY_IDLENESS = RemainingBasis.LIFETIME, RemainingBasis.IDLENESS
_GRACE, _WINDOW, _ALL = RemainingBasis.GRACE_PERIOD, RemainingBasis.WINDOW, ThresholdOperator.ALL
_ENDS_LIFETIME, _ENDS_IDLE = TerminationReason.SESSION_LIFETIME, TerminationReason.NETWORK_TIMEOUT
_ENDS_UNUSED = TerminationReason.UTILIZATION


def _no_deadline(name: CheckName, note: str) -> CheckReport:
    return CheckReport(name, False, None, None, note)


# reports that say the same for every session they apply to, built once (reports are immutable)
_BATCH_TIMEOUT = _no_deadline(CheckName.SESSION_LIFETIME, "bounded by its batch timeout instead")
_NO_LIFETIME = _no_deadline(CheckName.SESSION_LIFETIME, "no lifetime limit")
_NETWORK_EXEMPT = {t: _no_deadline(CheckName.NETWORK_TIMEOUT, f"{t.value} sessions are exempt") for t in NETWORK_EXEMPT}
_NO_NETWORK_TIMEOUT = _no_deadline(CheckName.NETWORK_TIMEOUT, "no network idle timeout")
_UTILIZATION_OFF = _no_deadline(CheckName.UTILIZATION, "utilization check disabled")
_NO_THRESHOLD = _no_deadline(CheckName.UTILIZATION, "no threshold applies to this session")


def check_lifetime(*, now: float, started: float, session: SessionFacts, limit: float | None) -> CheckReport:
    if session.type in LIFETIME_EXEMPT:
        return _BATCH_TIMEOUT
    if limit is None:
        return _NO_LIFETIME
    return _countdown(CheckName.SESSION_LIFETIME, started + limit - now, RemainingBasis.LIFETIME)


def check_network(*, now: float, started: float, session: SessionFacts, timeout: float | None) -> CheckReport:
    name = CheckName.NETWORK_TIMEOUT
    if session.type in NETWORK_EXEMPT:
        return _NETWORK_EXEMPT[session.type]
    if timeout is None:
        return _NO_NETWORK_TIMEOUT
    if session.open_connections > 0:
        return CheckReport(name, False, timeout, RemainingBasis.IDLENESS, "app connections open")
    activity = session.last_activity.timestamp() if session.last_activity is not None else started
    # Activity stamped after ``now`` (recorded while this sweep ran, or by a gateway whose clock runs ahead) is
    # activity now: the countdown never exceeds the timeout.
    idle_for = max(0.0, now - max(activity, started))
    return _countdown(name, timeout - idle_for, RemainingBasis.IDLENESS)


def check_utilization(
    *, now: float, started: float, session: SessionFacts, policy: UtilizationPolicy | None, interval: float
) -> CheckReport:
    if policy is None:
        return _UTILIZATION_OFF
    checked = session.checked
    if checked is None:
        checked = checked_thresholds(policy, session.requested_slots)
    if not checked:
        return _NO_THRESHOLD
    window = session.window
    if window is None:
        averages: list[float | None] = [None] * len(checked)
    else:
        averages = [window.average(metric) for metric in checked]
    if window is None or window.window_seconds != policy.window or window.interval != interval:  # another shape
        to_fill = policy.window
    else:
        to_fill = max([window.seconds_until_full(metric, now=now) for metric in checked])
    return utilization_report(
        now=now, started=started, policy=policy, checked=checked, averages=averages, to_fill=to_fill
    )


def utilization_report(
    *,
    now: float,
    started: float,
    policy: UtilizationPolicy,
    checked: Mapping[str, float],
    averages: Sequence[float | None],
    to_fill: float,
) -> CheckReport:
    """The utilization check's report once the window is read: ``checked`` (not empty) metric -> threshold,
    ``averages`` their window averages in the same order (None without samples), ``to_fill`` the seconds until every
    one's window is full and fresh (``policy.window`` when the window has another shape)."""
    if len(averages) != len(checked):
        raise ValueError("one average per checked metric")
    return _utilization(now, started, policy, checked, averages, to_fill)


def _utilization(
    now: float,
    started: float,
    policy: UtilizationPolicy,
    checked: Mapping[str, float],
    averages: Sequence[float | None],
    to_fill: float,
) -> CheckReport:
    operator = policy.operator
    readings = tuple(map(MetricReading, checked, averages, checked.values()))  # as many averages: the callers check
    grace_left = started + policy.grace_period - now
    if grace_left > 0:
        return CheckReport(_UTILIZATION, False, grace_left, _GRACE, "in grace period", operator, readings)
    if to_fill > 0:
        return CheckReport(_UTILIZATION, False, to_fill, _WINDOW, "collecting samples", operator, readings)
    below = [r.average is not None and r.average < r.threshold for r in readings]
    if all(below) if operator is _ALL else any(below):
        return CheckReport(_UTILIZATION, True, 0.0, _WINDOW, "below thresholds", operator, readings)
    return CheckReport(_UTILIZATION, False, None, _WINDOW, "utilized", operator, readings)


def checked_thresholds(policy: UtilizationPolicy, requested_slots: SlotAmounts) -> Mapping[str, float]:
    """The thresholds judged for a session requesting ``requested_slots``: the only metrics worth sampling.

    Memoized per policy and requested device set (the mapping returned is shared: read it, do not change it)."""
    devices = requested_device_prefixes(requested_slots)
    checked = policy.checked_by_devices.get(devices)
    if checked is None:
        checked = policy.checked_by_devices[devices] = MappingProxyType(
            {m: t for m, t in policy.thresholds.items() if m in ALWAYS_APPLICABLE or metric_applies(m, devices)}
        )
    return checked


def _countdown(name: CheckName, remaining: float, basis: RemainingBasis) -> CheckReport:
    return CheckReport(name, remaining <= 0, max(remaining, 0.0), basis)
