"""An inference endpoint's autoscaling in GraphQL: the rules as an input (createSession's ``autoscaling``, and
``updateEndpointScaling`` for a live endpoint), and what the session shows of them (``session.autoscaling``)."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

import strawberry

from core.errors import Conflict, InvalidInput, NotFound
from domain import autoscaling as policy
from domain.access import can_access
from domain.endpoint_scaling import (
    behind,
    replica_template,
    replicas_now,
    rules_of,
    with_update,
)
from domain.inference import is_inference
from domain.model import Session as SessionModel
from domain.model import SessionStatus as Status
from domain.session_requests import checked_replica_update
from gateway.graphql import fields
from gateway.graphql.context import Info
from gateway.graphql.sessions.resource_input import ResourceInput


@strawberry.enum(name="ScalingMetric", description="What an endpoint's target counts, per replica.")
class ScalingMetric(Enum):
    IN_FLIGHT = "IN_FLIGHT"
    RPS = "RPS"


@strawberry.input(description="An inference endpoint's autoscaling rules. Durations: '90s', '5m' or seconds.")
class AutoscalingInput:
    min_replicas: int = strawberry.field(description="0-16; 0: the endpoint scales to zero when idle.")
    max_replicas: int = strawberry.field(description="1-16, at least minReplicas; admitted under resource policies.")
    target: float = strawberry.field(description="Requests in flight (IN_FLIGHT) or per second (RPS) per replica.")
    metric: ScalingMetric = ScalingMetric.IN_FLIGHT
    stable_window: str | None = strawberry.field(default=None, description="Averaging window (default 60s).")
    panic_window: str | None = strawberry.field(default=None, description="Burst window (default 6s).")
    panic_threshold: float | None = strawberry.field(
        default=None, description="Panic when the burst window asks this many times the ready replicas (default 2)."
    )
    scale_down_delay: str | None = strawberry.field(
        default=None, description="Demand must stay lower this long before a scale-down (default 30s)."
    )
    scale_to_zero_after: str | None = strawberry.field(
        default=None, description="minReplicas 0: no request for this long and replicas go to zero (default 5m)."
    )
    drain_timeout: str | None = strawberry.field(
        default=None, description="A replica taken out of traffic stops at the latest after this (default 30s)."
    )


def scaling_request_of(given: AutoscalingInput | None) -> policy.ScalingRequest | None:
    if given is None:
        return None
    return policy.ScalingRequest(
        min_replicas=given.min_replicas,
        max_replicas=given.max_replicas,
        target=given.target,
        metric=policy.Metric(given.metric.value),
        stable_window=given.stable_window,
        panic_window=given.panic_window,
        panic_threshold=given.panic_threshold,
        scale_down_delay=given.scale_down_delay,
        scale_to_zero_after=given.scale_to_zero_after,
        drain_timeout=given.drain_timeout,
    )


@strawberry.type(description="An endpoint's autoscaling rules, seconds for every window.")
class AutoscalingRules:
    min_replicas: int
    max_replicas: int
    target: float
    metric: ScalingMetric
    stable_window: float
    panic_window: float
    panic_threshold: float
    scale_down_delay: float
    scale_to_zero_after: float
    drain_timeout: float


@strawberry.type(description="An inference endpoint's scaling: its rules, replicas, and the last decision.")
class EndpointScaling:
    rules: AutoscalingRules | None = strawberry.field(description="Null: a fixed number of replicas.")
    desired_replicas: int = strawberry.field(description="What the autoscaler last decided (the replicas if never).")
    current_replicas: int = strawberry.field(description="Replicas starting, running or recovering (not draining).")
    ready_replicas: int = strawberry.field(description="Replicas taking traffic (len(endpoints)).")
    draining_replicas: int = strawberry.field(description="Replicas out of traffic, finishing their requests.")
    revision: int = strawberry.field(description="Bumped by each updateEndpoint.")
    replicas_behind: int = strawberry.field(
        description="Replicas still on an older revision (a rolling update in progress when above 0)."
    )
    last_decision_reason: str | None
    last_decision_at: datetime | None
    panicking: bool


def scaling_of(s: SessionModel) -> EndpointScaling | None:
    if not is_inference(s):
        return None
    rules = s.autoscaling
    replicas = replicas_now(s)
    return EndpointScaling(
        rules=None
        if rules is None
        else AutoscalingRules(
            min_replicas=rules.min_replicas,
            max_replicas=rules.max_replicas,
            target=rules.target,
            metric=ScalingMetric(rules.metric.value),
            stable_window=rules.stable_window,
            panic_window=rules.panic_window,
            panic_threshold=rules.panic_threshold,
            scale_down_delay=rules.scale_down_delay,
            scale_to_zero_after=rules.scale_to_zero_after,
            drain_timeout=rules.drain_timeout,
        ),
        desired_replicas=s.scaling.desired if s.scaling is not None else replicas.current,
        current_replicas=replicas.current,
        ready_replicas=replicas.ready,
        draining_replicas=sum(1 for k in s.kernels if k.draining_since is not None),
        revision=s.revision,
        replicas_behind=len(behind(s)),
        last_decision_reason=s.scaling.reason if s.scaling is not None else None,
        last_decision_at=s.scaling.at if s.scaling is not None else None,
        panicking=s.scaling.panicking if s.scaling is not None else False,
    )


@strawberry.input
class EndpointEnvVarInput:
    name: str
    value: str


@strawberry.input(
    description="What a live endpoint's replicas run: replaced one at a time (a rolling update). A field left out "
    "(or null) keeps its current value; at least one is given."
)
class EndpointUpdateInput:
    startup_command: str | None = strawberry.field(default=None, description="The server each replica runs.")
    environ: list[EndpointEnvVarInput] | None = strawberry.field(
        default=None, description="The replicas' environment (replaces the previous one whole)."
    )
    image: str | None = strawberry.field(
        default=None, description="docker: the replicas' image, allowed as at createSession (allowlist, catalog)."
    )
    resources: list[ResourceInput] | None = strawberry.field(
        default=None,
        description="Slots of each replica: those given replace the current ones, the others stay; admitted under "
        "the owner's and the project's resource policies as at creation.",
    )


def _once(pairs: list[tuple[str, str]] | None, field: str, what: str) -> dict[str, str] | None:
    """``pairs`` as a mapping (None: not given); a name given twice is INVALID_INPUT on ``field``."""
    if pairs is None:
        return None
    found = dict(pairs)
    if len(found) != len(pairs):
        raise InvalidInput(f"each {what} may be given once", field=field)
    return found


@strawberry.type
class ScalingMutations:
    @fields.mutation(
        description="Set (or, with null, clear) a live INFERENCE endpoint's autoscaling rules; the autoscaler acts "
        "on them within a second. Without rules the endpoint keeps the replicas it has."
    )
    async def update_endpoint_scaling(
        self, info: Info, id: strawberry.ID, autoscaling: AutoscalingInput | None
    ) -> EndpointScaling:
        ctx = info.context
        found = await ctx.sessions.get(str(id))
        if found is None or not can_access(ctx.viewer, found.owner_id, found.project):
            raise NotFound(f"no session {id}", field="id")
        if not is_inference(found):
            raise InvalidInput("only an INFERENCE session has autoscaling rules", field="id")
        if found.status.is_terminal:
            raise Conflict("an ended endpoint cannot be scaled", field="id")
        request = scaling_request_of(autoscaling)
        rules = policy.rules_of_request(request) if request is not None else None
        (await ctx.creation.policies([found.owner_id], [found.project])).admit_replicas(found, rules)

        def mutate(session: SessionModel) -> SessionModel | None:
            if session.status.is_terminal:
                return None
            return session.evolve(autoscaling=rules)

        updated = await ctx.sessions.update(found.id, mutate)
        if updated is None or updated.status.is_terminal:
            raise Conflict("the endpoint ended meanwhile", field="id")
        scaling = scaling_of(updated)
        assert scaling is not None
        return scaling

    @fields.mutation(
        description="Change what a live INFERENCE endpoint's replicas run (command, environment, image, slots): a "
        "rolling update starts a replica of the new revision, waits until its health check passes, then drains and "
        "stops one of the old, one at a time; the endpoint keeps serving throughout. The image and slots are checked "
        "as at createSession (allowlist, known slots, the owner's resource policy). CONFLICT while an update is in "
        "progress."
    )
    async def update_endpoint(self, info: Info, id: strawberry.ID, input: EndpointUpdateInput) -> EndpointScaling:
        ctx = info.context
        found = await ctx.sessions.get(str(id))
        if found is None or not can_access(ctx.viewer, found.owner_id, found.project):
            raise NotFound(f"no session {id}", field="id")
        if not is_inference(found):
            raise InvalidInput("only an INFERENCE session is updated this way", field="id")
        environ = _once(None if input.environ is None else [(e.name, e.value) for e in input.environ], "environ",
                        "environment variable")  # fmt: skip
        slots = _once(None if input.resources is None else [(r.slot, r.amount) for r in input.resources],
                      "resources", "slot")  # fmt: skip
        template = replica_template(found)
        owner = await ctx.users.get(found.owner_id)
        rules = await ctx.creation.rules(
            resource_group=found.resource_group,
            preset=None,
            images=[input.image] if input.image else [],
            users=(ctx.viewer.id, found.owner_id),
        )
        update = checked_replica_update(
            found,
            template,
            startup_command=input.startup_command,
            environ=environ,
            image=input.image,
            resources=slots,
            rules=rules,
            users=[ctx.viewer] + ([owner] if owner is not None and owner.id != ctx.viewer.id else []),
        )
        policies = await ctx.creation.policies([found.owner_id], [found.project])
        policies.admit_replicas(found, rules_of(found), replica=update.resources)

        def mutate(session: SessionModel) -> SessionModel | None:
            if session.status is not Status.RUNNING:
                raise Conflict(f"only a RUNNING endpoint is updated; this one is {session.status.value}", field="id")
            return with_update(session, update)

        updated = await ctx.sessions.update(found.id, mutate)
        assert updated is not None
        scaling = scaling_of(updated)
        assert scaling is not None
        return scaling
