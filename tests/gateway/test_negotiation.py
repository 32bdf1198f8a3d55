"""GraphQL over HTTP: media types, status codes and refusals, against a real gateway."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import quote, urlparse

import pytest

from gateway.graphql.http import GRAPHQL_RESPONSE, JSON, negotiate
from tests.gateway.conftest import error_of, post
from tests.harness import Caravan

BOTH = pytest.mark.parametrize("accept", [GRAPHQL_RESPONSE, JSON])
LEGACY_STATUS = {GRAPHQL_RESPONSE: 400, JSON: 200}
"""A request error is 400 with graphql-response+json, and 200 in the legacy application/json mode."""
JSON_BODY = {"content-type": JSON}


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
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
    ],
)
def test_accept_negotiation(accept: str | None, chosen: str | None) -> None:
    assert negotiate(accept) == chosen


@BOTH
async def test_success_matches_the_accepted_media_type(caravan: Caravan, accept: str) -> None:
    response = await post(caravan, "{ viewer { id } }", accept=accept)
    assert response.status_code == 200
    assert response.headers["content-type"] == f"{accept}; charset=utf-8"
    assert response.json() == {"data": {"viewer": {"id": "admin"}}}


@BOTH
@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"query": "{"}, id="parse-error"),
        pytest.param({"query": "{ nope }"}, id="validation-error"),
        pytest.param(
            {"query": "query($id: ID!) { session(id: $id) { id } }", "variables": {"id": None}}, id="bad-variables"
        ),
        pytest.param(
            {"query": "query($id: ID!) { session(id: $id) { id } }", "variables": {"id": {"an": "object"}}},
            id="uncoercible-variables",
        ),
    ],
)
async def test_request_errors(caravan: Caravan, accept: str, body: dict[str, Any]) -> None:
    response = await post(caravan, body, accept=accept)
    assert error_of(response, LEGACY_STATUS[accept])["code"] == "INVALID_INPUT"
    assert response.headers["content-type"].startswith(accept)
    assert "data" not in response.json()  # the operation never started


@BOTH
@pytest.mark.parametrize("operation_name", [None, "B"])
async def test_several_operations_need_an_operation_name(
    caravan: Caravan, accept: str, operation_name: str | None
) -> None:
    """GraphQL's GetOperation: without operationName a document must hold one operation; it is a request error
    (Strawberry used to run the first)."""
    document = "query A { viewer { id } } query B { __typename }"
    response = await post(caravan, {"query": document, "operationName": operation_name}, accept=accept)
    if operation_name == "B":
        assert response.status_code == 200 and response.json() == {"data": {"__typename": "Query"}}
        return
    error = error_of(response, LEGACY_STATUS[accept])
    assert error == {"code": "INVALID_INPUT", "field": "operationName"}
    assert "data" not in response.json()


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
    response = await caravan.http.get(
        caravan.url,
        params={"query": "query Q($n: String!) { __type(name: $n) { name } }", "variables": '{"n": "Session"}'},
    )
    assert response.status_code == 200
    assert response.json() == {"data": {"__type": {"name": "Session"}}}


async def raw_get(caravan: Caravan, target: str) -> tuple[int, str, dict[str, Any]]:
    """Status, media type and JSON body of a GET of ``target`` written on the socket (HTTP clients refuse URLs this
    long before sending them)."""
    url = urlparse(caravan.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)

    async def send() -> None:
        with contextlib.suppress(ConnectionError):  # the server may answer and close before reading it all
            writer.write(f"GET {target} HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()

    sending = asyncio.create_task(send())
    answer = await reader.read()
    await sending
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *headers = head.decode().split("\r\n")
    media_type = next(h.split(":", 1)[1].strip() for h in headers if h.lower().startswith("content-type:"))
    return int(status_line.split()[1]), media_type, json.loads(body)


@pytest.mark.parametrize("length", [40_000, 70_000, 5_000_000])
async def test_a_url_over_the_limit_is_414_with_a_code(caravan: Caravan, length: int) -> None:
    """Over CARAVAN_GRAPHQL_MAX_URL_BYTES (32768) the gateway refuses it; over 65535 the HTTP server's parser cannot
    take it, and answers the same way (it used to be 400 text/plain)."""
    query = "{ __typename " + " " * length + "}"
    status, media_type, body = await raw_get(caravan, f"{urlparse(caravan.url).path}?query={quote(query)}")
    assert (status, media_type) == (414, "application/json; charset=utf-8")
    [error] = body["errors"]
    assert error["extensions"]["code"] == "URI_TOO_LONG", body


async def test_a_request_the_server_cannot_parse_is_400_with_a_code(caravan: Caravan) -> None:
    status, media_type, body = await raw_get(caravan, "/graphql?query=x y")  # a space inside the request target
    assert (status, media_type) == (400, "application/json; charset=utf-8")
    assert body["errors"][0]["extensions"]["code"] == "BAD_REQUEST"


async def test_other_methods_are_405_with_allow(caravan: Caravan) -> None:
    response = await caravan.http.put(caravan.url, json={"query": "{ __typename }"})
    assert error_of(response, 405)["code"] == "METHOD_NOT_ALLOWED"
    assert response.headers["allow"] == "GET, POST"


async def test_graphiql_for_browsers(caravan: Caravan) -> None:
    response = await caravan.http.get(caravan.url, headers={"accept": "text/html"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "graphiql" in response.text.lower()


@pytest.mark.parametrize(
    ("content", "headers", "status", "code"),
    [
        pytest.param(
            '{"query": "{ __typename }"}',
            {**JSON_BODY, "accept": "text/plain"},
            406,
            "NOT_ACCEPTABLE",
            id="not-acceptable",
        ),
        pytest.param(
            '{"query": "{ __typename }"}', {"content-type": "text/plain"}, 415, "UNSUPPORTED_MEDIA_TYPE", id="text-body"
        ),
        pytest.param('{"query": "{ __typename }"}', {}, 415, "UNSUPPORTED_MEDIA_TYPE", id="no-content-type"),
        pytest.param('{"query": ', JSON_BODY, 400, "BAD_REQUEST", id="bad-json"),
        pytest.param(b'{"query": "\xff"}', JSON_BODY, 400, "BAD_REQUEST", id="bad-utf8"),
        pytest.param("[" * 100_000 + "]" * 100_000, JSON_BODY, 400, "BAD_REQUEST", id="absurd-nesting"),
        pytest.param("[]", JSON_BODY, 400, "BAD_REQUEST", id="empty-batch"),
        pytest.param('[{"query": "{ __typename }"}, 7]', JSON_BODY, 400, "BAD_REQUEST", id="batch-of-a-number"),
        pytest.param(
            '[{"query": "{ __typename }", "variables": [1]}]', JSON_BODY, 400, "BAD_REQUEST", id="batch-variables"
        ),
        pytest.param('"{ __typename }"', JSON_BODY, 400, "BAD_REQUEST", id="not-an-object"),
        pytest.param(
            '{"query": "{ __typename }", "operationName": 7}', JSON_BODY, 400, "BAD_REQUEST", id="operation-name"
        ),
        pytest.param('{"query": "{ __typename }", "variables": [1]}', JSON_BODY, 400, "BAD_REQUEST", id="variables"),
        pytest.param('{"qeury": "{ __typename }"}', JSON_BODY, 400, "BAD_REQUEST", id="no-query"),
    ],
)
async def test_malformed_requests(
    caravan: Caravan, content: str | bytes, headers: dict[str, str], status: int, code: str
) -> None:
    response = await caravan.http.post(caravan.url, content=content, headers=headers)
    assert error_of(response, status)["code"] == code
