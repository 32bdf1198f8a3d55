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
"""

from __future__ import annotations

from dataclasses import replace

from common.model import Kernel, KernelObservation, Session, SessionStatus, SessionType

S = SessionStatus

MAX_REPLICAS = 16
SERVICE_PORT_ENV = "CARAVAN_SERVICE_PORT"
"""The dynamic host port a replica must listen on (kernels use host networking)."""

RECOVERABLE_SESSION_STATUSES = frozenset({S.SCHEDULED, S.PREPARING, S.RUNNING})
"""While the session is live and not being stopped, a replica going down is one Nomad brings back."""
REPLICA_DOWN = frozenset({S.TERMINATING, S.TERMINATED, S.ERROR})
NEVER_STARTED_FAILURE = "failed-to-start"
"""A replica that never ran once (bad image, bad driver config) stays an ERROR: retrying will not fix it."""


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


def service_endpoint(session: Session, kernel: Kernel) -> str | None:
    """``host:port`` where ``kernel`` serves the session's service port, once Nomad allocated it."""
    if session.service_port is None:
        return None
    head = f"{session.service_port}="
    return next((p[len(head):] for p in kernel.ports if p.startswith(head)), None)


def endpoints_of(session: Session) -> tuple[str, ...]:
    """The service endpoint of every RUNNING replica, in replica order (empty unless INFERENCE)."""
    if not is_inference(session) or session.status.is_terminal:
        return ()
    found = (service_endpoint(session, k) for k in session.kernels if k.status is S.RUNNING)
    return tuple(e for e in found if e)
