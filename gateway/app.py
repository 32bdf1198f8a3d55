"""The gateway's ASGI app: GraphQL at /graphql, health at /healthz and /readyz, Prometheus at /metrics."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from strawberry.types.unset import UNSET, UnsetType

from common.errors import TransientError, Unavailable
from common.event_hub import EventHub
from common.keys import Keys
from common.redis import client as redis_client
from common.settings import Settings
from common.store import SessionStore
from common.users import UserStore, bootstrap_admin_token
from gateway.graphql.context import Context
from gateway.graphql.errors import OUTAGES
from gateway.graphql.http import GraphQLOverHTTP
from gateway.graphql.protection import Guard, Limits, RateLimiter, bearer
from gateway.graphql.result_cache import ResultCache
from gateway.graphql.schema import build_schema
from gateway.graphql.websocket import PROTOCOLS as WS_PROTOCOLS
from gateway.graphql.websocket import RateLimitedTransportWS, accept_connection
from gateway.metrics import Metrics
from nomad_jobs.client import NomadClient

log = logging.getLogger(__name__)


class CaravanGraphQL(GraphQLOverHTTP):
    graphql_transport_ws_handler_class = RateLimitedTransportWS

    def __init__(self, state: dict[str, Any], limits: Limits, metrics: Metrics) -> None:
        settings: Settings = state["settings"]
        keys = Keys(settings.redis.prefix)
        limiter = RateLimiter(lambda: state["redis"], keys, limits.rate_limit, limits.rate_window)
        schema = build_schema(limits)
        results = (ResultCache(lambda: state["redis"], keys, schema._schema, limits.max_tokens)
                   if limits.result_cache else None)
        super().__init__(schema, guard=Guard(limits, limiter), metrics=metrics, result_cache=results,
                         graphql_ide="graphiql", allow_queries_via_get=True, subscription_protocols=WS_PROTOCOLS)
        self.state = state

    async def on_ws_connect(self, context: Context) -> UnsetType:
        await accept_connection(context)
        return UNSET  # a plain connection_ack

    async def get_context(self, request: Request | WebSocket, response: Any = None) -> Context:
        users: UserStore = self.state["users"]
        token = bearer(request.headers.get("authorization", ""))
        user, failure = None, None
        try:
            user = await users.by_token(token) if token else None
        except OUTAGES:
            failure = Unavailable("Redis is unreachable; retry shortly")
        return Context(
            request=request,
            settings=self.state["settings"],
            sessions=self.state["sessions"],
            users=users,
            nomad=self.state["nomad"],
            user=user,
            request_id=uuid.uuid4().hex[:12],
            auth_failure=failure,
            hub=self.state["hub"],
        )


def create_app(settings: Settings, limits: Limits | None = None) -> Starlette:
    """``limits`` default to the ``CARAVAN_GRAPHQL_*`` environment variables (see protection.Limits)."""
    state: dict[str, Any] = {"settings": settings}
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connect_as = settings.for_role("gateway")  # its own Nomad token and Redis user
        redis = redis_client(connect_as.redis)
        keys = Keys(settings.redis.prefix)
        nomad = NomadClient(connect_as.nomad)
        state.update(redis=redis, sessions=SessionStore(redis, keys), users=UserStore(redis, keys), nomad=nomad,
                     hub=EventHub(redis))
        token = bootstrap_admin_token(settings.gateway.admin_token, settings.home)
        try:
            await state["users"].ensure_bootstrap_admin(token)
        except Exception as exc:  # Redis may come up after us; readiness reports it meanwhile
            log.warning("could not register the bootstrap admin yet: %s", exc)
        yield
        await state["hub"].aclose()
        await nomad.aclose()
        await redis.aclose()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        checks: dict[str, str] = {}
        try:
            await state["redis"].ping()
            checks["redis"] = "ok"
        except Exception as exc:
            checks["redis"] = f"unavailable: {exc}"
        try:
            await state["nomad"].leader()
            checks["nomad"] = "ok"
        except TransientError as exc:
            checks["nomad"] = f"unavailable: {exc}"
        ready = all(v == "ok" for v in checks.values())
        return JSONResponse({"ready": ready, **checks}, status_code=200 if ready else 503)

    graphql = CaravanGraphQL(state, limits or Limits.from_env(), metrics)
    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics.endpoint(lambda: state["sessions"])),
            Route("/graphql", graphql),  # the view answers other methods itself: 405 with Allow
            WebSocketRoute("/graphql", graphql),
        ],
        lifespan=lifespan,
    )
