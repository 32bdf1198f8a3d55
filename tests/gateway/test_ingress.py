"""HAProxy, the apps' data plane, against hostile and heavy traffic: the real HAProxy the stack runs
(``caravan.stack.haproxy``), a gateway keeping its maps from a real Redis (``gateway.apps.control``), and, standing
in for the kernels' apps, HTTP servers of the test's own on loopback that record every request they get. Sessions
are written to Redis as the scheduler leaves them (RUNNING, a published port): no Nomad here, the e2e tests
(tests/e2e/test_app_proxy.py) run real apps in real sessions through the same path."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

from caravan.stack.haproxy import ingress_config, start_haproxy
from caravan.stack.processes import free_port
from core.settings import Settings
from domain.apps import app_host
from domain.model import Session, SessionStatus
from gateway.apps import control, plane
from gateway.apps.ingress_config import IngressPaths
from tests.harness import ADMIN_TOKEN, Caravan, running_caravan
from tests.ingress import Ingress, caravan_behind_haproxy, gateway_behind, haproxy_for, running_app, with_ingress

BOUND = 5.0
"""Seconds a change may take to reach HAProxy here (it takes milliseconds; bench/app_proxy measures it): a busy
machine's margin, not a speed claim."""


class Upstream:
    """An HTTP/1.1 server on loopback (keep-alive) that answers ``<name> <method> <path>`` and records each request
    line it parsed."""

    def __init__(self, name: str, port: int = 0) -> None:
        self.name = name
        self.lines: list[str] = []
        seen = self.lines

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                seen.append(self.requestline)
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                out = json.dumps(
                    {"app": name, "line": self.requestline, "headers": dict(self.headers), "body": len(body)}
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstreams() -> Iterator[tuple[Upstream, Upstream]]:
    pair = Upstream("alice-app"), Upstream("bob-app")
    yield pair
    for upstream in pair:
        upstream.close()


@pytest.fixture
async def behind(redis_settings: Settings) -> AsyncIterator[tuple[Caravan, Ingress]]:
    async with caravan_behind_haproxy(redis_settings, scheduler=False) as pair:
        yield pair


async def started(caravan: Caravan, *sessions: Session) -> list[str]:
    await caravan.store.create(list(sessions))
    return [app_host("web", s.id, caravan.settings.gateway.apps_domain) for s in sessions]


def raw(port: int, data: bytes, *, wait: float = 2.0) -> bytes:
    """What HAProxy answers ``data`` sent on one connection (read until it closes or ``wait`` passes quiet)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as connection:
        connection.sendall(data)
        out = b""
        try:
            while chunk := connection.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out


def request(host: str, token: str | None, path: str = "/", extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}{extra}\r\n".encode()


async def until_status(ingress: Ingress, host: str, token: str | None, status: int, wait: float = 2.0) -> bytes:
    deadline = asyncio.get_running_loop().time() + BOUND
    while True:
        answer = await asyncio.to_thread(
            raw, ingress.port, request(host, token, extra="Connection: close\r\n"), wait=wait
        )
        if answer.startswith(f"HTTP/1.1 {status} ".encode()):
            return answer
        assert asyncio.get_running_loop().time() < deadline, answer[:300]
        await asyncio.sleep(0.02)


async def test_a_fresh_haproxy_lets_nobody_in_until_the_control_plane_built_it(
    behind: tuple[Caravan, Ingress], upstreams: tuple[Upstream, Upstream]
) -> None:
    caravan, ingress = behind
    alice = await caravan.user("alice")
    [host] = await started(caravan, running_app("alice", upstreams[0].port))
    await until_status(ingress, host, alice, 200)

    # a second HAProxy on the same configuration, with nobody keeping its maps: nobody passes, whatever they send
    lonely_dir = ingress.paths.state_dir / "lonely"
    lonely_port = free_port()
    config = dataclasses.replace(ingress_config(ingress.settings, lonely_port, ingress.gateway_port))
    lonely = start_haproxy(config, lonely_dir, log=lonely_dir.parent / "lonely.log")
    try:
        for token in (alice, ADMIN_TOKEN, None):
            answer = await asyncio.to_thread(raw, lonely_port, request(host, token, extra="Connection: close\r\n"))
            assert answer.startswith(b"HTTP/1.1 503 ") and b'"UNAVAILABLE"' in answer
    finally:
        lonely.stop()
    assert upstreams[0].lines.count("GET / HTTP/1.1") == 1  # only the first request ever reached the app

    # HAProxy killed with -9 and started again (fresh, empty maps): the control plane sees it and rebuilds it
    ingress.service.process.kill()
    ingress.service.process.wait(10)
    ingress.start()
    await until_status(ingress, host, alice, 200)


async def test_a_gateway_started_before_its_haproxy_keeps_it_once_it_runs(
    redis_settings: Settings, upstreams: tuple[Upstream, Upstream]
) -> None:
    """The gateway's control planes start before HAProxy has made its state directory (the ingress and the gateways
    start at once: the deployed jobs, bench/chaos): they wait for it, and keep HAProxy once it runs. (Before, each
    plane's task died opening its lock file there, and no route ever reached HAProxy.)"""
    scratch = Path(tempfile.mkdtemp(prefix="cvh-", dir="/tmp"))  # a unix socket path has at most 97 bytes
    state_dir, port, gateway_port = scratch / "later", free_port(), free_port()
    settings = with_ingress(redis_settings, state_dir, port)
    ingress = Ingress(settings, IngressPaths(state_dir), port, gateway_port, None)  # type: ignore[arg-type]
    try:
        async with running_caravan(settings, port=gateway_port, scheduler=False) as caravan:
            await asyncio.sleep(2 * plane.RETRY)  # the planes have started, and found no state directory
            assert not state_dir.exists()
            ingress.start()
            await ingress.built()
            alice = await caravan.user("alice")
            [host] = await started(caravan, running_app("alice", upstreams[0].port))
            await until_status(ingress, host, alice, 200)
    finally:
        if ingress.service is not None:
            ingress.service.stop()
        shutil.rmtree(scratch, ignore_errors=True)


async def test_request_smuggling_is_refused_or_neutralized(
    behind: tuple[Caravan, Ingress], upstreams: tuple[Upstream, Upstream]
) -> None:
    caravan, ingress = behind
    alice = await caravan.user("alice")
    app = upstreams[0]
    [host] = await started(caravan, running_app("alice", app.port))
    await until_status(ingress, host, alice, 200)
    app.lines.clear()
    head = f"POST / HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {alice}\r\n"
    smuggled = "GET /smuggled HTTP/1.1\r\nHost: " + host + "\r\n\r\n"
    attacks = {
        # CL.TE: the front end would read 6 bytes, the back end a chunked body ending early, "G..." left over
        "CL.TE": f"{head}Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGPOST",
        # TE.CL: the front end reads the chunk, a back end trusting Content-Length would see the rest as a request
        "TE.CL": f"{head}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        f"{len(smuggled):x}\r\n{smuggled}\r\n0\r\n\r\n",
        "duplicate Content-Length": f"{head}Content-Length: 5\r\nContent-Length: 40\r\n\r\n{smuggled}",
        "TE obfuscated": f"{head}Content-Length: 4\r\nTransfer-Encoding: xchunked\r\n\r\n{smuggled}",
    }
    for name, attack in attacks.items():
        answer = await asyncio.to_thread(raw, ingress.port, attack.encode())
        statuses = [line for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
        assert statuses, (name, answer[:200])
        assert all(s.split()[1] in (b"200", b"400", b"501") for s in statuses), (name, statuses)
    assert "GET /smuggled HTTP/1.1" not in app.lines and not any("GPOST" in line for line in app.lines), app.lines
    assert all(line == "POST / HTTP/1.1" for line in app.lines), app.lines  # each reached it as one request, or not


async def test_host_header_tricks_reach_no_one_elses_app(
    behind: tuple[Caravan, Ingress], upstreams: tuple[Upstream, Upstream]
) -> None:
    caravan, ingress = behind
    alice, bob = await caravan.user("alice"), await caravan.user("bob")
    alice_host, bob_host = await started(
        caravan, running_app("alice", upstreams[0].port), running_app("bob", upstreams[1].port)
    )
    await until_status(ingress, bob_host, bob, 200)
    await until_status(ingress, alice_host, alice, 200)
    before = list(upstreams[0].lines)

    port = ingress.port
    tricks = [
        request(f"{alice_host.upper()}:{port}", bob),  # case and port
        request(alice_host + ".", bob),  # a trailing dot: not an app host HAProxy knows
        request(bob_host, bob, extra=f"Host: {alice_host}\r\n"),  # two Host headers
        f"GET http://{alice_host}/ HTTP/1.1\r\nHost: {bob_host}\r\nAuthorization: Bearer {bob}\r\n\r\n".encode(),
        f"GET http://{bob_host}/ HTTP/1.1\r\nHost: {alice_host}\r\nAuthorization: Bearer {bob}\r\n\r\n".encode(),
        request(f"{bob_host}@{alice_host}", bob),
        request(f"{alice_host}\t", bob),
        request(f"x.{alice_host}", bob),
    ]
    for trick in tricks:
        answer = await asyncio.to_thread(raw, port, trick[:-2] + b"Connection: close\r\n\r\n")
        assert not answer.startswith(b"HTTP/1.1 200 ") or b'"bob-app"' in answer, (trick, answer[:300])
    assert upstreams[0].lines == before  # nothing of bob's reached alice's app


async def test_a_revoked_token_is_refused_on_a_kept_alive_connection(
    behind: tuple[Caravan, Ingress], upstreams: tuple[Upstream, Upstream]
) -> None:
    caravan, ingress = behind
    await caravan.user("alice")
    token, record = await caravan.users.new_token("alice", "kept-alive")
    [host] = await started(caravan, running_app("alice", upstreams[0].port))
    await until_status(ingress, host, token, 200)

    def exchange(connection: socket.socket) -> bytes:
        connection.sendall(request(host, token))
        head = b""
        while b"\r\n\r\n" not in head:
            head += connection.recv(65536)
        header, _, body = head.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in header.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        while len(body) < length:
            body += connection.recv(65536)
        return header.split(b"\r\n", 1)[0]

    with socket.create_connection(("127.0.0.1", ingress.port), timeout=10) as connection:
        assert await asyncio.to_thread(exchange, connection) == b"HTTP/1.1 200 OK"
        await caravan.users.revoke_token(record.id)
        deadline = asyncio.get_running_loop().time() + BOUND
        while (status := await asyncio.to_thread(exchange, connection)) != b"HTTP/1.1 401 Unauthorized":
            assert status == b"HTTP/1.1 200 OK" and asyncio.get_running_loop().time() < deadline, status
            await asyncio.sleep(0.01)
        # the same connection: the next request is refused, not a new connection's
        assert await asyncio.to_thread(exchange, connection) == b"HTTP/1.1 401 Unauthorized"


class BusyApp:
    """An app too busy to accept connections until :meth:`wake`: its accept queue is full (a backlog of 0 and one
    connection never accepted), so the kernel drops every SYN, as it does for a real app whose backlog overflows
    (busybox httpd listens with 9). Woken, it accepts and answers every request ``200 awake``."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = int(self.listener.getsockname()[1])
        self.filler = socket.create_connection(("127.0.0.1", self.port))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.awake = threading.Event()
        self.thread.start()

    def wake(self) -> None:
        self.awake.set()

    def _serve(self) -> None:
        self.awake.wait()
        self.filler.close()
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.listener.accept()
                threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    @staticmethod
    def _answer(connection: socket.socket) -> None:
        with connection, contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data and (chunk := connection.recv(65536)):
                data += chunk
            if data:
                connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nawake")

    def close(self) -> None:
        self.awake.set()
        self.listener.close()


def exchange(connection: socket.socket, data: bytes) -> bytes:
    """One request on a kept-alive ``connection``: the answer's head and body (b"" if it was closed unanswered)."""
    connection.sendall(data)
    head = b""
    while b"\r\n\r\n" not in head:
        if not (chunk := connection.recv(65536)):
            return head
        head += chunk
    header, _, body = head.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in header.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length and (chunk := connection.recv(65536)):
        body += chunk
    return header + b"\r\n\r\n" + body


class OneRequestPerConnection:
    """Fault injector: an app that answers the first request of each connection (keep-alive, as far as its headers
    say) and closes the connection, unanswered, when a second one arrives on it: what a real app does when the next
    request reaches it just as it closes an idle connection (uvicorn after 5 s, tornado, any server's idle timeout),
    a race a real app loses only now and then."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.answered = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.listener.accept()
                threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection, contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data and (chunk := connection.recv(65536)):
                data += chunk
            self.answered += 1
            connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst")
            connection.recv(65536)  # the next request: closed unanswered

    def close(self) -> None:
        self.listener.close()


async def test_a_kept_alive_connection_survives_an_app_closing_its_idle_connection(
    behind: tuple[Caravan, Ingress],
) -> None:
    """HAProxy opens a connection to the app per request (``option http-server-close``): a server connection kept
    for the client's next request could be one the app is closing, and HAProxy 2.6 answers that failure on a
    kept-alive connection's later request by closing the client's connection unanswered."""
    caravan, ingress = behind
    alice = await caravan.user("alice")
    app = OneRequestPerConnection()
    try:
        [host] = await started(caravan, running_app("alice", app.port))
        await until_status(ingress, host, alice, 200)
        with socket.create_connection(("127.0.0.1", ingress.port), timeout=30) as connection:
            for _ in range(3):
                answer = await asyncio.to_thread(exchange, connection, request(host, alice))
                assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"first"), answer
    finally:
        app.close()


async def connect_retries(ingress: Ingress) -> int:
    """HAProxy's count of connects to apps it tried again (``wretr`` of backend ``apps``)."""
    (stats,) = await ingress.api.run(["show stat"])
    lines = stats.splitlines()
    names = lines[0].lstrip("# ").split(",")
    row = next(dict(zip(names, line.split(","), strict=False)) for line in lines if line.startswith("apps,BACKEND,"))
    return int(row["wretr"] or 0)


async def test_a_busy_app_is_waited_for_on_a_kept_alive_connection(
    behind: tuple[Caravan, Ingress], upstreams: tuple[Upstream, Upstream]
) -> None:
    """An app whose accept queue overflows drops the SYN; HAProxy tries the connect again on a new socket, as often
    as it takes a busy app to catch up. Once its tries ran out on a connection that carried a request before, HAProxy
    2.6 closes that connection without an answer (a connect timeout there is left to the client to retry): that was
    the kept-alive connection closed silently under load (4 tries, 500 ms each, against a busybox httpd whose
    backlog of 9 overflowed)."""
    caravan, ingress = behind
    alice = await caravan.user("alice")
    busy = BusyApp()
    try:
        live, sleepy = await started(caravan, running_app("alice", upstreams[0].port), running_app("alice", busy.port))
        await until_status(ingress, live, alice, 200)
        with socket.create_connection(("127.0.0.1", ingress.port), timeout=60) as connection:
            assert (await asyncio.to_thread(exchange, connection, request(live, alice))).startswith(b"HTTP/1.1 200 ")
            before = await connect_retries(ingress)
            answer = asyncio.create_task(asyncio.to_thread(exchange, connection, request(sleepy, alice)))
            # the app stays busy until HAProxy tried again more often than it used to in all
            while await connect_retries(ingress) - before < 6 and not answer.done():
                await asyncio.sleep(0.01)
            busy.wake()
            assert (await answer).startswith(b"HTTP/1.1 200 "), await answer
    finally:
        busy.close()


async def test_an_app_still_starting_is_tried_again_until_it_listens(behind: tuple[Caravan, Ingress]) -> None:
    """A session is RUNNING (its route in HAProxy) before its app listens (Jupyter ~0.4 s after its container
    started): the connect is refused, and HAProxy 2.6 waits min(``timeout connect``, 1 s) before it tries the same
    server again, so a starting app was reached up to that long after it listened. The apps' backend tries every
    25 ms (``APP_CONNECT_TIMEOUT_MS``), 120 times (about 3 s, as before): the request waits through more than the
    30 tries of 100 ms it had (then 502), and is answered once the app listens."""
    caravan, ingress = behind
    alice = await caravan.user("alice")
    port = free_port()  # nothing listens on it yet: refused
    [host] = await started(caravan, running_app("alice", port))
    deadline = asyncio.get_running_loop().time() + BOUND
    while host not in await ingress.api.show_map(ingress.paths.map("routes")):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    before = await connect_retries(ingress)
    data = request(host, alice, extra="Connection: close\r\n")
    answer = asyncio.create_task(asyncio.to_thread(raw, ingress.port, data, wait=60))
    while await connect_retries(ingress) - before < 60 and not answer.done():
        await asyncio.sleep(0.005)
    app = Upstream("late", port)
    try:
        assert (await answer).startswith(b"HTTP/1.1 200 "), await answer
    finally:
        app.close()


def starting_app(owner: str, port: int) -> Session:
    """A PREPARING session whose kernel's allocation Nomad placed (its ports known) and has not reported running."""
    session = running_app(owner, port)
    kernel = dataclasses.replace(session.main_kernel, status=SessionStatus.PREPARING, alloc_id="a-placed-alloc")
    return dataclasses.replace(session, status=SessionStatus.PREPARING, kernels=(kernel,))


async def test_a_starting_session_is_routed_from_placement_and_said_not_ready_until_its_app_listens(
    behind: tuple[Caravan, Ingress],
) -> None:
    """The route exists from the allocation's placement (Nomad's client reports a new allocation running up to a
    second after its task started): a request to a session still PREPARING is held while HAProxy tries the connect,
    answered ``APP_NOT_READY`` (not ``UPSTREAM_UNREACHABLE``) when its tries run out, and answered by the app once it
    listens, before the session is RUNNING. One not placed yet (no allocation) is not routed at all."""
    caravan, ingress = behind
    alice = await caravan.user("alice")
    port = free_port()  # nothing listens on it yet: refused
    placing = starting_app("alice", free_port())
    unplaced = dataclasses.replace(placing, kernels=(dataclasses.replace(placing.main_kernel, alloc_id=None),))
    [host, waiting] = await started(caravan, starting_app("alice", port), unplaced)
    deadline = asyncio.get_running_loop().time() + BOUND
    while host not in (routes := await ingress.api.show_map(ingress.paths.map("routes"))):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    assert routes[host] == f"127.0.0.1:{port}:starting" and waiting not in routes
    assert b'"APP_NOT_READY"' in await until_status(ingress, waiting, alice, 503)
    answer = await asyncio.to_thread(raw, ingress.port, request(host, alice, extra="Connection: close\r\n"), wait=10)
    assert answer.startswith(b"HTTP/1.1 503 ") and b'"APP_NOT_READY"' in answer and b"still starting" in answer
    app = Upstream("late", port)
    try:
        assert (await until_status(ingress, host, alice, 200)).startswith(b"HTTP/1.1 200 ")
    finally:
        app.close()
    # RUNNING and unreachable after as many tries: the app is what failed
    [gone] = await started(caravan, running_app("alice", free_port()))
    answer = await until_status(ingress, gone, alice, 502, wait=10)
    assert b'"UPSTREAM_UNREACHABLE"' in answer


async def test_ten_thousand_routes(behind: tuple[Caravan, Ingress], upstreams: tuple[Upstream, Upstream]) -> None:
    caravan, ingress = behind
    alice = await caravan.user("alice")
    sessions = [running_app("alice", upstreams[i % 2].port) for i in range(10_000)]
    for start in range(0, len(sessions), 500):
        await caravan.store.create(sessions[start : start + 500])
    hosts = [app_host("web", s.id, caravan.settings.gateway.apps_domain) for s in sessions]
    deadline = asyncio.get_running_loop().time() + 120
    while len(await ingress.api.show_map(ingress.paths.map("routes"))) < 10_000:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.5)
    for index in (0, 4_999, 9_998, 9_999):
        answer = await asyncio.to_thread(raw, ingress.port, request(hosts[index], alice, extra="Connection: close\r\n"))
        assert answer.startswith(b"HTTP/1.1 200 ") and f'"{upstreams[index % 2].name}"'.encode() in answer


async def test_the_control_plane_waits_for_changes_instead_of_polling(
    redis_settings: Settings, upstreams: tuple[Upstream, Upstream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control plane blocks on ``Keys.route_changes`` (every session, user or token write appends to it): with
    its fallback read pushed out of reach, it reads Redis's counters only when something was written, and a change
    still takes effect at once (it used to read them every 5 ms)."""
    monkeypatch.setattr(plane, "CHECK_INTERVAL", 3600.0)
    syncs = 0
    sync = control.ControlPlane.sync

    async def counted(plane: control.ControlPlane) -> None:
        nonlocal syncs
        syncs += 1
        await sync(plane)

    monkeypatch.setattr(control.ControlPlane, "sync", counted)
    with haproxy_for(redis_settings) as ingress:
        async with gateway_behind(ingress, scheduler=False) as caravan:
            alice = await caravan.user("alice")
            [host] = await started(caravan, running_app("alice", upstreams[0].port))
            await until_status(ingress, host, alice, 200)  # woken by the writes
            quiet = syncs
            await asyncio.sleep(0.5)  # nothing written meanwhile
            assert syncs == quiet
            await caravan.users.deactivate("alice")
            await until_status(ingress, host, alice, 401)


async def opened(ingress: Ingress, host: str, token: str) -> ClientConnection:
    """A WebSocket to ``host`` (an app's, an endpoint's) through HAProxy, once its route is there."""
    deadline = asyncio.get_running_loop().time() + BOUND
    while True:
        try:
            return await connect(
                f"ws://{host}:{ingress.port}/",
                host="127.0.0.1",
                port=ingress.port,
                additional_headers={"Authorization": f"Bearer {token}"},
            )
        except InvalidStatus:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)


async def test_a_websocket_opened_before_a_gateway_restart_closes_when_its_token_is_revoked(
    redis_settings: Settings,
) -> None:
    """HAProxy keeps the open WebSockets (who opened each, with which token) in a table of its own: a gateway that
    started after a socket opened finds it there, and closes it when its token is revoked."""

    async def echo(ws: ServerConnection) -> None:
        async for message in ws:
            await ws.send(message)

    async with serve(echo, "127.0.0.1", 0) as server:
        app_port = int(next(iter(server.sockets)).getsockname()[1])
        with haproxy_for(redis_settings) as ingress:
            async with gateway_behind(ingress, scheduler=False) as caravan:
                await caravan.user("alice")
                token, record = await caravan.users.new_token("alice", "socket")
                [host] = await started(caravan, running_app("alice", app_port))
                ws = await opened(ingress, host, token)
                generation = await ingress.built()
            async with ws:
                await ws.send("across")
                assert await ws.recv() == "across"  # no gateway now: HAProxy carries it on alone
                async with gateway_behind(ingress, scheduler=False) as caravan:
                    await ingress.built(after=generation)  # the new gateway's control plane rebuilt HAProxy
                    await caravan.users.revoke_token(record.id)
                    with pytest.raises(ConnectionClosed):
                        async with asyncio.timeout(BOUND):
                            while True:
                                await ws.send("still there?")
                                await ws.recv()


def listening_tcp_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its sockets' inodes, found in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def test_the_runtime_api_is_a_private_unix_socket(behind: tuple[Caravan, Ingress]) -> None:
    """Sessions cannot reach HAProxy's runtime API: it is no TCP port at all, and its unix socket is its owner's
    alone, in a directory only its owner may enter."""
    _, ingress = behind
    assert listening_tcp_ports(ingress.service.pid) == {ingress.port}
    assert stat.S_IMODE(ingress.paths.socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(ingress.paths.state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(ingress.paths.config.stat().st_mode) == 0o600  # it holds the app cookies' key
