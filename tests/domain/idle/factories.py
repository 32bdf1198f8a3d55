"""Builders shared by the idle tests: a fixed clock origin and small constructors with defaults."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from domain.idle.arbiter import SessionFacts
from domain.idle.config import EffectivePolicy, ThresholdOperator, UtilizationPolicy
from domain.idle.verdict import CheckReport, RemainingBasis
from domain.idle.window import UtilizationWindow
from domain.model import SessionType

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
"""When the session under test became RUNNING."""
INTERVAL = 15.0


def at(seconds: float) -> datetime:
    """``seconds`` after :data:`T0`."""
    return T0 + timedelta(seconds=seconds)


def ts(seconds: float) -> float:
    return at(seconds).timestamp()


def utilization(
    thresholds: Mapping[str, float],
    *,
    grace: float = 0.0,
    window: float = 60.0,
    operator: ThresholdOperator = ThresholdOperator.ALL,
) -> UtilizationPolicy:
    return UtilizationPolicy(grace_period=grace, window=window, operator=operator, thresholds=dict(thresholds))


def policy(
    *,
    lifetime: float | None = None,
    network: float | None = None,
    util: UtilizationPolicy | None = None,
) -> EffectivePolicy:
    return EffectivePolicy(
        check_interval=INTERVAL, max_session_lifetime=lifetime, network_idle_timeout=network, utilization=util
    )


def facts(
    type: SessionType = SessionType.INTERACTIVE,
    *,
    last_activity: float | None = None,
    open_connections: int = 0,
    slots: Mapping[str, float] | None = None,
    window: UtilizationWindow | None = None,
) -> SessionFacts:
    return SessionFacts(
        type=type,
        started_at=T0,
        last_activity=at(last_activity) if last_activity is not None else None,
        open_connections=open_connections,
        requested_slots=slots if slots is not None else {"cpu": 2, "mem": 2**30},
        window=window,
    )


def filled_window(
    sample: Mapping[str, float],
    *,
    start: float,
    end: float,
    window: float = 60.0,
    interval: float = INTERVAL,
) -> UtilizationWindow:
    """A window fed ``sample`` at every interval from ``start`` to ``end`` (seconds after T0), inclusive."""
    filled = UtilizationWindow.empty(window_seconds=window, interval=interval)
    moment = start
    while moment <= end:
        filled = filled.add(ts(moment), sample)
        moment += interval
    return filled


def outcome(report: CheckReport) -> tuple[str, bool, float | None, RemainingBasis | None]:
    """What table-driven tests compare: which check, expired or not, seconds left and what they count to."""
    return report.name.value, report.expired, report.remaining, report.measured_against
