"""GraphQL of an INFERENCE session's endpoint (``domain.endpoint_routes``): its url, who may call it (public, endpoint
tokens), what the ingress measured (requests/s, in-flight, errors, latency, routable replicas, cold starts)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import strawberry

from core.clock import utcnow
from core.errors import InvalidInput, NotFound, QuotaExceeded
from domain.access import can_access
from domain.endpoint_routes import endpoint_url
from domain.endpoint_series import MAX_POINTS, STEP
from domain.inference import is_inference
from domain.model import Session as SessionModel
from gateway.graphql import fields
from gateway.graphql.context import Context, Info
from stores.endpoint_access import MAX_TOKENS, ColdStart, EndpointAccessStore, EndpointToken

MAX_TOKEN_NAME = 100


def _at(stamp: float | None) -> datetime | None:
    return datetime.fromtimestamp(stamp, UTC) if stamp is not None else None


@strawberry.type(description="A token that calls one private endpoint (its secret is shown once, when issued).")
class EndpointTokenInfo:
    id: strawberry.ID
    name: str
    created_at: datetime


@strawberry.type(description="One request the activator held while the endpoint had no routable replica.")
class EndpointColdStart:
    arrived_at: datetime
    started_at: datetime | None = strawberry.field(
        description="When the first replica's task started (placed and running), before its health check passed."
    )
    routable_at: datetime | None = strawberry.field(
        description="When the endpoint first had a routable replica (its health check passed)."
    )
    first_byte_at: datetime | None = strawberry.field(description="When the replica's answer began.")
    outcome: str = strawberry.field(description="SERVED, TIMED_OUT (503 to the caller), FAILED or REFUSED.")
    seconds_to_first_byte: float | None


@strawberry.type(description="The endpoint's traffic as HAProxy counts it, sampled about once a second.")
class EndpointStatsInfo:
    sampled_at: datetime
    requests_per_second: float
    in_flight: int
    requests_total: int
    errors_total: int = strawberry.field(description="5xx answers and failed connections or responses.")
    avg_response_ms: int = strawberry.field(description="Average time to the answer's headers (last 1024 requests).")
    avg_total_ms: int = strawberry.field(description="Average total time of a request (last 1024 requests).")
    replicas_routable: int
    held: int = strawberry.field(description="Requests the activator holds now, waiting for a replica.")
    p50_ms: float | None = strawberry.field(
        description="Median time to the answer's headers, measured by HAProxy, over the last 1024 requests."
    )
    p99_ms: float | None = strawberry.field(description="The 99th percentile of the same.")


@strawberry.type(description="One point of an endpoint's traffic over time (one every few seconds, the last hour).")
class EndpointPointInfo:
    at: datetime = strawberry.field(description="The end of the step the point covers.")
    requests_per_second: float = strawberry.field(description="The mean over the step.")
    replicas: int = strawberry.field(description="Replicas taking traffic at the step's end.")
    in_flight: int


@strawberry.type(description="An INFERENCE session's stable address, balanced over its routable replicas.")
class Endpoint:
    url: str
    public: bool = strawberry.field(description="Callable without a token.")
    session_id: strawberry.Private[str]

    @fields.field(description="The endpoint's live tokens (their secrets are never shown again).")
    async def tokens(self, info: Info) -> list[EndpointTokenInfo]:
        return [_token(t) for t in await _store(info.context).tokens_of(self.session_id)]

    @fields.field(description="The latest sample of HAProxy's counters; null before the first.")
    async def stats(self, info: Info) -> EndpointStatsInfo | None:
        found = (await _store(info.context).stats()).get(self.session_id)
        if found is None:
            return None
        return EndpointStatsInfo(
            sampled_at=datetime.fromtimestamp(found.sampled_at, UTC),
            requests_per_second=found.requests_per_second,
            in_flight=found.in_flight,
            requests_total=found.requests_total,
            errors_total=found.errors_total,
            avg_response_ms=found.avg_response_ms,
            avg_total_ms=found.avg_total_ms,
            replicas_routable=found.replicas_routable,
            held=found.held,
            p50_ms=found.p50_ms,
            p99_ms=found.p99_ms,
        )

    @fields.field(
        description=f"Requests/s and replicas over the last hour, a point every {STEP:g} seconds, oldest first "
        f"(at most {MAX_POINTS})."
    )
    async def series(self, info: Info) -> list[EndpointPointInfo]:
        return [
            EndpointPointInfo(
                at=datetime.fromtimestamp(p.at, UTC),
                requests_per_second=p.requests_per_second,
                replicas=p.replicas,
                in_flight=p.in_flight,
            )
            for p in await _store(info.context).series(self.session_id)
        ]

    @fields.field(description="The last cold starts (requests held by the activator), newest first.")
    async def cold_starts(self, info: Info) -> list[EndpointColdStart]:
        return [_cold(c) for c in await _store(info.context).cold_starts(self.session_id)]


def _cold(c: ColdStart) -> EndpointColdStart:
    return EndpointColdStart(
        arrived_at=datetime.fromtimestamp(c.arrived_at, UTC),
        started_at=_at(c.started_at),
        routable_at=_at(c.routable_at),
        first_byte_at=_at(c.first_byte_at),
        outcome=c.outcome,
        seconds_to_first_byte=round(c.first_byte_at - c.arrived_at, 3) if c.first_byte_at is not None else None,
    )


def _token(t: EndpointToken) -> EndpointTokenInfo:
    return EndpointTokenInfo(id=strawberry.ID(t.id), name=t.name, created_at=t.created_at)


def _store(ctx: Context) -> EndpointAccessStore:
    return EndpointAccessStore(ctx.sessions.redis, ctx.sessions.keys)


def _url(ctx: Context, session_id: str) -> str:
    return endpoint_url(session_id, ctx.settings.gateway.apps_domain, ctx.settings.public_port)


def endpoint_url_of(root: Any, info: Info) -> str | None:
    """Session.endpointUrl."""
    return _url(info.context, str(root.id)) if root.type.value == "INFERENCE" else None


async def endpoint_of(root: Any, info: Info) -> Endpoint | None:
    """Session.endpoint."""
    if root.type.value != "INFERENCE":
        return None
    session_id = str(root.id)
    public = await _store(info.context).is_public(session_id)
    return Endpoint(url=_url(info.context, session_id), public=public, session_id=session_id)


async def _endpoint_session(ctx: Context, session_id: str) -> SessionModel:
    found = await ctx.sessions.get(session_id)
    if found is None or not can_access(ctx.viewer, found.owner_id, found.project):
        raise NotFound(f"no session {session_id}", field="sessionId")
    if not is_inference(found):
        raise InvalidInput("only INFERENCE sessions have an endpoint", field="sessionId")
    if found.status.is_terminal:
        raise NotFound(f"session {session_id} has ended", field="sessionId")
    return found


@strawberry.type(description="A new endpoint token: its secret, shown this once.")
class IssuedEndpointToken:
    token: EndpointTokenInfo
    secret: str = strawberry.field(description="Send it as 'Authorization: Bearer <secret>'.")


@strawberry.type
class EndpointMutations:
    @fields.mutation(description="Make an INFERENCE session's endpoint public (no token needed) or private again.")
    async def set_endpoint_public(self, info: Info, session_id: strawberry.ID, public: bool) -> Endpoint:
        ctx = info.context
        session = await _endpoint_session(ctx, str(session_id))
        await _store(ctx).set_public(session.id, public)
        return Endpoint(url=_url(ctx, session.id), public=public, session_id=session.id)

    @fields.mutation(
        description=f"A new token that calls this private endpoint (at most {MAX_TOKENS} live per endpoint); it "
        "passes within milliseconds."
    )
    async def issue_endpoint_token(self, info: Info, session_id: strawberry.ID, name: str) -> IssuedEndpointToken:
        ctx = info.context
        if not 0 < len(name) <= MAX_TOKEN_NAME:
            raise InvalidInput(f"a token's name has 1-{MAX_TOKEN_NAME} characters", field="name")
        session = await _endpoint_session(ctx, str(session_id))
        issued = await _store(ctx).issue(session.id, name, utcnow())
        if issued is None:
            raise QuotaExceeded(f"the endpoint has {MAX_TOKENS} live tokens already: revoke one")
        return IssuedEndpointToken(token=_token(issued[0]), secret=issued[1])

    @fields.mutation(
        description="Revoke an endpoint token: refused from HAProxy's next request on, also on an open connection."
    )
    async def revoke_endpoint_token(self, info: Info, session_id: strawberry.ID, token_id: strawberry.ID) -> bool:
        ctx = info.context
        session = await _endpoint_session(ctx, str(session_id))
        if not await _store(ctx).revoke(session.id, str(token_id)):
            raise NotFound(f"no token {str(token_id)[:40]!r} on this endpoint", field="tokenId")
        return True
