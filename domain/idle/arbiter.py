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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Protocol

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


class Arbiter(Protocol):
    """What the idle service calls per session: :func:`evaluate`, or a replacement taking the same keywords."""

    def __call__(self, *, now: datetime, session: SessionFacts, policy: EffectivePolicy) -> Verdict: ...


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


def evaluate_recorded(
    now: float,
    type: SessionType,
    started: float,
    last_activity: float | None,
    open_connections: int,
    policy: EffectivePolicy,
    checked: Mapping[str, float] | None,
    averages: Sequence[float | None] = (),
    to_fill: float = 0.0,
    /,
) -> Verdict:
    """:func:`evaluate` of a session whose window the caller has read already (``domain.idle.columns``): moments in
    unix seconds, ``checked`` the thresholds judged (None or empty when utilization is not checked), ``averages`` and
    ``to_fill`` as :func:`utilization_report` takes them. The same verdict as :func:`evaluate` on the same facts (the
    reference, kept as it was), its checks written out here, positional (the idle sweep calls it for every session)."""
    if type in LIFETIME_EXEMPT:
        lifetime = _BATCH_TIMEOUT
    elif (limit := policy.max_session_lifetime) is None:
        lifetime = _NO_LIFETIME
    else:
        left = started + limit - now
        lifetime = CheckReport(_LIFETIME, left <= 0, max(left, 0.0), _BY_LIFETIME)
    if type in NETWORK_EXEMPT:
        network = _NETWORK_EXEMPT[type]
    elif (timeout := policy.network_idle_timeout) is None:
        network = _NO_NETWORK_TIMEOUT
    elif open_connections > 0:
        network = CheckReport(_NETWORK, False, timeout, _BY_IDLENESS, "app connections open")
    else:
        activity = last_activity if last_activity is not None else started
        left = timeout - max(0.0, now - max(activity, started))
        network = CheckReport(_NETWORK, left <= 0, max(left, 0.0), _BY_IDLENESS)
    utilization = policy.utilization
    if utilization is None:
        usage = _UTILIZATION_OFF
    elif not checked:
        usage = _NO_THRESHOLD
    elif len(averages) != len(checked):
        raise ValueError("one average per checked metric")
    else:
        usage = _utilization(now, started, utilization, checked, averages, to_fill)
    reports = (lifetime, network, usage)
    if lifetime.expired:
        return Verdict(True, _ENDS_LIFETIME, reports)
    if network.expired:
        return Verdict(True, _ENDS_IDLE, reports)
    if usage.expired:
        return Verdict(True, _ENDS_UNUSED, reports)
    return Verdict(False, None, reports)


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
