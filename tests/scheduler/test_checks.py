"""Non-resource checks: each check alone, all failures recorded, never blocking, dependency failure cancels."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

import pytest

from scheduler.pass_model import (
    DependencyState,
    PendingSession,
    ProjectPolicy,
    RunningSession,
    Snapshot,
    UserPolicy,
    WaitKind,
)
from scheduler.wait_checks import (
    DEPENDENCY_FAILED,
    Check,
    CheckContext,
    Usage,
    check_concurrency,
    check_dependencies,
    check_project_quota,
    check_start_time,
    check_user_quota,
    failed_checks,
)
from tests.scheduler.builders import T0, agent, run, session, slots

NOW = T0 + timedelta(hours=1)
DONE, WAITING, FAILED = DependencyState.DONE, DependencyState.WAITING, DependencyState.FAILED


@dataclass(frozen=True)
class CheckCase:
    name: str
    check: Check
    session: PendingSession
    passed: bool
    message: str = ""
    cancel: str | None = None
    dependency_states: dict[str, DependencyState] = field(default_factory=dict)
    user_policies: dict[str, UserPolicy] = field(default_factory=dict)
    project_policies: dict[str, ProjectPolicy] = field(default_factory=dict)
    running: tuple[RunningSession, ...] = ()


CASES = [
    CheckCase("start-time-none", check_start_time, session("s", {"cpu": 1}), True),
    CheckCase(
        "start-time-future",
        check_start_time,
        session("s", {"cpu": 1}, starts_at=NOW + timedelta(seconds=1)),
        False,
        "starts at",
    ),
    CheckCase("start-time-now-passes", check_start_time, session("s", {"cpu": 1}, starts_at=NOW), True),
    CheckCase(
        "deps-all-done",
        check_dependencies,
        session("s", {"cpu": 1}, dependencies=("d1", "d2")),
        True,
        dependency_states={"d1": DONE, "d2": DONE},
    ),
    CheckCase(
        "deps-waiting",
        check_dependencies,
        session("s", {"cpu": 1}, dependencies=("d1", "d2")),
        False,
        "waiting for dependencies: d2",
        dependency_states={"d1": DONE, "d2": WAITING},
    ),
    CheckCase(
        "deps-unknown-counts-as-waiting",
        check_dependencies,
        session("s", {"cpu": 1}, dependencies=("d9",)),
        False,
        "d9",
    ),
    CheckCase(
        "deps-failed-cancels",
        check_dependencies,
        session("s", {"cpu": 1}, dependencies=("d1", "d2")),
        False,
        "dependencies failed: d2",
        DEPENDENCY_FAILED,
        dependency_states={"d1": WAITING, "d2": FAILED},
    ),
    CheckCase(
        "concurrency-unlimited",
        check_concurrency,
        session("s", {"cpu": 1}),
        True,
        running=(RunningSession("r", "u", "g", slots(cpu=1)),) * 5,
    ),
    CheckCase(
        "concurrency-below-limit",
        check_concurrency,
        session("s", {"cpu": 1}),
        True,
        user_policies={"u": UserPolicy(max_concurrent_sessions=2)},
        running=(RunningSession("r", "u", "g", slots(cpu=1)),),
    ),
    CheckCase(
        "concurrency-at-limit",
        check_concurrency,
        session("s", {"cpu": 1}),
        False,
        "already runs 2 of 2",
        user_policies={"u": UserPolicy(max_concurrent_sessions=2)},
        running=(RunningSession("r1", "u", "g", slots(cpu=1)), RunningSession("r2", "u", "other", slots(cpu=1))),
    ),
    CheckCase(
        "concurrency-zero-blocks-all",
        check_concurrency,
        session("s", {"cpu": 1}),
        False,
        "0 of 0",
        user_policies={"u": UserPolicy(max_concurrent_sessions=0)},
    ),
    CheckCase(
        "user-quota-fits",
        check_user_quota,
        session("s", {"cpu": 2}),
        True,
        user_policies={"u": UserPolicy(total_resource_slots={"cpu": Decimal(4)})},
        running=(RunningSession("r", "u", "g", slots(cpu=2)),),
    ),
    CheckCase(
        "user-quota-exceeded",
        check_user_quota,
        session("s", {"cpu": 2, "mem": "2g"}),
        False,
        "cpu: 3 held + 2 requested > limit 4",
        user_policies={"u": UserPolicy(total_resource_slots={"cpu": Decimal(4)})},
        running=(RunningSession("r", "u", "g", slots(cpu=3)),),
    ),
    CheckCase(
        "user-quota-listed-zero-allows-none",
        check_user_quota,
        session("s", {"cuda.shares": 1}),
        False,
        "cuda.shares",
        user_policies={"u": UserPolicy(total_resource_slots={"cuda.shares": Decimal(0)})},
    ),
    CheckCase(
        "user-quota-unlisted-slot-unlimited",
        check_user_quota,
        session("s", {"mem": "1t"}),
        True,
        user_policies={"u": UserPolicy(total_resource_slots={"cpu": Decimal(1)})},
    ),
    CheckCase(
        "project-quota-exceeded",
        check_project_quota,
        session("s", {"mem": "3g"}, project="p"),
        False,
        "project p quota exceeded: mem: 2 GiB held + 3 GiB requested > limit 4 GiB",
        project_policies={"p": ProjectPolicy(total_resource_slots={"mem": Decimal(4 * 1024**3)})},
        running=(RunningSession("r", "other-user", "g", slots(mem="2g"), project="p"),),
    ),
    CheckCase(
        "project-quota-no-project",
        check_project_quota,
        session("s", {"mem": "3g"}),
        True,
        project_policies={"p": ProjectPolicy(total_resource_slots={"mem": Decimal(0)})},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_check(case: CheckCase) -> None:
    snapshot = Snapshot((), (), case.running, case.dependency_states, case.user_policies, case.project_policies)
    context = CheckContext(
        NOW, case.dependency_states, case.user_policies, case.project_policies, Usage.from_snapshot(snapshot)
    )
    result = case.check(case.session, context)
    assert result.passed is case.passed
    assert case.message in result.message
    assert result.cancel_reason == case.cancel


def test_every_failure_is_recorded() -> None:
    late = session("s", {"cpu": 1}, starts_at=NOW + timedelta(hours=1), dependencies=("d",))
    context = CheckContext(NOW, {}, {"u": UserPolicy(max_concurrent_sessions=0)}, {}, Usage())
    assert [r.name for r in failed_checks(late, context)] == ["start-time", "dependencies", "concurrency"]


def test_non_resource_failures_never_block_anyone() -> None:
    # strict FIFO: the three oldest fail checks, the youngest still runs
    pending = [
        session("future", {"cpu": 1}, at=0, starts_at=NOW + timedelta(minutes=5)),
        session("waits-dep", {"cpu": 1}, at=1, dependencies=("d",)),
        session("capped", {"cpu": 1}, at=2, user="capped"),
        session("ok", {"cpu": 1}, at=3),
    ]
    result = run(
        [agent("a1", {"cpu": 4})],
        pending,
        now=NOW,
        dependency_states={"d": WAITING},
        user_policies={"capped": UserPolicy(max_concurrent_sessions=0)},
    )
    assert set(result.placements) == {"ok"}
    for sid in ("future", "waits-dep", "capped"):
        assert result.waiting[sid].kind is WaitKind.CHECKS_FAILED
        assert len(result.waiting[sid].failed_checks) == 1
    assert result.retry_increments == {}
    assert result.queue_positions == {"future": 1, "waits-dep": 2, "capped": 3}


def test_failed_dependency_cancels_even_when_blocked() -> None:
    pending = [
        session("head", {"cpu": 5}, at=0),
        session("child", {"cpu": 1}, at=1, dependencies=("d",)),
        session("tail", {"cpu": 1}, at=2),
    ]
    result = run([agent("a1", {"cpu": 8}, {"cpu": 4})], pending, dependency_states={"d": FAILED})
    assert result.cancellations["child"].reason == "dependency-failed"
    assert "d" in result.cancellations["child"].message
    assert "child" not in result.waiting and "child" not in result.queue_positions
    assert result.waiting["tail"].kind is WaitKind.BLOCKED


def test_concurrency_and_quota_count_placements_of_the_same_pass() -> None:
    pending = [session(f"c{n}", {"cpu": 1}, user="c", at=n) for n in range(3)]
    pending += [session(f"q{n}", {"cpu": 2}, user="q", at=10 + n) for n in range(3)]
    pending += [session(f"p{n}", {"cpu": 1}, user=f"pu{n}", project="p", at=20 + n) for n in range(3)]
    result = run(
        [agent("a1", {"cpu": 64})],
        pending,
        running=(RunningSession("r", "c", "g", slots(cpu=1)),),
        user_policies={
            "c": UserPolicy(max_concurrent_sessions=2),
            "q": UserPolicy(total_resource_slots={"cpu": Decimal(4)}),
        },
        project_policies={"p": ProjectPolicy(total_resource_slots={"cpu": Decimal(1)})},
    )
    assert set(result.placements) == {"c0", "q0", "q1", "p0"}
    assert {sid for sid, w in result.waiting.items() if w.kind is WaitKind.CHECKS_FAILED} == {
        "c1",
        "c2",
        "q2",
        "p1",
        "p2",
    }
