"""How a session is ended when asked to (pure: ``begin_termination``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from domain.model import SessionStatus as S
from domain.model import SessionType
from domain.termination import begin_termination, job_outlives
from tests.domain.test_lifecycle import kernel, session

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kernels", "forced", "expected"),
    [
        ((S.ERROR,), False, S.TERMINATED),  # failed to start: nothing runs, nothing to wait for
        ((S.TERMINATED, S.ERROR), False, S.TERMINATED),
        ((S.RUNNING, S.ERROR), False, S.TERMINATING),  # a kernel still runs: stopped first
        ((S.PREPARING, S.ERROR), False, S.TERMINATING),  # one may still be placed or restarted
        ((S.RUNNING, S.ERROR), True, S.TERMINATED),
    ],
    ids=["failed", "ended-and-failed", "one-running", "one-preparing", "forced"],
)
def test_a_plain_destroy_ends_an_error_session(kernels: tuple[S, ...], forced: bool, expected: S) -> None:
    errored = session(
        *(kernel(f"k{i}", status, role="main" if i == 0 else "sub") for i, status in enumerate(kernels)), status=S.ERROR
    )
    after = begin_termination(errored, reason="user-requested", at=NOW, forced=forced)
    assert after is not None and (after.status, after.status_info) == (expected, "user-requested")
    assert (after.terminated_at is not None) == (expected is S.TERMINATED)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (S.PENDING, S.CANCELLED),
        (S.RUNNING, S.TERMINATING),
        (S.PREPARING, S.TERMINATING),
        (S.TERMINATING, None),
        (S.TERMINATED, None),
    ],
)
def test_other_sessions(status: S, expected: S | None) -> None:
    after = begin_termination(
        session(kernel("main1", S.RUNNING, role="main"), status=status), reason="user-requested", at=NOW
    )
    assert (after.status if after else None) is expected


@pytest.mark.parametrize(
    ("type_", "before", "after", "kernels", "outlives"),
    [
        (SessionType.BATCH, S.PREPARING, S.ERROR, (S.RUNNING, S.ERROR), True),  # a sub waits for a main1 that failed
        (SessionType.BATCH, S.PREPARING, S.ERROR, (S.PREPARING, S.ERROR), True),
        (SessionType.BATCH, S.PREPARING, S.ERROR, (S.ERROR,), False),  # nothing left to run
        (SessionType.BATCH, S.ERROR, S.ERROR, (S.RUNNING, S.ERROR), False),  # asked when it failed
        (SessionType.BATCH, S.RUNNING, S.TERMINATED, (S.TERMINATED,), False),  # a batch's job ends by itself
        (SessionType.BATCH, S.TERMINATING, S.ERROR, (S.RUNNING, S.ERROR), False),  # stopped with the request
        (SessionType.INTERACTIVE, S.RUNNING, S.TERMINATED, (S.TERMINATED,), True),  # Nomad would restart it
        (SessionType.INTERACTIVE, S.TERMINATING, S.TERMINATED, (S.TERMINATED,), False),
    ],
    ids=[
        "batch-error-running",
        "batch-error-preparing",
        "batch-error-alone",
        "already-error",
        "batch-ended",
        "stopping",
        "service-ended",
        "service-stopped",
    ],
)
def test_which_ended_sessions_leave_a_job_to_stop(
    type_: SessionType, before: S, after: S, kernels: tuple[S, ...], outlives: bool
) -> None:
    ks = tuple(kernel(f"k{i}", status, role="main" if i == 0 else "sub") for i, status in enumerate(kernels))
    assert job_outlives(session(*ks, type=type_, status=before), session(*ks, type=type_, status=after)) is outlives
