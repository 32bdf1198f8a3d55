"""The one reader of a request's credential (``gateway/auth.py``), through each transport it serves, on the real
gateway (real Redis, no Nomad): the forms each transport took before the readers were merged into one module, each
still answered as it was (a bearer header's scheme in any case, a terminal's first message with its own rules, a
GraphQL WebSocket's ``connection_init`` payload before the header), and every
refusal the typed one of its transport (401 / 4401 / 4403 with ``UNAUTHENTICATED``). An app's own requests are
checked by HAProxy (``tests/gateway/test_ingress.py``)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from starlette.datastructures import Headers
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.auth import bearer, bearer_token, header_token, init_payload_token
from gateway.terminal import PATH as TERMINAL_PATH
from tests.harness import ADMIN_TOKEN, Caravan
from tests.ws_client import graphql_socket

VIEWER = "{ viewer { id } }"


@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),  # the scheme in any case (RFC 9110 §11.1)
        ("BEARER   abc  ", "abc"),
        ("Bearer ", ""),  # a bearer credential, empty
        ("Bearer", None),
        ("Bearerabc", None),
        ("Basic YWxhZGRpbjpvcGVuc2VzYW1l", None),
        ("abc", None),
        ("", None),
        (None, None),
        (42, None),
        (["Bearer abc"], None),
    ],
)
def test_a_bearer_value(value: object, token: str | None) -> None:
    assert bearer_token(value) == token
    assert bearer(value) == (token or "")


def test_the_first_authorization_header_is_the_one_read() -> None:
    headers = Headers(raw=[(b"authorization", b"Bearer first"), (b"authorization", b"Bearer second")])
    assert header_token(headers) == "first"
    assert header_token(Headers(raw=[(b"authorization", b"Basic x"), (b"authorization", b"Bearer y")])) == ""
    assert header_token(Headers(raw=[])) == ""


@pytest.mark.parametrize(
    ("params", "header", "token"),
    [
        ({"authorization": "Bearer init"}, "Bearer upgrade", "init"),  # the payload first
        ({"Authorization": "Bearer init"}, "Bearer upgrade", "init"),
        ({"authorization": "", "Authorization": "Bearer init"}, "", "init"),
        ({"authorization": "Token init"}, "Bearer upgrade", "upgrade"),  # no bearer token there: the header's
        ({"authorization": 7}, "Bearer upgrade", "upgrade"),
        ({"authorization": "Bearer "}, "Bearer upgrade", "upgrade"),
        ({}, "Bearer upgrade", "upgrade"),
        (None, "bearer upgrade", "upgrade"),
        (None, "", ""),
    ],
)
def test_a_graphql_websockets_token(params: dict[str, object] | None, header: str, token: str) -> None:
    headers = Headers(raw=[(b"authorization", header.encode())] if header else [])
    assert init_payload_token(params, headers) == token


def _base(caravan: Caravan) -> str:
    return caravan.url.removesuffix("/graphql")


async def _terminal_closes(caravan: Caravan, first: str | bytes | None, headers: dict[str, str] | None = None) -> int:
    """The close code of a terminal of a made-up session (a valid token: 4404; none: 4401) after ``first``."""
    url = _base(caravan).replace("http://", "ws://", 1) + TERMINAL_PATH.format(session_id=uuid.uuid4(), kernel="main1")
    async with connect(url, additional_headers=headers or {}, proxy=None) as ws:
        if first is not None:
            await ws.send(first)
        texts: list[dict[str, Any]] = []
        try:
            while True:
                message = await ws.recv()
                assert isinstance(message, str)
                texts.append(json.loads(message))
        except ConnectionClosed:
            pass
    code = ws.close_code
    assert code is not None
    assert texts and texts[0]["code"] == {4404: "NOT_FOUND", 4401: "UNAUTHENTICATED"}[code], texts
    return code


@pytest.mark.parametrize(
    ("first", "code"),
    [
        (json.dumps({"type": "auth", "token": ADMIN_TOKEN}), 4404),  # passed: the made-up session is not found
        (json.dumps({"type": "auth", "token": f"Bearer {ADMIN_TOKEN}"}), 4404),
        (json.dumps({"type": "auth", "token": f"  {ADMIN_TOKEN}  "}), 4404),
        (json.dumps({"type": "auth", "token": f"bearer {ADMIN_TOKEN}"}), 4401),  # here the prefix is "Bearer " only
        (json.dumps({"type": "auth", "token": "not-a-token"}), 4401),
        (json.dumps({"type": "auth", "token": ""}), 4401),
        (json.dumps({"type": "auth", "token": 7}), 4401),
        (json.dumps({"type": "auth"}), 4401),
        (json.dumps({"type": "resize", "rows": 1, "cols": 1}), 4401),
        (json.dumps(["auth", ADMIN_TOKEN]), 4401),
        ("not json", 4401),
        (ADMIN_TOKEN.encode(), 4401),  # binary: stdin, not an auth message
    ],
)
async def test_a_terminals_first_message(caravan: Caravan, first: str | bytes, code: int) -> None:
    assert await _terminal_closes(caravan, first) == code


async def test_a_terminals_header(caravan: Caravan) -> None:
    url = _base(caravan).replace("http://", "ws://", 1) + TERMINAL_PATH.format(session_id=uuid.uuid4(), kernel="main1")
    for header, status in ((f"Bearer {ADMIN_TOKEN}", 404), (f"bearer {ADMIN_TOKEN}", 404), ("Bearer nope", 401)):
        with pytest.raises(InvalidStatus) as refused:  # refused before the upgrade, as an HTTP answer
            async with connect(url, additional_headers={"Authorization": header}, proxy=None):
                pass
        assert refused.value.response.status_code == status
    # no bearer token in the header: the upgrade is accepted, and the first message is read
    for header in ("Basic YWxhZGRpbjpvcGVuc2VzYW1l", "Bearer ", "Bearer"):
        message = json.dumps({"type": "auth", "token": ADMIN_TOKEN})
        assert await _terminal_closes(caravan, message, {"Authorization": header}) == 4404


async def _init(caravan: Caravan, payload: dict[str, Any] | None, header: str | None) -> dict[str, Any] | int | None:
    """The answer to ``connection_init``: the ack, or the close code."""
    async with graphql_socket(caravan.url, headers={"Authorization": header} if header else None) as socket:
        await socket.send({"type": "connection_init", **({"payload": payload} if payload is not None else {})})
        try:
            return await socket.receive()
        except ConnectionClosed:
            return socket.ws.close_code


@pytest.mark.parametrize(
    ("payload", "header", "answer"),
    [
        ({"authorization": f"Bearer {ADMIN_TOKEN}"}, None, "ack"),
        ({"Authorization": f"bearer {ADMIN_TOKEN}"}, None, "ack"),
        ({"authorization": f"Bearer {ADMIN_TOKEN}"}, "Bearer nope", "ack"),  # the payload's token first
        ({"authorization": "Bearer nope"}, f"Bearer {ADMIN_TOKEN}", 4403),
        ({"authorization": ADMIN_TOKEN}, f"Bearer {ADMIN_TOKEN}", "ack"),  # not a bearer value: the header's
        ({"authorization": 7}, f"Bearer {ADMIN_TOKEN}", "ack"),
        (None, f"Bearer {ADMIN_TOKEN}", "ack"),
        ({"authorization": ADMIN_TOKEN}, None, 4403),
        ({"authorization": "Bearer "}, None, 4403),
        (None, None, 4403),
    ],
)
async def test_a_graphql_websockets_connection_init(
    caravan: Caravan, payload: dict[str, Any] | None, header: str | None, answer: str | int
) -> None:
    expected = {"type": "connection_ack"} if answer == "ack" else answer
    assert await _init(caravan, payload, header) == expected


@pytest.mark.parametrize(
    ("header", "viewer"),
    [(f"Bearer {ADMIN_TOKEN}", True), (f"BEARER {ADMIN_TOKEN}", True), ("Bearer nope", False), ("Bearer", False)],
)
async def test_graphql_over_http(caravan: Caravan, header: str, viewer: bool) -> None:
    body = (await caravan.http.post(caravan.url, json={"query": VIEWER}, headers={"Authorization": header})).json()
    if viewer:
        assert body["data"]["viewer"]["id"], body
    else:
        assert body["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED", body


@pytest.mark.parametrize(
    ("header", "status", "code"),
    [
        (f"Bearer {ADMIN_TOKEN}", 404, "NOT_FOUND"),  # passed: the made-up folder is not found
        (f"bearer {ADMIN_TOKEN}", 404, "NOT_FOUND"),
        ("Bearer nope", 401, "UNAUTHENTICATED"),
        ("Bearer", 401, "UNAUTHENTICATED"),
        (f"Basic {ADMIN_TOKEN}", 401, "UNAUTHENTICATED"),
        (None, 401, "UNAUTHENTICATED"),
    ],
)
async def test_the_files_api(caravan: Caravan, header: str | None, status: int, code: str) -> None:
    url = f"{_base(caravan)}/folders/{uuid.uuid4()}/files"
    response = await caravan.http.get(url, params={"path": "x"}, headers={"Authorization": header} if header else {})
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
