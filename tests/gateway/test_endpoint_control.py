"""The endpoint control plane and what HAProxy enforces for it, on a real HAProxy and Redis (no Nomad: INFERENCE
sessions stored as the scheduler would write them, their replicas loopback servers of the test's own): woken by
``Keys.route_changes`` rather than polling, an open WebSocket cut when its token is revoked, a chunked body capped
at the proxy, the activator's held count right again after a gateway was killed while holding."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx2
import pytest
from websockets.asyncio.server import ServerConnection, serve

from core.keys import Keys
from core.redis import client as redis_client
from core.settings import Settings
from domain.endpoint_routes import endpoint_host
from domain.model import Session
from gateway.apps import plane
from gateway.endpoints.control import EndpointControl
from stores.endpoint_access import HELD_LEASE, EndpointAccessStore
from stores.endpoint_traffic import read_loads
from stores.sessions import SessionStore
from tests.dev_process import gateway_answers
from tests.gateway.test_endpoint_ingress import app_of, inference
from tests.gateway.test_ingress import BOUND, Upstream, opened, raw, request, until_status
from tests.harness import Caravan, caravan_env
from tests.ingress import Ingress, caravan_behind_haproxy, gateway_behind, haproxy_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def replicas() -> Iterator[tuple[Upstream, Upstream]]:
    pair = Upstream("main1"), Upstream("main2")
    yield pair
    for upstream in pair:
        upstream.close()


def access_of(caravan: Caravan) -> EndpointAccessStore:
    return EndpointAccessStore(caravan.store.redis, caravan.store.keys)


def names(ingress: Ingress, host: str, token: str | None, times: int = 8) -> set[str]:
    return {app_of(raw(ingress.port, request(host, token, extra="Connection: close\r\n"))) for _ in range(times)}


async def test_the_endpoint_plane_is_woken_by_changes_and_applies_them(
    redis_settings: Settings, replicas: tuple[Upstream, Upstream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its fallback read pushed out of reach, the endpoint control plane reads Redis only when something was
    written (it used to read two counters every 5 ms), and a token revoked, an endpoint made public, a replica added
    still reach HAProxy: the writes wake it through ``Keys.route_changes``."""
    monkeypatch.setattr(plane, "CHECK_INTERVAL", 3600.0)
    monkeypatch.setattr(EndpointControl, "sample_interval", 3600.0)
    syncs = 0
    sync = EndpointControl.sync

    async def counted(control: EndpointControl) -> None:
        nonlocal syncs
        syncs += 1
        await sync(control)

    monkeypatch.setattr(EndpointControl, "sync", counted)
    async with caravan_behind_haproxy(redis_settings, scheduler=False) as (caravan, ingress):
        await caravan.user("alice")
        session = inference("alice", replicas[0].port)
        await caravan.store.create([session])
        host = endpoint_host(session.id, caravan.settings.gateway.apps_domain)
        issued = await access_of(caravan).issue(session.id, "ci", datetime.now(UTC))
        assert issued is not None
        token, secret = issued
        await until_status(ingress, host, secret, 200)

        quiet = syncs
        await asyncio.sleep(0.5)  # nothing written meanwhile: the plane sleeps on the stream
        assert syncs == quiet

        assert await access_of(caravan).revoke(session.id, token.id)
        await until_status(ingress, host, secret, 401)
        await access_of(caravan).set_public(session.id, True)
        await until_status(ingress, host, None, 200)

        def second_replica(before: Session) -> Session:
            added = dataclasses.replace(
                before.kernels[0], index=2, hostname="main2", ports=(f"8000=127.0.0.1:{replicas[1].port}",)
            )
            return before.evolve(kernels=(*before.kernels, added))

        await caravan.store.update(session.id, second_replica)
        deadline = asyncio.get_running_loop().time() + BOUND
        while await asyncio.to_thread(names, ingress, host, None) != {"main1", "main2"}:
            assert asyncio.get_running_loop().time() < deadline


async def test_an_open_endpoint_websocket_is_cut_when_its_token_is_revoked(redis_settings: Settings) -> None:
    """HAProxy keeps the WebSockets it admitted to an endpoint (who, with which token) in a table of their own; the
    endpoint control plane shuts down the one whose endpoint token was revoked (it used to stay open: a WebSocket is
    admitted once), and leaves the one opened with the owner's API token alone."""

    async def echo(ws: ServerConnection) -> None:
        async for message in ws:
            await ws.send(message)

    async with serve(echo, "127.0.0.1", 0) as server:
        replica_port = int(next(iter(server.sockets)).getsockname()[1])
        async with caravan_behind_haproxy(redis_settings, scheduler=False) as (caravan, ingress):
            alice = await caravan.user("alice")
            session = inference("alice", replica_port)
            await caravan.store.create([session])
            host = endpoint_host(session.id, caravan.settings.gateway.apps_domain)
            issued = await access_of(caravan).issue(session.id, "socket", datetime.now(UTC))
            assert issued is not None
            token, secret = issued
            revoked, kept = await opened(ingress, host, secret), await opened(ingress, host, alice)
            async with revoked, kept:
                await revoked.send("before")
                assert await revoked.recv() == "before"
                assert await access_of(caravan).revoke(session.id, token.id)
                await asyncio.wait_for(revoked.wait_closed(), BOUND)
                await kept.send("still")
                assert await kept.recv() == "still"


class ChunkCounter:
    """A replica that reads a request body in any framing (chunked too) and answers its length."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                total = 0
                if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        total += len(self.rfile.read(size))
                        self.rfile.readline()
                    self.rfile.readline()
                else:
                    total = len(self.rfile.read(int(self.headers.get("content-length") or 0)))
                out = json.dumps({"app": "counter", "body": total}).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def chunked_post(port: int, host: str, size: int, chunk: int = 8192) -> bytes:
    """A POST of ``size`` bytes in chunks of ``chunk`` (no Content-Length), and HAProxy's answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        # Connection: close, so the answer ends with the connection (kept alive, it was read until the 10 s timeout)
        head = f"POST / HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        connection.sendall(head.encode())
        sent = 0
        try:
            while sent < size:
                part = min(chunk, size - sent)
                connection.sendall(b"%x\r\n" % part + b"x" * part + b"\r\n")
                sent += part
            connection.sendall(b"0\r\n\r\n")
        except OSError:  # HAProxy answered and closed before the rest: what it answered is below
            pass
        out = b""
        try:
            while data := connection.recv(65536):
                out += data
        except OSError:
            pass
    return out


async def test_a_chunked_body_over_the_limit_gets_413_at_the_proxy(redis_settings: Settings) -> None:
    """A chunked upload has no Content-Length to refuse it by: HAProxy counts it as it streams and answers 413 at the
    first byte over ``CARAVAN_ENDPOINT_MAX_BODY`` (it used to pass whole to the replica); one at the limit passes."""
    limit = 100_000
    settings = dataclasses.replace(
        redis_settings, endpoints=dataclasses.replace(redis_settings.endpoints, max_body=limit)
    )
    counter = ChunkCounter()
    try:
        async with caravan_behind_haproxy(settings, scheduler=False) as (caravan, ingress):
            await caravan.user("alice")
            session = inference("alice", counter.port)
            await caravan.store.create([session])
            await access_of(caravan).set_public(session.id, True)
            host = endpoint_host(session.id, caravan.settings.gateway.apps_domain)
            await until_status(ingress, host, None, 501)  # routed: the counter answers GET with 501
            for size in (limit + 1, 4 * limit, 50 * limit):
                answer = await asyncio.to_thread(chunked_post, ingress.port, host, size)
                assert answer.startswith(b"HTTP/1.1 413 "), (size, answer[:300])
                assert b'"PAYLOAD_TOO_LARGE"' in answer
            for size in (limit // 2, limit):
                answer = await asyncio.to_thread(chunked_post, ingress.port, host, size)
                assert (
                    answer.startswith(b"HTTP/1.1 200 ") and json.loads(answer.split(b"\r\n\r\n", 1)[1])["body"] == size
                )
    finally:
        counter.close()


@pytest.fixture
async def gateway_process(redis_settings: Settings) -> AsyncIterator[tuple[Ingress, subprocess.Popen[bytes]]]:
    """``caravan gateway`` as a process of its own behind a HAProxy of the test's (no scheduler)."""
    with haproxy_for(redis_settings) as ingress:
        env = {
            **caravan_env(ingress.settings, ingress.gateway_port),
            "CARAVAN_INGRESS_PORT": str(ingress.port),
            "CARAVAN_INGRESS_DIR": str(ingress.paths.state_dir),
            "CARAVAN_ENDPOINT_HOLD_TIMEOUT": "600",
        }
        with (redis_settings.home / "gateway.log").open("ab") as log:
            process = subprocess.Popen(  # noqa: ASYNC220 (starts it and returns)
                [sys.executable, "-m", "caravan.cli", "gateway"], cwd=ROOT, env=env, stdout=log, stderr=log
            )
        try:
            async with httpx2.AsyncClient(timeout=5) as http:
                deadline = time.monotonic() + 120
                while not await gateway_answers(http, f"http://127.0.0.1:{ingress.gateway_port}/graphql"):
                    assert process.poll() is None, (redis_settings.home / "gateway.log").read_text()[-3000:]
                    assert time.monotonic() < deadline, "the gateway did not come up"
                    await asyncio.sleep(0.3)
            await ingress.built()
            yield ingress, process
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()


async def held_request(redis_settings: Settings, ingress: Ingress) -> tuple[asyncio.Task[bytes], Session]:
    """A request for a cold endpoint (its one replica's check has not passed: nothing routable), sent through
    ``ingress`` as a task, once the activator holds it."""
    keys = Keys(redis_settings.redis.prefix)
    redis = redis_client(redis_settings.redis)
    try:
        session = inference("alice", 9)
        session = session.evolve(kernels=(dataclasses.replace(session.kernels[0], healthy=False),))
        await SessionStore(redis, keys).create([session])
        await EndpointAccessStore(redis, keys).set_public(session.id, True)
        host = endpoint_host(session.id, redis_settings.gateway.apps_domain)
        held = asyncio.create_task(asyncio.to_thread(raw, ingress.port, request(host, None), wait=60))
        deadline = time.monotonic() + 60
        while (load := (await read_loads(redis, keys)).get(session.id)) is None or load.held != 1:
            assert time.monotonic() < deadline and not held.done(), (load, held.done() and held.result()[:300])
            await asyncio.sleep(0.1)
        return held, session
    finally:
        await redis.aclose()


async def test_a_request_held_when_its_gateway_stops_is_answered_unavailable_not_500(
    redis_settings: Settings, gateway_process: tuple[Ingress, subprocess.Popen[bytes]]
) -> None:
    """A gateway stopped (SIGTERM) while its activator holds a request for a cold endpoint: uvicorn cancels the
    request once its grace (``SHUTDOWN_GRACE``) is over, and the client gets ``503 UNAVAILABLE`` with Retry-After, a
    typed answer it can retry on (it got uvicorn's plain-text ``500 Internal Server Error``: bench/chaos in CI)."""
    ingress, process = gateway_process
    held, _ = await held_request(redis_settings, ingress)
    process.send_signal(signal.SIGTERM)
    answer = await held
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), answer[:400]
    assert b"\r\nretry-after: 1" in head.lower(), head
    assert json.loads(body)["error"]["code"] == "UNAVAILABLE", body
    assert process.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn raises the signal it caught once stopped
    log = (redis_settings.home / "gateway.log").read_text()
    assert "Exception in ASGI application" not in log, log[-3000:]


async def test_the_held_count_is_right_again_after_a_gateway_killed_while_holding(
    redis_settings: Settings, gateway_process: tuple[Ingress, subprocess.Popen[bytes]]
) -> None:
    """A gateway process SIGKILLed while its activator holds a request for a cold endpoint: the count it left lapses
    with its lease (it used to stay at 1 for ever: the autoscaler then saw a request waiting that nobody held), and
    the next gateway's control plane reports 0."""
    ingress, process = gateway_process
    keys = Keys(redis_settings.redis.prefix)
    redis = redis_client(redis_settings.redis)
    try:
        held, session = await held_request(redis_settings, ingress)
        process.send_signal(signal.SIGKILL)
        process.wait()
        await held  # HAProxy lost the activator's connection
        async with gateway_behind(ingress, scheduler=False):
            deadline = time.monotonic() + 3 * HELD_LEASE + BOUND
            killed_at = time.time()
            while (
                (load := (await read_loads(redis, keys)).get(session.id)) is None
                or load.sampled_at < killed_at
                or load.held
            ):
                assert time.monotonic() < deadline, load
                await asyncio.sleep(0.2)
    finally:
        await redis.aclose()
