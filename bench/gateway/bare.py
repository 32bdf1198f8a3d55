"""The yardstick: the same page read bare — a Starlette endpoint doing ZREVRANGE + MGET → JSON, no GraphQL.

It reads what ``sessions(first: 50)`` reads (the newest 50 of the created-time index and their documents)
and answers the same fields, without authentication, rate limiting or GraphQL. Served by uvicorn as
``bench.gateway.bare:create`` (a factory) with ``BENCH_REDIS_URL`` and ``BENCH_REDIS_PREFIX`` set.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from core.keys import Keys

PAGE = 50
FIELDS = {
    "id": "id",
    "name": "name",
    "status": "status",
    "type": "type",
    "createdAt": "created_at",
    "ownerId": "owner_id",
}


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
        nodes: list[dict[str, Any]] = []
        for raw in docs:
            if raw:
                doc = json.loads(raw)
                nodes.append({out: doc[stored] for out, stored in FIELDS.items()})
        return JSONResponse({"data": {"sessions": {"edges": [{"node": n} for n in nodes]}}})

    return Starlette(routes=[Route("/sessions", sessions, methods=["GET", "POST"])], lifespan=lifespan)
