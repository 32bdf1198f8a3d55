"""Changing a live inference endpoint's replicas: which to add, drain, stop or park. Pure: the clock is passed in.

``domain.autoscaling`` says how many replicas an endpoint should run; this module says what that means for the
session's kernels (each replica is a kernel ``mainN``, one Nomad task group, see ``domain.inference``):

* **up**: a draining replica is taken back first (it still runs); then a parked one is woken; then new kernels take the
  lowest free indices (``main2`` … ), copies of the replica template, each placed on an agent by the scheduler.
* **down**: the highest replicas are *drained*: ``draining_since`` takes them out of ``endpoints_of`` at once (the
  ingress routes no new request to them) while they keep running, so requests in flight finish. A draining replica
  is stopped once the endpoint has no request in flight in a sample taken :data:`PROPAGATION` seconds after the drain
  began (the ingress has dropped it by then), or at the latest after the rules' ``drain_timeout``. Stopping removes
  its kernel (its task group leaves the job, Nomad stops the allocation and its resources are free).
* **zero**: the last replica is not removed but *parked*: the kernel stays as the template of the next replica, its
  group rendered with ``count = 0`` (no allocation, nothing held). The session stays RUNNING: an endpoint at zero is a
  live endpoint with no replica, woken by the next request (``domain.autoscaling``'s wake).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal

from core.errors import Forbidden
from domain.autoscaling import Replicas, ScalingRules
from domain.inference import endpoints_of, is_inference
from domain.model import Kernel, ScalingStatus, Session, SessionStatus
from domain.resource_policies import ProjectResourcePolicy, UserResourcePolicy

S = SessionStatus
PROPAGATION = 2.0
"""Seconds for the ingress to drop a draining replica from its routes (it follows the sessions about every second)."""
SCALED_TO_ZERO = "scaled-to-zero"
"""A parked replica's status info."""


@dataclass(frozen=True)
class ReplicaPlan:
    """What to do to an endpoint's replicas now (kernel hostnames)."""

    add: tuple[str, ...] = ()
    """New replicas, or the parked one woken: each needs an agent."""
    undrain: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.add or self.undrain or self.drain or self.stop)

    @property
    def changes_job(self) -> bool:
        """Whether the Nomad job changes (a drain or undrain only changes who gets traffic)."""
        return bool(self.add or self.stop)


def fixed_rules(session: Session) -> ScalingRules:
    """An endpoint without rules keeps the replicas it was created with."""
    count = max(1, len(serving(session)))
    return ScalingRules(min_replicas=count, max_replicas=count)


def rules_of(session: Session) -> ScalingRules:
    return session.autoscaling if session.autoscaling is not None else fixed_rules(session)


def serving(session: Session) -> tuple[Kernel, ...]:
    """The replicas that count: neither parked nor draining (starting, running or recovering)."""
    return tuple(k for k in session.kernels if not k.parked and k.draining_since is None)


def replicas_now(session: Session) -> Replicas:
    return Replicas(current=len(serving(session)), ready=len(endpoints_of(session)))


def is_scalable(session: Session) -> bool:
    """The autoscaler acts on a RUNNING endpoint only (placed, started once, not being stopped)."""
    return is_inference(session) and session.status is S.RUNNING


def plan_replicas(
    session: Session,
    desired: int,
    *,
    now: datetime,
    drain_timeout: float,
    in_flight: int | None,
    sampled_at: float | None,
) -> ReplicaPlan:
    """How to bring ``session`` to ``desired`` replicas, and which draining replicas may stop now.

    ``in_flight`` and ``sampled_at``: the endpoint's latest load sample (None: none), which says when a drained
    replica's requests have ended."""
    live = serving(session)
    draining = sorted((k for k in session.kernels if k.draining_since is not None), key=lambda k: k.index)
    parked = [k for k in session.kernels if k.parked]
    gap = desired - len(live)
    undrain: list[str] = []
    add: list[str] = []
    drain: list[str] = []
    if gap > 0:
        undrain = [k.hostname for k in draining[:gap]]
        gap -= len(undrain)
        if gap > 0 and parked:
            add.append(parked[0].hostname)
            gap -= 1
        used = {k.index for k in session.kernels}
        index = 1
        while gap > 0:
            if index not in used:
                add.append(f"main{index}")
                gap -= 1
            index += 1
    elif gap < 0:
        drain = [k.hostname for k in sorted(live, key=lambda k: k.index, reverse=True)[:-gap]]
    stop = [
        k.hostname
        for k in draining
        if k.hostname not in undrain and drained(k, now=now, timeout=drain_timeout, in_flight=in_flight, at=sampled_at)
    ]
    return ReplicaPlan(tuple(add), tuple(undrain), tuple(drain), tuple(stop))


def drained(kernel: Kernel, *, now: datetime, timeout: float, in_flight: int | None, at: float | None) -> bool:
    """May a draining replica stop: it serves nothing (not running), or no request is in flight at the endpoint in a
    sample the ingress took after dropping it, or the drain timed out."""
    since = kernel.draining_since
    if since is None:
        return False
    if kernel.status is not S.RUNNING:
        return True
    if (now - since).total_seconds() >= timeout:
        return True
    return in_flight == 0 and at is not None and at >= since.timestamp() + PROPAGATION


def with_plan(session: Session, plan: ReplicaPlan, *, now: datetime, agents: Mapping[str, str]) -> Session:
    """``session`` with ``plan`` applied to its kernels; ``agents``: the agent each added replica was placed on (an
    added replica without one is left out: it waits for the next decision)."""
    kernels = list(session.kernels)
    template = kernels[0]
    for i, kernel in enumerate(kernels):
        if kernel.hostname in plan.undrain:
            kernels[i] = replace(kernel, draining_since=None)
        elif kernel.hostname in plan.drain:
            kernels[i] = replace(kernel, draining_since=now)
        elif kernel.hostname in plan.add and kernel.parked and kernel.hostname in agents:
            kernels[i] = fresh(kernel, kernel.index, agents[kernel.hostname])
    existing = {k.hostname for k in kernels}
    for hostname in plan.add:
        if hostname not in existing and hostname in agents:
            kernels.append(fresh(template, int(hostname.removeprefix("main")), agents[hostname]))
    stopping = set(plan.stop)
    kept = [k for k in kernels if k.hostname not in stopping]
    if not kept:  # the last replica: parked, not removed (the endpoint lives on at zero)
        last = min((k for k in kernels if k.hostname in stopping), key=lambda k: k.index)
        kept = [park(last)]
    return session.evolve(kernels=tuple(sorted(kept, key=lambda k: k.index)))


def fresh(template: Kernel, index: int, agent: str) -> Kernel:
    """A new run of a replica: the template's image and resources, on ``agent``, with nothing observed yet."""
    return Kernel(
        role=template.role,
        index=index,
        hostname=f"main{index}",
        image=template.image,
        resources=dict(template.resources),
        agent=agent,
    )


def park(kernel: Kernel) -> Kernel:
    return replace(
        fresh(kernel, kernel.index, ""),
        agent=None,
        parked=True,
        status=S.TERMINATED,
        status_info=SCALED_TO_ZERO,
        finished_at=kernel.finished_at,
    )


def with_decision(session: Session, desired: int, reason: str, panicking: bool, *, now: datetime) -> Session:
    """The decision recorded, when it differs from the last one recorded (so a steady endpoint is not rewritten)."""
    last = session.scaling
    if last is not None and (last.desired, last.panicking) == (desired, panicking):
        return session
    return session.evolve(scaling=ScalingStatus(desired=desired, reason=reason, at=now, panicking=panicking))


def check_replica_ceiling(
    session: Session,
    rules: ScalingRules | None,
    *,
    user: UserResourcePolicy | None,
    project: ProjectResourcePolicy | None,
) -> None:
    """Refuse (FORBIDDEN on ``maxReplicas``) rules whose most replicas the owner's or the project's policy could never
    hold: ``max_replicas`` × a replica's slots above a listed ``total_resource_slots`` (the scheduler would leave such
    replicas waiting for ever). What the owner's other sessions hold is the scheduler's to count, at placement."""
    if rules is None or not session.kernels:
        return
    replica = session.kernels[0].resources
    for scope, policy in (("your", user), (f"project {session.project!r}'s", project)):
        limits = policy.total_resource_slots if policy is not None else None
        for slot, limit in sorted((limits or {}).items()):
            wanted = Decimal(replica.get(slot, "0")) * rules.max_replicas
            if wanted > limit:
                raise Forbidden(
                    f"maxReplicas {rules.max_replicas} would hold {wanted} of {slot}, above {scope} resource "
                    f"policy's total of {limit}",
                    field="maxReplicas",
                )
