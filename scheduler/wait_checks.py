"""Checks that are not about agent resources: each is a small pure function ``(session, context) -> CheckResult``.

All checks are evaluated for every session (so the user sees every reason at once) and a failure never blocks another
session. A failed dependency is the one failure that ends the session: its result carries
``cancel_reason = "dependency-failed"`` (Backend.AI leaves such sessions PENDING forever).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from domain.slots import ResourceSlots, format_amount
from scheduler.pass_model import DependencyState, PendingSession, ProjectPolicy, Snapshot, UserPolicy

__all__ = ["CHECKS", "DEPENDENCY_FAILED", "CheckContext", "CheckResult", "Usage", "failed_checks", "may_fail"]

DEPENDENCY_FAILED = "dependency-failed"


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    message: str = ""
    cancel_reason: str | None = None


@dataclass
class Usage:
    """What users and projects hold, cluster-wide, updated as the pass places sessions (mutable, one pass only).

    Slot sums are kept only for users and projects that have a slot quota: nobody else needs them.
    """

    sessions_by_user: dict[str, int] = field(default_factory=dict)
    slots_by_user: dict[str, ResourceSlots] = field(default_factory=dict)
    slots_by_project: dict[str, ResourceSlots] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> Usage:
        usage = cls(
            slots_by_user={u: ResourceSlots() for u, p in snapshot.user_policies.items() if p.total_resource_slots},
            slots_by_project={
                name: ResourceSlots() for name, p in snapshot.project_policies.items() if p.total_resource_slots
            },
        )
        for running in snapshot.running:
            usage.add(running.user, running.project, running.occupied)
        return usage

    def add(self, user: str, project: str | None, slots: ResourceSlots) -> None:
        self.sessions_by_user[user] = self.sessions_by_user.get(user, 0) + 1
        if user in self.slots_by_user:
            self.slots_by_user[user] += slots
        if project is not None and project in self.slots_by_project:
            self.slots_by_project[project] += slots

    def add_placed(self, user: str, project: str | None, session: PendingSession) -> None:
        """``user`` and ``project``: the session's (at hand in the caller); its slots are read only when tracked."""
        if user in self.slots_by_user or (project is not None and project in self.slots_by_project):
            self.add(user, project, session.requested)
        else:
            self.sessions_by_user[user] = self.sessions_by_user.get(user, 0) + 1


@dataclass(frozen=True)
class CheckContext:
    now: datetime
    dependency_states: Mapping[str, DependencyState]
    user_policies: Mapping[str, UserPolicy]
    project_policies: Mapping[str, ProjectPolicy]
    usage: Usage


Check = Callable[[PendingSession, CheckContext], CheckResult]


def check_start_time(session: PendingSession, context: CheckContext) -> CheckResult:
    if session.starts_at is not None and context.now < session.starts_at:
        return CheckResult("start-time", False, f"starts at {session.starts_at.isoformat()}")
    return CheckResult("start-time", True)


def check_dependencies(session: PendingSession, context: CheckContext) -> CheckResult:
    states = {dep: context.dependency_states.get(dep, DependencyState.WAITING) for dep in session.dependencies}
    failed = sorted(dep for dep, state in states.items() if state is DependencyState.FAILED)
    if failed:
        return CheckResult("dependencies", False, f"dependencies failed: {', '.join(failed)}", DEPENDENCY_FAILED)
    waiting = sorted(dep for dep, state in states.items() if state is not DependencyState.DONE)
    if waiting:
        return CheckResult("dependencies", False, f"waiting for dependencies: {', '.join(waiting)}")
    return CheckResult("dependencies", True)


def check_concurrency(session: PendingSession, context: CheckContext) -> CheckResult:
    policy = context.user_policies.get(session.user)
    limit = policy.max_concurrent_sessions if policy else None
    running = context.usage.sessions_by_user.get(session.user, 0)
    if limit is not None and running + 1 > limit:
        return CheckResult("concurrency", False, f"user {session.user} already runs {running} of {limit} sessions")
    return CheckResult("concurrency", True)


def _over_quota(held: ResourceSlots, requested: ResourceSlots, limits: Mapping[str, Decimal]) -> list[str]:
    return sorted(slot for slot, limit in limits.items() if held.amount(slot) + requested.amount(slot) > limit)


def _quota_result(
    name: str, scope: str, held: ResourceSlots | None, session: PendingSession, limits: Mapping[str, Decimal] | None
) -> CheckResult:
    if not limits or held is None:
        return CheckResult(name, True)
    over = _over_quota(held, session.requested, limits)
    if not over:
        return CheckResult(name, True)
    parts = "; ".join(
        f"{slot}: {format_amount(slot, held.amount(slot))} held + "
        f"{format_amount(slot, session.requested.amount(slot))} requested > limit {format_amount(slot, limits[slot])}"
        for slot in over
    )
    return CheckResult(name, False, f"{scope} quota exceeded: {parts}")


def check_user_quota(session: PendingSession, context: CheckContext) -> CheckResult:
    policy = context.user_policies.get(session.user)
    held = context.usage.slots_by_user.get(session.user)
    limits = policy.total_resource_slots if policy else None
    return _quota_result("user-quota", f"user {session.user}", held, session, limits)


def check_project_quota(session: PendingSession, context: CheckContext) -> CheckResult:
    if session.project is None:
        return CheckResult("project-quota", True)
    policy = context.project_policies.get(session.project)
    held = context.usage.slots_by_project.get(session.project)
    limits = policy.total_resource_slots if policy else None
    return _quota_result("project-quota", f"project {session.project}", held, session, limits)


CHECKS: tuple[Check, ...] = (
    check_start_time,
    check_dependencies,
    check_concurrency,
    check_user_quota,
    check_project_quota,
)


def failed_checks(
    session: PendingSession, context: CheckContext, checks: Iterable[Check] = CHECKS
) -> list[CheckResult]:
    """Every failing check (all are evaluated, none short-circuits)."""
    if checks is CHECKS and not may_fail(session, context):
        return []
    return [result for result in (check(session, context) for check in checks) if not result.passed]


def may_fail(session: PendingSession, context: CheckContext) -> bool:
    """Cheap guard: most sessions have no start time, no dependencies and no policy, so no built-in check applies."""
    return bool(
        session.starts_at is not None
        or session.dependencies
        or session.user in context.user_policies
        or (session.project is not None and session.project in context.project_policies)
    )
