"""``caravan deploy`` on the tests' Nomad agent: Caravan's own jobs come up, GraphQL answers through the deployed
HAProxy (whose gateway backend lists every replica), a session reaches RUNNING, one scheduler of two leads, and a
stopped leader hands over (the time it took is printed: speed is bench/'s business); the deployed namespace keeper
fills its client's pool, a docker session runs in a pooled namespace, and neither an update of the keepers nor the
deployment's end leaves a pause container behind."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import pytest
from msgspec.structs import replace as dataclasses_replace

from caravan.deploy import gateway_service, job_id
from caravan.stack.nomad_agent import NomadAgent
from core.keys import Keys
from core.redis import client as redis_client
from core.settings import Settings
from domain.apps import app_host
from domain.endpoint_routes import endpoint_host
from domain.model import Session
from stores.sessions import SessionStore
from tests.conftest import DOCKER, STACK, namespaced_settings
from tests.deployed import (
    Deployed,
    config_for,
    deploy_command,
    deployed,
    free_namespaces,
    logs,
    pause_containers,
)
from tests.e2e.test_namespace_pool import pooled_in
from tests.gateway.test_endpoint_ingress import inference
from tests.gateway.test_ingress import Upstream
from tests.harness import ADMIN_TOKEN
from tests.ingress import running_app
from tests.ws_client import authenticated_socket

pytestmark = [pytest.mark.nomad, pytest.mark.redis]

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CREATE = """mutation($input: CreateSessionInput!) { createSession(input: $input) { sessions { id } } }"""
STATUS = """query($id: ID!) { session(id: $id) { status waitReasons } }"""
JOB_HCL = """query($id: ID!) { session(id: $id) { jobHcl } }"""
DESTROY = """mutation($id: ID!) { destroySession(ids: [$id]) { id } }"""


def until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return found


def one_leader(stack: Deployed, job: str, count: int) -> str:
    """The allocation id of the one replica of ``job`` that leads, once all ``count`` answer and one leads."""

    def settled() -> dict[str, bool | None] | None:
        health = stack.health(job)
        return health if len(health) == count and any(health.values()) else None

    health = until(settled, 60, f"{count} {job} replicas, one leading")
    leaders = [alloc for alloc, leading in health.items() if leading]
    assert len(leaders) == 1, health
    return leaders[0]


@pytest.fixture(scope="module")
def releases(
    redis_server: str, secrets_dir: Path, nomad_agent: NomadAgent, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    """One deployment of the default shape (two replicas of each job; with Docker, the namespace keepers and a pool of
    2) for every test here: deployed once, in a namespace of its own; once it is purged, no pause container is left.
    A dense stream of requests is allowed, and a cold endpoint's request is held 1 s. Each test first waits for what
    it needs (two gateways, all in HAProxy's backend; a leader of two; a full pool), and releases its job as a version
    none runs yet (:func:`next_version`). The keeper test, which ends the keepers, runs last."""
    namespace = "t" + uuid.uuid4().hex[:10]
    home = tmp_path_factory.mktemp("releases")
    settings = namespaced_settings(redis_server, nomad_agent.addr, secrets_dir, namespace, home)
    env = {"CARAVAN_GRAPHQL_RATE_LIMIT": "1000000", "CARAVAN_ENDPOINT_HOLD_TIMEOUT": "1"}
    if DOCKER:
        env |= {"CARAVAN_NAMESPACE_POOL": "2", "CARAVAN_PAUSE_IMAGE": STACK["CARAVAN_PAUSE_IMAGE"]}
    with deployed(settings, config_for(settings, env, version="1")) as stack:
        yield stack
    assert not pause_containers(nomad_agent.node_id), "pause containers left after the deployment's end"


def next_version(stack: Deployed) -> str:
    """The shared deployment's next release: a version no job of it runs yet (the stack's configuration keeps it)."""
    stack.config = dataclasses_replace(stack.config, version=str(int(stack.config.version) + 1))
    return stack.config.version


def test_deploy_brings_caravan_up_on_nomad(releases: Deployed) -> None:
    stack, settings = releases, releases.settings
    assert stack.gql("{ viewer { id } }") == {"viewer": {"id": "admin"}}
    # HAProxy's gateway backend: every replica Nomad runs, and nothing else
    replicas = until(lambda: r if len(r := stack.gateway_replicas()) == 2 else None, 30, "two gateways")
    until(lambda: stack.backend() == replicas, 30, f"HAProxy's backend to list {replicas}")

    # HAProxy's maps are kept by the ingress job's own process (the gateways could run on any client)
    keepers = until(lambda: k if len(k := stack.map_keepers()) == 2 else None, 30, "both control planes")
    assert sorted(keepers) == ["control.lock", "endpoints.lock"]
    assert all("caravan.cli ingress" in command for command in keepers.values()), keepers
    until(lambda: "admin" in stack.map_values("tokens"), 30, "the admin's token in HAProxy's tokens map")

    # an endpoint with no replica in service: HAProxy hands its request to the activator, in a gateway replica
    # (before, the activator's backend was 127.0.0.1 and the gateway's port 0: HAProxy's own 503, no wake-up)
    cold = inference("admin", 9)
    cold = cold.evolve(kernels=tuple(dataclasses.replace(k, healthy=False) for k in cold.kernels))
    asyncio.run(stored(settings, cold))
    host = endpoint_host(cold.id, settings.gateway.apps_domain)
    until(lambda: host in stack.map_entries("endpoints"), 30, "the endpoint's route in HAProxy")
    origin = f"http://127.0.0.1:{stack.config.ingress.port}/"
    answer = httpx2.get(origin, headers={"Host": host, **AUTH}, timeout=30)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "ENDPOINT_COLD", answer.text

    session = stack.gql(CREATE, {"input": {"name": "deployed", "type": "INTERACTIVE", "driver": "EXEC"}})
    session_id = session["createSession"]["sessions"][0]["id"]
    until(lambda: stack.gql(STATUS, {"id": session_id})["session"]["status"] == "RUNNING", 120, "RUNNING")

    leader = one_leader(stack, "scheduler", 2)
    one_leader(stack, "idle", 2)
    stopped = time.monotonic()
    stack.nomad.call("POST", f"/v1/allocation/{leader}/stop?namespace={stack.config.namespace}")
    successor = until(
        lambda: next((a for a, leading in stack.health("scheduler").items() if leading and a != leader), None),
        60,
        "another scheduler to lead",
    )
    print(f"scheduler leadership handed over in {time.monotonic() - stopped:.2f} s (allocation stopped)")
    assert successor != leader
    # the new leader schedules: a session created now runs too
    session = stack.gql(CREATE, {"input": {"name": "after", "type": "INTERACTIVE", "driver": "EXEC"}})
    after = session["createSession"]["sessions"][0]["id"]
    until(lambda: stack.gql(STATUS, {"id": after})["session"]["status"] == "RUNNING", 120, "RUNNING after")
    for sid in (session_id, after):
        stack.gql(DESTROY, {"id": sid})


class SteadyStream:
    """Requests through HAProxy one after another, on a kept-alive connection (or a new one each with
    ``keep_alive=False``), in a thread: how many were sent, and every one that did not answer as expected. GraphQL
    (the admin's ``viewer``) by default; with ``app_host``, a GET of that app (the upstream's 200)."""

    def __init__(self, url: str, *, keep_alive: bool = True, app_host: str | None = None) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"} | ({} if keep_alive else {"Connection": "close"})
        if app_host:
            self.headers["Host"] = app_host
        self.app = app_host is not None
        self.sent = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx2.Client(timeout=30, headers=self.headers) as http:
            while not self._stop.is_set():
                self.sent += 1
                try:
                    if self.app:
                        response = http.get(self.url)
                        good = response.status_code == 200 and response.json()["app"] == "upstream"
                    else:
                        response = http.post(self.url, json={"query": "{ viewer { id } }"})
                        good = response.status_code == 200 and response.json() == {"data": {"viewer": {"id": "admin"}}}
                    if not good:
                        self.failures.append(f"{response.status_code} {response.text[:200]}")
                except httpx2.HTTPError as failed:
                    self.failures.append(repr(failed))

    def __enter__(self) -> SteadyStream:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)


async def test_rolling_upgrade_of_the_gateway_fails_no_request(releases: Deployed) -> None:
    """A new release of the gateway job (``caravan deploy --only gateway``) replaces both replicas one at a time
    under a steady stream of requests through HAProxy: none fails; a WebSocket open on an old replica is closed with
    1012 (service restart: reconnect), not cut."""
    stack = releases
    before = until(lambda: r if len(r := stack.gateway_replicas()) == 2 else None, 60, "two gateways")
    until(lambda: stack.backend() == before, 60, f"HAProxy's backend to list {before}")
    async with authenticated_socket(stack.url, ADMIN_TOKEN) as socket:
        with SteadyStream(stack.url) as stream:
            await asyncio.to_thread(upgraded_gateways, stack, before, next_version(stack))
        assert await socket.closed_with(30) == 1012
    print(f"rolling upgrade of 2 gateway replicas: {stream.sent} requests, {len(stream.failures)} failed")
    assert stream.sent > 0
    assert stream.failures == []


def upgraded_gateways(stack: Deployed, before: list[tuple[str, int]], version: str) -> list[tuple[str, int]]:
    """Release ``version`` of the gateway job (``caravan deploy --only gateway``: a rolling upgrade, one replica at a
    time) and wait until two new replicas serve, both in HAProxy's backend: their addresses."""
    path = stack.settings.home / "deploy.json"
    path.write_text(json.dumps(msgspec.to_builtins(dataclasses_replace(stack.config, version=version))))
    done = deploy_command(stack.settings, path, "--only", "gateway", "--wait", "180")
    assert done.returncode == 0, done.stdout + done.stderr
    after: list[tuple[str, int]] = until(
        lambda: r if len(r := stack.gateway_replicas()) == 2 and not set(r) & set(before) else None,
        60,
        "two new gateways",
    )
    until(lambda: stack.backend() == after, 60, f"HAProxy's backend to list {after}")
    return after


def listening(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=1):
            return True
    except OSError:
        return False


def stop_a_gateway_under_a_stream(stack: Deployed) -> SteadyStream:
    """Stop one of the two gateway allocations under a stream of requests: it must leave HAProxy's backend while it
    still listens; the stream, once it stopped listening."""
    replicas = until(lambda: r if len(r := stack.gateway_replicas()) == 2 else None, 60, "two gateways")
    until(lambda: stack.backend() == replicas, 60, f"HAProxy's backend to list {replicas}")
    [victim, *_] = stack.services(gateway_service(stack.config))
    address = (victim["Address"], int(victim["Port"]))
    with SteadyStream(stack.url) as stream:
        stack.nomad.call("POST", f"/v1/allocation/{victim['AllocID']}/stop?namespace={stack.config.namespace}")
        until(lambda: address not in stack.backend(), 60, f"{address} out of HAProxy's backend")
        assert listening(address), f"{address} stopped listening before HAProxy stopped sending it requests"
        until(lambda: not listening(address), 60, f"{address} to stop")
    return stream


def test_a_stopping_gateway_leaves_the_backend_while_it_still_serves(releases: Deployed) -> None:
    """A gateway allocation stopped (an upgrade, a scale-down, a drain) leaves HAProxy's backend while it still
    listens, within its ``shutdown_delay``: a request HAProxy sends it is answered, none is cut. (With Nomad's
    default template wait, 5 s, the ingress learned of it only as it stopped listening: a request HAProxy had just
    sent it was closed unanswered, ``RemoteProtocolError`` for the client; 2 stops of 4 cut one.)"""
    for _ in range(2):
        stream = stop_a_gateway_under_a_stream(releases)
        print(f"gateway allocation stopped: {stream.sent} requests, {len(stream.failures)} failed")
        assert stream.failures == []


def test_an_upgrade_of_the_ingress_refuses_no_connection(releases: Deployed) -> None:
    """A new release of the ingress job (HAProxy) under streams of requests, GraphQL on a kept-alive connection and
    on a new connection each, an app's and an inference endpoint's on new connections: the new HAProxy starts beside
    the old one on the public port (a canary), with the gateways already in its backend and the apps' and endpoints'
    maps and backends prefilled (``gateway.planes.prefilled``), and the old one stops once it is healthy: no
    connection is refused, no request fails. (Before, the old allocation stopped first and its replacement waited for
    it to end: the port was closed 6.6 s, 80 of 232 new connections refused; with the maps empty, app and endpoint
    requests on the new HAProxy answered 503 until its control planes rebuilt it.)"""
    stack, settings = releases, releases.settings
    with contextlib.closing(Upstream("upstream")) as upstream:
        replicas = until(lambda: r if len(r := stack.gateway_replicas()) == 2 else None, 60, "two gateways")
        until(lambda: stack.backend() == replicas, 60, f"HAProxy's backend to list {replicas}")
        # an app (the admin's session, published on the upstream's port): its requests HAProxy routes by its maps
        app = running_app("admin", upstream.port)
        asyncio.run(stored(settings, app))
        host = app_host("web", app.id, settings.gateway.apps_domain)
        origin = f"http://127.0.0.1:{stack.config.ingress.port}/"
        until(lambda: httpx2.get(origin, headers={"Host": host, **AUTH}).status_code == 200, 30, "the app's route")
        # an inference endpoint of the admin's, its one replica the upstream: HAProxy routes it by its endpoint maps
        endpoint = inference("admin", upstream.port)
        asyncio.run(stored(settings, endpoint))
        ep_host = endpoint_host(endpoint.id, settings.gateway.apps_domain)
        until(lambda: httpx2.get(origin, headers={"Host": ep_host, **AUTH}).status_code == 200, 30, "the endpoint")
        [old] = stack.allocations("ingress")
        path = settings.home / "deploy.json"
        next_version(stack)
        path.write_text(json.dumps(msgspec.to_builtins(stack.config)))
        with (
            SteadyStream(stack.url) as kept,
            SteadyStream(stack.url, keep_alive=False) as fresh,
            SteadyStream(origin, keep_alive=False, app_host=host) as apps,
            SteadyStream(origin, keep_alive=False, app_host=ep_host) as endpoints,
        ):
            done = deploy_command(settings, path, "--only", "ingress", "--wait", "180")
            assert done.returncode == 0, done.stdout + done.stderr
            until(lambda: [a["ID"] for a in stack.allocations("ingress")] not in ([], [old["ID"]]), 60, "a new HAProxy")
            until(lambda: old["ID"] not in [a["ID"] for a in stack.allocations("ingress")], 60, "the old to stop")
            until(lambda: stack.backend() == replicas, 60, f"the new HAProxy's backend to list {replicas}")
            sent = (kept.sent, fresh.sent)
            until(lambda: kept.sent > sent[0] + 10 and fresh.sent > sent[1] + 10, 60, "requests after the old stopped")
        unavailable = sum(failure.startswith("503 ") for failure in endpoints.failures)
        print(
            f"ingress upgrade: {kept.sent} requests kept alive, {fresh.sent} on new connections, {apps.sent} to an "
            f"app, {endpoints.sent} to an endpoint; failed: {len(kept.failures)}, {len(fresh.failures)}, "
            f"{len(apps.failures)} {apps.failures[:3]}, {len(endpoints.failures)} ({unavailable} 503) "
            f"{endpoints.failures[:3]}"
        )
        assert (kept.failures, fresh.failures, apps.failures, endpoints.failures) == ([], [], [], [])


@pytest.mark.docker
def test_deployed_keeper_pools_namespaces_for_docker_sessions_and_leaves_no_pause_container(
    releases: Deployed, nomad_agent: NomadAgent
) -> None:
    """The keeper job (``<name>-namespace-keeper``, a system job) fills its client's pool; a docker session placed
    there runs in a pooled namespace; a rolling update of the keepers replaces the free ones (the old keeper deletes
    them on its SIGTERM, within its kill timeout: it exits 0, not killed) and keeps the session's; once the session
    ends its namespace is deleted, and the deployment's end leaves no pause container. (Before, ``caravan deploy``
    started no keeper: the pool stayed empty and every docker session made its namespace at launch.)"""
    stack, settings, config = releases, releases.settings, releases.config
    node = nomad_agent.node_id
    first = until(lambda: f if len(f := free_namespaces(settings, node)) == 2 else None, 90, "a pool of 2")
    assert pause_containers(node) == first
    created = stack.gql(CREATE, {"input": {"name": "pooled", "type": "INTERACTIVE", "driver": "DOCKER"}})
    session_id = created["createSession"]["sessions"][0]["id"]
    until(lambda: stack.gql(STATUS, {"id": session_id})["session"]["status"] == "RUNNING", 120, "RUNNING")
    claimed = pooled_in(stack.gql(JOB_HCL, {"id": session_id})["session"]["jobHcl"] or "")
    assert claimed in first, (claimed, first)
    before = until(lambda: f if len(f := free_namespaces(settings, node)) == 2 else None, 60, "a refill")
    assert claimed not in before

    [old] = stack.allocations("namespace-keeper")
    path = settings.home / "deploy.json"
    next_version(stack)
    path.write_text(json.dumps(msgspec.to_builtins(stack.config)))
    done = deploy_command(settings, path, "--only", "namespace-keeper", "--wait", "120")
    assert done.returncode == 0, done.stdout + done.stderr
    after = until(
        lambda: f if len(f := free_namespaces(settings, node)) == 2 and not f & before else None, 90, "a new pool"
    )
    assert pause_containers(node) == after | {claimed}, "the old keeper's free namespaces were left"
    events = stack.get(f"/v1/allocation/{old['ID']}")["TaskStates"]["namespace-keeper"]["Events"]
    ended = [e for e in events if e["Type"] == "Terminated"]
    assert ended and ended[-1]["ExitCode"] == 0, events  # released within its kill timeout, not killed
    stack.gql(DESTROY, {"id": session_id})
    until(lambda: claimed not in pause_containers(node), 60, "the session's namespace deleted")
    # the keepers stopped (the deployment's end): each deletes its free namespaces
    [keeper] = stack.allocations("namespace-keeper")
    stack.nomad.call("DELETE", f"/v1/job/{job_id(config, 'namespace-keeper')}?namespace={config.namespace}")
    until(lambda: stack.get(f"/v1/allocation/{keeper['ID']}")["ClientStatus"] == "complete", 60, "its stop")
    left = pause_containers(node)
    assert not left, f"pause containers left after the keeper's stop: {left}\n{logs(settings, config)}"


async def stored(settings: Settings, *sessions: Session) -> None:
    redis = redis_client(settings.redis)
    try:
        await SessionStore(redis, Keys(settings.redis.prefix)).create(list(sessions))
    finally:
        await redis.aclose()
