"""A batch kernel whose command never ran (its allocation's set-up failed) is started again, a bounded number of
times (pure: ``domain.start_retry`` through ``observe_kernel``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from domain.lifecycle import observe_kernel
from domain.model import KernelObservation, Session, SessionType
from domain.model import SessionStatus as S
from domain.start_retry import START_ATTEMPTS, START_RETRIED, awaits_start_retry, start_retries, start_retry_asked
from tests.domain.test_lifecycle import T0, kernel, preparing

SETUP = 'Setup Failure: failed to setup alloc: pre-run hook "network" failed: network already configured'


def setup_failure(alloc: str, hostname: str = "main1") -> KernelObservation:
    return KernelObservation(
        hostname=hostname,
        status=S.ERROR,
        reason="failed-to-start",
        alloc_id=alloc,
        detail=SETUP,
        finished_at=T0,
        setup_failed=True,
    )


def pending(alloc: str, hostname: str = "main1") -> KernelObservation:
    return KernelObservation(hostname=hostname, status=S.PREPARING, reason="allocation-pending", alloc_id=alloc)


def observed(session: Session, *seen: KernelObservation) -> Session:
    for n, one in enumerate(seen):
        after = observe_kernel(session, one, at=T0 + timedelta(seconds=n + 1))
        session = after if after is not None else session
    return session


def test_a_batch_kernel_that_never_started_waits_to_be_placed_again() -> None:
    before = preparing(kernel("main1", S.PREPARING, role="main"))
    after = observe_kernel(before, setup_failure("a1"), at=T0)
    assert after is not None and (after.status, after.status_info) == (S.PREPARING, START_RETRIED)
    assert after.status_detail == f"attempt 2 of {START_ATTEMPTS + 1}, after: {SETUP}"
    assert (after.main_kernel.status, after.main_kernel.alloc_id) == (S.PREPARING, "a1")
    assert start_retry_asked(before, after) and awaits_start_retry(after)
    assert observe_kernel(after, setup_failure("a1"), at=T0) is None  # the same allocation read again: asked already
    placed = observe_kernel(after, pending("a2"), at=T0)
    assert placed is not None and not awaits_start_retry(placed) and not start_retry_asked(after, placed)


def test_the_attempts_are_bounded_then_it_fails_saying_so() -> None:
    session = preparing(kernel("main1", S.PREPARING, role="main"))
    for n in range(START_ATTEMPTS):
        session = observed(session, setup_failure(f"a{n}"), pending(f"b{n}"))
    ended = observe_kernel(session, setup_failure("last"), at=T0 + timedelta(minutes=1))
    assert ended is not None and (ended.status, ended.status_info) == (S.ERROR, "failed-to-start")
    assert ended.status_detail == f"{SETUP} (not started after {START_ATTEMPTS + 1} attempts)"


def test_a_failure_after_the_start_a_service_or_a_decided_batch_is_not_retried() -> None:
    started = replace(setup_failure("a1"), setup_failed=False)  # e.g. a driver failure: Nomad's own verdict
    failed = observe_kernel(preparing(kernel("main1", S.PREPARING, role="main")), started, at=T0)
    assert failed is not None and failed.status is S.ERROR
    service = preparing(kernel("main1", S.PREPARING, role="main"), type=SessionType.INTERACTIVE)
    failed = observe_kernel(service, setup_failure("a1"), at=T0)
    assert failed is not None and failed.status is S.ERROR
    sub_failed = replace(kernel("sub1", S.ERROR), status_info="failed-to-start")
    cluster = preparing(kernel("main1", S.PREPARING, role="main"), sub_failed)
    after = observe_kernel(cluster, setup_failure("a1"), at=T0)  # the session's result is decided: failed
    assert after is not None and after.main_kernel.status is S.ERROR and not awaits_start_retry(after)


def test_one_kernel_of_a_cluster_is_retried_while_the_others_run_on() -> None:
    cluster = preparing(kernel("main1", S.PREPARING, role="main"), kernel("sub1", S.RUNNING))
    after = observe_kernel(cluster, setup_failure("a1"), at=T0)
    assert after is not None and after.status is S.PREPARING and awaits_start_retry(after)
    assert [k.status for k in after.kernels] == [S.PREPARING, S.RUNNING]


def test_a_kernel_killed_by_its_clients_failed_set_up_while_running_is_placed_again_and_recorded() -> None:
    running = observed(preparing(kernel("main1", S.PREPARING, role="main")), pending("a1"))
    running = observed(
        running, KernelObservation(hostname="main1", status=S.RUNNING, reason="kernel-running", alloc_id="a1")
    )
    assert running.status is S.RUNNING
    killed = replace(setup_failure("a1"), command_started=True)
    after = observe_kernel(running, killed, at=T0 + timedelta(minutes=1))
    assert after is not None and (after.status, after.status_info) == (S.RUNNING, START_RETRIED)
    assert after.status_detail is not None and after.status_detail.endswith("its command runs again")
    assert awaits_start_retry(after) and start_retry_asked(running, after)
    again = observed(
        after,
        pending("a2"),
        KernelObservation(hostname="main1", status=S.RUNNING, reason="kernel-running", alloc_id="a2"),
    )
    assert (again.status, again.status_info) == (S.RUNNING, "kernels-running") and not awaits_start_retry(again)
    assert [c.reason for c in again.status_history].count(START_RETRIED) == 1


def test_a_cluster_out_of_start_retries_ends_error_whatever_its_kernels_report_after() -> None:
    # Found by bench/chaos: sub1 ran out of start retries while its next allocation was being placed; that allocation
    # (pending, then stopped with the job) and main1 (killed by Caravan's stop: 143) were reported after the give-up,
    # and the session ended TERMINATED ("terminating", or main1's 143) instead of ERROR failed-to-start.
    session = preparing(kernel("main1", S.PREPARING, role="main"), kernel("sub1", S.PREPARING))
    running_main = KernelObservation(hostname="main1", status=S.RUNNING, reason="kernel-running", alloc_id="m1")
    session = observed(session, running_main)
    for n in range(START_ATTEMPTS):
        session = observed(session, setup_failure(f"a{n}", "sub1"), pending(f"b{n}", "sub1"))
    gave_up = observed(session, setup_failure("late", "sub1"))
    assert (gave_up.status, gave_up.status_info, gave_up.exit_code) == (S.ERROR, "failed-to-start", None)
    stopped = KernelObservation(hostname="sub1", status=S.TERMINATING, reason="stopping", alloc_id="next")
    killed = KernelObservation(
        hostname="main1", status=S.TERMINATED, reason="task-failed", alloc_id="m1", exit_code=143, finished_at=T0
    )
    ended_sub = KernelObservation(hostname="sub1", status=S.TERMINATED, reason="task-finished", alloc_id="next")
    after = observed(gave_up, pending("next", "sub1"), stopped, killed, ended_sub)
    assert (after.status, after.status_info, after.exit_code) == (S.ERROR, "failed-to-start", None)
    assert after.status_detail == gave_up.status_detail and after.status_detail is not None
    assert after.status_detail.endswith(f"(not started after {START_ATTEMPTS + 1} attempts)")
    assert [k.status for k in after.kernels] == [S.TERMINATED, S.ERROR]


def test_an_earlier_allocations_late_report_is_not_one_more_failed_start() -> None:
    # Found by bench/chaos: a session gave up 44 ms after it asked for its last attempt, before that allocation could
    # start. A report of an earlier failed allocation that comes after the kernel moved on to a newer one (the event
    # stream replayed from its stored index by a new scheduler leader, or a restarted Nomad client reporting its
    # allocations again) was counted as one more failed start.
    session = preparing(kernel("main1", S.PREPARING, role="main"))
    first = replace(setup_failure("a1"), alloc_index=10)
    session = observed(session, first, replace(pending("a2"), alloc_index=20))
    assert start_retries(session) == 1 and not awaits_start_retry(session)
    assert observe_kernel(session, first, at=T0 + timedelta(minutes=1)) is None  # a1 again, late: nothing new
    second = replace(setup_failure("a2"), alloc_index=20)
    after = observed(session, second)
    assert start_retries(after) == 2 and awaits_start_retry(after)
    assert observe_kernel(after, first, at=T0 + timedelta(minutes=1)) is None
