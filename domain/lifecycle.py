"""The session state machine: which transitions are legal, and how a session's status follows its kernels'.

Pure: no I/O. Every status write in Caravan goes through :func:`transition`, so an illegal
transition is refused in one place and never written.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from domain.inference import NEVER_STARTED_FAILURE, earlier_run, elsewhere, replica_observation
from domain.model import Kernel, KernelObservation, Session, SessionResult, SessionStatus, SessionType, StatusChange
from domain.start_retry import START_RETRIED, retried_observation, start_retry_asked

S = SessionStatus

ALLOWED: dict[SessionStatus, frozenset[SessionStatus]] = {
    # Forward skips (SCHEDULED → RUNNING/TERMINATED) are legal: a short job may finish between two
    # observations, and the session must still converge to its true state.
    S.PENDING: frozenset({S.SCHEDULED, S.CANCELLED, S.ERROR}),
    S.SCHEDULED: frozenset({S.PREPARING, S.RUNNING, S.TERMINATING, S.TERMINATED, S.CANCELLED, S.ERROR}),
    S.PREPARING: frozenset({S.RUNNING, S.TERMINATING, S.TERMINATED, S.CANCELLED, S.ERROR}),
    S.RUNNING: frozenset({S.TERMINATING, S.TERMINATED, S.ERROR}),
    S.TERMINATING: frozenset({S.TERMINATED, S.ERROR}),
    S.ERROR: frozenset({S.TERMINATING, S.TERMINATED}),
    S.TERMINATED: frozenset(),
    S.CANCELLED: frozenset(),
}

PROGRESS_ORDER = (S.PENDING, S.SCHEDULED, S.PREPARING, S.RUNNING, S.TERMINATING, S.TERMINATED)
"""Kernel progress, slowest first: the session is as far as its slowest kernel."""


class IllegalTransition(ValueError):
    def __init__(self, current: SessionStatus, target: SessionStatus) -> None:
        super().__init__(f"a {current.value} session cannot become {target.value}")
        self.current = current
        self.target = target


def can_transition(current: SessionStatus, target: SessionStatus) -> bool:
    return target in ALLOWED[current]


def transition(
    session: Session, target: SessionStatus, *, reason: str, at: datetime, detail: str | None = None
) -> Session:
    """The session in ``target``, with the change recorded (``detail``: why, for a person; see ``StatusChange``);
    raises :class:`IllegalTransition`."""
    if not can_transition(session.status, target):
        raise IllegalTransition(session.status, target)
    history = (*session.status_history, StatusChange(target, at, reason, detail))
    changes: dict[str, object] = {
        "status": target,
        "status_info": reason,
        "status_detail": detail,
        "status_history": history,
    }
    if target is not S.PENDING:
        changes["wait_reasons"] = ()
        changes["queue_position"] = None
    if target is S.RUNNING and session.started_at is None:
        changes["started_at"] = at
    if target.is_terminal:
        changes["kernels"] = tuple(_settle(k, target) for k in session.kernels)
    return session.evolve(**changes)


def restate(session: Session, *, reason: str, detail: str | None, at: datetime) -> Session:
    """The session in the same status with a new reason, recorded like a change (a history entry, an event): a
    PREPARING session learning why it does not start yet (a kernel Nomad cannot place, or restarts after a failure),
    a RUNNING one whose kernel is placed again (``domain.start_retry``)."""
    if session.status not in (S.PREPARING, S.RUNNING):
        raise ValueError(
            f"only a PREPARING or RUNNING session changes its reason without changing its status, "
            f"not a {session.status.value} one"
        )
    history = (*session.status_history, StatusChange(session.status, at, reason, detail))
    return session.evolve(status_info=reason, status_detail=detail, status_history=history)


def _settle(kernel: Kernel, final: SessionStatus) -> Kernel:
    if kernel.status.is_terminal or kernel.status is S.ERROR:
        return kernel
    return Kernel(**{**kernel.__dict__, "status": final})


def derive_session_status(kernels: Iterable[Kernel]) -> SessionStatus:
    """Any kernel in ERROR makes the session ERROR; otherwise the slowest kernel wins."""
    statuses = [k.status for k in kernels]
    if S.ERROR in statuses:
        return S.ERROR
    if statuses and all(s is S.CANCELLED for s in statuses):
        return S.CANCELLED
    progressing = [s for s in statuses if s in PROGRESS_ORDER]
    if not progressing:
        return S.CANCELLED
    return min(progressing, key=PROGRESS_ORDER.index)


def observe_kernel(session: Session, seen: KernelObservation, *, at: datetime) -> Session | None:
    """The session after one kernel observation, or ``None`` when nothing changes.

    A terminal session ignores late observations; the session's status follows its kernels'
    (slowest wins, ERROR wins; a TERMINATING session ends once none of its kernels runs, whether they ended or
    failed), and a BATCH session's result comes from the kernel that decides it (:func:`deciding_kernel`). Start and
    end times are Nomad's (the task's), so a kernel that ran and ended between two observations still has both; a
    change is recorded at the kernels' time, never before the previous change nor after ``at``.

    A BATCH session in ERROR because a kernel could not start stays ERROR, with no exit code, until it is asked to end
    (``domain.termination``): the kernel that failed (``failed-to-start``, ``not started after 4 attempts`` once its
    start retries ran out: ``domain.start_retry``) is its result, so later reports of that kernel change nothing, nor
    do the ends of its other kernels, which Caravan stops (``domain.termination.job_outlives``). Found by bench/chaos:
    a cluster session that ran out of start retries while its sub's next allocation was being placed saw that
    allocation stopped and main1 killed by the stop (exit 143), and ended TERMINATED (``terminating``, or main1's 143)
    instead of ERROR."""
    if session.status.is_terminal:
        return None
    reported = seen
    seen = replica_observation(session, seen)  # an INFERENCE replica going down is recovering, not ending
    kernels = list(session.kernels)
    for i, kernel in enumerate(kernels):
        if kernel.hostname == seen.hostname:
            if (taken := _taken(session, kernel, seen, reported)) is None:
                return None
            kernels[i] = _observed(kernel, taken)
            break
    else:
        return None
    updated = session.evolve(kernels=tuple(kernels))
    if updated.started_at is None:
        updated = updated.evolve(started_at=min((k.started_at for k in kernels if k.started_at), default=None))
    target = _target(updated)
    main = updated.main_kernel
    if session.type is SessionType.BATCH:
        if not _start_failed(session):  # else its kernels' ends are Caravan's stop of its job, not a result
            updated = _batch_result(session, updated, target)
    elif target is S.TERMINATED or main.status is S.TERMINATED:
        updated = updated.evolve(exit_code=main.exit_code)
    if target is session.status or not can_transition(session.status, target):
        if target is session.status is S.PREPARING:
            updated = _restated(updated, at)
        elif session.status is S.RUNNING:
            updated = _running_restated(session, updated, at)
        return updated if updated != session else None
    reason, detail = _reason_for(session, updated, target)
    return transition(updated, target, reason=reason, detail=detail, at=_moment(updated, target, at))


def _taken(
    session: Session, kernel: Kernel, seen: KernelObservation, reported: KernelObservation
) -> KernelObservation | None:
    """The observation of ``kernel`` as the session takes it; None when it says nothing of the kernel now."""
    if kernel.parked or earlier_run(session, kernel, reported) or elsewhere(session, kernel, reported):
        return None  # an endpoint's replica at zero, not placed yet or moved: an old allocation says nothing of it
    if _start_failed(session) and kernel.status is S.ERROR and kernel.status_info == NEVER_STARTED_FAILURE:
        return None  # the failure that made the session ERROR stands (see observe_kernel)
    if seen.setup_failed and seen.alloc_index and seen.alloc_index < kernel.alloc_index:
        # the failed set-up of an allocation created before the kernel's own, reported late (the event stream
        # replayed by a new leader, a restarted client): bench/chaos saw one counted as one more failed start, and a
        # session give up before the last allocation it asked for could start. Other late reports still count: a
        # lost allocation's end, once its client is back, ends its ERROR job-lost session (Nomad placed a
        # replacement meanwhile, which the kernel followed)
        return None
    if kernel.status.is_terminal and not seen.status.is_terminal:
        return None  # an old allocation's late report
    if not seen.placed and kernel.alloc_id is not None:
        return None  # a failed placement reported after Nomad placed the kernel: its allocation speaks
    # a batch kernel whose command never ran is started again (None: that failed set-up is being retried already)
    return retried_observation(session, kernel, seen)


def _start_failed(session: Session) -> bool:
    """Is this a BATCH session in ERROR because a kernel could not start (its result, which nothing changes now)? One
    in ERROR ``job-lost`` is not: its kernel may still run on a node that comes back, and its end is reported then."""
    return (
        session.type is SessionType.BATCH
        and session.status is S.ERROR
        and any(k.status is S.ERROR and k.status_info == NEVER_STARTED_FAILURE for k in session.kernels)
    )


def _batch_result(before: Session, after: Session, target: SessionStatus) -> Session:
    """A BATCH session's result and exit code, decided once by the kernel that ends it (:func:`deciding_kernel`);
    a session ended otherwise (a timeout, a destroy) takes its main kernel's exit code."""
    if after.result is SessionResult.UNDEFINED and before.status is not S.ERROR:  # failed: its job is being stopped
        decider = deciding_kernel(after, live=before.status is not S.TERMINATING)
        if decider is not None:
            success = decider.exit_code == 0
            result = SessionResult.SUCCESS if success else SessionResult.FAILURE
            return after.evolve(result=result, exit_code=decider.exit_code)
    main = after.main_kernel
    if after.exit_code is None and (target is S.TERMINATED or main.status is S.TERMINATED):
        return after.evolve(exit_code=main.exit_code)
    return after


def deciding_kernel(session: Session, *, live: bool = True) -> Kernel | None:
    """The kernel whose command decides a BATCH cluster's result, once one does: main1 when its command has ended
    (its exit code is the result), else, while the session is ``live`` (not being stopped), the first sub whose
    command failed (a failing sub fails the session at once). A sub whose command succeeded decides nothing: it waits
    for main1 (``nomad_jobs.session_job.BOOTSTRAP``)."""
    main = session.main_kernel
    if main.status is S.TERMINATED:
        return main
    if not live:
        return None
    return next((k for k in session.kernels if not k.is_main and _failed(k)), None)


def _failed(kernel: Kernel) -> bool:
    return kernel.status is S.TERMINATED and kernel.exit_code not in (0, None)


def batch_ending(session: Session) -> tuple[str, str | None] | None:
    """Why a BATCH session whose result is decided must end now, with the deciding kernel's detail (``task-finished``,
    or ``task-failed`` and what Nomad said about the kernel); None when it need not (not decided, or ending)."""
    if session.type is not SessionType.BATCH or session.status in (S.TERMINATING, S.TERMINATED, S.CANCELLED):
        return None
    decider = deciding_kernel(session)
    if decider is None or session.result is SessionResult.UNDEFINED:
        return None
    return _ended_by(session, decider)


def _ended_by(session: Session, kernel: Kernel) -> tuple[str, str | None]:
    if kernel.exit_code in (0, None):
        return "task-finished", None
    return "task-failed", _kernel_detail(session, kernel)


def _observed(kernel: Kernel, seen: KernelObservation) -> Kernel:
    ended = seen.status.is_terminal or seen.status is S.ERROR
    return Kernel(
        **{
            **kernel.__dict__,
            "status": seen.status,
            "status_info": seen.reason,
            "status_detail": seen.detail,
            "agent": seen.agent or kernel.agent,
            "alloc_id": seen.alloc_id or kernel.alloc_id,
            "alloc_index": seen.alloc_index or kernel.alloc_index,
            "exit_code": seen.exit_code if seen.exit_code is not None else kernel.exit_code,
            "ports": seen.ports or kernel.ports,
            "restarts": seen.restarts,
            "started_at": min((t for t in (kernel.started_at, seen.started_at) if t), default=None),
            "finished_at": (seen.finished_at or kernel.finished_at) if ended else None,
        }
    )


def _target(session: Session) -> SessionStatus:
    if session.status is S.TERMINATING:
        # Being stopped: a kernel failing now does not turn it to ERROR; it has ended once none runs.
        ended = all(k.status.is_terminal or k.status is S.ERROR for k in session.kernels)
        return S.TERMINATED if ended else S.TERMINATING
    return derive_session_status(session.kernels)


def _moment(session: Session, target: SessionStatus, at: datetime) -> datetime:
    """When the session reached ``target`` by its kernels' Nomad times: the last kernel's start (RUNNING) or end
    (TERMINATED, ERROR); ``at`` when one is not known. Kept between the previous change and ``at``, so the history
    stays in order whatever the clocks of Nomad's clients say."""
    if target is S.RUNNING:
        stamps = [k.started_at for k in session.kernels]
    elif target is S.TERMINATED:
        stamps = [k.finished_at for k in session.kernels]
    elif target is S.ERROR:
        stamps = [k.finished_at for k in session.kernels if k.status is S.ERROR]
    else:
        stamps = []
    known = [s for s in stamps if s is not None]
    moment = max(known) if known and len(known) == len(stamps) else at
    floor = session.status_history[-1].at if session.status_history else session.created_at
    return max(floor, min(moment, at))


def _restated(session: Session, at: datetime) -> Session:
    """A PREPARING session's reason, kept to why its kernels do not start yet: the first kernel Nomad cannot place
    or that restarts after a failure gives it its reason and detail; once none has one, the reason is a kernel's
    again (``allocation-pending``…)."""
    if (troubled := _troubled(session)) is not None:
        reason, detail = troubled.status_info, _kernel_detail(session, troubled)
    elif session.status_detail is not None:
        waiting = next((k for k in session.kernels if k.status is S.PREPARING), None)
        reason, detail = (waiting.status_info if waiting else "job-registered"), None
    else:
        return session
    if (reason, detail) == (session.status_info, session.status_detail):
        return session
    return restate(session, reason=reason, detail=detail, at=at)


def _running_restated(before: Session, session: Session, at: datetime) -> Session:
    """A RUNNING session one of whose kernels is placed again (``domain.start_retry``) records it (reason
    ``start-retried``, the kernel's detail); once its kernels all run again, its reason is ``kernels-running`` again."""
    if start_retry_asked(before, session):
        retried = next(k for k in session.kernels if k.status_info == START_RETRIED)
        return restate(session, reason=START_RETRIED, detail=_kernel_detail(session, retried), at=at)
    if session.status_info == START_RETRIED and all(k.status is S.RUNNING for k in session.kernels):
        return restate(session, reason="kernels-running", detail=None, at=at)
    return session


def _troubled(session: Session) -> Kernel | None:
    """The first kernel that does not start yet for a reason Nomad gave (it cannot be placed, it restarts)."""
    return next((k for k in session.kernels if k.status is S.PREPARING and k.status_detail), None)


def _kernel_detail(session: Session, kernel: Kernel) -> str | None:
    """A kernel's detail as its session's: naming the kernel when the session has several."""
    if kernel.status_detail is None or len(session.kernels) == 1:
        return kernel.status_detail
    return f"{kernel.hostname}: {kernel.status_detail}"


def _reason_for(before: Session, after: Session, target: SessionStatus) -> tuple[str, str | None]:
    if before.status is S.TERMINATING:
        return before.status_info, before.status_detail  # the reason the session was being stopped stays its reason
    if target is S.TERMINATED:
        decider = deciding_kernel(after) if after.type is SessionType.BATCH else None
        return _ended_by(after, decider or after.main_kernel)
    if target is S.ERROR:
        failed = next((k for k in after.kernels if k.status is S.ERROR), None)
        return (failed.status_info, _kernel_detail(after, failed)) if failed else ("kernel-error", None)
    if target is S.PREPARING:
        if (troubled := _troubled(after)) is not None:
            return troubled.status_info, _kernel_detail(after, troubled)
        return "job-registered", None
    return {S.RUNNING: "kernels-running"}.get(target, target.value.lower()), None
