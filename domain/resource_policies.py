"""Resource policies of users and projects: the limits the scheduler enforces and creation admits (the model and its
checks; kept in Redis by ``stores.resource_policies``).

A user policy caps
- ``max_concurrent_sessions``: sessions holding resources at once (SCHEDULED … TERMINATING); the scheduler keeps
  the rest PENDING with the reason;
- ``max_pending_sessions``: sessions queued at once; a creation beyond it is refused with ``QUOTA_EXCEEDED``
  (atomically: see :func:`pending_admission`);
- ``total_resource_slots``: per slot, what the user's running sessions may hold together, cluster-wide;
- ``max_priority``: the highest ``priority`` a USER may give a session (without it, the default priority: a USER
  cannot jump the queue by themself); admins are bounded only by the range 0-100 (:func:`check_priority`).

A project policy caps ``total_resource_slots`` of the project's sessions together. Both may also set
- ``max_session_lifetime`` and ``idle_timeout`` (seconds): the idle checker reclaims a RUNNING session past
  the strictest of its resource group's idle policy, its owner's and its project's (``domain.idle.owner_limits``);
- ``allowed_resource_groups`` and ``allowed_drivers``: a creation outside them is refused with ``FORBIDDEN``.

``None`` means unlimited, for a whole policy (nobody stored one) as for any of its fields; a slot not listed is
unlimited, a listed 0 allows none; an empty allowed list allows nothing. Stored JSON missing the newer fields
(written before they existed) reads as unlimited.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Any, NamedTuple

from core.errors import Forbidden
from domain.model import DEFAULT_PRIORITY, MAX_PRIORITY, Session
from domain.users import User

Slots = Mapping[str, Decimal]


def _limit(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be a whole number >= 0 or None, got {value!r}")


def _seconds(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a number of seconds > 0 or None, got {value!r}")
    return float(value)


def _names(name: str, value: Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f"{name} must be a list of names or None, got {value!r}")
    return tuple(sorted(set(value)))


def _slots(value: Mapping[str, Any] | None) -> Slots | None:
    if value is None:
        return None
    amounts: dict[str, Decimal] = {}
    for slot, raw in value.items():
        try:
            amount = Decimal(str(raw)) if not isinstance(raw, bool) else Decimal("nan")
        except InvalidOperation:
            amount = Decimal("nan")
        if not amount.is_finite() or amount < 0:
            raise ValueError(f"total_resource_slots.{slot} must be a number >= 0, got {raw!r}")
        amounts[str(slot)] = amount
    return MappingProxyType(amounts)


def _slots_json(slots: Slots | None) -> dict[str, str] | None:
    return None if slots is None else {slot: format(amount, "f") for slot, amount in slots.items()}


@dataclass(frozen=True, kw_only=True)
class _Common:
    """The fields user and project policies share, checked and normalized on construction."""

    total_resource_slots: Slots | None = None
    """Slot -> amount (cores, bytes, devices), exact; amounts given as strings or numbers are converted."""
    max_session_lifetime: float | None = None
    """Seconds a session may stay RUNNING."""
    idle_timeout: float | None = None
    """Seconds a session may go without user traffic (the idle checker's network timeout)."""
    allowed_resource_groups: tuple[str, ...] | None = None
    allowed_drivers: tuple[str, ...] | None = None
    """Driver names (``docker``, ``exec``, ``qemu``, ``raw_exec``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_resource_slots", _slots(self.total_resource_slots))
        for name in ("max_session_lifetime", "idle_timeout"):
            object.__setattr__(self, name, _seconds(name, getattr(self, name)))
        for name in ("allowed_resource_groups", "allowed_drivers"):
            object.__setattr__(self, name, _names(name, getattr(self, name)))

    def to_doc(self) -> dict[str, Any]:
        """The stored document (``core.codec`` writes it; a policy reads back with ``core.codec.decode``): the fields,
        with slot amounts as exact decimal strings in plain notation (``"10000000000"``, never ``"1E+10"``)."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["total_resource_slots"] = _slots_json(self.total_resource_slots)
        return doc


@dataclass(frozen=True, kw_only=True)
class UserResourcePolicy(_Common):
    max_concurrent_sessions: int | None = None
    max_pending_sessions: int | None = None
    max_priority: int | None = None
    """The highest session priority (0-100) the user may ask for; None: the default priority (a USER)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _limit("max_concurrent_sessions", self.max_concurrent_sessions)
        _limit("max_pending_sessions", self.max_pending_sessions)
        _limit("max_priority", self.max_priority)
        if self.max_priority is not None and self.max_priority > MAX_PRIORITY:
            raise ValueError(f"max_priority must be at most {MAX_PRIORITY}, got {self.max_priority}")


@dataclass(frozen=True, kw_only=True)
class ProjectResourcePolicy(_Common):
    pass


# -- decisions (pure) --


class SessionLimits(NamedTuple):
    """The policies' limits on one RUNNING session, the strictest of its owner's and its project's."""

    max_session_lifetime: float | None
    idle_timeout: float | None


def session_limits(*policies: _Common | None) -> SessionLimits:
    def strictest(name: str) -> float | None:
        values = [getattr(p, name) for p in policies if p is not None and getattr(p, name) is not None]
        return min(values) if values else None

    return SessionLimits(strictest("max_session_lifetime"), strictest("idle_timeout"))


def check_allowed(
    *,
    resource_group: str,
    driver: str,
    user: UserResourcePolicy | None,
    project: ProjectResourcePolicy | None,
    project_name: str,
) -> None:
    """Refuse (``FORBIDDEN`` on the field) a resource group or driver the owner's or the project's policy leaves out."""
    for whose, policy in (("your", user), (f"project {project_name}'s", project)):
        if policy is None:
            continue
        if policy.allowed_resource_groups is not None and resource_group not in policy.allowed_resource_groups:
            raise Forbidden(
                f"{whose} resource policy does not allow resource group {resource_group!r}", field="resourceGroup"
            )
        if policy.allowed_drivers is not None and driver not in policy.allowed_drivers:
            raise Forbidden(f"{whose} resource policy does not allow the {driver} driver", field="driver")


def check_admission(
    first: Session, *, viewer: User, user: UserResourcePolicy | None, project: ProjectResourcePolicy | None
) -> None:
    """Every check of the policies on a creation, given its first session (a creation's sessions share owner, project,
    resource group, driver and priority) and the owner's and project's policies: their allowed resource groups and
    drivers (:func:`check_allowed`), the priority ``viewer`` may give (:func:`check_priority`; the schedule runner
    passes the owner). Used by every creation: ``stores.creation_rules.Policies.admit``."""
    check_allowed(
        resource_group=first.resource_group,
        driver=first.driver.value,
        user=user,
        project=project,
        project_name=first.project,
    )
    check_priority(first.priority, viewer=viewer, policy=user)


def check_priority(priority: int, *, viewer: User, policy: UserResourcePolicy | None) -> None:
    """Refuse (``FORBIDDEN`` on ``priority``) a USER's priority above their policy's ``max_priority``, or above the
    default without one. Admins are bounded only by the range 0-100, which every request is checked against."""
    if viewer.is_admin:
        return
    limit = policy.max_priority if policy is not None and policy.max_priority is not None else None
    if priority > (DEFAULT_PRIORITY if limit is None else limit):
        allowed = (
            f"{limit}, the maxPriority of your resource policy"
            if limit is not None
            else f"the default, {DEFAULT_PRIORITY}: your resource policy sets no maxPriority"
        )
        raise Forbidden(f"priority {priority} is too high: yours may be at most {allowed}", field="priority")
