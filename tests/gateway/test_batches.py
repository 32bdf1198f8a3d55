"""Batched requests (a JSON array of operations) against a real gateway: through npm graphql-request's
``batchRequests`` as a client sends them, and raw for the limits (size cap, rate limit and cost limit per operation)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gateway.graphql.http import GRAPHQL_RESPONSE
from tests.gateway.conftest import GatewayWith, error_of, post
from tests.harness import ADMIN_TOKEN, Caravan

CLIENT = Path(__file__).with_name("batch_client")
SESSIONS = "{ sessions(first: 10) { edges { node { name } } } }"
CREATE = 'mutation { createSession(input: {name: "%s", type: INTERACTIVE, driver: EXEC}) { sessions { name } } }'


async def graphql_request(url: str, documents: list[dict[str, Any]], token: str | None = ADMIN_TOKEN) -> dict[str, Any]:
    """What npm graphql-request's ``batchRequests`` made of the gateway's answer to ``documents``."""
    node = shutil.which("node")
    if node is None or not (CLIENT / "node_modules" / "graphql-request").is_dir():
        pytest.fail("Node.js and graphql-request's node modules are needed: run ./ops/install")
    # Asynchronously: the gateway answers from this same event loop.
    process = await asyncio.create_subprocess_exec(
        node,
        str(CLIENT / "batch.mjs"),
        url,
        token or "",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(json.dumps(documents).encode()), timeout=60)
    assert process.returncode == 0, stderr.decode()
    answer: dict[str, Any] = json.loads(stdout)
    return answer


async def test_graphql_request_batches_run_in_order_and_see_each_others_writes(caravan: Caravan) -> None:
    before = await graphql_request(caravan.url, [{"document": SESSIONS}])
    assert before == {"results": [{"data": {"sessions": {"edges": []}}}]}  # an answer the result cache now keeps
    answer = await graphql_request(
        caravan.url,
        [
            {"document": "{ viewer { id } }"},
            {"document": CREATE % "batched-1"},
            {"document": SESSIONS},
            {"document": "query($n: String!) { __type(name: $n) { name } }", "variables": {"n": "Session"}},
        ],
    )
    assert answer == {
        "results": [
            {"data": {"viewer": {"id": "admin"}}},
            {"data": {"createSession": {"sessions": [{"name": "batched-1"}]}}},
            {"data": {"sessions": {"edges": [{"node": {"name": "batched-1"}}]}}},  # not the kept answer of before
            {"data": {"__type": {"name": "Session"}}},
        ]
    }


async def test_graphql_request_gets_each_operations_errors_in_place(caravan: Caravan) -> None:
    answer = await graphql_request(
        caravan.url,
        [
            {"document": "{ viewer { id } }"},
            {"document": "{ nope }"},
            {"document": "query A { viewer { id } } query B { __typename }"},
        ],
    )
    error = answer["error"]  # graphql-request throws a ClientError when any operation has errors
    assert error["status"] == 200
    body = json.loads(error["response"]["body"])
    ok, invalid, unnamed = body
    assert ok == {"data": {"viewer": {"id": "admin"}}}
    assert "data" not in invalid and invalid["errors"][0]["extensions"]["code"] == "INVALID_INPUT"
    assert unnamed["errors"][0]["extensions"] == {"code": "INVALID_INPUT", "field": "operationName"}
    assert [error["response"][str(i)] for i in range(3)] == body  # the client read the array, in order


async def test_a_batch_answers_an_array_in_order_with_each_operations_request_errors(caravan: Caravan) -> None:
    response = await post(
        caravan,
        [
            {"query": "{ viewer { id } }"},
            {"query": "{"},
            {"query": "query A { __typename } query B { __typename }", "operationName": "C"},
            {"query": "{ __typename }"},
        ],
        accept=GRAPHQL_RESPONSE,
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == f"{GRAPHQL_RESPONSE}; charset=utf-8"
    ok, unparsed, unknown, last = response.json()
    assert ok == {"data": {"viewer": {"id": "admin"}}} and last == {"data": {"__typename": "Query"}}
    assert "data" not in unparsed and unparsed["errors"][0]["extensions"]["code"] == "INVALID_INPUT"
    assert "data" not in unknown and unknown["errors"][0]["extensions"]["code"] == "BAD_REQUEST"


async def test_a_batch_over_the_cap_or_with_batching_off_is_refused(gateway_with: GatewayWith) -> None:
    three = [{"query": "{ __typename }"}] * 3
    async with gateway_with(max_batch=2) as caravan:
        assert error_of(await post(caravan, three), 400) == {"code": "BATCH_TOO_LARGE", "limit": 2}
        assert (await post(caravan, three[:2])).status_code == 200
    async with gateway_with(max_batch=0) as caravan:
        assert error_of(await post(caravan, three[:1]), 400) == {"code": "BATCHING_DISABLED"}


async def test_each_operation_of_a_batch_counts_against_the_rate_limit(gateway_with: GatewayWith) -> None:
    # A window of years: the counts cannot roll over into a fresh window mid-test.
    async with gateway_with(rate_limit=5, rate_window=10**8) as caravan:
        token = await caravan.user("alice")
        four = [{"query": "{ viewer { id } }"}] * 4
        assert (await post(caravan, four, token=token)).status_code == 200
        refused = await post(caravan, four[:2], token=token)  # 4 + 2 > 5
        assert error_of(refused, 429)["code"] == "RATE_LIMITED" and refused.headers["retry-after"]


async def test_each_operation_of_a_batch_is_held_to_the_cost_limit(gateway_with: GatewayWith) -> None:
    async with gateway_with(max_cost=50) as caravan:
        response = await post(
            caravan,
            [
                {"query": "{ sessions(first: 100) { edges { node { owner { id } } } } }"},  # 101
                {"query": CREATE % "cheap-1"},
            ],
        )
        costly, created = response.json()
        assert costly["errors"][0]["extensions"]["code"] == "QUERY_TOO_COSTLY" and "data" not in costly
        assert created == {"data": {"createSession": {"sessions": [{"name": "cheap-1"}]}}}
