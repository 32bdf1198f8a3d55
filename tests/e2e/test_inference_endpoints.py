"""Inference endpoints through the stack's HAProxy, on real Nomad: a small model server (Python's http.server, shipped
by the test, in raw_exec replicas on the host network) that answers with its replica's name, can be told to be slow,
streams tokens one by one (the next only once the test lets it), and listens only once a gate file exists (a model
loading: its Nomad check passes late).

Requests go to 127.0.0.1 with the endpoint's ``Host`` (``<session id>.endpoints.<apps domain>``)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
import websockets
from websockets.asyncio.client import connect

from core.settings import Settings
from nomad_jobs.meta import TASK_NAME
from tests.e2e.test_inference import RECONCILE_INTERVAL, alloc_of, eventually
from tests.harness import ADMIN_TOKEN, CREATE, Caravan
from tests.ingress import caravan_behind_haproxy

MODEL = r"""
import os, sys, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
from urllib.parse import urlparse, parse_qs
gate = sys.argv[1]
while gate != "-" and not os.path.exists(gate):
    time.sleep(0.05)
host = os.environ.get("CARAVAN_CLUSTER_HOST", "?")

class Model(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, body, kind="text/plain"):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def die_here(self, query):  # a replica failing mid-request: gone without an answer
        if query.get("on", [""])[0] == host:
            os._exit(1)

    def do_GET(self):
        url = urlparse(self.path)
        query = parse_qs(url.query)
        self.die_here(query)
        if url.path == "/stream":  # tokens one by one; the second only once the file "next" names exists
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                if i == 1:
                    while not os.path.exists(query["next"][0]):
                        time.sleep(0.02)
                chunk = ("data: token%d\n\n" % i).encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        if url.path == "/slow":
            time.sleep(float(query.get("s", ["1"])[0]))
        self.answer(("replica %s\n" % host).encode())

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.die_here(parse_qs(urlparse(self.path).query))
        self.answer(body)

ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(os.environ["CARAVAN_SERVICE_PORT"])), Model).serve_forever()
"""
VIEW = """
query($id: ID!) { session(id: $id) {
  id status endpoints endpointUrl
  endpoint { url public tokens { id name }
    coldStarts { outcome arrivedAt startedAt routableAt firstByteAt secondsToFirstByte }
    stats { sampledAt requestsTotal replicasRoutable inFlight held errorsTotal p50Ms p99Ms } }
} }
"""
ISSUE = "mutation($s: ID!, $n: String!) { issueEndpointToken(sessionId: $s, name: $n) { token { id name } secret } }"
REVOKE = "mutation($s: ID!, $t: ID!) { revokeEndpointToken(sessionId: $s, tokenId: $t) }"
PUBLIC = "mutation($s: ID!, $p: Boolean!) { setEndpointPublic(sessionId: $s, public: $p) { url public } }"
HTTPD = 'mkdir -p /tmp/w && echo model > /tmp/w/index.html && exec httpd -f -p "$CARAVAN_SERVICE_PORT" -h /tmp/w'
"""A one-page model in an exec kernel (busybox httpd), for the tests that need no Python in the replica."""
CHANGE_BOUND = 5.0
"""Seconds a change (token issued or revoked, replica routable) may take to reach HAProxy on a busy machine (the
product's bound is 1 s: bench/inference_serving)."""


@dataclasses.dataclass
class Endpoint:
    caravan: Caravan
    session_id: str
    url: str

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[1].rstrip("/").rsplit(":", 1)[0]

    def address(self, path: str) -> str:
        return f"http://127.0.0.1:{self.caravan.settings.public_port}{path}"

    def headers(self, token: str | None) -> dict[str, str]:
        return {"Host": self.host, **({"Authorization": f"Bearer {token}"} if token else {})}

    async def get(self, path: str, token: str | None = ADMIN_TOKEN, **kwargs: Any) -> httpx2.Response:
        client: httpx2.AsyncClient = kwargs.pop("client", self.caravan.http)
        return await client.get(self.address(path), headers=self.headers(token), **kwargs)

    async def view(self) -> dict[str, Any]:
        found: dict[str, Any] = (await self.caravan.gql(VIEW, {"id": self.session_id}))["session"]
        return found


async def _create(
    caravan: Caravan, model: Path, replicas: int, gate: Path | None = None, check: str | None = "/"
) -> Endpoint:
    command = f"exec {sys.executable} {model} {gate or '-'}"
    request = {
        "name": "ep-" + uuid.uuid4().hex[:8],
        "type": "INFERENCE",
        "driver": "RAW_EXEC",
        "servicePort": 8000,
        "replicas": replicas,
        **({"healthCheckPath": check} if check else {}),
        "startupCommand": command,
        "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "128m"}],
    }
    [session] = (await caravan.gql(CREATE, {"input": request}))["createSession"]["sessions"]
    found = (await caravan.gql(VIEW, {"id": session["id"]}))["session"]
    return Endpoint(caravan, session["id"], found["endpointUrl"])


async def _serving(endpoint: Endpoint, replicas: int) -> None:
    """Until every replica answers through the endpoint."""

    async def probe() -> bool | None:
        seen = set()
        for _ in range(4 * replicas):
            answer = await endpoint.get("/")
            if answer.status_code == 200:
                seen.add(answer.text)
        return True if len(seen) == replicas else None

    try:
        await eventually(probe, f"{replicas} replicas answering through the endpoint")
    except AssertionError as failed:  # say where each replica stands, so that a failure in CI explains itself
        stored = await endpoint.caravan.store.get(endpoint.session_id)
        kernels = [
            (k.hostname, k.status.value, k.restarts, k.healthy, k.alloc_id, k.status_info, k.status_detail)
            for k in (stored.kernels if stored else ())
        ]
        raise AssertionError(f"{failed}; kernels (name, status, restarts, healthy, alloc, why): {kernels}") from None


async def _until(endpoint: Endpoint, token: str | None, status: int, **kwargs: Any) -> httpx2.Response:
    deadline = asyncio.get_running_loop().time() + CHANGE_BOUND
    while (answer := await endpoint.get("/", token, **kwargs)).status_code != status:
        assert asyncio.get_running_loop().time() < deadline, (answer.status_code, answer.text[:200])
        await asyncio.sleep(0.02)
    return answer


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    path.chmod(0o644)
    tmp_path.chmod(0o755)
    return path


def _settings(settings: Settings, **endpoints: Any) -> Settings:
    scheduler = dataclasses.replace(settings.scheduler, reconcile_interval=RECONCILE_INTERVAL)
    return dataclasses.replace(
        settings, scheduler=scheduler, endpoints=dataclasses.replace(settings.endpoints, **endpoints)
    )


@pytest.fixture
async def caravan(settings: Settings) -> AsyncIterator[Caravan]:
    async with caravan_behind_haproxy(_settings(settings)) as (running, _):
        yield running


async def test_balanced_and_streamed_token_by_token(caravan: Caravan, model: Path, tmp_path: Path) -> None:
    endpoint = await _create(caravan, model, replicas=2)
    assert endpoint.url == (
        f"http://{endpoint.session_id}.endpoints.{caravan.settings.gateway.apps_domain}:{caravan.settings.public_port}/"
    )
    await _serving(endpoint, 2)
    answers = [(await endpoint.get("/")).text for _ in range(20)]
    assert set(answers) == {"replica main1\n", "replica main2\n"}
    assert min(answers.count(a) for a in set(answers)) >= 5  # balanced, not one replica with a straggler

    answered = time.time()

    async def measured() -> dict[str, Any] | None:  # HAProxy's counters, read by the control plane each second
        stats: dict[str, Any] | None = (await endpoint.view())["endpoint"]["stats"]
        if stats is None or datetime.fromisoformat(stats["sampledAt"]).timestamp() < answered:
            return None  # a sample from before both replicas answered (the first may have served 20 alone)
        return stats if stats["requestsTotal"] >= 20 and stats["p99Ms"] is not None else None

    stats = await eventually(measured, "the endpoint's traffic measured")
    assert stats["replicasRoutable"] == 2 and stats["errorsTotal"] == 0 and stats["held"] == 0
    assert 0 <= stats["p50Ms"] <= stats["p99Ms"]
    metrics = (await caravan.http.get(f"{caravan.url.rsplit('/', 1)[0]}/metrics")).text
    assert f'caravan_endpoint_replicas_routable{{session="{endpoint.session_id}"}} 2.0' in metrics
    echoed = await caravan.http.post(endpoint.address("/"), headers=endpoint.headers(ADMIN_TOKEN), content=b"x" * 5000)
    assert (echoed.status_code, echoed.content) == (200, b"x" * 5000)
    next_token = tmp_path / "next"
    async with caravan.http.stream("GET", endpoint.address(f"/stream?next={next_token}"),
                                   headers=endpoint.headers(ADMIN_TOKEN)) as streamed:  # fmt: skip
        assert streamed.headers["content-type"] == "text/event-stream"
        chunks = streamed.aiter_text()
        first = await anext(chunks)
        assert first == "data: token0\n\n"  # the first token arrived while the model still holds the second
        next_token.touch()
        rest = "".join([c async for c in chunks])
    assert rest == "data: token1\n\ndata: token2\n\n"
    # a body over the limit is refused by its Content-Length, before a byte of it is read
    reader, writer = await asyncio.open_connection("127.0.0.1", caravan.settings.public_port)
    head = f"POST / HTTP/1.1\r\nHost: {endpoint.host}\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
    writer.write(f"{head}Content-Length: {caravan.settings.endpoints.max_body + 1}\r\n\r\n".encode())
    status = await reader.readline()
    writer.close()
    assert status.split()[1] == b"413"


async def test_private_endpoint_tokens(caravan: Caravan, model: Path) -> None:
    alice = await caravan.user("alice")
    bob = await caravan.user("bob")
    request = {
        "name": "ep-" + uuid.uuid4().hex[:8],
        "type": "INFERENCE",
        "driver": "EXEC",
        "servicePort": 8000,
        "replicas": 1,
        "healthCheckPath": "/",
        "startupCommand": HTTPD,
        "resources": [{"slot": "cpu", "amount": "0.25"}, {"slot": "mem", "amount": "64m"}],
    }
    [session] = (await caravan.gql(CREATE, {"input": request}, token=alice))["createSession"]["sessions"]
    found = (await caravan.gql(VIEW, {"id": session["id"]}, token=alice))["session"]
    endpoint = Endpoint(caravan, session["id"], found["endpointUrl"])
    await eventually(lambda: _answers(endpoint, alice), "the endpoint answering its owner")
    refused = await endpoint.get("/", None)
    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "UNAUTHENTICATED")
    other = await endpoint.get("/", bob)
    assert (other.status_code, other.json()["error"]["code"]) == (404, "NOT_FOUND")  # bob's view: no such endpoint
    stranger = await endpoint.get("/", "cep_not-a-token")
    assert stranger.status_code == 401
    with pytest.raises(Exception, match="NOT_FOUND"):
        await caravan.gql(ISSUE, {"s": endpoint.session_id, "n": "bob's"}, token=bob)
    issued = (await caravan.gql(ISSUE, {"s": endpoint.session_id, "n": "app"}, token=alice))["issueEndpointToken"]
    secret = issued["secret"]
    async with httpx2.AsyncClient(timeout=10) as kept:  # one kept-alive connection for both requests
        assert (await endpoint.get("/", secret, client=kept)).text == "model\n"
        await caravan.gql(REVOKE, {"s": endpoint.session_id, "t": issued["token"]["id"]}, token=alice)
        revoked = await _until(endpoint, secret, 401, client=kept)
        assert revoked.json()["error"]["code"] == "UNAUTHENTICATED"
    public = (await caravan.gql(PUBLIC, {"s": endpoint.session_id, "p": True}, token=alice))["setEndpointPublic"]
    assert public["public"] is True
    assert (await _until(endpoint, None, 200)).text == "model\n"
    await caravan.gql(PUBLIC, {"s": endpoint.session_id, "p": False}, token=alice)
    await _until(endpoint, None, 401)
    unknown = Endpoint(caravan, str(uuid.uuid4()), endpoint.url.replace(endpoint.session_id, str(uuid.uuid4())))
    assert (await unknown.get("/", ADMIN_TOKEN)).status_code == 404


async def _answers(endpoint: Endpoint, token: str) -> bool | None:
    return True if (await endpoint.get("/", token)).status_code == 200 else None


async def test_a_replica_killed_under_load_loses_no_idempotent_request(caravan: Caravan, model: Path) -> None:
    endpoint = await _create(caravan, model, replicas=2)
    await _serving(endpoint, 2)
    statuses: list[int] = []
    stop = asyncio.Event()

    async def load() -> None:
        async with httpx2.AsyncClient(timeout=30) as client:
            while not stop.is_set():
                statuses.append((await endpoint.get("/slow?s=0.05", client=client)).status_code)

    workers = [asyncio.create_task(load()) for _ in range(8)]
    await eventually(lambda: _at_least(statuses, 50), "load running")
    killed = await alloc_of(caravan, endpoint.session_id, "main2")
    await caravan.nomad.signal_allocation(killed["ID"], TASK_NAME, "SIGKILL")
    before = len(statuses)
    await eventually(lambda: _at_least(statuses, before + 400), "load after the kill")
    stop.set()
    await asyncio.gather(*workers)
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}


async def test_a_replica_failing_mid_request_retries_what_is_idempotent(caravan: Caravan, model: Path) -> None:
    """main2 dies on the request, without an answer: a GET is sent again to main1, a POST is 502 (never twice).
    Each request on a connection of its own, four at once (leastconn spreads them), until main2 took one."""
    endpoint = await _create(caravan, model, replicas=2)
    await _serving(endpoint, 2)

    async def one(method: str) -> httpx2.Response:
        async with httpx2.AsyncClient(timeout=30) as client:
            return await client.request(
                method, endpoint.address("/die?on=main2"), headers=endpoint.headers(ADMIN_TOKEN), content=b"prompt"
            )

    for method in ("GET", "POST"):
        restarts = before = await _restarts(caravan, endpoint.session_id)
        answers: list[httpx2.Response] = []
        for _ in range(5):
            answers += await asyncio.gather(*(one(method) for _ in range(4)))
            if await _restarted(caravan, endpoint.session_id, restarts) or any(a.status_code != 200 for a in answers):
                break
        statuses = [a.status_code for a in answers]
        if method == "GET":
            assert set(statuses) == {200} and {a.text for a in answers} == {"replica main1\n"}, [
                (a.status_code, a.text[:100], dict(a.headers)) for a in answers
            ]
        else:
            assert 502 in statuses and set(statuses) <= {200, 502}, statuses
            assert {a.json()["error"]["code"] for a in answers if a.status_code == 502} == {"UPSTREAM_UNREACHABLE"}
        await eventually(functools.partial(_restarted, caravan, endpoint.session_id, before), "main2 died on a request")
        await _serving(endpoint, 2)


async def _restarts(caravan: Caravan, session_id: str) -> int:
    stored = await caravan.store.get(session_id)
    assert stored is not None
    return next(k.restarts for k in stored.kernels if k.hostname == "main2")


async def _restarted(caravan: Caravan, session_id: str, before: int) -> bool | None:
    return True if await _restarts(caravan, session_id) > before else None


async def _at_least(items: list[int], count: int) -> bool | None:
    return True if len(items) >= count else None


async def test_the_activator_holds_a_request_until_a_replica_is_routable(
    caravan: Caravan, model: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "loaded"
    endpoint = await _create(caravan, model, replicas=1, gate=gate)
    await caravan.wait_for(endpoint.session_id, "RUNNING")
    held = asyncio.create_task(endpoint.get("/", timeout=120))

    async def waiting() -> bool | None:
        stats = (await endpoint.view())["endpoint"]["stats"]
        return True if stats is not None and stats["held"] == 1 else None

    await eventually(waiting, "the request held by the activator")
    # the activator asked for a replica at once (request_wake); the scheduler's autoscaler takes that ask off the list
    # as soon as it is pushed, so the list is not looked at here (tests/e2e/test_inference_autoscaling.py: a wake
    # brings an endpoint at zero back)
    assert not held.done()
    gate.touch()  # the model loaded: it listens, its check passes, it becomes routable
    answer = await held
    assert (answer.status_code, answer.text) == (200, "replica main1\n")
    [cold] = (await endpoint.view())["endpoint"]["coldStarts"]
    assert cold["outcome"] == "SERVED"
    arrived, started, routable, first = (
        datetime.fromisoformat(cold[k]) for k in ("arrivedAt", "startedAt", "routableAt", "firstByteAt")
    )
    assert arrived <= routable <= first
    assert started <= routable  # the replica's task ran (here before the request came: its model was still loading)
    assert (await endpoint.get("/")).text == "replica main1\n"  # and from now on HAProxy routes it directly


async def test_a_held_request_times_out_to_503(settings: Settings, model: Path, tmp_path: Path) -> None:
    async with caravan_behind_haproxy(_settings(settings, hold_timeout=2.0)) as (caravan, _):
        endpoint = await _create(caravan, model, replicas=1, gate=tmp_path / "never")
        await caravan.wait_for(endpoint.session_id, "RUNNING")
        answer = await endpoint.get("/", timeout=60)
        assert (answer.status_code, answer.json()["error"]["code"]) == (503, "ENDPOINT_COLD")
        assert answer.headers["retry-after"] == "5"
        assert "its replicas: main1 running, its check not passed yet" in answer.json()["error"]["message"]
        [cold] = (await endpoint.view())["endpoint"]["coldStarts"]
        assert (cold["outcome"], cold["firstByteAt"]) == ("TIMED_OUT", None)


async def test_a_token_over_the_rate_limit_is_429(settings: Settings, model: Path) -> None:
    async with caravan_behind_haproxy(_settings(settings, rate_limit=5)) as (caravan, _):
        endpoint = await _create(caravan, model, replicas=1)
        await _serving(endpoint, 1)
        answers = await asyncio.gather(*(endpoint.get("/") for _ in range(30)))  # far more than 5 in one second
        limited = [a for a in answers if a.status_code == 429]
        assert limited and {a.status_code for a in answers} <= {200, 429}
        assert {(a.json()["error"]["code"], a.headers["retry-after"]) for a in limited} == {("RATE_LIMITED", "1")}
        # refused requests count too: sent more slowly than the limit, they pass again
        await eventually(lambda: _answers(endpoint, ADMIN_TOKEN), "a request under the limit passing")


ECHO = """
import asyncio, os
from websockets.asyncio.server import serve
async def echo(ws):
    async for message in ws:
        await ws.send(message)
async def main():
    async with serve(echo, "127.0.0.1", int(os.environ["CARAVAN_SERVICE_PORT"])):
        await asyncio.Future()
asyncio.run(main())
"""


async def test_a_websocket_is_relayed(caravan: Caravan, tmp_path: Path) -> None:
    server = tmp_path / "echo.py"
    server.write_text(ECHO)
    tmp_path.chmod(0o755)
    endpoint = await _create(caravan, server, replicas=1, check=None)  # a TCP check: it answers no plain GET
    await caravan.wait_for(endpoint.session_id, "RUNNING")
    port = caravan.settings.public_port

    async def echoed() -> str | None:
        try:
            async with connect(f"ws://{endpoint.host}:{port}/", host="127.0.0.1", port=port,
                               additional_headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as ws:  # fmt: skip
                await ws.send("token by token")
                return str(await ws.recv())
        except (OSError, websockets.exceptions.InvalidStatus, websockets.exceptions.InvalidMessage):
            return None  # not routable yet (the activator refuses a WebSocket it cannot hold)

    assert await eventually(echoed, "an echo through the endpoint") == "token by token"
    with pytest.raises(websockets.exceptions.InvalidStatus, match="401"):
        async with connect(f"ws://{endpoint.host}:{port}/", host="127.0.0.1", port=port):
            pass
