"""A stored session read the way the idle checks see it. Pure.

Lifetime and grace periods count from when the session became RUNNING (``Session.started_at``), not
from creation: time spent queued is not the user's.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import NamedTuple

from domain.idle.arbiter import SessionFacts, checked_thresholds
from domain.idle.config import EffectivePolicy, IdlePolicyConfig
from domain.idle.owner_limits import tightened
from domain.idle.window import UtilizationWindow
from domain.model import Kernel, Session, SessionStatus
from domain.resource_policies import SessionLimits


class Activity(NamedTuple):
    """A session's user traffic as the gateway records it (``stores.activity``)."""

    last: datetime | None
    """The last recorded user traffic; None if none was recorded."""
    open_connections: int


def policy_for(config: IdlePolicyConfig, session: Session, limits: SessionLimits | None = None) -> EffectivePolicy:
    """The policy ``session`` is judged by: the file's, tightened by ``limits``, its owner's and project's resource
    policies (:mod:`domain.idle.owner_limits`).

    Caravan's users carry no idle-policy name yet, so ``user_policy`` blocks of the file apply to nobody;
    this is the one place to pass it once they do.
    """
    policy = config.effective(resource_group=session.resource_group, user_policy=None)
    return tightened(policy, limits, config.enabled) if limits is not None else policy


def started_at(session: Session) -> datetime:
    """When the session became RUNNING (sessions stored before ``started_at`` existed: from the history)."""
    if session.started_at is not None:
        return session.started_at
    for change in reversed(session.status_history):
        if change.status is SessionStatus.RUNNING:
            return change.at
    return session.created_at


def requested_slots(session: Session) -> dict[str, Decimal]:
    """Slot -> the most any kernel requested (which devices the session uses: a cluster's roles may differ)."""
    found: dict[str, Decimal] = {}
    for kernel in session.kernels:
        for slot, amount in kernel.resources.items():
            found[slot] = max(found.get(slot, Decimal(0)), Decimal(amount))
    return found if session.kernels else {slot: Decimal(amount) for slot, amount in session.resources.items()}


def checked_metrics(session: Session, policy: EffectivePolicy) -> dict[str, float]:
    """Metric -> threshold judged for ``session``; empty when utilization is not checked for it."""
    if policy.utilization is None:
        return {}
    return checked_thresholds(policy.utilization, requested_slots(session))


def kernel_allocation(kernel: Kernel) -> tuple[float, float]:
    """(cores, memory bytes) a kernel was allocated: what its utilization is a percentage of."""
    return float(Decimal(kernel.resources.get("cpu", "0"))), float(Decimal(kernel.resources.get("mem", "0")))


def session_facts(session: Session, activity: Activity | None, window: UtilizationWindow | None) -> SessionFacts:
    return SessionFacts(
        type=session.type,
        started_at=started_at(session),
        last_activity=activity.last if activity else None,
        open_connections=activity.open_connections if activity else 0,
        requested_slots=requested_slots(session),
        window=window,
    )
