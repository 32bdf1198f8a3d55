"""Gateway fixtures (a gateway whose limits come from ``CARAVAN_GRAPHQL_*``, as in production) and raw requests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx2
import pytest

from core.settings import Settings
from gateway.graphql.http import GRAPHQL_RESPONSE
from tests.harness import ADMIN_TOKEN, Caravan, running_caravan

GatewayWith = Callable[..., AbstractAsyncContextManager[Caravan]]


@pytest.fixture
async def caravan(redis_settings: Settings) -> AsyncIterator[Caravan]:
    """The gateway alone, on Redis alone: these tests need no scheduler (and so cannot be held up by one) and no
    Nomad (a call to it fails the test: see ``caravan_on_nomad``)."""
    async with running_caravan(redis_settings, scheduler=False) as running:
        yield running


@pytest.fixture
async def caravan_on_nomad(settings: Settings) -> AsyncIterator[Caravan]:
    """The gateway alone, with the Nomad agent: for what the gateway reads from Nomad (its agents, logs)."""
    async with running_caravan(settings, scheduler=False) as running:
        yield running


@pytest.fixture
def gateway_with(redis_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> GatewayWith:
    """``async with gateway_with(rate_limit=3) as caravan``: a gateway (no scheduler, no Nomad) with those limits."""

    @contextlib.asynccontextmanager
    async def start(**limits: int) -> AsyncIterator[Caravan]:
        for name, value in limits.items():
            monkeypatch.setenv(f"CARAVAN_GRAPHQL_{name.upper()}", str(value))
        async with running_caravan(redis_settings, scheduler=False) as caravan:
            yield caravan

    return start


async def post(
    caravan: Caravan,
    body: str | dict[str, Any] | list[dict[str, Any]],
    *,
    accept: str | None = GRAPHQL_RESPONSE,
    token: str | None = ADMIN_TOKEN,
) -> httpx2.Response:
    """POST a query (or a whole request body, a batch's array too) with this ``Accept`` and bearer token."""
    headers = {**({"accept": accept} if accept else {}), **({"authorization": f"Bearer {token}"} if token else {})}
    return await caravan.http.post(
        caravan.url, json={"query": body} if isinstance(body, str) else body, headers=headers
    )


def error_of(response: httpx2.Response, status: int) -> dict[str, Any]:
    """The ``extensions`` of the one error of a response that must have this status."""
    assert response.status_code == status, response.text
    [error] = response.json()["errors"]
    extensions: dict[str, Any] = error["extensions"]
    return extensions
