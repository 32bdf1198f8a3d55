"""The yardstick: the same page read bare — a Starlette endpoint doing ZREVRANGE + MGET → JSON, no GraphQL.

``/sessions`` reads what ``sessions(first: 50)`` reads (the newest 50 of the created-time index and their
documents) and answers the same fields, without authentication, rate limiting or GraphQL. ``/listing/<variant>``
reads the page of one of :data:`VARIANTS` (a filter, an admin's scope) with the Redis reads the gateway makes for it
(``stores.session_listing`` running ``domain.listing``'s plan, the count included), decoding each document with
``json``, again without GraphQL. Served by uvicorn as ``bench.gateway.bare:create`` (a factory) with
``BENCH_REDIS_URL`` and ``BENCH_REDIS_PREFIX`` set.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from core.keys import Keys
from domain.access import Scope
from domain.listing import ListingFilter, ListingOrder, plan_listing
from domain.model import SessionStatus, SessionType
from stores.session_listing import SessionListing
from stores.sessions import SessionStore

PAGE = 50
FIELDS = {
    "id": "id",
    "name": "name",
    "status": "status",
    "type": "type",
    "createdAt": "created_at",
    "ownerId": "owner_id",
}
ADMIN_ID = "bench-project-admin"
"""The ADMIN of the ``admin`` variant: administers both projects the bench's sessions are in (so all of them)."""
PROJECTS = ("default", "research")


@dataclass(frozen=True)
class Variant:
    """A page other than the plain one: its GraphQL ``filter`` argument (as the query text writes it), the same
    filter for the store, and whose page it is (None: the bench's superadmin)."""

    graphql_filter: str | None
    listing_filter: ListingFilter
    admin: bool = False

    def scope(self) -> Scope:
        return Scope(everything=False, owners=(ADMIN_ID,), projects=PROJECTS) if self.admin else Scope(everything=True)


VARIANTS = {
    "filtered": Variant(
        "{statuses: [PENDING, RUNNING], type: BATCH}",
        ListingFilter(statuses=frozenset({SessionStatus.PENDING, SessionStatus.RUNNING}), type=SessionType.BATCH),
    ),
    "named": Variant('{nameContains: "bench-00"}', ListingFilter(name_contains="bench-00")),
    "admin": Variant(None, ListingFilter(), admin=True),
}


def node(raw: str) -> dict[str, Any]:
    doc = json.loads(raw)
    return {out: doc[stored] for out, stored in FIELDS.items()}


def create() -> Starlette:
    keys = Keys(os.environ["BENCH_REDIS_PREFIX"])
    state: dict[str, Redis] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["redis"] = Redis.from_url(os.environ["BENCH_REDIS_URL"], decode_responses=True)
        yield
        await state["redis"].aclose()

    async def sessions(request: Request) -> JSONResponse:
        redis = state["redis"]
        ids = await redis.zrevrange(keys.sessions_by_created, 0, PAGE - 1)
        docs = await redis.mget([keys.session(i) for i in ids]) if ids else []
        nodes = [node(raw) for raw in docs if raw]
        return JSONResponse({"data": {"sessions": {"edges": [{"node": n} for n in nodes]}}})

    async def listing(request: Request) -> JSONResponse:
        variant = VARIANTS[request.path_params["variant"]]
        plan = plan_listing(keys, variant.scope(), variant.listing_filter, ListingOrder.CREATED_AT_DESC)
        page = await SessionListing(SessionStore(state["redis"], keys), node).page(plan, size=PAGE, count=True)
        edges = [{"node": n} for _, n in page.entries]
        return JSONResponse({"data": {"sessions": {"totalCount": page.total, "edges": edges}}})

    return Starlette(
        routes=[
            Route("/sessions", sessions, methods=["GET", "POST"]),
            Route("/listing/{variant}", listing, methods=["GET", "POST"]),
        ],
        lifespan=lifespan,
    )
