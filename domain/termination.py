"""How a session is asked to end: the one rule every termination follows (user destroy, idle reclaim, timeouts, a
batch's main kernel ending). Pure.

A live session goes TERMINATING with its reason; its Nomad job is then stopped by the scheduler's job owner
(``scheduler.job_owner``), and the follower moves it to TERMINATED when none of its kernels runs any more, keeping the
reason. A session in ERROR is ended the same way (a plain destroy ends it; ``forced`` is for jobs stuck in Nomad): at
once when none of its kernels may still run, else through TERMINATING. ``forced`` does not wait: the session is
TERMINATED at once and its job purged. A session that never started is CANCELLED.
"""

from __future__ import annotations

from datetime import datetime

from domain.lifecycle import transition
from domain.model import Kernel, Session, SessionResult, SessionStatus, SessionType

S = SessionStatus
NEVER_STARTED = frozenset({S.PENDING})
STOPPING = frozenset({S.TERMINATING, S.TERMINATED})
"""A session with a job in these statuses must have its job stopped (``stores.sessions`` records it for the owner)."""


def begin_termination(
    session: Session,
    *,
    reason: str,
    at: datetime,
    forced: bool = False,
    result: SessionResult | None = None,
    detail: str | None = None,
) -> Session | None:
    """The session as it should be stored when asked to end (``detail``: why, for a person), or ``None`` if it
    already has ended."""
    if session.status.is_terminal:
        return None
    if result is not None and session.result is SessionResult.UNDEFINED:
        session = session.evolve(result=result)
    if session.status in NEVER_STARTED:
        return transition(session, S.CANCELLED, reason=reason, at=at, detail=detail)
    if forced or (session.status is S.ERROR and not any(map(may_run, session.kernels))):
        return transition(session, S.TERMINATED, reason=reason, at=at, detail=detail)
    if session.status is S.TERMINATING:
        return None
    return transition(session, S.TERMINATING, reason=reason, at=at, detail=detail)


def may_run(kernel: Kernel) -> bool:
    """Might Nomad still run (or restart, or place) this kernel? Not once it ended or failed."""
    return not (kernel.status.is_terminal or kernel.status is S.ERROR)


def job_outlives(before: Session, after: Session) -> bool:
    """Did ``after`` end by what Nomad reported (a task failed or finished), leaving a job that would run on?

    A service job (INTERACTIVE, INFERENCE) is, once the session ended, per its restart and reschedule policies. A BATCH
    job is never restarted or rescheduled (``nomad_jobs.session_job``), but a BATCH session that fails (ERROR: a kernel
    could not start) while another kernel may still run leaves that kernel running for nothing: a sub waits for a
    main1 that will never start, a main1 runs for a result nobody can have (found by ``bench/chaos``: a job left
    running after its session's ERROR). A session ended by a request (TERMINATING first) had its job stopped with the
    request."""
    if before.status.is_terminal or before.status is S.TERMINATING:
        return False
    if after.type is SessionType.BATCH:
        return after.status is S.ERROR and before.status is not S.ERROR and any(map(may_run, after.kernels))
    return after.status.is_terminal
