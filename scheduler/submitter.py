"""Turning SCHEDULED sessions into registered Nomad jobs, exactly once.

The job id is derived from the session id and registration is create-only, so a submission
repeated after a crash finds the job already there instead of making a second one.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Any

from core.clock import utcnow
from core.errors import PermanentError, TransientError
from core.lease import Fence
from domain.lifecycle import transition
from domain.model import Session, SessionStatus
from domain.start_retry import START_RETRIED, awaits_start_retry, start_retries
from nomad_jobs.client import JobExists, NomadClient, NomadDenied
from nomad_jobs.explain import clipped
from nomad_jobs.meta import SESSION_ID, START_ATTEMPT, TASK_NAME
from stores.sessions import SessionStore

log = logging.getLogger(__name__)


class JobShapeMismatch(PermanentError):
    """Nomad's parse of the rendered job differs from what Caravan meant to submit."""


def check_job_shape(session: Session, job: dict[str, Any]) -> None:
    """Belt and braces behind the encoder: the parsed job has exactly the session's shape."""
    groups = [g["Name"] for g in job.get("TaskGroups") or []]
    expected = [k.hostname for k in session.kernels]
    problems = []
    if job.get("ID") != session.nomad_job_id:
        problems.append(f"job id {job.get('ID')!r}")
    if groups != expected:
        problems.append(f"task groups {groups}")
    for group in job.get("TaskGroups") or []:
        tasks = group.get("Tasks") or []
        if [t["Name"] for t in tasks] != [TASK_NAME] or tasks[0]["Driver"] != session.driver.value:
            problems.append(f"tasks of {group['Name']}")
    if (job.get("Meta") or {}).get(SESSION_ID) != session.id:
        problems.append("meta")
    if problems:
        raise JobShapeMismatch(f"session {session.id}: unexpected " + ", ".join(problems))


async def submit(store: SessionStore, nomad: NomadClient, session: Session, fence: Fence | None) -> None:
    assert session.nomad_job_id and session.job_hcl
    try:
        job = await nomad.parse(session.job_hcl)
        check_job_shape(session, job)
        await nomad.register(job, source_hcl=session.job_hcl)
        log.info("session=%s job=%s registered", session.id, session.nomad_job_id)
    except JobExists:
        log.info("session=%s job=%s was already registered", session.id, session.nomad_job_id)
    except NomadDenied as exc:
        # the job owner's token may register jobs: a 403 is a server that has not restored its ACL state yet (just
        # after a restart), not a verdict on the job; the request stays for the next round instead of failing it
        raise TransientError(f"Nomad denied the registration for now: {exc}") from exc
    except PermanentError as exc:
        log.error("session=%s job=%s refused: %s", session.id, session.nomad_job_id, exc)
        reason = clipped(f"Nomad refused the job: {exc}")
        await store.update(session.id, lambda s: refused(s, reason, at=utcnow()), fence=fence)
        await store.requests.mark_submitted(session.id)
        return
    # A session ended meanwhile (destroyed, or a batch that already ran) is not stopped here: its end stored a stop
    # request, which the job owner carries out next, with the mode asked (a purge only if forced).
    await store.update(session.id, _registered, fence=fence)
    await store.requests.mark_submitted(session.id)


async def resubmit(store: SessionStore, nomad: NomadClient, session: Session) -> None:
    """Register a live endpoint's job again, as stored now (the autoscaler added, stopped or parked replicas).

    A plain register (not create-only): Nomad compares each task group with the running version, places the new
    groups, stops the removed ones (and a parked one's ``count = 0``), and leaves unchanged groups as they run. Done
    once the request is removed; an outage (TransientError) keeps the request for the next round. The registration is
    idempotent: the same job again changes nothing in Nomad."""
    assert session.nomad_job_id and session.job_hcl
    try:
        job = await nomad.parse(session.job_hcl)
        check_job_shape(session, job)
        await nomad.register(job, source_hcl=session.job_hcl, create_only=False)
        log.info("session=%s job=%s registered again (replicas changed)", session.id, session.nomad_job_id)
    except NomadDenied as exc:
        raise TransientError(f"Nomad denied the registration for now: {exc}") from exc  # as in submit
    except PermanentError as exc:
        log.error("session=%s job=%s change refused: %s", session.id, session.nomad_job_id, exc)
    await store.requests.mark_submitted(session.id)


async def place_again(store: SessionStore, nomad: NomadClient, session: Session) -> None:
    """Register again the job of a batch session whose kernel failed in its set-up without ever starting
    (``domain.start_retry``), with that kernel's group stamped with the attempt's number (:data:`START_ATTEMPT`):
    Nomad sees that group changed and replaces its failed allocation (a batch job's reschedule policy would not, and
    ``-force-reschedule`` needs one); the other groups are unchanged and run on. A repeated request (its removal
    lost) registers the same job again, which changes nothing. Done once the request is removed; an outage
    (TransientError) keeps it for the next round."""
    assert session.nomad_job_id and session.job_hcl
    attempt = str(start_retries(session))
    retried = {k.hostname for k in session.kernels if k.status_info == START_RETRIED}
    try:
        if await _ended_meanwhile(store, nomad, session):
            # a plain register would bring a stopped job back to life (a job ended by the session's end, stopped by
            # this job owner a moment ago or by a deposed leader's successor): the ended session's job stays stopped
            log.info("session=%s job=%s ended meanwhile: not placed again", session.id, session.nomad_job_id)
            await store.requests.mark_submitted(session.id)
            return
        job = await nomad.parse(session.job_hcl)
        check_job_shape(session, job)
        for group in job["TaskGroups"]:
            if group["Name"] in retried:
                group["Meta"] = {**(group.get("Meta") or {}), START_ATTEMPT: attempt}
        await nomad.register(job, source_hcl=session.job_hcl, create_only=False)
        log.info("session=%s job=%s: %s placed again (attempt %s)", session.id, session.nomad_job_id, retried, attempt)
    except NomadDenied as exc:
        raise TransientError(f"Nomad denied the registration for now: {exc}") from exc  # as in submit
    except PermanentError as exc:  # the job is gone (the follower reads that as job-lost) or refused now
        log.error("session=%s job=%s could not be placed again: %s", session.id, session.nomad_job_id, exc)
    await store.requests.mark_submitted(session.id)


async def _ended_meanwhile(store: SessionStore, nomad: NomadClient, session: Session) -> bool:
    """Whether the session no longer waits for a kernel to be placed again, or its job was stopped (found by
    bench/chaos: a re-registration after the stop left a pending job of a TERMINATED session)."""
    current = await store.get(session.id)
    if current is None or not awaits_start_retry(current):
        return True
    assert session.nomad_job_id
    return bool((await nomad.job(session.nomad_job_id)).get("Stop"))


def _registered(session: Session) -> Session | None:
    if session.status is not SessionStatus.SCHEDULED:
        return None
    return transition(session, SessionStatus.PREPARING, reason="job-registered", at=utcnow())


def refused(session: Session, detail: str, *, at: datetime) -> Session | None:
    """A SCHEDULED session whose job Nomad refused: ERROR ``failed-to-start`` with Nomad's answer as the detail, and so
    each kernel (none will run: a destroy ends it at once)."""
    if session.status is not SessionStatus.SCHEDULED:
        return None
    kernels = tuple(
        replace(k, status=SessionStatus.ERROR, status_info="failed-to-start", status_detail=detail)
        for k in session.kernels
    )
    return transition(
        session.evolve(kernels=kernels), SessionStatus.ERROR, reason="failed-to-start", detail=detail, at=at
    )
