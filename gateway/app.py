"""The gateway's ASGI app: GraphQL at /graphql, health at /healthz and /readyz."""

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
from strawberry.asgi import GraphQL

from common.errors import TransientError
from common.keys import Keys
from common.redis import client as redis_client
from common.settings import Settings
from common.store import SessionStore
from common.users import UserStore, bootstrap_admin_token
from gateway.graphql.context import Context
from gateway.graphql.schema import schema
from nomad_jobs.client import NomadClient

log = logging.getLogger(__name__)


class CaravanGraphQL(GraphQL[Context, None]):
    def __init__(self, state: dict[str, Any]) -> None:
        super().__init__(schema, graphql_ide="graphiql", allow_queries_via_get=True)
        self.state = state

    async def get_context(self, request: Request | WebSocket, response: Any = None) -> Context:
        users: UserStore = self.state["users"]
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else ""
        user = await users.by_token(token) if token else None
        return Context(
            request=request,
            settings=self.state["settings"],
            sessions=self.state["sessions"],
            users=users,
            nomad=self.state["nomad"],
            user=user,
            request_id=uuid.uuid4().hex[:12],
        )


def create_app(settings: Settings) -> Starlette:
    state: dict[str, Any] = {"settings": settings}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        redis = redis_client(settings.redis)
        keys = Keys(settings.redis.prefix)
        nomad = NomadClient(settings.nomad)
        state.update(redis=redis, sessions=SessionStore(redis, keys), users=UserStore(redis, keys), nomad=nomad)
        token = bootstrap_admin_token(settings.gateway.admin_token, settings.home)
        try:
            await state["users"].ensure_bootstrap_admin(token)
        except Exception as exc:  # Redis may come up after us; readiness reports it meanwhile
            log.warning("could not register the bootstrap admin yet: %s", exc)
        yield
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

    graphql = CaravanGraphQL(state)
    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/graphql", graphql, methods=["GET", "POST"]),
            WebSocketRoute("/graphql", graphql),
        ],
        lifespan=lifespan,
    )
