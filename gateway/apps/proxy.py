"""The app proxy: an ASGI middleware in front of the gateway's routes that serves every app origin
(``<app>--<session id>.<apps domain>``, ``domain.apps``) and passes every other request on.

HTTP goes to the kernel's Nomad host port through one ``httpx2`` client (a keep-alive pool per upstream), request and
response bodies streamed chunk by chunk in both directions (never held whole: uploads, downloads, SSE), any method.
An upstream that refuses or drops the connection is 502, one that does not answer in time 504, a kernel that has no
published port yet 503, each with a JSON body. WebSockets are relayed message by message (``websockets`` client to
the app), and close when the credential's token is revoked (``gateway.revocations``). A request that carries the
app's cookie passes only from the app's own origin (``domain.apps.cookie_may_pass``; else 403 ``CROSS_ORIGIN``).

``/.caravan/launch?code=`` on an app origin is the gateway's own: it exchanges a ``launchApp`` code for the app's
cookie (``stores.app_access``) and redirects to the app's root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import httpx2
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

from core.clock import utcnow
from core.settings import Settings
from domain.apps import cookie_may_pass, parse_app_host, published_port
from domain.model import SessionStatus
from gateway.apps.access import AppPass, AppStores, Denied, Moment, authorize_app
from gateway.apps.activity import REFRESH_INTERVAL, TrafficRecorder
from gateway.apps.headers import (
    app_cookie,
    downstream_response_headers,
    signed_cookie_value,
    upstream_request_headers,
)
from gateway.graphql.sessions.app_mutations import LAUNCH_PATH
from gateway.revocations import RevocationWatch
from stores.activity import close_connection, open_connection

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
"""Seconds to connect to an app's port before answering 504."""
POOL_CONNECTIONS = 1000
"""Upstream connections open at once (all apps of one gateway process); keep-alive ones at most the same."""
WS_MAX_MESSAGE = 64 * 1024 * 1024
"""Bytes of one WebSocket message relayed from an app."""
REVOKED_CLOSE = 4401
"""WebSocket close code when the credential's token is revoked or expires."""


@dataclass
class AppRelay:
    """What the proxy needs, made in the gateway's lifespan."""

    settings: Settings
    stores: AppStores
    revocations: RevocationWatch
    recorder: TrafficRecorder
    client: httpx2.AsyncClient
    cookie_key: str | None = None
    """The app cookie's HS256 key when HAProxy serves the apps (``gateway.apps.ingress_config``): the gateway then
    keeps only the launch exchange, and its cookies are JWTs HAProxy checks."""

    @classmethod
    def create(
        cls,
        settings: Settings,
        stores: AppStores,
        revocations: RevocationWatch,
        recorder: TrafficRecorder,
        cookie_key: str | None = None,
    ) -> AppRelay:
        timeout = httpx2.Timeout(settings.gateway.app_upstream_timeout, connect=CONNECT_TIMEOUT)
        limits = httpx2.Limits(max_connections=POOL_CONNECTIONS, max_keepalive_connections=POOL_CONNECTIONS)
        client = httpx2.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False, trust_env=False)
        return cls(settings, stores, revocations, recorder, client, cookie_key)

    async def aclose(self) -> None:
        await self.client.aclose()


def _optional_header(scope: Scope, name: bytes) -> str | None:
    """The first ``name`` header's value, or None when the request has none."""
    return next((str(v.decode("latin-1")) for k, v in scope["headers"] if k == name), None)


def _header(scope: Scope, name: bytes) -> str:
    return _optional_header(scope, name) or ""


def _headers(scope: Scope) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]


async def _json(send: Send, status: int, code: str, message: str, extra: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class AppProxy:
    """ASGI middleware: app origins to :class:`AppRelay`, the rest to ``app``."""

    def __init__(self, app: ASGIApp, state: dict[str, Any]) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            settings: Settings = self.state["settings"]
            host = _header(scope, b"host")
            found = parse_app_host(host, settings.gateway.apps_domain)
            if found is not None:
                relay: AppRelay = self.state["apps"]
                hostname = host.rsplit(":", 1)[0].lower().rstrip(".")
                if relay.cookie_key is not None and not (scope["type"] == "http" and scope["path"] == LAUNCH_PATH):
                    await _not_served(scope, receive, send)
                    return
                if scope["type"] == "http":
                    await _serve_http(relay, scope, receive, send, hostname, *found)
                else:
                    await _serve_websocket(relay, scope, receive, send, hostname, *found)
                return
        await self.app(scope, receive, send)


async def _not_served(scope: Scope, receive: Receive, send: Send) -> None:
    """Behind HAProxy, which serves the apps: an app host it handed to the gateway names no app it knows."""
    if scope["type"] == "http":
        await _json(send, 404, "NOT_FOUND", "no such app")
    elif (await receive())["type"] == "websocket.connect":
        await _refuse_websocket(scope, send, 404, "NOT_FOUND", "no such app")


def _from_own_origin(scope: Scope) -> bool:
    """Whether the request comes from the app's own origin, as far as its browser's headers tell
    (``domain.apps.cookie_may_pass``)."""
    return cookie_may_pass(
        host=_header(scope, b"host"),
        method=scope.get("method", "GET"),
        websocket=scope["type"] == "websocket",
        origin=_optional_header(scope, b"origin"),
        fetch_site=_optional_header(scope, b"sec-fetch-site"),
        fetch_mode=_optional_header(scope, b"sec-fetch-mode"),
        fetch_dest=_optional_header(scope, b"sec-fetch-dest"),
    )


async def _authorize(relay: AppRelay, scope: Scope, hostname: str, app: str, session_id: str) -> AppPass:
    cookies = [v.decode("latin-1") for k, v in scope["headers"] if k == b"cookie"]
    return await authorize_app(
        relay.stores,
        host=hostname,
        app_name=app,
        session_id=session_id,
        authorization=_header(scope, b"authorization"),
        cookie_headers=cookies,
        cookie_allowed=_from_own_origin(scope),
        at=Moment(time.monotonic(), utcnow()),
    )


def _upstream(granted: AppPass) -> tuple[str, int] | None:
    if granted.session.status is not SessionStatus.RUNNING:
        return None
    return published_port(granted.session.main_kernel.ports, granted.app.port)


async def _traffic(relay: AppRelay, session_id: str) -> None:
    try:
        await relay.recorder.traffic(session_id, time.monotonic(), utcnow())
    except (RedisError, OSError) as exc:  # the app keeps working; the idle checker sees less
        log.warning("could not record app traffic of %s: %s", session_id, exc)


# -- HTTP ------------------------------------------------------------------------------------------------------------


async def _serve_http(
    relay: AppRelay, scope: Scope, receive: Receive, send: Send, hostname: str, app: str, session_id: str
) -> None:
    if scope["path"] == LAUNCH_PATH:
        await _launch(relay, scope, send, hostname)
        return
    try:
        granted = await _authorize(relay, scope, hostname, app, session_id)
    except Denied as denied:
        await _json(send, denied.status, denied.code, denied.message)
        return
    upstream = _upstream(granted)
    if upstream is None:
        await _json(send, 503, "APP_NOT_READY", f"app {app!r} has no published port yet: is the session RUNNING?")
        return
    await _traffic(relay, session_id)
    await _forward(relay, scope, receive, send, upstream, session_id)


def _has_body(scope: Scope) -> bool:
    return any(k in (b"content-length", b"transfer-encoding") for k, _ in scope["headers"])


async def _request_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError("the client went away")
        if message.get("body"):
            yield message["body"]
        if not message.get("more_body", False):
            return


async def _forward(
    relay: AppRelay, scope: Scope, receive: Receive, send: Send, upstream: tuple[str, int], session_id: str
) -> None:
    host, port = upstream
    raw_path = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        raw_path += b"?" + scope["query_string"]
    url = httpx2.URL(f"http://{host}:{port}").copy_with(raw_path=raw_path)
    client = scope.get("client")
    headers = upstream_request_headers(
        _headers(scope), client=client[0] if client else None, scheme=scope.get("scheme", "http")
    )
    request = relay.client.build_request(
        scope["method"], url, headers=headers, content=_request_body(receive) if _has_body(scope) else None
    )
    try:
        response = await relay.client.send(request, stream=True)
    except httpx2.TimeoutException:
        await _json(send, 504, "UPSTREAM_TIMEOUT", f"the app on port {port} did not answer in time")
        return
    except (httpx2.TransportError, ConnectionAbortedError) as exc:
        await _json(send, 502, "UPSTREAM_UNREACHABLE", f"the app could not be reached: {type(exc).__name__}")
        return
    try:
        out = downstream_response_headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw])
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out],
            }
        )
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await _traffic(relay, session_id)
        await send({"type": "http.response.body", "body": b""})
    finally:
        await response.aclose()


async def _launch(relay: AppRelay, scope: Scope, send: Send, hostname: str) -> None:
    """``/.caravan/launch?code=``: the code's grant, on its own host, for the app's cookie; then to the app."""
    codes = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("code", [])
    access = relay.stores.access
    grant = await access.take_launch_code(codes[0]) if len(codes) == 1 else None
    if grant is None or grant.host != hostname:
        await _json(send, 404, "NOT_FOUND", "unknown, used or expired launch code: ask launchApp for a new one")
        return
    found = await relay.stores.users.authenticate_hash(grant.token_hash)
    if found is None:
        await _json(send, 401, "UNAUTHENTICATED", "the token this launch was made with is no longer valid")
        return
    ttl = relay.settings.gateway.app_cookie_ttl
    if relay.cookie_key is not None:  # HAProxy checks it (gateway.apps.ingress_config)
        value = signed_cookie_value(
            relay.cookie_key,
            host=grant.host,
            token_hash=grant.token_hash,
            user_id=found.user.id,
            expires=int(time.time()) + ttl,
        )
    else:
        value = await access.new_cookie(grant, ttl)
    cookie = app_cookie(value, ttl, secure=scope.get("scheme") == "https")
    headers = [
        (b"location", b"/"),
        (b"set-cookie", cookie.encode("latin-1")),
        (b"cache-control", b"no-store"),
        (b"referrer-policy", b"no-referrer"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


# -- WebSocket -------------------------------------------------------------------------------------------------------


async def _refuse_websocket(scope: Scope, send: Send, status: int, code: str, message: str) -> None:
    """Before the handshake: an HTTP answer where the server can send one (ASGI's ``websocket.http.response``),
    else a close (the server answers 403)."""
    if "websocket.http.response" in scope.get("extensions", {}):
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": code})


async def _serve_websocket(
    relay: AppRelay, scope: Scope, receive: Receive, send: Send, hostname: str, app: str, session_id: str
) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    await relay.revocations.open()  # the reader's position is fixed before the token is checked (no gap)
    try:
        granted = await _authorize(relay, scope, hostname, app, session_id)
    except Denied as denied:
        await _refuse_websocket(scope, send, denied.status, denied.code, denied.message)
        return
    watched = relay.revocations.watch_hash(granted.token_hash) if granted.token_hash else None
    try:
        if granted.token_hash and await relay.stores.users.authenticate_hash(granted.token_hash) is None:
            await _refuse_websocket(scope, send, 401, "UNAUTHENTICATED", "the token was revoked")
            return
        upstream = _upstream(granted)
        if upstream is None:
            await _refuse_websocket(scope, send, 503, "APP_NOT_READY", f"app {app!r} has no published port yet")
            return
        await _relay_websocket(relay, scope, receive, send, upstream, granted, watched)
    finally:
        if watched is not None:
            relay.revocations.forget(watched)


async def _relay_websocket(
    relay: AppRelay,
    scope: Scope,
    receive: Receive,
    send: Send,
    upstream: tuple[str, int],
    granted: AppPass,
    watched: Any,
) -> None:
    host, port = upstream
    path = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        path += b"?" + scope["query_string"]
    client = scope.get("client")
    headers = upstream_request_headers(
        _headers(scope), client=client[0] if client else None, scheme=scope.get("scheme", "ws"), websocket=True
    )
    try:
        upstream_ws = await connect(
            f"ws://{host}:{port}{path.decode('latin-1')}",
            additional_headers=headers,
            subprotocols=[Subprotocol(p) for p in scope.get("subprotocols", [])] or None,
            open_timeout=CONNECT_TIMEOUT,
            max_size=WS_MAX_MESSAGE,
            compression=None,
            proxy=None,
            user_agent_header=None,
        )
    except TimeoutError:
        await _refuse_websocket(scope, send, 504, "UPSTREAM_TIMEOUT", "the app did not answer the handshake in time")
        return
    except (OSError, InvalidHandshake, InvalidStatus) as exc:
        await _refuse_websocket(scope, send, 502, "UPSTREAM_UNREACHABLE", f"the app refused: {type(exc).__name__}")
        return
    session_id = granted.session.id
    connection_id = uuid.uuid4().hex
    accept: Message = {"type": "websocket.accept"}
    if upstream_ws.subprotocol:
        accept["subprotocol"] = upstream_ws.subprotocol
    await send(accept)
    redis, keys = relay.recorder.redis, relay.recorder.keys
    async with upstream_ws:
        await open_connection(redis, keys, session_id, connection_id, utcnow())
        tasks = [
            asyncio.create_task(_client_to_app(relay, receive, upstream_ws, session_id)),
            asyncio.create_task(_app_to_client(relay, upstream_ws, send, session_id)),
            asyncio.create_task(_keep_open(redis, keys, session_id, connection_id)),
        ]
        if watched is not None:
            tasks.append(asyncio.create_task(watched.tripped.wait()))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if watched is not None and watched.tripped.is_set():
                with contextlib.suppress(Exception):
                    await send({"type": "websocket.close", "code": REVOKED_CLOSE, "reason": f"token {watched.reason}"})
            elif tasks[1] in done:  # the app closed: pass its close on
                code = upstream_ws.close_code or 1000
                with contextlib.suppress(Exception):
                    await send({"type": "websocket.close", "code": code, "reason": upstream_ws.close_reason or ""})
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(RedisError, OSError):
                await close_connection(redis, keys, session_id, connection_id, utcnow())


async def _client_to_app(relay: AppRelay, receive: Receive, upstream: ClientConnection, session_id: str) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            await upstream.close(message.get("code", 1000))
            return
        if message["type"] != "websocket.receive":
            continue
        data = message.get("bytes")
        try:
            await upstream.send(data if data is not None else message.get("text") or "")
        except ConnectionClosed:
            return
        await _traffic(relay, session_id)


async def _app_to_client(relay: AppRelay, upstream: ClientConnection, send: Send, session_id: str) -> None:
    try:
        async for data in upstream:
            if isinstance(data, bytes):
                await send({"type": "websocket.send", "bytes": data})
            else:
                await send({"type": "websocket.send", "text": data})
            await _traffic(relay, session_id)
    except ConnectionClosed:
        return


async def _keep_open(redis: Any, keys: Any, session_id: str, connection_id: str) -> None:
    while True:
        await asyncio.sleep(REFRESH_INTERVAL)
        try:
            await open_connection(redis, keys, session_id, connection_id, utcnow())
        except (RedisError, OSError) as exc:
            log.warning("could not refresh the app connection of %s: %s", session_id, exc)
