"""A stored session read the way the idle checks see it. Pure.

Lifetime and grace periods count from when the session became RUNNING (``Session.started_at``), not
from creation: time spent queued is not the user's.

The functions here take any :class:`SweptSession`: a whole :class:`~domain.model.Session` (the gateway's
``idleChecks``) or the :class:`SessionView` the idle service reads every sweep. The view decodes only the dozen fields
the checks read from a stored session's document and skips the rest (its rendered job, most of the document): reading
RUNNING sessions that way costs a fraction of decoding them whole (``bench/idle``; the figures in bench/README.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import lru_cache
from typing import NamedTuple, Protocol

from domain.idle.arbiter import SessionFacts, checked_thresholds
from domain.idle.config import EffectivePolicy, IdlePolicyConfig
from domain.idle.owner_limits import tightened
from domain.idle.window import UtilizationWindow
from domain.model import SessionStatus, SessionType
from domain.resource_policies import SessionLimits


class SweptKernel(Protocol):
    """What the idle checks read of a kernel (:class:`domain.model.Kernel` is one)."""

    @property
    def hostname(self) -> str: ...
    @property
    def resources(self) -> Mapping[str, str]: ...
    @property
    def alloc_id(self) -> str | None: ...


class SweptChange(Protocol):
    @property
    def status(self) -> SessionStatus: ...
    @property
    def at(self) -> datetime: ...


class SweptSession(Protocol):
    """What the idle checks read of a session (:class:`domain.model.Session` is one, :class:`SessionView` too)."""

    @property
    def id(self) -> str: ...
    @property
    def owner_id(self) -> str: ...
    @property
    def project(self) -> str: ...
    @property
    def type(self) -> SessionType: ...
    @property
    def status(self) -> SessionStatus: ...
    @property
    def resource_group(self) -> str: ...
    @property
    def resources(self) -> Mapping[str, str]: ...
    @property
    def kernels(self) -> Sequence[SweptKernel]: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def status_history(self) -> Sequence[SweptChange]: ...


@dataclass(frozen=True, slots=True)
class KernelView:
    """The fields of a stored :class:`domain.model.Kernel` the idle checks read (same names, types and defaults)."""

    hostname: str
    resources: dict[str, str]
    """Slot -> amount, exact decimal strings."""
    alloc_id: str | None = None


@dataclass(frozen=True, slots=True)
class StatusChangeView:
    status: SessionStatus
    at: datetime


@dataclass(frozen=True, slots=True)
class SessionView:
    """A stored :class:`domain.model.Session` document read as the idle sweep needs it (``core.codec`` ignores the
    fields not named here; those named keep the model's names, types and defaults, so any session document reads)."""

    id: str
    owner_id: str
    type: SessionType
    resources: dict[str, str]
    kernels: tuple[KernelView, ...]
    created_at: datetime
    status: SessionStatus = SessionStatus.PENDING
    status_history: tuple[StatusChangeView, ...] = ()
    resource_group: str = "default"
    project: str = "default"
    started_at: datetime | None = None


class Activity(NamedTuple):
    """A session's user traffic as the gateway records it (``stores.activity``)."""

    last: datetime | None
    """The last recorded user traffic; None if none was recorded."""
    open_connections: int

    def with_client_seen(self, seen_at: datetime, *, now: datetime, connected_within: float) -> Activity:
        """This activity with a client the session's own server saw connected at ``seen_at`` (an SFTP session's
        watcher, ``domain.sftp``): activity then, and one open connection more while ``seen_at`` is less than
        ``connected_within`` seconds before ``now``."""
        last = seen_at if self.last is None else max(self.last, seen_at)
        connected = (now - seen_at).total_seconds() < connected_within
        return Activity(last, self.open_connections + connected)


def policy_for(config: IdlePolicyConfig, session: SweptSession, limits: SessionLimits | None = None) -> EffectivePolicy:
    """The policy ``session`` is judged by: the file's, tightened by ``limits``, its owner's and project's resource
    policies (:mod:`domain.idle.owner_limits`).

    Caravan's users carry no idle-policy name yet, so ``user_policy`` blocks of the file apply to nobody;
    this is the one place to pass it once they do.
    """
    policy = config.effective(resource_group=session.resource_group, user_policy=None)
    return tightened(policy, limits, config.enabled) if limits is not None else policy


def started_at(session: SweptSession) -> datetime:
    """When the session became RUNNING (sessions stored before ``started_at`` existed: from the history)."""
    if session.started_at is not None:
        return session.started_at
    for change in reversed(session.status_history):
        if change.status is SessionStatus.RUNNING:
            return change.at
    return session.created_at


def requested_slots(session: SweptSession) -> dict[str, Decimal]:
    """Slot -> the most any kernel requested (which devices the session uses: a cluster's roles may differ)."""
    found: dict[str, Decimal] = {}
    for kernel in session.kernels:
        for slot, amount in kernel.resources.items():
            found[slot] = max(found.get(slot, Decimal(0)), Decimal(amount))
    return found if session.kernels else {slot: Decimal(amount) for slot, amount in session.resources.items()}


def checked_metrics(
    session: SweptSession, policy: EffectivePolicy, slots: Mapping[str, Decimal] | None = None
) -> Mapping[str, float]:
    """Metric -> threshold judged for ``session``; empty when utilization is not checked for it (``slots``: its
    :func:`requested_slots` when the caller has them already)."""
    if policy.utilization is None:
        return {}
    return checked_thresholds(policy.utilization, requested_slots(session) if slots is None else slots)


def kernel_allocation(kernel: SweptKernel) -> tuple[float, float]:
    """(cores, memory bytes) a kernel was allocated: what its utilization is a percentage of."""
    resources = kernel.resources
    return _allocation(resources.get("cpu", "0"), resources.get("mem", "0"))


@lru_cache(maxsize=1024)
def _allocation(cpu: str, mem: str) -> tuple[float, float]:
    # kernels ask for a handful of sizes; the sweep asks for every kernel's every sweep (two Decimal parses each)
    return float(Decimal(cpu)), float(Decimal(mem))


def session_facts(
    session: SweptSession,
    activity: Activity | None,
    window: UtilizationWindow | None,
    slots: Mapping[str, Decimal] | None = None,
) -> SessionFacts:
    """``slots``: the session's :func:`requested_slots` when the caller has them already."""
    return SessionFacts(
        type=session.type,
        started_at=started_at(session),
        last_activity=activity.last if activity else None,
        open_connections=activity.open_connections if activity else 0,
        requested_slots=requested_slots(session) if slots is None else slots,
        window=window,
    )
