"""The session state machine: which transitions are legal, and how a session's status follows its kernels'.

Pure: no I/O. Every status write in Caravan goes through :func:`transition`, so an illegal
transition is refused in one place and never written.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from common.inference import replica_observation
from common.model import Kernel, KernelObservation, Session, SessionResult, SessionStatus, SessionType, StatusChange

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


def transition(session: Session, target: SessionStatus, *, reason: str, at: datetime) -> Session:
    """The session in ``target``, with the change recorded; raises :class:`IllegalTransition`."""
    if not can_transition(session.status, target):
        raise IllegalTransition(session.status, target)
    history = (*session.status_history, StatusChange(target, at, reason))
    changes: dict[str, object] = {"status": target, "status_info": reason, "status_history": history}
    if target is not S.PENDING:
        changes["wait_reasons"] = ()
        changes["queue_position"] = None
    if target is S.RUNNING and session.started_at is None:
        changes["started_at"] = at
    if target.is_terminal:
        changes["kernels"] = tuple(_settle(k, target) for k in session.kernels)
    return session.evolve(**changes)


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
    (slowest wins, ERROR wins), and a BATCH session's result comes from its main kernel's exit code.
    """
    if session.status.is_terminal:
        return None
    seen = replica_observation(session, seen)  # an INFERENCE replica going down is recovering, not ending
    kernels = list(session.kernels)
    for i, kernel in enumerate(kernels):
        if kernel.hostname == seen.hostname:
            if kernel.status.is_terminal and not seen.status.is_terminal:
                return None  # an old allocation's late report
            kernels[i] = Kernel(
                **{
                    **kernel.__dict__,
                    "status": seen.status,
                    "status_info": seen.reason,
                    "agent": seen.agent or kernel.agent,
                    "alloc_id": seen.alloc_id or kernel.alloc_id,
                    "exit_code": seen.exit_code if seen.exit_code is not None else kernel.exit_code,
                    "ports": seen.ports or kernel.ports,
                    "restarts": seen.restarts,
                }
            )
            break
    else:
        return None
    updated = session.evolve(kernels=tuple(kernels))
    target = derive_session_status(updated.kernels)
    main = updated.main_kernel
    if target is S.TERMINATED or main.status is S.TERMINATED:
        updated = updated.evolve(exit_code=main.exit_code)
    if session.type is SessionType.BATCH and main.status is S.TERMINATED and updated.result is SessionResult.UNDEFINED:
        success = main.exit_code == 0
        updated = updated.evolve(result=SessionResult.SUCCESS if success else SessionResult.FAILURE)
    if target is session.status or not can_transition(session.status, target):
        return updated if updated != session else None
    reason = _reason_for(session, updated, target)
    return transition(updated, target, reason=reason, at=at)


def _reason_for(before: Session, after: Session, target: SessionStatus) -> str:
    if before.status is S.TERMINATING:
        return before.status_info  # the reason the session was being stopped stays its reason
    if target is S.TERMINATED:
        return "task-finished" if after.main_kernel.exit_code in (0, None) else "task-failed"
    if target is S.ERROR:
        failed = next((k for k in after.kernels if k.status is S.ERROR), None)
        return failed.status_info if failed else "kernel-error"
    return {S.PREPARING: "job-registered", S.RUNNING: "kernels-running"}.get(target, target.value.lower())
