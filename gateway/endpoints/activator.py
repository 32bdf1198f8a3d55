"""The activator: where HAProxy sends an endpoint's request while the endpoint has no routable replica (its backend's
backup server, through the activator's listener: ``gateway.endpoints.ingress``). Scale-to-zero's data-plane side.

A request arrives here only through HAProxy, which admitted it and marked it with a header carrying a secret only it
and the gateway know (anything else on an endpoint host is 404). Then:

- the endpoint has a routable replica already (HAProxy's servers lag Redis by milliseconds): forwarded at once;
- else it is **held**: at most ``CARAVAN_ENDPOINT_HOLD_MAX`` per endpoint (503 ``ENDPOINT_BUSY`` beyond), the
  autoscaler is asked for a replica at once (``stores.endpoint_traffic.request_wake``), and the request waits until
  ``domain.inference.endpoints_of`` lists a replica (its Nomad check passes: never before), then is forwarded to it,
  streamed both ways. No replica within ``CARAVAN_ENDPOINT_HOLD_TIMEOUT``: 503 ``ENDPOINT_COLD`` with
  ``Retry-After``. Each held request is recorded as a cold start (arrival, first routable replica, first byte:
  ``stores.endpoint_access.ColdStart``), shown in GraphQL.

One poller per endpoint and gateway process reads the session while requests wait (every :data:`HOLD_POLL` s). A
WebSocket cannot be held: it is refused (close 1013, "try again later") once it woke the endpoint.

The requests held are counted per gateway process (an instance id of its activator) under a lease the process renews
while it holds any (``stores.endpoint_access.HELD_LEASE``): the count the control plane reads (the autoscaler's
``held``, the endpoint's stats) is right again within a lease after a gateway was killed while holding.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.settings import Settings
from domain.endpoint_routes import parse_endpoint_host, replica_started, routable
from domain.inference import is_inference, why_cold
from gateway.endpoints.control import raise_if_cancelling
from gateway.endpoints.ingress import ACTIVATOR_HEADER, IDEMPOTENT, activator_secret
from gateway.json_errors import send_error
from stores.endpoint_access import HELD_LEASE, ColdStart, EndpointAccessStore
from stores.endpoint_traffic import request_wake
from stores.sessions import SessionStore

log = logging.getLogger(__name__)

HOLD_POLL = 0.05
"""Seconds between reads of a held endpoint's session."""
RETRY_AFTER = 5
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer", b"upgrade"}
)


@dataclass
class _Wait:
    """The requests held for one endpoint in this process, and the poller that tells them a replica is routable."""

    waiters: int = 0
    ready: asyncio.Future[tuple[str, ...]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    poller: asyncio.Task[None] | None = None
    started_at: float | None = None
    """When the replica that made the endpoint routable started its task (``endpoint_routes.replica_started``)."""


class EndpointActivator:
    """ASGI middleware: requests on endpoint hosts (``domain.endpoint_routes``) are the activator's; others go on."""

    def __init__(self, app: ASGIApp, state: dict[str, Any]) -> None:
        self.app = app
        self.state = state
        self._waits: dict[str, _Wait] = {}
        self._turn = itertools.count()
        self.instance = uuid.uuid4().hex[:16]
        """This process's activator, in the counts of held requests (``stores.endpoint_access.set_held``)."""
        self._held: dict[str, int] = {}
        """Session id -> requests this process holds for it."""
        self._lease: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        settings: Settings = self.state["settings"]
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        session_id = parse_endpoint_host(host, settings.gateway.apps_domain)
        if session_id is None:
            await self.app(scope, receive, send)
            return
        secret = activator_secret(self.state["apps"].cookie_key)
        mark = next((v.decode("latin-1") for k, v in scope["headers"] if k == ACTIVATOR_HEADER.encode()), "")
        if not hmac.compare_digest(mark, secret):
            await self._refuse(scope, receive, send, 404, "NOT_FOUND", "no such endpoint")
            return
        sessions: SessionStore = self.state["sessions"]
        session = await sessions.get(session_id)
        if session is None or not is_inference(session) or session.status.is_terminal:
            await self._refuse(scope, receive, send, 404, "NOT_FOUND", "no such endpoint")
            return
        replicas = routable(session)
        if scope["type"] == "websocket":
            if not replicas:
                await request_wake(sessions.redis, sessions.keys, session_id)
            await self._refuse(scope, receive, send, 503, "ENDPOINT_COLD", "no replica yet: retry")
            return
        cold: ColdStart | None = None
        if not replicas:
            cold, replicas = await self._hold(session_id, settings, send)
            if not replicas:
                return
        await self._forward(scope, receive, send, replicas, session_id, cold)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, code: str, text: str) -> None:
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.close", "code": 1013 if status == 503 else 1008, "reason": code})
        else:
            await send_error(send, status, code, text)

    async def _hold(self, session_id: str, settings: Settings, send: Send) -> tuple[ColdStart, tuple[str, ...]]:
        """Wait for a routable replica: ``(cold start so far, replicas)``; empty replicas: answered already."""
        arrived = time.time()
        sessions: SessionStore = self.state["sessions"]
        access = EndpointAccessStore(sessions.redis, sessions.keys)
        wait = self._waits.get(session_id)
        if wait is None or wait.ready.done():
            wait = self._waits[session_id] = _Wait()
        if wait.waiters >= settings.endpoints.hold_max:
            await send_error(send, 503, "ENDPOINT_BUSY", "too many requests wait for this endpoint's first replica",
                             [(b"retry-after", str(RETRY_AFTER).encode())])  # fmt: skip
            return ColdStart(arrived, None, None, "REFUSED"), ()
        wait.waiters += 1
        await self._count(access, session_id, 1)
        if self._lease is None or self._lease.done():
            self._lease = asyncio.create_task(self._renew(access), name="activator lease")
        try:
            await request_wake(sessions.redis, sessions.keys, session_id)
            if wait.poller is None:
                wait.poller = asyncio.create_task(self._poll(session_id, wait), name=f"activator {session_id}")
            try:
                async with asyncio.timeout(settings.endpoints.hold_timeout):
                    replicas = await asyncio.shield(wait.ready)
            except TimeoutError:
                replicas = ()
        finally:
            wait.waiters -= 1
            with contextlib.suppress(Exception):
                await self._count(access, session_id, -1)
            if wait.waiters == 0 and wait.poller is not None and not wait.ready.done():
                wait.poller.cancel()
                self._waits.pop(session_id, None)
        if not replicas:
            cold = ColdStart(arrived, None, None, "TIMED_OUT")
            await access.record_cold_start(session_id, cold)
            why = await self._why_cold(session_id)
            await send_error(send, 503, "ENDPOINT_COLD",
                             f"no replica of this endpoint became ready within {settings.endpoints.hold_timeout:g}s"
                             f"{why}", [(b"retry-after", str(RETRY_AFTER).encode())])  # fmt: skip
            return cold, ()
        return ColdStart(arrived, time.time(), None, "SERVED", started_at=wait.started_at), replicas

    async def _why_cold(self, session_id: str) -> str:
        """``: <why>`` (``domain.inference.why_cold``), or nothing when Redis cannot say."""
        sessions: SessionStore = self.state["sessions"]
        try:
            return ": " + why_cold(await sessions.get(session_id))
        except Exception:  # Redis away a moment: the answer goes without the reason
            return ""

    async def _count(self, access: EndpointAccessStore, session_id: str, delta: int) -> None:
        held = self._held[session_id] = self._held.get(session_id, 0) + delta
        if held <= 0:
            self._held.pop(session_id, None)
        await access.set_held(self.instance, session_id, held, time.time())

    async def _renew(self, access: EndpointAccessStore) -> None:
        """The lease of this process's counts, renewed while it holds any request."""
        while self._held:
            await asyncio.sleep(HELD_LEASE / 3)
            for session_id in list(self._held):
                with contextlib.suppress(Exception):  # Redis away a moment: the next turn renews it
                    await self._count(access, session_id, 0)

    async def _poll(self, session_id: str, wait: _Wait) -> None:
        sessions: SessionStore = self.state["sessions"]
        while True:
            raise_if_cancelling()
            try:
                session = await sessions.get(session_id)
            except Exception:  # Redis away a moment: the held requests wait on, up to their timeout
                raise_if_cancelling()
                await asyncio.sleep(HOLD_POLL)
                continue
            if session is None or session.status.is_terminal:
                wait.ready.set_result(())
                return
            replicas = routable(session)
            if replicas:
                wait.started_at = replica_started(session)
                wait.ready.set_result(replicas)
                return
            await asyncio.sleep(HOLD_POLL)

    def _http(self) -> httpx2.AsyncClient:
        client: httpx2.AsyncClient = self.state["endpoint_http"]
        return client

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        replicas: tuple[str, ...],
        session_id: str,
        cold: ColdStart | None,
    ) -> None:
        """The request to a replica (another once more if it was refused and the method is idempotent), the answer
        streamed back."""
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k not in HOP_BY_HOP and k != ACTIVATOR_HEADER.encode()
        ]
        idempotent = scope["method"] in IDEMPOTENT
        body: bytes | AsyncIterator[bytes] = (
            b"".join([c async for c in _body(receive)]) if idempotent else _body(receive)
        )
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        target = path.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
        tries = 2 if idempotent and len(replicas) > 1 else 1
        start = next(self._turn)
        response = None
        for attempt in range(tries):
            replica = replicas[(start + attempt) % len(replicas)]
            request = self._http().build_request(
                scope["method"], f"http://{replica}{target}", headers=headers, content=body
            )
            try:
                response = await self._http().send(request, stream=True)
                break
            except httpx2.TimeoutException:
                await send_error(send, 504, "UPSTREAM_TIMEOUT", "the endpoint did not answer in time")
                return
            except httpx2.HTTPError:
                continue
        if response is None:
            await self._cold(session_id, cold, "FAILED")
            await send_error(send, 502, "UPSTREAM_UNREACHABLE", "no replica of the endpoint could be reached")
            return
        try:
            out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.multi_items()]
            out = [(k, v) for k, v in out if k.lower() not in HOP_BY_HOP]
            await send({"type": "http.response.start", "status": response.status_code, "headers": out})
            await self._cold(session_id, cold, "SERVED", first_byte=True)
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    async def _cold(self, session_id: str, cold: ColdStart | None, outcome: str, first_byte: bool = False) -> None:
        if cold is None:
            return
        sessions: SessionStore = self.state["sessions"]
        first = time.time() if first_byte else None
        record = ColdStart(cold.arrived_at, cold.routable_at, first, outcome, started_at=cold.started_at)
        with contextlib.suppress(Exception):
            await EndpointAccessStore(sessions.redis, sessions.keys).record_cold_start(session_id, record)


def http_client(settings: Settings) -> httpx2.AsyncClient:
    """The activator's client to the replicas (made and closed in the gateway's lifespan)."""
    timeout = settings.gateway.app_upstream_timeout
    return httpx2.AsyncClient(timeout=httpx2.Timeout(timeout, connect=2.0), follow_redirects=False)


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message: Message = await receive()
        if message["type"] != "http.request":
            return
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return
