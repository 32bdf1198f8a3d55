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
* **rolling update** (``with_update``, ``plan_rollout``): a new revision of what the replicas run (command,
  environment, image, slots); new replicas are made of it (:func:`replica_template`), the old ones keep theirs (their
  kernel's image and slots, the previous command and environment: :func:`as_run_by`) until replaced one by one.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal

from core.errors import Conflict, Forbidden
from domain.autoscaling import Replicas, ScalingRules
from domain.inference import endpoints_of, is_inference, takes_traffic
from domain.model import Kernel, ReplicaSpec, ScalingStatus, Session, SessionStatus
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
    """An endpoint without rules keeps the replicas it has (those it was created with, or those it had when its rules
    were cleared): nothing but a rolling update, which keeps their number, changes them."""
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
    template = replica_template(session)
    for i, kernel in enumerate(kernels):
        if kernel.hostname in plan.undrain:
            kernels[i] = replace(kernel, draining_since=None)
        elif kernel.hostname in plan.drain:
            kernels[i] = replace(kernel, draining_since=now)
        elif kernel.hostname in plan.add and kernel.parked and kernel.hostname in agents:
            kernels[i] = fresh(template, kernel.index, agents[kernel.hostname], session.revision)
    existing = {k.hostname for k in kernels}
    for hostname in plan.add:
        if hostname not in existing and hostname in agents:
            index = int(hostname.removeprefix("main"))
            kernels.append(fresh(template, index, agents[hostname], session.revision))
    stopping = set(plan.stop)
    kept = [k for k in kernels if k.hostname not in stopping]
    if not kept:  # the last replica: parked, not removed (the endpoint lives on at zero)
        last = min((k for k in kernels if k.hostname in stopping), key=lambda k: k.index)
        kept = [park(last)]
    after = session.evolve(kernels=tuple(sorted(kept, key=lambda k: k.index)))
    if after.previous is not None and not behind(after):
        after = after.evolve(previous=None)  # the rolling update is over: no replica runs the previous revision
    return after


def replica_template(session: Session) -> Kernel:
    """What a new replica of the endpoint's revision copies (its image and slots): a replica already at that revision
    (the lowest), else, while a rolling update has made none yet, the first kernel with the revision's image and slots
    (``Session.image`` and ``resources``, which :func:`with_update` sets)."""
    current = [k for k in session.kernels if k.revision == session.revision]
    if current:
        return min(current, key=lambda k: k.index)
    return replace(session.kernels[0], image=session.image, resources=dict(session.resources))


def fresh(template: Kernel, index: int, agent: str, revision: int = 0) -> Kernel:
    """A new run of a replica: the template's image and resources, on ``agent``, at ``revision``, with nothing observed
    yet."""
    return Kernel(
        role=template.role,
        index=index,
        hostname=f"main{index}",
        image=template.image,
        resources=dict(template.resources),
        agent=agent,
        revision=revision,
    )


def park(kernel: Kernel) -> Kernel:
    return replace(
        fresh(kernel, kernel.index, "", kernel.revision),
        agent=None,
        parked=True,
        status=S.TERMINATED,
        status_info=SCALED_TO_ZERO,
        finished_at=kernel.finished_at,
    )


def stranded(session: Session, down: Set[str]) -> tuple[str, ...]:
    """Replicas down on an agent whose Nomad node is ``down`` (its client lost): each replica is pinned to its agent
    (``nomad_jobs.session_job``), so Nomad cannot place it elsewhere; the scheduler places it again
    (:func:`moved`). A replica running there (its client back) is left as it runs."""
    return tuple(k.hostname for k in serving(session) if k.agent in down and k.status is not S.RUNNING)


def moved(session: Session, agents: Mapping[str, str]) -> Session:
    """``session`` with each replica named in ``agents`` a new run on its new agent (its own image, slots and
    revision): its job rendered again changes only that replica's group (its pin), so Nomad places it there."""
    kernels = tuple(
        fresh(k, k.index, agents[k.hostname], k.revision) if k.hostname in agents else k for k in session.kernels
    )
    return session.evolve(kernels=kernels)


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
    replica: Mapping[str, str] | None = None,
) -> None:
    """Refuse (FORBIDDEN) rules whose most replicas the owner's or the project's policy could never hold:
    ``max_replicas`` × a replica's slots above a listed ``total_resource_slots`` (the scheduler would leave such
    replicas waiting for ever). What the owner's other sessions hold is the scheduler's to count, at placement.

    ``replica``: the slots of a replica (default: those new replicas get, :func:`replica_template`); when given (a
    rolling update's new slots), the refusal is on ``resources.<slot>``, else on ``maxReplicas``."""
    if rules is None or not session.kernels:
        return
    slots = replica if replica is not None else replica_template(session).resources
    for scope, policy in (("your", user), (f"project {session.project!r}'s", project)):
        limits = policy.total_resource_slots if policy is not None else None
        for slot, limit in sorted((limits or {}).items()):
            wanted = Decimal(slots.get(slot, "0")) * rules.max_replicas
            if wanted > limit:
                raise Forbidden(
                    f"{rules.max_replicas} replicas would hold {wanted} of {slot}, above {scope} resource "
                    f"policy's total of {limit}",
                    field="maxReplicas" if replica is None else f"resources.{slot}",
                )


# -- rolling updates --


def behind(session: Session) -> tuple[Kernel, ...]:
    """Replicas still on an older revision than the endpoint's (a parked one is woken at the current one)."""
    return tuple(k for k in session.kernels if k.revision < session.revision and not k.parked)


@dataclass(frozen=True)
class ReplicaUpdate:
    """What the replicas of an endpoint's next revision run (``updateEndpoint``, checked by
    ``domain.session_requests.checked_replica_update``): each field given, or the current revision's."""

    startup_command: str | None
    environ: dict[str, str]
    image: str
    resources: dict[str, str]


def with_update(session: Session, update: ReplicaUpdate) -> Session:
    """The endpoint at a new revision running ``update``: its replicas keep the previous one (their kernels' image and
    slots, ``previous``'s command and environment) until the rolling update has replaced them. Refused while one is
    in progress."""
    if session.previous is not None and behind(session):
        raise Conflict("a rolling update of this endpoint is in progress: wait until it is over", field="id")
    previous = ReplicaSpec(session.startup_command, dict(session.environ), len(serving(session)))
    return session.evolve(
        startup_command=update.startup_command,
        environ=dict(update.environ),
        image=update.image,
        resources=dict(update.resources),
        revision=session.revision + 1,
        previous=previous,
    )


def as_run_by(session: Session, kernel: Kernel) -> Session:
    """``session`` as ``kernel``'s task group is rendered: with the previous revision's command and environment while
    the replica runs that revision."""
    if session.previous is None or kernel.revision >= session.revision:
        return session
    return session.evolve(startup_command=session.previous.startup_command, environ=session.previous.environ)


def plan_rollout(
    session: Session, *, now: datetime, drain_timeout: float, in_flight: int | None, sampled_at: float | None
) -> ReplicaPlan | None:
    """The next step of a rolling update, one replica at a time (None: no replica is behind).

    Surge first: a replica of the new revision is added; once it takes traffic (its check passed), the highest
    replica of the old revision is drained (it finishes its requests) and then stopped, and so on. So the endpoint
    never serves with fewer replicas than it had, and each old replica leaves only after a new one serves."""
    if not behind(session):
        return None
    old = [k for k in serving(session) if k.revision < session.revision]
    draining = [k for k in session.kernels if k.draining_since is not None]
    stop = tuple(
        k.hostname for k in draining if drained(k, now=now, timeout=drain_timeout, in_flight=in_flight, at=sampled_at)
    )
    new = [k for k in serving(session) if k.revision == session.revision]
    if any(not takes_traffic(k) for k in new) or draining or not old:
        return ReplicaPlan(stop=stop)  # a new replica is not serving yet, or an old one drains: wait
    kept = session.previous.replicas if session.previous is not None else len(old)
    if len(serving(session)) > kept:  # the new replica serves: retire the highest old one
        victim = max(old, key=lambda k: k.index)
        return ReplicaPlan(drain=(victim.hostname,), stop=stop)
    used = {k.index for k in session.kernels}
    index = next(i for i in range(1, len(used) + 2) if i not in used)
    return ReplicaPlan(add=(f"main{index}",), stop=stop)
