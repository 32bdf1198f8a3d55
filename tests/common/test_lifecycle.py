"""The session state machine, table-driven."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from common.lifecycle import ALLOWED, IllegalTransition, derive_session_status, observe_kernel, transition
from common.model import (Driver, Kernel, KernelObservation, Session, SessionResult, SessionStatus as S,
                          SessionType, StatusChange)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def kernel(hostname: str, status: S = S.PENDING, role: str = "sub") -> Kernel:
    return Kernel(role=role, index=1, hostname=hostname, image="i", resources={}, status=status)


def session(*kernels: Kernel, type: SessionType = SessionType.BATCH, status: S = S.PENDING) -> Session:
    ks = kernels or (kernel("main1", role="main"),)
    return Session(id="s", name="name", owner_id="u", type=type, driver=Driver.EXEC, image="", resources={},
                   kernels=ks, created_at=T0, status=status,
                   status_history=(StatusChange(S.PENDING, T0, "created"),))


@pytest.mark.parametrize("current", list(S), ids=str)
@pytest.mark.parametrize("target", list(S), ids=str)
def test_only_listed_transitions_are_written(current: S, target: S) -> None:
    start = session(status=current)
    if target in ALLOWED[current]:
        after = transition(start, target, reason="why", at=T0 + timedelta(seconds=1))
        assert after.status is target and after.status_info == "why"
        assert after.status_history[-1] == StatusChange(target, T0 + timedelta(seconds=1), "why")
    else:
        with pytest.raises(IllegalTransition):
            transition(start, target, reason="why", at=T0)


def test_terminal_statuses_have_no_way_out() -> None:
    assert ALLOWED[S.TERMINATED] == ALLOWED[S.CANCELLED] == frozenset()


@pytest.mark.parametrize(
    ("kernel_statuses", "expected"),
    [
        ((S.RUNNING, S.RUNNING), S.RUNNING),
        ((S.RUNNING, S.PREPARING), S.PREPARING),
        ((S.TERMINATED, S.RUNNING), S.RUNNING),
        ((S.TERMINATED, S.TERMINATING), S.TERMINATING),
        ((S.RUNNING, S.ERROR), S.ERROR),
        ((S.TERMINATED, S.TERMINATED), S.TERMINATED),
        ((S.CANCELLED, S.CANCELLED), S.CANCELLED),
    ],
    ids=lambda v: "-".join(x.value for x in v) if isinstance(v, tuple) else v.value,
)
def test_slowest_kernel_wins_and_error_wins(kernel_statuses: tuple[S, ...], expected: S) -> None:
    assert derive_session_status(kernel("k", s) for s in kernel_statuses) is expected


@pytest.mark.parametrize(("code", "result", "reason"), [(0, SessionResult.SUCCESS, "task-finished"),
                                                         (3, SessionResult.FAILURE, "task-failed")])
def test_batch_result_follows_the_main_kernel(code: int, result: SessionResult, reason: str) -> None:
    running = session(kernel("main1", S.RUNNING, role="main"), status=S.RUNNING)
    seen = KernelObservation(hostname="main1", status=S.TERMINATED, reason="x", exit_code=code)
    after = observe_kernel(running, seen, at=T0)
    assert after is not None
    assert (after.status, after.result, after.exit_code, after.status_info) == (S.TERMINATED, result, code, reason)


def test_late_reports_do_not_revive_a_finished_kernel() -> None:
    done = session(kernel("main1", S.TERMINATED, role="main"), kernel("sub1", S.RUNNING), status=S.RUNNING)
    assert observe_kernel(done, KernelObservation(hostname="main1", status=S.RUNNING, reason="x"), at=T0) is None


def test_a_stopping_session_keeps_the_reason_it_was_stopped_for() -> None:
    stopping = transition(session(kernel("main1", S.RUNNING, role="main"), status=S.RUNNING),
                          S.TERMINATING, reason="user-requested", at=T0)
    after = observe_kernel(stopping, KernelObservation(hostname="main1", status=S.TERMINATED, reason="x",
                                                       exit_code=0), at=T0)
    assert after is not None and (after.status, after.status_info) == (S.TERMINATED, "user-requested")


def test_started_at_is_recorded_once() -> None:
    scheduled = transition(session(), S.SCHEDULED, reason="scheduled", at=T0)
    running = transition(scheduled, S.RUNNING, reason="kernels-running", at=T0 + timedelta(seconds=5))
    assert running.started_at == T0 + timedelta(seconds=5)


def test_json_round_trip() -> None:
    original = session().evolve(starts_at=T0, dependencies=("a", "b"), preopen_ports=(8080,), batch_timeout=3.5)
    assert Session.from_json(original.to_json()) == original
