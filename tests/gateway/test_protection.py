"""Document limits, the body limit and the per-user rate limit, each refused with its own code."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx2
import pytest
from redis.asyncio import Redis

from core.clock import utcnow
from core.keys import Keys
from core.settings import Settings
from domain.users import Role, User
from gateway.graphql.http import GRAPHQL_RESPONSE, JSON
from gateway.graphql.limits import Limits
from gateway.graphql.rate_limit import RateLimiter
from stores.users import UserStore
from tests.gateway.conftest import GatewayWith, error_of, post
from tests.harness import Caravan, running_caravan

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
async def test_rate_limit_per_user(gateway_with: GatewayWith, accept: str) -> None:
    # A window of years: the counts cannot roll over into a fresh window mid-test.
    async with gateway_with(rate_limit=3, rate_window=10**8) as caravan:
        first = await caravan.user("alice")
        tokens = [first, *[await caravan.users.issue_token("alice", f"t{i}") for i in range(9)]]  # ten tokens
        for token in tokens[:3]:
            assert (await post(caravan, "{ viewer { id } }", token=token, accept=accept)).status_code == 200
        for token in tokens[3:]:  # ten tokens, one budget: alice's
            response = await post(caravan, "{ viewer { id } }", token=token, accept=accept)
            details = refused(response, 429, "RATE_LIMITED")
            assert int(response.headers["retry-after"]) == details["retryAfter"] > 0
        other = await caravan.user("other")
        assert (await post(caravan, "{ viewer { id } }", token=other, accept=accept)).status_code == 200
        # Without a valid token, the client's address is counted instead: made-up tokens buy no fresh budget.
        for token in (None, "made-up-1", "made-up-2"):
            assert (await post(caravan, "{ __typename }", token=token, accept=accept)).status_code == 200
        for token in (None, "made-up-3"):
            refused(await post(caravan, "{ __typename }", token=token, accept=accept), 429, "RATE_LIMITED")


async def test_a_forwarded_address_is_believed_only_from_a_trusted_proxy(
    redis_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a valid token, the client's address is counted: a client cannot pick another one by sending
    ``X-Forwarded-For`` (uvicorn's default believes it from any local client); a configured ingress can."""
    monkeypatch.setenv("CARAVAN_GRAPHQL_RATE_LIMIT", "2")
    monkeypatch.setenv("CARAVAN_GRAPHQL_RATE_WINDOW", str(10**8))

    async def anonymous(caravan: Caravan, address: str) -> int:
        response = await caravan.http.post(
            caravan.url, json={"query": "{ __typename }"}, headers={"X-Forwarded-For": address}
        )
        return response.status_code

    async with running_caravan(redis_settings, scheduler=False) as caravan:
        assert [await anonymous(caravan, f"198.51.100.{i}") for i in range(4)] == [200, 200, 429, 429]
    trusting = replace(redis_settings, gateway=replace(redis_settings.gateway, trusted_proxies=("127.0.0.0/8",)))
    async with running_caravan(trusting, scheduler=False) as caravan:
        assert [await anonymous(caravan, f"198.51.100.{i}") for i in (7, 7, 7, 8)] == [200, 200, 429, 200]


async def commands_served(redis: Redis) -> dict[str, int]:
    """Calls per command on the Redis server (the commands a script runs count too)."""
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(entry["calls"]) for name, entry in stats.items()}


@pytest.mark.parametrize("rate_limit", [600, 0])
async def test_an_authenticated_request_costs_one_redis_round_trip(gateway_with: GatewayWith, rate_limit: int) -> None:
    """The token check, the rate limit's count and the result cache's version read are one script call."""
    async with gateway_with(rate_limit=rate_limit) as caravan:
        token = await caravan.user("alice")
        redis = caravan.store.redis
        assert (await post(caravan, "{ viewer { id } }", token=token)).status_code == 200  # the script is loaded
        before = await commands_served(redis)
        for _ in range(5):
            assert (await post(caravan, "{ viewer { id } }", token=token)).json()["data"]["viewer"]["id"] == "alice"
        after = await commands_served(redis)
        served = {name: calls - before.get(name, 0) for name, calls in after.items() if calls != before.get(name, 0)}
        inside = {"hmget": 5, "get": 10, **({"incr": 5} if rate_limit else {})}  # token, user, version; count
        assert served == {"evalsha": 5, **inside, "info": 1}


async def test_rate_limit_off(gateway_with: GatewayWith) -> None:
    async with gateway_with(rate_limit=0) as caravan:
        for _ in range(5):
            assert (await post(caravan, "{ __typename }")).status_code == 200


async def test_rate_windows_are_fixed(redis: Redis, keys: Keys) -> None:
    limiter = RateLimiter(lambda: redis, keys, limit=2, window=10)

    async def wait(now: float) -> float | None:
        return (await limiter.admit("", "addr:t", now=now)).retry_after

    assert [await wait(t) for t in (100.0, 101.0)] == [None, None]
    assert await wait(107.5) == pytest.approx(2.5)  # the third in [100, 110)
    assert await wait(110.0) is None  # a new window
    assert 0 < await redis.ttl(keys.rate_limit("addr:t", 11)) <= 11


async def test_one_round_trip_checks_the_token_counts_and_reads(redis: Redis, keys: Keys) -> None:
    users = UserStore(redis, keys)
    await users.put(User(id="alice", name="alice", role=Role.USER))
    secret, record = await users.new_token("alice", "t", expires_at=utcnow() + timedelta(hours=1))
    await redis.set(keys.sessions_version, "7")
    limiter = RateLimiter(lambda: redis, keys, limit=1, window=10**8)
    await limiter.admit("", "addr:warm-up")  # loads the script on a cold server
    sent = []
    original = redis.execute_command

    async def counted(*args: Any, **options: Any) -> Any:
        sent.append(args[0])
        return await original(*args, **options)

    redis.execute_command = counted  # type: ignore[method-assign]
    try:
        admitted = await limiter.admit(secret, "addr:x", read=[keys.sessions_version])
        again = await limiter.admit(secret, "addr:x")
    finally:
        redis.execute_command = original  # type: ignore[method-assign]
    assert admitted.viewer is not None and admitted.viewer.user.id == "alice"
    assert admitted.viewer.expires_at == record.expires_at
    assert (admitted.retry_after, admitted.values) == (None, ["7"])
    assert again.retry_after is not None  # the second request of alice in the window
    assert sent == ["EVALSHA", "EVALSHA"]  # one round trip each


def test_limits_from_environment() -> None:
    assert Limits.from_env({}) == Limits()
    assert Limits.from_env({"CARAVAN_GRAPHQL_MAX_DEPTH": "4", "CARAVAN_GRAPHQL_RATE_LIMIT": "0"}) == Limits(
        max_depth=4, rate_limit=0
    )
    with pytest.raises(ValueError, match="CARAVAN_GRAPHQL_MAX_ALIASES"):
        Limits.from_env({"CARAVAN_GRAPHQL_MAX_ALIASES": "many"})
    with pytest.raises(ValueError, match="CARAVAN_GRAPHQL_RATE_WINDOW must be positive"):
        Limits.from_env({"CARAVAN_GRAPHQL_RATE_WINDOW": "0"})
    with pytest.raises(
        ValueError, match=r"CARAVAN_GRAPHQL_MAX_LOG_FOLLOWS \(17\) must be at most .*_LOG_FOLLOWS \(16\)"
    ):
        Limits.from_env({"CARAVAN_GRAPHQL_MAX_LOG_FOLLOWS": "17"})
    with pytest.raises(ValueError, match=r"MAX_USER_LOG_FOLLOWS \(64\), which must be below .* 64 log follows"):
        Limits.from_env({"CARAVAN_GRAPHQL_MAX_USER_LOG_FOLLOWS": "64"})  # one user could take every follow
    assert Limits.from_env({"CARAVAN_GRAPHQL_MAX_LOG_FOLLOWS": "4"}).max_log_follows == 4
    assert Limits.from_env({"CARAVAN_GRAPHQL_MAX_USER_LOG_FOLLOWS": "63"}).max_user_log_follows == 63


async def test_a_client_that_leaves_mid_request_leaves_no_error_behind(
    caravan: Caravan, caplog: pytest.LogCaptureFixture
) -> None:
    """A client (or HAProxy dying under it) that goes away while its request body is read: the gateway logs no
    error and no traceback (uvicorn's "Exception in ASGI application", before: bench/chaos's gateways' logs were
    full of them), and goes on answering."""
    caplog.set_level(logging.INFO, logger="gateway.app")
    token = await caravan.user("alice")
    url = httpx2.URL(caravan.url)
    for _ in range(2):
        _, writer = await asyncio.open_connection(url.host, url.port)
        head = (
            f"POST /graphql HTTP/1.1\r\nHost: {url.host}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        )
        writer.write(head.encode() + b'{"query": "' + b" " * 1000)
        await writer.drain()
        await asyncio.sleep(0.2)  # the gateway is reading the body
        writer.close()
        await writer.wait_closed()
    assert (await caravan.gql("{ viewer { id } }", token=token))["viewer"]["id"]
    await asyncio.sleep(0.2)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [r.getMessage() for r in errors]
    assert sum("went away" in r.getMessage() for r in caplog.records) == 2
