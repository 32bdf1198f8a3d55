"""The session state machine, table-driven."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from core.codec import decode, encode
from domain.lifecycle import (
    ALLOWED,
    IllegalTransition,
    batch_ending,
    derive_session_status,
    observe_kernel,
    restate,
    transition,
)
from domain.model import (
    Driver,
    Kernel,
    KernelObservation,
    Session,
    SessionResult,
    SessionType,
    StatusChange,
)
from domain.model import (
    SessionStatus as S,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def kernel(hostname: str, status: S = S.PENDING, role: str = "sub") -> Kernel:
    return Kernel(role=role, index=1, hostname=hostname, image="i", resources={}, status=status)


def session(*kernels: Kernel, type: SessionType = SessionType.BATCH, status: S = S.PENDING) -> Session:
    ks = kernels or (kernel("main1", role="main"),)
    return Session(
        id="s",
        name="name",
        owner_id="u",
        type=type,
        driver=Driver.EXEC,
        image="",
        resources={},
        kernels=ks,
        created_at=T0,
        status=status,
        status_history=(StatusChange(S.PENDING, T0, "created"),),
    )


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


@pytest.mark.parametrize(
    ("code", "result", "reason"),
    [(0, SessionResult.SUCCESS, "task-finished"), (3, SessionResult.FAILURE, "task-failed")],
)
def test_batch_result_follows_the_main_kernel(code: int, result: SessionResult, reason: str) -> None:
    running = session(kernel("main1", S.RUNNING, role="main"), status=S.RUNNING)
    seen = KernelObservation(hostname="main1", status=S.TERMINATED, reason="x", exit_code=code)
    after = observe_kernel(running, seen, at=T0)
    assert after is not None
    assert (after.status, after.result, after.exit_code, after.status_info) == (S.TERMINATED, result, code, reason)


def ended(hostname: str, code: int, detail: str | None = None) -> KernelObservation:
    return KernelObservation(hostname=hostname, status=S.TERMINATED, reason="x", exit_code=code, detail=detail)


def test_a_cluster_batch_ends_with_main1_whatever_its_subs_did() -> None:
    running = session(kernel("main1", S.RUNNING, role="main"), kernel("sub1", S.RUNNING), status=S.RUNNING)
    sub_done = observe_kernel(running, ended("sub1", 0), at=T0)  # a sub that succeeded decides nothing
    assert sub_done is not None and sub_done.result is SessionResult.UNDEFINED and batch_ending(sub_done) is None
    main_failed = observe_kernel(sub_done, ended("main1", 4, "Terminated: Exit Code: 4"), at=T1)
    assert main_failed is not None
    assert (main_failed.status, main_failed.result, main_failed.exit_code) == (S.TERMINATED, SessionResult.FAILURE, 4)
    assert (main_failed.status_info, main_failed.status_detail) == ("task-failed", "main1: Terminated: Exit Code: 4")


def test_a_failing_sub_fails_a_cluster_batch_at_once() -> None:
    running = session(kernel("main1", S.RUNNING, role="main"), kernel("sub1", S.RUNNING), status=S.RUNNING)
    failed = observe_kernel(running, ended("sub1", 3, "Terminated: Exit Code: 3"), at=T0)
    assert failed is not None
    assert (failed.status, failed.result, failed.exit_code) == (S.RUNNING, SessionResult.FAILURE, 3)
    assert batch_ending(failed) == ("task-failed", "sub1: Terminated: Exit Code: 3")
    stopping = transition(failed, S.TERMINATING, reason="task-failed", detail="sub1: …", at=T1)
    assert batch_ending(stopping) is None
    stopped = observe_kernel(stopping, ended("main1", 143), at=T2)  # main1 stopped: the result stays the sub's
    assert stopped is not None
    assert (stopped.status, stopped.result, stopped.exit_code, stopped.status_info) == (
        S.TERMINATED,
        SessionResult.FAILURE,
        3,
        "task-failed",
    )


def test_a_sub_stopped_with_its_session_decides_nothing() -> None:
    running = session(kernel("main1", S.RUNNING, role="main"), kernel("sub1", S.RUNNING), status=S.RUNNING)
    stopping = transition(running, S.TERMINATING, reason="user-requested", at=T0)
    after = observe_kernel(stopping, ended("sub1", 143), at=T1)
    assert after is not None and after.result is SessionResult.UNDEFINED and after.exit_code is None


def test_late_reports_do_not_revive_a_finished_kernel() -> None:
    done = session(kernel("main1", S.TERMINATED, role="main"), kernel("sub1", S.RUNNING), status=S.RUNNING)
    assert observe_kernel(done, KernelObservation(hostname="main1", status=S.RUNNING, reason="x"), at=T0) is None


def test_a_stopping_session_keeps_the_reason_it_was_stopped_for() -> None:
    stopping = transition(
        session(kernel("main1", S.RUNNING, role="main"), status=S.RUNNING),
        S.TERMINATING,
        reason="user-requested",
        at=T0,
    )
    after = observe_kernel(
        stopping, KernelObservation(hostname="main1", status=S.TERMINATED, reason="x", exit_code=0), at=T0
    )
    assert after is not None and (after.status, after.status_info) == (S.TERMINATED, "user-requested")


def test_started_at_is_recorded_once() -> None:
    scheduled = transition(session(), S.SCHEDULED, reason="scheduled", at=T0)
    running = transition(scheduled, S.RUNNING, reason="kernels-running", at=T0 + timedelta(seconds=5))
    assert running.started_at == T0 + timedelta(seconds=5)


def test_json_round_trip() -> None:
    original = session().evolve(starts_at=T0, dependencies=("a", "b"), preopen_ports=(8080,), batch_timeout=3.5)
    assert decode(encode(original), Session) == original


# -- Nomad's reasons and times (issue 11) ---------------------------------------------------------------------------

T1, T2, T3 = (T0 + timedelta(seconds=s) for s in (1, 2, 3))


def preparing(*kernels: Kernel, type: SessionType = SessionType.BATCH) -> Session:
    return transition(
        transition(session(*kernels, type=type), S.SCHEDULED, reason="scheduled", at=T0),
        S.PREPARING,
        reason="job-registered",
        at=T0,
    )


def test_a_batch_that_ran_between_two_observations_has_nomads_start_and_end() -> None:
    seen = KernelObservation(
        hostname="main1",
        status=S.TERMINATED,
        reason="task-finished",
        exit_code=0,
        alloc_id="a",
        started_at=T1,
        finished_at=T2,
    )
    after = observe_kernel(preparing(), seen, at=T3)
    assert after is not None and after.status is S.TERMINATED
    assert (after.started_at, after.main_kernel.started_at, after.main_kernel.finished_at) == (T1, T1, T2)
    assert after.terminated_at == T2  # when it ended, not when it was noticed
    assert after.status_detail is None


def test_a_change_is_never_recorded_before_the_previous_one_nor_after_now() -> None:
    early = KernelObservation(
        hostname="main1", status=S.RUNNING, reason="kernel-running", alloc_id="a", started_at=T0 - timedelta(seconds=5)
    )  # a Nomad client's clock behind ours
    running = observe_kernel(preparing(), early, at=T3)
    assert running is not None and running.status_history[-1].at == T0
    assert running.started_at == T0 - timedelta(seconds=5)  # the start itself is Nomad's
    late = KernelObservation(
        hostname="main1",
        status=S.TERMINATED,
        reason="task-finished",
        exit_code=0,
        alloc_id="a",
        started_at=T1,
        finished_at=T3 + timedelta(hours=1),
    )
    ended = observe_kernel(running, late, at=T3)
    assert ended is not None and ended.terminated_at == T3


def test_a_kernel_keeps_its_first_start_across_restarts() -> None:
    first = KernelObservation(hostname="main1", status=S.RUNNING, reason="kernel-running", alloc_id="a", started_at=T1)
    running = observe_kernel(preparing(type=SessionType.INTERACTIVE), first, at=T1)
    assert running is not None
    again = observe_kernel(
        running,
        KernelObservation(
            hostname="main1", status=S.RUNNING, reason="kernel-running", alloc_id="a", restarts=1, started_at=T3
        ),
        at=T3,
    )
    assert again is not None and again.main_kernel.started_at == T1 and again.main_kernel.finished_at is None


def test_a_failure_gives_the_session_the_kernels_detail_naming_it_among_several() -> None:
    start = preparing(kernel("main1", S.PREPARING, role="main"), kernel("sub1", S.PREPARING))
    seen = KernelObservation(
        hostname="sub1",
        status=S.ERROR,
        reason="failed-to-start",
        alloc_id="b",
        detail="Driver Failure: Failed to pull `x:1`",
        finished_at=T1,
    )
    after = observe_kernel(start, seen, at=T2)
    assert after is not None
    assert (after.status, after.status_info, after.status_detail) == (
        S.ERROR,
        "failed-to-start",
        "sub1: Driver Failure: Failed to pull `x:1`",
    )
    assert after.kernels[1].status_detail == "Driver Failure: Failed to pull `x:1`"
    assert after.status_history[-1] == StatusChange(
        S.ERROR, T1, "failed-to-start", "sub1: Driver Failure: Failed to pull `x:1`"
    )


def test_a_preparing_session_says_why_it_waits_and_stops_saying_it_once_placed() -> None:
    start = preparing()
    unplaced = KernelObservation(
        hostname="main1",
        status=S.PREPARING,
        reason="unplaceable",
        placed=False,
        detail="Nomad cannot place it: constraint 'x' excluded 1 node",
    )
    waiting = observe_kernel(start, unplaced, at=T1)
    assert waiting is not None and waiting.status is S.PREPARING
    assert waiting.status_history[-1] == StatusChange(S.PREPARING, T1, "unplaceable", unplaced.detail)
    assert observe_kernel(waiting, unplaced, at=T2) is None  # said once
    placed = observe_kernel(
        waiting,
        KernelObservation(hostname="main1", status=S.PREPARING, reason="allocation-pending", alloc_id="a"),
        at=T2,
    )
    assert placed is not None
    assert (placed.status_info, placed.status_detail, placed.status_history[-1].at) == ("allocation-pending", None, T2)
    # an evaluation's failure reported after Nomad placed the kernel does not take it back
    assert observe_kernel(placed, unplaced, at=T3) is None


def test_a_scheduled_session_becomes_preparing_with_the_reason_it_waits() -> None:
    scheduled = transition(session(), S.SCHEDULED, reason="scheduled", at=T0)
    unplaced = KernelObservation(
        hostname="main1",
        status=S.PREPARING,
        reason="unplaceable",
        placed=False,
        detail="Nomad cannot place it: no nodes were eligible for evaluation",
    )
    after = observe_kernel(scheduled, unplaced, at=T1)
    assert after is not None and (after.status, after.status_info, after.status_detail) == (
        S.PREPARING,
        "unplaceable",
        unplaced.detail,
    )


def test_a_restarting_kernel_gives_a_preparing_session_its_failure() -> None:
    seen = KernelObservation(
        hostname="main1",
        status=S.PREPARING,
        reason="restarting",
        alloc_id="a",
        restarts=1,
        detail="Driver Failure: Failed to pull `x:1`",
    )
    after = observe_kernel(preparing(type=SessionType.INTERACTIVE), seen, at=T1)
    assert after is not None and (after.status_info, after.status_detail) == ("restarting", seen.detail)


def test_a_running_session_is_not_restated() -> None:
    running = session(kernel("main1", S.RUNNING, role="main"), status=S.RUNNING, type=SessionType.INTERACTIVE)
    seen = KernelObservation(
        hostname="main1",
        status=S.PREPARING,
        reason="restarting",
        alloc_id="a",
        restarts=1,
        detail="Terminated: Exit Code: 1",
    )
    after = observe_kernel(running, seen, at=T1)
    assert after is not None and after.status_history == running.status_history
    assert after.main_kernel.status_detail == "Terminated: Exit Code: 1"


def test_restate_is_for_preparing_and_running_sessions_only() -> None:
    with pytest.raises(ValueError):
        restate(session(status=S.TERMINATED), reason="x", detail=None, at=T0)


def test_a_kernel_failing_while_its_session_is_stopped_ends_the_session() -> None:
    # An ERROR session destroyed goes TERMINATING; its failed kernel's allocation is reported again: it ends.
    failed = KernelObservation(hostname="sub1", status=S.ERROR, reason="failed-to-start", alloc_id="b", finished_at=T1)
    errored = observe_kernel(
        preparing(kernel("main1", S.RUNNING, role="main"), kernel("sub1", S.PREPARING)), failed, at=T1
    )
    assert errored is not None and errored.status is S.ERROR
    stopping = transition(errored, S.TERMINATING, reason="user-requested", at=T2)
    assert observe_kernel(stopping, failed, at=T2) is None  # main1 still runs: still TERMINATING
    ended = observe_kernel(
        stopping,
        KernelObservation(
            hostname="main1", status=S.TERMINATED, reason="task-finished", exit_code=0, alloc_id="a", finished_at=T3
        ),
        at=T3,
    )
    assert ended is not None and (ended.status, ended.status_info, ended.terminated_at) == (
        S.TERMINATED,
        "user-requested",
        T3,
    )


def test_json_round_trip_keeps_reasons_and_kernel_times() -> None:
    start = preparing()
    seen = KernelObservation(
        hostname="main1",
        status=S.TERMINATED,
        reason="task-failed",
        exit_code=3,
        alloc_id="a",
        detail="Terminated: Exit Code: 3",
        started_at=T1,
        finished_at=T2,
    )
    after = observe_kernel(start, seen, at=T3)
    assert after is not None and decode(encode(after), Session) == after
