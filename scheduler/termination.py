"""Ending sessions: the one path every termination takes (user destroy, idle reclaim, timeouts).

A live session goes TERMINATING with its reason and its Nomad job is stopped; the follower moves it
to TERMINATED when none of its kernels runs any more, keeping the reason. A session in ERROR is ended the same way
(a plain destroy ends it; ``forced`` is for jobs stuck in Nomad): at once when none of its kernels may still run,
else through TERMINATING. ``forced`` does not wait: the job is purged and the session is TERMINATED at once. A
session that never started is CANCELLED.
"""

from __future__ import annotations

import logging

from core.clock import utcnow
from domain.lifecycle import transition
from domain.model import Kernel, Session, SessionResult, SessionStatus
from core.lease import Fence
from stores.sessions import SessionStore
from nomad_jobs.client import NomadClient

log = logging.getLogger(__name__)

S = SessionStatus
NEVER_STARTED = frozenset({S.PENDING})


def begin_termination(session: Session, *, reason: str, forced: bool = False,
                      result: SessionResult | None = None) -> Session | None:
    """The session as it should be stored when asked to end, or ``None`` if it already has ended."""
    if session.status.is_terminal:
        return None
    now = utcnow()
    if result is not None and session.result is SessionResult.UNDEFINED:
        session = session.evolve(result=result)
    if session.status in NEVER_STARTED:
        return transition(session, S.CANCELLED, reason=reason, at=now)
    if forced or (session.status is S.ERROR and not any(map(may_run, session.kernels))):
        return transition(session, S.TERMINATED, reason=reason, at=now)
    if session.status is S.TERMINATING:
        return None
    return transition(session, S.TERMINATING, reason=reason, at=now)


def may_run(kernel: Kernel) -> bool:
    """Might Nomad still run (or restart, or place) this kernel? Not once it ended or failed."""
    return not (kernel.status.is_terminal or kernel.status is S.ERROR)


async def terminate(
    store: SessionStore, nomad: NomadClient, session_id: str, *, reason: str, forced: bool = False,
    result: SessionResult | None = None, fence: Fence | None = None,
) -> Session | None:
    """End one session; returns it as stored afterwards (``None`` if it does not exist)."""
    session = await store.update(
        session_id, lambda s: begin_termination(s, reason=reason, forced=forced, result=result), fence=fence
    )
    if session is None:
        return None
    if session.nomad_job_id and session.status in (S.TERMINATING, S.TERMINATED):
        await nomad.deregister(session.nomad_job_id, purge=forced)
        log.info("session=%s job=%s stopping (%s%s)", session.id, session.nomad_job_id, reason,
                 ", forced" if forced else "")
    return session
