"""GraphQL over HTTP: media types, status codes and refusals, against a real gateway."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.graphql.http import GRAPHQL_RESPONSE, JSON, negotiate
from tests.gateway.conftest import error_of, post
from tests.harness import Caravan

BOTH = pytest.mark.parametrize("accept", [GRAPHQL_RESPONSE, JSON])
LEGACY_STATUS = {GRAPHQL_RESPONSE: 400, JSON: 200}
"""A request error is 400 with graphql-response+json, and 200 in the legacy application/json mode."""
JSON_BODY = {"content-type": JSON}


@pytest.mark.parametrize(("accept", "chosen"), [
    (None, JSON),
    ("", JSON),
    ("*/*", JSON),
    ("application/*", JSON),
    (JSON, JSON),
    (GRAPHQL_RESPONSE, GRAPHQL_RESPONSE),
    (f"{GRAPHQL_RESPONSE}, {JSON};q=0.9", GRAPHQL_RESPONSE),  # what the spec's legacy-aware clients send
    (f"{JSON}, {GRAPHQL_RESPONSE}", GRAPHQL_RESPONSE),  # a tie goes to the named graphql-response+json
    (f"{JSON}, {GRAPHQL_RESPONSE};q=0.5", JSON),
    (f"{GRAPHQL_RESPONSE};charset=utf-8", GRAPHQL_RESPONSE),
    (f"*/*;q=0.8, {GRAPHQL_RESPONSE};q=0", JSON),  # explicitly refused
    ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", JSON),  # a browser
    ("text/html", None),
    (f"{JSON};q=0, {GRAPHQL_RESPONSE};q=0", None),
    (f"{JSON};q=nonsense", None),
])
def test_accept_negotiation(accept: str | None, chosen: str | None) -> None:
    assert negotiate(accept) == chosen


@BOTH
async def test_success_matches_the_accepted_media_type(caravan: Caravan, accept: str) -> None:
    response = await post(caravan, "{ viewer { id } }", accept=accept)
    assert response.status_code == 200
    assert response.headers["content-type"] == f"{accept}; charset=utf-8"
    assert response.json() == {"data": {"viewer": {"id": "admin"}}}


@BOTH
@pytest.mark.parametrize("body", [
    pytest.param({"query": "{"}, id="parse-error"),
    pytest.param({"query": "{ nope }"}, id="validation-error"),
    pytest.param({"query": "query($id: ID!) { session(id: $id) { id } }", "variables": {"id": None}}, id="bad-variables"),
    pytest.param({"query": "query($id: ID!) { session(id: $id) { id } }", "variables": {"id": {"an": "object"}}},
                 id="uncoercible-variables"),
])
async def test_request_errors(caravan: Caravan, accept: str, body: dict[str, Any]) -> None:
    response = await post(caravan, body, accept=accept)
    assert error_of(response, LEGACY_STATUS[accept])["code"] == "INVALID_INPUT"
    assert response.headers["content-type"].startswith(accept)
    assert "data" not in response.json()  # the operation never started


@BOTH
async def test_field_errors_are_200_with_data(caravan: Caravan, accept: str) -> None:
    response = await post(caravan, "{ viewer { id } }", accept=accept, token=None)
    assert error_of(response, 200)["code"] == "UNAUTHENTICATED"
    assert response.json()["data"] is None


@BOTH
async def test_mutation_over_get_is_405(caravan: Caravan, accept: str) -> None:
    mutation = 'mutation { createSession(input: {name: "x", type: BATCH}) { sessions { id } } }'
    response = await caravan.http.get(caravan.url, params={"query": mutation}, headers={"accept": accept})
    assert error_of(response, 405)["code"] == "METHOD_NOT_ALLOWED"
    assert response.headers["allow"] == "POST"
    assert await caravan.store.session_ids() == []


async def test_query_over_get(caravan: Caravan) -> None:
    response = await caravan.http.get(caravan.url, params={"query": "query Q($n: String!) { __type(name: $n) { name } }",
                                                           "variables": '{"n": "Session"}'})
    assert response.status_code == 200
    assert response.json() == {"data": {"__type": {"name": "Session"}}}


async def test_other_methods_are_405_with_allow(caravan: Caravan) -> None:
    response = await caravan.http.put(caravan.url, json={"query": "{ __typename }"})
    assert error_of(response, 405)["code"] == "METHOD_NOT_ALLOWED"
    assert response.headers["allow"] == "GET, POST"


async def test_graphiql_for_browsers(caravan: Caravan) -> None:
    response = await caravan.http.get(caravan.url, headers={"accept": "text/html"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "graphiql" in response.text.lower()


@pytest.mark.parametrize(("content", "headers", "status", "code"), [
    pytest.param('{"query": "{ __typename }"}', {**JSON_BODY, "accept": "text/plain"}, 406, "NOT_ACCEPTABLE", id="not-acceptable"),
    pytest.param('{"query": "{ __typename }"}', {"content-type": "text/plain"}, 415, "UNSUPPORTED_MEDIA_TYPE", id="text-body"),
    pytest.param('{"query": "{ __typename }"}', {}, 415, "UNSUPPORTED_MEDIA_TYPE", id="no-content-type"),
    pytest.param('{"query": ', JSON_BODY, 400, "BAD_REQUEST", id="bad-json"),
    pytest.param(b'{"query": "\xff"}', JSON_BODY, 400, "BAD_REQUEST", id="bad-utf8"),
    pytest.param("[" * 100_000 + "]" * 100_000, JSON_BODY, 400, "BAD_REQUEST", id="absurd-nesting"),
    pytest.param('[{"query": "{ __typename }"}]', JSON_BODY, 400, "BAD_REQUEST", id="batch"),
    pytest.param('"{ __typename }"', JSON_BODY, 400, "BAD_REQUEST", id="not-an-object"),
    pytest.param('{"query": "{ __typename }", "operationName": 7}', JSON_BODY, 400, "BAD_REQUEST", id="operation-name"),
    pytest.param('{"query": "{ __typename }", "variables": [1]}', JSON_BODY, 400, "BAD_REQUEST", id="variables"),
    pytest.param('{"qeury": "{ __typename }"}', JSON_BODY, 400, "BAD_REQUEST", id="no-query"),
])
async def test_malformed_requests(caravan: Caravan, content: str | bytes, headers: dict[str, str], status: int, code: str) -> None:
    response = await caravan.http.post(caravan.url, content=content, headers=headers)
    assert error_of(response, status)["code"] == code
