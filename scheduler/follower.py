"""Keeping sessions true to Nomad: the allocation and evaluation event stream, and a periodic reconciliation.

The event stream gives changes as they happen (resuming from the last applied index after a
disconnect); reconciliation walks every live session and its job's allocations, so anything the
stream missed (Caravan was down, the event buffer wrapped) still converges.

An allocation Nomad has replaced (a rescheduled INFERENCE replica, say) no longer speaks for its kernel:
its late updates are dropped, and reconciliation reads the newest allocation of each task group. How a live
INFERENCE session reads a replica going down (recovering, not ending) is decided in ``domain.inference``.
Replicas not yet known healthy have their checks read more often than reconciliation runs, so that they join
``endpoints`` within seconds of passing.

A kernel Nomad cannot place has no allocation to speak for it: its job's evaluations say why (an evaluation event,
or, when reconciliation finds the job's summary with a queued group and no allocation, one read of the job's
evaluations), and it waits PREPARING with that reason (``nomad_jobs.observe.observe_unplaced``).

A running kernel holding a device its node reports unhealthy keeps running (Nomad only stops placing work there) and
says so: reason ``device-unhealthy``, the device and Nomad's health description as detail, until it is healthy again.
The nodes' unhealthy devices are kept from Node events and each reconciliation's read of the nodes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from core.clock import utcnow
from core.errors import PermanentError, TransientError
from core.lease import Fence
from core.replies import text_set
from core.retry import stop_if_cancelled
from domain.inference import HealthReading, forget_stale_health, is_inference, replica_health, with_replica_health
from domain.lifecycle import batch_ending, observe_kernel, transition
from domain.model import KernelObservation, Session, SessionStatus, SessionType
from domain.termination import job_outlives
from nomad_jobs.client import TERMINAL_ALLOCATION_STATUSES, NomadClient
from nomad_jobs.meta import session_id_of
from nomad_jobs.observe import (
    for_driver,
    is_superseded,
    latest_per_group,
    observe_allocation,
    observe_unplaced,
    placement_failures,
    restarts_of,
    unhealthy_devices,
    with_device_health,
)
from nomad_jobs.replica_service import run_started_at
from scheduler.job_owner import JobOwner
from stores.sessions import SessionStore

log = logging.getLogger(__name__)

S = SessionStatus
OBSERVED_STATUSES = frozenset({S.SCHEDULED, S.PREPARING, S.RUNNING, S.TERMINATING, S.ERROR})
NOT_STARTED = frozenset({S.SCHEDULED, S.PREPARING})
"""Sessions whose jobs may have kernels Nomad has not placed (and says why, in its evaluations)."""
RESOURCES_FREED = frozenset({S.TERMINATED, S.CANCELLED, S.ERROR})


class Follower:
    def __init__(
        self, store: SessionStore, nomad: NomadClient, fence: Fence | None, owner: JobOwner | None = None
    ) -> None:
        """``owner``: who stops a job that has no session (the follower itself only reads Nomad)."""
        self.store = store
        self.nomad = nomad
        self.fence = fence
        self.owner = owner or JobOwner(store, nomad, fence)
        self.prefix = nomad.settings.job_prefix
        self.unhealthy: dict[str, dict[str, str]] = {}
        """Node id -> its unhealthy device instances (``nomad_jobs.observe.unhealthy_devices``)."""

    async def apply(self, session_id: str, seen: KernelObservation) -> Session | None:
        ended = outlived = False

        def mutate(session: Session) -> Session | None:
            nonlocal ended, outlived
            if session.status not in OBSERVED_STATUSES:
                return None
            after = observe_kernel(session, for_driver(seen, session.driver), at=utcnow())
            if after is not None:
                after = forget_stale_health(session, after)  # a replica's next run must pass its checks anew
            ended = after is not None and after.status in RESOURCES_FREED and session.status not in RESOURCES_FREED
            outlived = after is not None and job_outlives(session, after)
            return after

        stored = await self.store.update(session_id, mutate, fence=self.fence)
        if ended:
            await self.store.wake_scheduler("ended")  # what it held may let a pending session start now
        if outlived and stored is not None and stored.nomad_job_id:
            # its job was asked to stop in the same write (stores.sessions): Nomad would restart or reschedule it
            log.info("session=%s ended (%s): its job=%s is stopped", stored.id, stored.status_info, stored.nomad_job_id)
        if stored is not None and (ending := batch_ending(stored)) is not None:
            # main1's end (or a sub's failure) decides a BATCH session: stop the kernels still running.
            reason, detail = ending
            await self.store.request_termination(stored.id, reason=reason, detail=detail, at=utcnow(), fence=self.fence)
        return stored

    async def on_allocation(self, alloc: dict[str, Any]) -> None:
        session_id = session_id_of(self.prefix, str(alloc.get("JobID", "")))
        if session_id and not is_superseded(alloc):
            await self.apply(session_id, self.observe(alloc))

    def observe(self, alloc: dict[str, Any]) -> KernelObservation:
        return with_device_health(observe_allocation(alloc), alloc, self.unhealthy)

    async def on_node(self, node: dict[str, Any]) -> None:
        """A node changed: capacity may have come or gone (a pass), and its devices' health may have changed (its
        running kernels say so)."""
        await self.store.wake_scheduler("node-changed")
        node_id = str(node.get("ID") or "")
        if not node_id:
            return
        if "NodeResources" not in node:
            node = await self.nomad.node(node_id)
        unhealthy = unhealthy_devices(node)
        if unhealthy == self.unhealthy.get(node_id, {}):
            return
        self.unhealthy[node_id] = unhealthy
        for alloc in await self.nomad.allocations(self.prefix + "-"):
            if alloc.get("NodeID") == node_id and alloc.get("ClientStatus") == "running":
                await self.on_allocation(alloc)

    async def on_evaluation(self, evaluation: dict[str, Any]) -> None:
        """An evaluation that could not place some of a session's kernels: they wait, and say why."""
        session_id = session_id_of(self.prefix, str(evaluation.get("JobID", "")))
        if session_id:
            await self.apply_placement_failures(session_id, [evaluation])

    async def apply_placement_failures(self, session_id: str, evaluations: list[dict[str, Any]]) -> None:
        for group, detail in sorted(placement_failures(evaluations).items()):
            await self.apply(session_id, observe_unplaced(group, detail))

    async def follow_events(self) -> None:
        """Apply allocation events until the stream breaks (raises TransientError)."""
        index = int(await self.store.redis.get(self.store.keys.nomad_event_index) or 0)
        topics = ["Allocation", "Evaluation", "Node"]
        async for batch in self.nomad.event_stream(index=index + 1 if index else 0, topics=topics):
            for event in batch.get("Events") or []:
                payload = event.get("Payload") or {}
                if alloc := payload.get("Allocation"):
                    await self.on_allocation(alloc)
                elif evaluation := payload.get("Evaluation"):
                    await self.on_evaluation(evaluation)
                elif event.get("Topic") == "Node":
                    await self.on_node(payload.get("Node") or {})
            if batch.get("Index"):
                await self.store.redis.set(self.store.keys.nomad_event_index, batch["Index"])
            stop_if_cancelled()  # else we would wait for the next event with the stop request lost

    async def reconcile(self) -> None:
        """Every live session against Nomad, then Caravan's jobs without a session.

        Three Nomad calls in all (the job list, the allocation list, matched by job id, and the nodes, for their
        devices' health), not two per session: the reconciliation must stay cheap with thousands of live sessions.
        """
        ids = sorted(await self.store.live_ids())
        # The sessions, then the registrations not yet acknowledged, are read before Nomad is asked: a session seen
        # with a job and not awaiting registration had its job registered before the listing, so a job missing from
        # the listing is lost. Read the other way round, a registration acknowledged between the listing and the
        # read would look lost (and end a healthy session in ERROR job-lost).
        sessions = await self.store.get_many(ids)
        submitting = await self.store.ids_to_submit()
        self.unhealthy = {str(node.get("ID")): unhealthy_devices(node) for node in await self.nomad.nodes()}
        jobs = {j["ID"]: j for j in await self.nomad.jobs(self.prefix + "-")}
        allocs_by_job: dict[str, list[dict[str, Any]]] = {}
        for alloc in await self.nomad.allocations(self.prefix + "-"):
            allocs_by_job.setdefault(str(alloc.get("JobID")), []).append(alloc)
        await self._sessions_against_jobs(sessions, submitting, jobs, allocs_by_job)
        await self.stop_orphans(set(ids), jobs)

    async def stop_orphans(self, live: set[str], jobs: dict[str, dict[str, Any]] | None = None) -> list[str]:
        """Stop running Caravan jobs whose session does not exist (e.g. Redis lost it) or has ended (its end was
        observed while Caravan was down, or the stop then failed); returns their ids.

        ``live``: the live session ids read before ``jobs``; the sessions of the other running jobs are read again
        (one MGET), so a session created meanwhile is seen live and its job kept."""
        if jobs is None:
            jobs = {j["ID"]: j for j in await self.nomad.jobs(self.prefix + "-")}
        running = {
            session_id: job["ID"]
            for job in jobs.values()
            if (session_id := session_id_of(self.prefix, job["ID"]))
            and session_id not in live
            and not job.get("Stop")
            and job.get("Status") != "dead"
        }
        stopped = []
        for session_id, session in zip(running, await self.store.get_many(list(running)), strict=True):
            if session is not None and not session.status.is_terminal:
                continue
            why = "has no session" if session is None else f"outlives its {session.status.value} session"
            log.warning("job=%s %s %s: stopping it", running[session_id], why, session_id)
            if session is None:
                await self.owner.stop_orphan(running[session_id])
            else:
                await self.store.requests.request_stop(session_id)
            stopped.append(running[session_id])
        return stopped

    async def read_replica_health(self, session_id: str, allocs: Iterable[dict[str, Any]]) -> None:
        """Each running replica's service checks, as its Nomad client last ran them, onto its kernel.

        Cost: one Nomad call per running INFERENCE replica per reconciliation (the server forwards it to the
        replica's client; one session's replicas are asked at once), plus one fenced store update per INFERENCE
        session, which writes only when a replica's health changed. Nomad's event stream carries no check results.
        """
        running = [a for a in allocs if a.get("ClientStatus") == "running" and a.get("DesiredStatus") == "run"]
        answers = await asyncio.gather(*(self._checks_of(str(a["ID"])) for a in running))
        readings = [
            HealthReading(
                hostname=str(alloc.get("TaskGroup", "")),
                alloc_id=str(alloc["ID"]),
                restarts=restarts_of(alloc),
                healthy=replica_health(checks.values(), run_started=run_started_at(alloc)),
            )
            for alloc, checks in zip(running, answers, strict=True)
            if checks is not None
        ]
        if readings:
            await self.store.update(session_id, lambda s: with_replica_health(s, readings), fence=self.fence)

    async def confirm_replica_health(self) -> None:
        """Read the checks of live INFERENCE sessions that have a RUNNING replica not known healthy (loading,
        restarted, failing): one set intersection and one MGET of those sessions, then per such session one call for
        its allocations and one per running replica. Sessions whose replicas are all healthy cost nothing here."""
        keys = self.store.keys
        inference = keys.sessions_of_type(SessionType.INFERENCE.value)
        ids = sorted(text_set(await self.store.redis.sinter([inference, keys.sessions_live])))
        for session in await self.store.get_many(ids):
            stop_if_cancelled()
            if session is None or session.status is not S.RUNNING or session.nomad_job_id is None:
                continue
            if all(k.healthy is True for k in session.kernels if k.status is S.RUNNING):
                continue
            try:
                allocs = await self.nomad.job_allocations(session.nomad_job_id)
            except (PermanentError, TransientError) as exc:
                log.warning("allocations of %s unreadable: %s", session.nomad_job_id, exc)
                continue
            await self.read_replica_health(session.id, latest_per_group(allocs).values())

    async def _checks_of(self, alloc_id: str) -> dict[str, Any] | None:
        """None when they cannot be read now (the allocation is gone, its client unreachable): the health stays as
        last read until the next reconciliation, or until the event stream sees the replica stop."""
        try:
            return await self.nomad.allocation_checks(alloc_id)
        except (PermanentError, TransientError) as exc:
            log.warning("checks of allocation %s unreadable: %s", alloc_id, exc)
            return None

    async def _sessions_against_jobs(
        self,
        sessions: list[Session | None],
        submitting: set[str],
        jobs: dict[str, dict[str, Any]],
        allocs_by_job: dict[str, list[dict[str, Any]]],
    ) -> None:
        for session in sessions:
            if session is None or session.nomad_job_id is None or session.status not in OBSERVED_STATUSES:
                continue
            if session.id in submitting:
                continue  # the submitter owns it until registration is acknowledged
            job = jobs.get(session.nomad_job_id)
            if job is None:
                await self.store.update(session.id, _job_lost, fence=self.fence)
                continue
            allocs = allocs_by_job.get(session.nomad_job_id, [])
            latest = latest_per_group(allocs)
            for alloc in latest.values():
                await self.apply(session.id, self.observe(alloc))
            if session.status in NOT_STARTED and unplaced_groups(job, latest):
                await self._read_placement_failures(session.id, session.nomad_job_id)
            if is_inference(session):
                await self.read_replica_health(session.id, latest.values())
            if session.status is S.TERMINATING and not job.get("Stop"):
                await self.store.requests.request_stop(
                    session.id
                )  # asked, but not done yet (or lost before the owner existed)
            elif job.get("Stop") and session.status is S.TERMINATING and not any(map(is_live, allocs)):
                await self.store.update(session.id, _stopped, fence=self.fence)

    async def _read_placement_failures(self, session_id: str, job_id: str) -> None:
        """Why Nomad has not placed some of the job's kernels, from its evaluations (one call; only for a job whose
        summary shows a queued kernel with no allocation: the event stream may have missed its evaluation)."""
        try:
            evaluations = await self.nomad.job_evaluations(job_id)
        except (PermanentError, TransientError) as exc:
            log.warning("evaluations of %s unreadable: %s", job_id, exc)
            return
        await self.apply_placement_failures(session_id, evaluations)


def unplaced_groups(job: dict[str, Any], latest: dict[str, dict[str, Any]]) -> list[str]:
    """Task groups of ``job`` (a job list stub) that Nomad has queued and not placed: no allocation yet."""
    summary = (job.get("JobSummary") or {}).get("Summary") or {}
    return sorted(group for group, counts in summary.items() if (counts or {}).get("Queued") and group not in latest)


def is_live(alloc: dict[str, Any]) -> bool:
    """May the allocation still run a task (or restart one)?"""
    return str(alloc.get("ClientStatus")) not in TERMINAL_ALLOCATION_STATUSES


def _job_lost(session: Session) -> Session | None:
    if session.status.is_terminal:
        return None
    if session.status is S.TERMINATING:
        return transition(session, S.TERMINATED, reason=session.status_info, at=utcnow())
    if session.status is S.ERROR:
        return None
    return transition(session, S.ERROR, reason="job-lost", at=utcnow())


def _stopped(session: Session) -> Session | None:
    if session.status is not S.TERMINATING:
        return None
    return transition(session, S.TERMINATED, reason=session.status_info, at=utcnow())
