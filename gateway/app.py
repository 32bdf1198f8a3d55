"""The gateway's ASGI app: the web UI at /ui/ (``/`` leads there), GraphQL at /graphql (GraphiQL for a browser, its
assets at /graphiql/), health at /healthz and /readyz, Prometheus at /metrics."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from strawberry.types.unset import UNSET, UnsetType

from core.errors import TransientError, Unavailable
from core.keys import Keys
from core.redis import client as redis_client
from core.secrets import ensure_app_cookie_key
from core.settings import Settings
from gateway import files, ide, terminal, usage_export, web
from gateway.apps.proxy import AppLaunches, AppOrigins
from gateway.auth import authenticate, header_token
from gateway.endpoints.activator import EndpointActivator
from gateway.endpoints.activator import http_client as endpoint_http_client
from gateway.graphql.context import Context
from gateway.graphql.errors import OUTAGES
from gateway.graphql.guard import Guard
from gateway.graphql.http import GraphQLOverHTTP
from gateway.graphql.limits import Limits
from gateway.graphql.rate_limit import RateLimiter
from gateway.graphql.result_cache import ResultCache
from gateway.graphql.schema import build_schema
from gateway.graphql.websocket import PROTOCOLS as WS_PROTOCOLS
from gateway.graphql.websocket import RateLimitedTransportWS, accept_connection
from gateway.kernel_exec import ExecSlots, exec_limits_from_env
from gateway.log_follows import LogFollows
from gateway.nomad_shares import NomadShares
from gateway.outages import OutageAnswers
from gateway.planes import planes_running
from gateway.prometheus import Metrics
from gateway.revocations import RevocationWatch
from nomad_jobs.client import LOG_FOLLOWS, NomadClient
from stores.app_access import AppAccessStore
from stores.event_hub import EventHub
from stores.sessions import SessionStore
from stores.users import Authenticated, UserStore, bootstrap_admin_token

log = logging.getLogger(__name__)


class CaravanGraphQL(GraphQLOverHTTP):
    graphql_transport_ws_handler_class = RateLimitedTransportWS

    def __init__(self, state: dict[str, Any], limits: Limits, metrics: Metrics) -> None:
        settings: Settings = state["settings"]
        keys = Keys(settings.redis.prefix)
        limiter = RateLimiter(lambda: state["redis"], keys, limits.rate_limit, limits.rate_window)
        schema = build_schema(limits)
        results = (
            ResultCache(lambda: state["redis"], keys, schema._schema, limits.max_tokens)
            if limits.result_cache
            else None
        )
        super().__init__(
            schema,
            guard=Guard(limits, limiter),
            metrics=metrics,
            result_cache=results,
            graphql_ide="graphiql",
            allow_queries_via_get=True,
            subscription_protocols=WS_PROTOCOLS,
        )
        self.state = state
        self.nomad_shares = NomadShares(limits.max_nomad_calls, limits.max_user_nomad_calls)
        self.log_follows = LogFollows(LOG_FOLLOWS, limits.max_user_log_follows, limits.max_log_follows)
        self.execs: ExecSlots = state["execs"]

    @property
    def graphql_ide_html(self) -> str:
        """GraphiQL with its assets served by this gateway (Strawberry's page loads them from a CDN)."""
        return ide.page()

    async def on_ws_connect(self, context: Context) -> UnsetType:
        await accept_connection(context)
        if context.user is not None:  # known only now (the token may come in connection_init): the user's share
            context.nomad = self.state["nomad"].admitted(self.nomad_shares.admission(context.user.id))
        return UnsetType()  # UNSET (the one instance, typed): a plain connection_ack

    async def get_context(self, request: Request | WebSocket, response: Any = None) -> Context:
        users: UserStore = self.state["users"]
        user, failure = None, None
        admitted: Authenticated | None | UnsetType = getattr(request.state, "admitted", UNSET)
        try:
            if not isinstance(admitted, UnsetType):  # checked with the rate limit's count (Guard.admit)
                user = admitted.user if admitted else None
            elif found := await authenticate(users, header_token(request.headers)):
                user = found.user
        except OUTAGES as exc:
            failure = Unavailable("Redis is unreachable; retry shortly")
            failure.__cause__ = exc  # what failed, for the log of outages (gateway.outage_log)
        return Context(
            request=request,
            settings=self.state["settings"],
            sessions=self.state["sessions"],
            users=users,
            nomad=self.state["nomad"].admitted(self.nomad_shares.admission(user.id if user else "")),
            user=user,
            request_id=uuid.uuid4().hex[:12],
            auth_failure=failure,
            hub=self.state["hub"],
            revocations=self.state["revocations"],
            log_follows=self.log_follows.connection(),
            execs=self.execs.connection(),
        )


def create_app(settings: Settings, limits: Limits | None = None) -> Starlette:
    """``limits`` default to the ``CARAVAN_GRAPHQL_*`` environment variables (see gateway.graphql.limits)."""
    state: dict[str, Any] = {"settings": settings, "execs": ExecSlots(exec_limits_from_env())}
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connect_as = settings.for_role("gateway")  # its own Nomad token and Redis user
        async with (
            contextlib.AsyncExitStack() as closing
        ):  # each closed at the end, the last made first, whatever fails
            redis = redis_client(connect_as.redis)
            closing.push_async_callback(redis.aclose)
            keys = Keys(settings.redis.prefix)
            nomad = NomadClient(connect_as.nomad)
            closing.push_async_callback(nomad.aclose)
            users = UserStore(redis, keys, max_tokens=settings.gateway.max_tokens_per_user)
            state.update(
                redis=redis,
                sessions=SessionStore(redis, keys, usage_retention=settings.usage_raw_retention),
                users=users,
                nomad=nomad,
                hub=EventHub(redis),
                revocations=RevocationWatch(redis, keys),
            )
            closing.push_async_callback(state["hub"].aclose)
            closing.push_async_callback(state["revocations"].aclose)
            state["apps"] = AppLaunches(  # the launch exchange; HAProxy serves the apps themselves
                settings, AppAccessStore(redis, keys), users, ensure_app_cookie_key(settings.secrets)
            )
            state["endpoint_http"] = endpoint_http_client(settings)
            closing.push_async_callback(state["endpoint_http"].aclose)
            token = bootstrap_admin_token(settings.gateway.admin_token, settings.home)
            try:
                await state["users"].ensure_bootstrap_admin(token)
            except Exception as exc:  # Redis may come up after us; readiness reports it meanwhile
                log.warning("could not register the bootstrap admin yet: %s", exc)
            if settings.gateway.ingress_port is not None and settings.gateway.keeps_maps:  # HAProxy's maps: here
                await closing.enter_async_context(planes_running(settings, redis, state["sessions"], users))
            yield

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
            Route(ide.PREFIX + "{name:path}", ide.asset),
            Route("/", web.root),
            Route(web.PREFIX + "/assets/{name:path}", web.asset),
            Route(web.PREFIX, web.page),
            Route(web.PREFIX + "/{path:path}", web.page),
            Route("/graphql", graphql),  # the view answers other methods itself: 405 with Allow
            WebSocketRoute("/graphql", graphql),
            WebSocketRoute(terminal.PATH, terminal.Terminals(state).endpoint),
            *files.routes(state),
            *usage_export.routes(state),
        ],
        lifespan=lifespan,
        exception_handlers={ClientDisconnect: client_gone},
        # app origins (domain.apps) and endpoint hosts (domain.endpoint_routes) before the routes
        # outermost: an outage in them answers 503 UNAVAILABLE (gateway.outages), not 500
        middleware=[
            Middleware(OutageAnswers),
            Middleware(AppOrigins, state=state),
            Middleware(EndpointActivator, state=state),
        ],
    )


async def client_gone(request: Request, exc: Exception) -> Response:
    """The client (or the ingress in front of it) went away while its request was read: nobody is left to answer,
    so no error is logged (uvicorn's "Exception in ASGI application" with a traceback, before); the answer is
    dropped by the server."""
    log.info("%s %s: the client went away before its request was read", request.method, request.url.path)
    return Response(status_code=499)
