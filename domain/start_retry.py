"""A BATCH kernel whose command never ran is started again: the one retry a batch kernel gets. Pure.

A batch kernel runs once (``nomad_jobs.session_job``: no restarts, no rescheduling), since its exit code is the
session's result. But an allocation can fail in Nomad's own set-up, before its task starts: a Nomad client killed
while it set up the allocation's network finds, at its restart, ``network already configured but not found in
state`` and fails the allocation (found by ``bench/chaos``). Its command never ran, so running it now is its first
run, not a second one. Such a kernel waits PREPARING (reason ``start-retried``) while the scheduler's job owner asks
Nomad to place its allocation again (``scheduler.submitter.place_again``: its job registered again with that kernel's
group stamped with the attempt, so Nomad replaces that group's failed allocation), at most :data:`START_ATTEMPTS` times
per session; after that it fails as before (``failed-to-start``, its detail saying how many attempts were made).

The same when the task had started: a Nomad client killed just after starting it fails the allocation's set-up at its
restart and kills the task (its exit code is Nomad's signal, not the command's: found by ``bench/chaos``). The kernel
is placed again and the session reports the new run's exit code, so its command may run twice, the first run cut
short (at least once, as for any command run on a host that can fail). Its session may be RUNNING already (its
other kernels run on): it stays RUNNING, the retry recorded in its history with its reason.

Only while the session's result is open: a session being stopped, or one with a kernel that failed or ended with a
non-zero code, is not started again.
"""

from __future__ import annotations

from dataclasses import replace

from domain.model import Kernel, KernelObservation, Session, SessionStatus, SessionType

S = SessionStatus
START_RETRIED = "start-retried"
"""A kernel's (and its session's) reason while its allocation is placed again after a set-up failure."""
START_ATTEMPTS = 3
"""Times one session's kernels are started again at most, in all."""
OPEN = frozenset({S.SCHEDULED, S.PREPARING, S.RUNNING})


def start_retries(session: Session) -> int:
    """How often the session's kernels were started again so far (its history records each)."""
    return sum(1 for change in session.status_history if change.reason == START_RETRIED)


def retried_observation(session: Session, kernel: Kernel, seen: KernelObservation) -> KernelObservation | None:
    """``seen`` as the session should take it: a set-up failure of a batch kernel whose command never ran becomes
    PREPARING ``start-retried`` while attempts remain (its detail: Nomad's failure and the attempt), or says the
    attempts made once none remain; None when it says nothing new (the same failed allocation, already retried)."""
    if not (seen.setup_failed and seen.status is S.ERROR and session.type is SessionType.BATCH):
        return seen
    if kernel.status_info == START_RETRIED and kernel.alloc_id == seen.alloc_id:
        return None  # read again before its replacement exists: the retry is asked already
    if session.status not in OPEN or any(_failed(k) for k in session.kernels if k.hostname != kernel.hostname):
        return seen
    made = start_retries(session)
    if made >= START_ATTEMPTS:
        return replace(seen, detail=f"{seen.detail or 'setup failure'} (not started after {made + 1} attempts)")
    ran = "; its command runs again" if seen.command_started else ""
    detail = f"attempt {made + 2} of {START_ATTEMPTS + 1}, after: {seen.detail or 'setup failure'}{ran}"
    return replace(seen, status=S.PREPARING, reason=START_RETRIED, detail=detail)


def _failed(kernel: Kernel) -> bool:
    return kernel.status is S.ERROR or (kernel.status is S.TERMINATED and kernel.exit_code not in (0, None))


def awaits_start_retry(session: Session) -> bool:
    """Has a kernel of the session asked to be placed again (the job owner's part)?"""
    return session.status in OPEN and any(k.status_info == START_RETRIED for k in session.kernels)


def start_retry_asked(before: Session, after: Session) -> bool:
    """Did this change ask for a kernel to be placed again (a new failed allocation now ``start-retried``)?"""
    was = {k.hostname: k for k in before.kernels}
    return any(
        k.status_info == START_RETRIED
        and (
            was.get(k.hostname) is None
            or (was[k.hostname].status_info, was[k.hostname].alloc_id) != (START_RETRIED, k.alloc_id)
        )
        for k in after.kernels
    )
