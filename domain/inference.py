"""INFERENCE sessions: replicas of the main kernel behind a health-checked service port. Pure: no I/O.

How replicas are modelled: each replica is a kernel of its own (``main1`` … ``mainN``, role ``main``), so one
task group with ``count = 1`` per replica, exactly like the kernels of a cluster session. Everything that
works per kernel then works per replica with no special case: the scheduler counts N× the resources and
pins each replica to an agent, each replica has its own allocation, status, restart count and dynamic
ports, and ``main_kernel`` stays ``main1``. (A single group with ``count = N`` would have needed per-index
placement, status and ports in every layer.) So an INFERENCE session has clusterSize 1 in the request and
its replicas are its kernels: ``CARAVAN_CLUSTER_*`` describe the replicas, and ``clusterMode`` decides as for
any session whether they share one agent (SINGLE_NODE) or may spread (MULTI_NODE).

Recovery is Nomad's job (``restart`` in place, then ``reschedule``, see ``nomad_jobs/replica_service.py``);
what Caravan decides here is how a live INFERENCE session *reads* a replica going down: as a replica being
recovered (the kernel shows PREPARING with a ``recovering: …`` reason), never as the session ending or
failing. The session stays RUNNING while any replica recovers (RUNNING → PREPARING is not a legal
transition, so the slowest-kernel rule leaves it as it is) and ends only when destroyed.

Which replicas get traffic is decided here too: ``endpoints`` lists a replica only while it is RUNNING *and* its
service check is known to pass (``Kernel.healthy``), so a client is never sent to a replica still loading its model
or failing. The scheduler reads the check results from Nomad at each reconciliation (the event stream does not
carry them) and records them with :func:`with_replica_health`; :func:`forget_stale_health` makes a replica's health
unknown again as soon as it stops, restarts or moves, so a result about an earlier run is never taken for this one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from domain.model import Kernel, KernelObservation, Session, SessionStatus, SessionType

S = SessionStatus

MAX_REPLICAS = 16
SERVICE_PORT_ENV = "CARAVAN_SERVICE_PORT"
"""The dynamic host port a replica must listen on (kernels use host networking)."""

RECOVERABLE_SESSION_STATUSES = frozenset({S.SCHEDULED, S.PREPARING, S.RUNNING})
"""While the session is live and not being stopped, a replica going down is one Nomad brings back."""
REPLICA_DOWN = frozenset({S.TERMINATING, S.TERMINATED, S.ERROR})
NEVER_STARTED_FAILURE = "failed-to-start"
"""A replica that never ran once (bad image, bad driver config) stays an ERROR: retrying will not fix it."""
CHECK_PASSED = "success"
CHECK_FAILED = "failure"
"""Nomad's check statuses besides ``pending`` (not run yet)."""


@dataclass(frozen=True)
class HealthReading:
    """What the service checks of one run of a replica said: the run is the allocation and its restart count."""

    hostname: str
    alloc_id: str
    restarts: int
    healthy: bool | None


def replicas_of(main: Kernel, replicas: int) -> tuple[Kernel, ...]:
    """``main1`` … ``main{replicas}``: every replica is a copy of the main kernel (its image and slots)."""
    return tuple(
        replace(main, index=i, hostname=f"main{i}", resources=dict(main.resources)) for i in range(1, replicas + 1)
    )


def is_inference(session: Session) -> bool:
    return session.type is SessionType.INFERENCE


def replica_observation(session: Session, seen: KernelObservation) -> KernelObservation:
    """``seen`` as a live INFERENCE session reads it: a replica down is a replica recovering.

    Nomad restarts a killed or unhealthy replica in place and, once the restarts are used up, reschedules
    it, with no limit: so a replica's allocation stopping, failing or being lost is never the session's
    end. Only a replica that failed to start before the session ever ran keeps its ERROR.
    """
    if not is_inference(session) or session.status not in RECOVERABLE_SESSION_STATUSES:
        return seen
    if seen.status not in REPLICA_DOWN:
        return seen
    if seen.reason == NEVER_STARTED_FAILURE and session.started_at is None:
        return seen
    return replace(seen, status=S.PREPARING, reason=f"recovering: {seen.reason}")


def earlier_run(session: Session, kernel: Kernel, seen: KernelObservation) -> bool:
    """Is ``seen`` about an earlier replica of the same name? A replica the autoscaler added (or woke from zero) has no
    allocation yet, and the one stopped before under its name may still be reported, down, until Nomad places the new
    one: that report is not about this replica (a new replica's own allocation is seen running before it can fail)."""
    return (
        is_inference(session)
        and session.status is S.RUNNING
        and kernel.alloc_id is None
        and seen.alloc_id is not None
        and seen.status in REPLICA_DOWN
    )


def elsewhere(session: Session, kernel: Kernel, seen: KernelObservation) -> bool:
    """Is ``seen`` about an allocation on another agent than the replica's? A replica is pinned to its agent, so such
    an allocation is the run it had before the scheduler moved it off a lost node (``domain.endpoint_scaling.moved``):
    that node's client, back, stops it, and its reports say nothing of the replica now."""
    return is_inference(session) and kernel.agent is not None and seen.agent is not None and seen.agent != kernel.agent


def service_endpoint(session: Session, kernel: Kernel) -> str | None:
    """``host:port`` where ``kernel`` serves the session's service port, once Nomad allocated it."""
    if session.service_port is None:
        return None
    head = f"{session.service_port}="
    return next((p[len(head) :] for p in kernel.ports if p.startswith(head)), None)


def takes_traffic(kernel: Kernel) -> bool:
    """A replica gets requests while it runs, passes its check, and is neither draining nor parked (the autoscaler's
    scale-down takes it out of traffic first: ``domain.endpoint_scaling``)."""
    return kernel.status is S.RUNNING and kernel.healthy is True and kernel.draining_since is None and not kernel.parked


def endpoints_of(session: Session) -> tuple[str, ...]:
    """The service endpoint of every replica that takes traffic (:func:`takes_traffic`), in replica order (empty
    unless INFERENCE)."""
    if not is_inference(session) or session.status.is_terminal:
        return ()
    found = (service_endpoint(session, k) for k in session.kernels if takes_traffic(k))
    return tuple(e for e in found if e)


def why_cold(session: Session | None) -> str:
    """Why an endpoint has no replica taking traffic, in a sentence (the ``ENDPOINT_COLD`` answer of a request held
    to its end): waiting in the queue, and for what (its wait reasons); or each replica's state."""
    if session is None or session.status.is_terminal:
        return "the endpoint ended"
    if session.status is S.PENDING:
        reasons = "; ".join(session.wait_reasons) or "not placed yet"
        return f"the endpoint waits in the queue: {reasons}"
    states = []
    for kernel in session.kernels:
        if kernel.parked:
            state = "parked"
        elif kernel.draining_since is not None:
            state = "draining"
        elif kernel.status is S.RUNNING:
            state = "running, its check not passed yet" if kernel.healthy is not True else "running"
        else:
            state = kernel.status.value.lower()
        states.append(f"{kernel.hostname} {state}")
    return "its replicas: " + ", ".join(states) if states else "it has no replica"


def replica_health(results: Iterable[Mapping[str, Any]], *, run_started: int | None) -> bool | None:
    """Whether a replica's current run passes its checks, from Nomad's latest result of each check.

    ``results`` are the values of Nomad's ``/v1/client/allocation/<id>/checks`` answer; ``run_started`` is when the
    task's current run started, in unix seconds (Nomad keeps a check's last result across a task restart, so a
    success from before a crash would otherwise vouch for the run after it). Every check counts, whatever its
    ``Mode``: a failing readiness check asks for no traffic just as a failing healthiness check means none should
    come. True: every check passed since the run started. False: one failed since. None: not known yet (no
    checks, one pending, or one not run since the run started).
    """
    current: list[str] = []
    known = True
    for result in results:
        stamp = result.get("Timestamp")
        if run_started is not None and (not isinstance(stamp, int | float) or int(stamp) < run_started):
            known = False  # about an earlier run: tells nothing of this one
            continue
        current.append(str(result.get("Status", "")))
    if CHECK_FAILED in current:
        return False
    if not known or not current or any(status != CHECK_PASSED for status in current):
        return None
    return True


def forget_stale_health(before: Session, after: Session) -> Session:
    """``after`` with the health of each kernel that stopped running, restarted or moved since ``before`` unknown
    again: a health reading is about one run of a replica, and the next run must pass its checks anew."""
    was = {k.hostname: k for k in before.kernels}

    def still_valid(kernel: Kernel) -> bool:
        old = was.get(kernel.hostname)
        return (
            old is not None
            and kernel.status is S.RUNNING
            and kernel.alloc_id == old.alloc_id
            and kernel.restarts == old.restarts
        )

    kernels = tuple(k if k.healthy is None or still_valid(k) else replace(k, healthy=None) for k in after.kernels)
    return after if kernels == after.kernels else after.evolve(kernels=kernels)


def with_replica_health(session: Session, readings: Iterable[HealthReading]) -> Session | None:
    """``session`` with each reading recorded on its replica, or None when nothing changed.

    A reading counts only while its replica still is the RUNNING run it was taken of: the event stream may have seen
    the replica stop, restart or move while the checks were read, and then the reading is about a run that is gone.
    """
    if not is_inference(session) or session.status.is_terminal:
        return None
    by_host = {r.hostname: r for r in readings}

    def read(kernel: Kernel) -> Kernel:
        reading = by_host.get(kernel.hostname)
        if (
            reading is None
            or kernel.status is not S.RUNNING
            or kernel.alloc_id != reading.alloc_id
            or kernel.restarts != reading.restarts
        ):
            return kernel
        return replace(kernel, healthy=reading.healthy)

    kernels = tuple(read(k) for k in session.kernels)
    return session.evolve(kernels=kernels) if kernels != session.kernels else None
