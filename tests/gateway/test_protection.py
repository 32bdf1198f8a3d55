"""Document limits, the body limit and the per-token rate limit, each refused with its own code."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from redis.asyncio import Redis

from common.keys import Keys
from gateway.graphql.http import GRAPHQL_RESPONSE, JSON
from gateway.graphql.protection import Limits, RateLimiter
from tests.gateway.conftest import GatewayWith, error_of, post
from tests.harness import Caravan

DEEP = '{ session(id: "x") { mainKernel { logs { stdout } } } }'  # stdout is at depth 3
SHALLOW = '{ session(id: "x") { mainKernel { hostname } } }'


def refused(response: httpx2.Response, status: int, code: str) -> dict[str, Any]:
    extensions = error_of(response, status)
    assert extensions["code"] == code and "data" not in response.json()
    return extensions


async def test_depth_limit(gateway_with: GatewayWith) -> None:
    async with gateway_with(max_depth=2) as caravan:
        assert refused(await post(caravan, DEEP), 400, "QUERY_TOO_DEEP")["limit"] == 2
        allowed = await post(caravan, SHALLOW)  # validates, then finds no such session
        assert error_of(allowed, 200)["code"] == "NOT_FOUND"


async def test_depth_limit_ignores_introspection(gateway_with: GatewayWith) -> None:
    async with gateway_with(max_depth=2) as caravan:
        response = await post(caravan, "{ __schema { types { fields { type { ofType { ofType { name } } } } } } }")
        assert response.status_code == 200 and "errors" not in response.json()


async def test_alias_limit(caravan: Caravan) -> None:
    limit = Limits().max_aliases
    within = "{ " + " ".join(f"a{i}: __typename" for i in range(limit)) + " }"
    over = "{ " + " ".join(f"a{i}: __typename" for i in range(limit + 1)) + " }"
    assert (await post(caravan, within)).status_code == 200
    assert refused(await post(caravan, over), 400, "TOO_MANY_ALIASES")["limit"] == limit


async def test_token_limit(caravan: Caravan) -> None:
    limit = Limits().max_tokens
    at_limit = "{" + " __typename" * (limit - 2) + " }"  # parses; then fails validation (too many to merge)
    assert refused(await post(caravan, at_limit), 400, "INVALID_INPUT")
    assert refused(await post(caravan, "{ __typename" + at_limit[1:]), 400, "TOO_MANY_TOKENS")["limit"] == limit


@pytest.mark.parametrize("accept", [GRAPHQL_RESPONSE, JSON])
async def test_body_limit(gateway_with: GatewayWith, accept: str) -> None:
    async with gateway_with(max_body_bytes=1000) as caravan:
        padding = "#" + "x" * 1000 + "\n"  # a GraphQL comment
        assert (await post(caravan, "{ __typename }" + padding[:900], accept=accept)).status_code == 200
        response = await post(caravan, "{ __typename }" + padding, accept=accept)
        assert refused(response, 413, "PAYLOAD_TOO_LARGE")["limit"] == 1000


async def test_body_limit_without_content_length(gateway_with: GatewayWith) -> None:
    """A chunked body is counted as it arrives."""

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"query": "{ __typename }'
        for _ in range(20):
            yield b" " * 100
        yield b'"}'

    async with gateway_with(max_body_bytes=1000) as caravan:
        response = await caravan.http.post(caravan.url, content=chunks(), headers={"content-type": JSON})
        assert "content-length" not in response.request.headers
        refused(response, 413, "PAYLOAD_TOO_LARGE")


@pytest.mark.parametrize("accept", [GRAPHQL_RESPONSE, JSON])
async def test_rate_limit_per_token(gateway_with: GatewayWith, accept: str) -> None:
    # A window of years: the counts cannot roll over into a fresh window mid-test.
    async with gateway_with(rate_limit=3, rate_window=10**8) as caravan:
        other = await caravan.user("other")
        for _ in range(3):
            assert (await post(caravan, "{ viewer { id } }", accept=accept)).status_code == 200
        response = await post(caravan, "{ viewer { id } }", accept=accept)
        details = refused(response, 429, "RATE_LIMITED")
        assert int(response.headers["retry-after"]) == details["retryAfter"] > 0
        assert (await post(caravan, "{ viewer { id } }", token=other, accept=accept)).status_code == 200
        # Without a token, the client's address is counted instead.
        for _ in range(3):
            assert (await post(caravan, "{ __typename }", token=None, accept=accept)).status_code == 200
        refused(await post(caravan, "{ __typename }", token=None, accept=accept), 429, "RATE_LIMITED")


async def test_rate_limit_off(gateway_with: GatewayWith) -> None:
    async with gateway_with(rate_limit=0) as caravan:
        for _ in range(5):
            assert (await post(caravan, "{ __typename }")).status_code == 200


async def test_rate_windows_are_fixed(redis: Redis, keys: Keys) -> None:
    limiter = RateLimiter(lambda: redis, keys, limit=2, window=10)
    assert [await limiter.hit("t", now=t) for t in (100.0, 101.0)] == [None, None]
    assert await limiter.hit("t", now=107.5) == pytest.approx(2.5)  # the third in [100, 110)
    assert await limiter.hit("t", now=110.0) is None  # a new window
    assert 0 < await redis.ttl(keys.rate_limit("t", 11)) <= 11


def test_limits_from_environment() -> None:
    assert Limits.from_env({}) == Limits()
    assert Limits.from_env({"CARAVAN_GRAPHQL_MAX_DEPTH": "4", "CARAVAN_GRAPHQL_RATE_LIMIT": "0"}) == Limits(max_depth=4, rate_limit=0)
    with pytest.raises(ValueError, match="CARAVAN_GRAPHQL_MAX_ALIASES"):
        Limits.from_env({"CARAVAN_GRAPHQL_MAX_ALIASES": "many"})
    with pytest.raises(ValueError, match="CARAVAN_GRAPHQL_RATE_WINDOW must be positive"):
        Limits.from_env({"CARAVAN_GRAPHQL_RATE_WINDOW": "0"})
