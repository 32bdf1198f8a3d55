"""Inference endpoints on a real HAProxy and Redis (no Nomad: INFERENCE sessions stored as the scheduler would write
them, their replicas loopback HTTP servers of the test's own): fail closed until built, rebuilt after a kill -9,
routes following the routable replicas, the activator reachable only through HAProxy."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest

from caravan.stack.haproxy import ingress_config, start_haproxy
from caravan.stack.processes import Service, free_port
from core.keys import Keys
from core.settings import Settings
from domain.endpoint_routes import ENDPOINT_MAPS, endpoint_host
from domain.model import Session, SessionStatus, SessionType
from gateway.apps.ingress_config import MAPS, IngressPaths
from gateway.apps.runtime_api import RuntimeApi
from gateway.endpoints.control import EndpointControl
from gateway.endpoints.ingress import META_MAP, map_path
from gateway.planes import prefilled
from tests.gateway.test_ingress import Upstream, raw, request, until_status
from tests.harness import ADMIN_TOKEN, Caravan
from tests.ingress import Ingress, caravan_behind_haproxy, running_app


@pytest.fixture
async def behind(redis_settings: Settings) -> AsyncIterator[tuple[Caravan, Ingress]]:
    async with caravan_behind_haproxy(redis_settings, scheduler=False) as pair:
        yield pair


@pytest.fixture
def replicas() -> Iterator[tuple[Upstream, Upstream]]:
    pair = Upstream("main1"), Upstream("main2")
    yield pair
    for upstream in pair:
        upstream.close()


def inference(owner: str, *ports: int) -> Session:
    """A RUNNING INFERENCE session whose replicas passed their checks and serve on 127.0.0.1:``ports``."""
    session = running_app(owner, ports[0])
    kernels = tuple(
        dataclasses.replace(session.kernels[0], index=i, hostname=f"main{i}", ports=(f"8000=127.0.0.1:{p}",),
                            healthy=True)
        for i, p in enumerate(ports, start=1)
    )  # fmt: skip
    return session.evolve(type=SessionType.INFERENCE, service_port=8000, kernels=kernels, apps=())


async def serving(caravan: Caravan, ingress: Ingress, replicas: tuple[Upstream, Upstream]) -> tuple[str, Session, str]:
    """alice's token, her endpoint on ``replicas``, and its host, once it serves her through HAProxy."""
    alice = await caravan.user("alice")
    session = inference("alice", replicas[0].port, replicas[1].port)
    await caravan.store.create([session])
    host = endpoint_host(session.id, caravan.settings.gateway.apps_domain)
    await until_status(ingress, host, alice, 200)
    return alice, session, host


def app_of(answer: bytes) -> str:
    return str(json.loads(answer.split(b"\r\n\r\n", 1)[1])["app"])


async def test_endpoint_routes_follow_the_routable_replicas_and_fail_closed(
    behind: tuple[Caravan, Ingress], replicas: tuple[Upstream, Upstream]
) -> None:
    caravan, ingress = behind
    alice, session, host = await serving(caravan, ingress, replicas)
    seen = {app_of(await asyncio.to_thread(raw, ingress.port, request(host, alice, extra="Connection: close\r\n")))
            for _ in range(8)}  # fmt: skip
    assert seen == {"main1", "main2"}
    assert all("authorization" not in line.lower() for line in replicas[0].lines)

    # main2's check fails: it leaves the backend; only main1 answers
    def main2_unhealthy(before: Session) -> Session:
        return before.evolve(kernels=(before.kernels[0], dataclasses.replace(before.kernels[1], healthy=False)))

    await caravan.store.update(session.id, main2_unhealthy)
    deadline = asyncio.get_running_loop().time() + 5
    while {app_of(await asyncio.to_thread(raw, ingress.port, request(host, alice, extra="Connection: close\r\n")))
           for _ in range(6)} != {"main1"}:  # fmt: skip
        assert asyncio.get_running_loop().time() < deadline
    replicas[1].lines.clear()
    for _ in range(8):
        answer = await asyncio.to_thread(raw, ingress.port, request(host, alice, extra="Connection: close\r\n"))
        assert app_of(answer) == "main1"
    assert not replicas[1].lines

    # a second HAProxy on the same configuration, nobody keeping its maps: nobody passes
    lonely_dir = ingress.paths.state_dir / "lonely"
    lonely_port = free_port()
    lonely = start_haproxy(ingress_config(ingress.settings, lonely_port, ingress.gateway_port), lonely_dir,
                           log=lonely_dir.parent / "lonely.log")  # fmt: skip
    try:
        for token in (alice, ADMIN_TOKEN, None):
            answer = await asyncio.to_thread(raw, lonely_port, request(host, token, extra="Connection: close\r\n"))
            assert answer.startswith(b"HTTP/1.1 503 ") and b'"UNAVAILABLE"' in answer
    finally:
        lonely.stop()

    # killed with -9 and started again: rebuilt by the control plane
    ingress.service.process.kill()
    ingress.service.process.wait(10)
    ingress.start()
    await until_status(ingress, host, alice, 200)

    # the gateway itself, asked on an endpoint host without HAProxy's mark: no such endpoint
    direct = await asyncio.to_thread(
        raw, ingress.gateway_port, request(host, alice, extra="Connection: close\r\nX-Caravan-Activator: guess\r\n")
    )
    assert direct.startswith(b"HTTP/1.1 404 ")

    # ended: gone
    await caravan.store.update(session.id, lambda s: s.evolve(status=SessionStatus.TERMINATED))
    await until_status(ingress, host, alice, 404)


async def test_a_restarted_haproxy_never_answers_a_valid_token_401_while_half_rebuilt(
    behind: tuple[Caravan, Ingress], replicas: tuple[Upstream, Upstream]
) -> None:
    # The endpoint and the apps' control planes rebuild a restarted HAProxy each on its own, and an endpoint's
    # admission reads the apps' tokens map too. A HAProxy whose endpoint maps and mark are back but not yet its apps'
    # maps (bench/chaos caught 14 such answers) answered a valid API token 401; now 503 UNAVAILABLE, retried.
    caravan, ingress = behind
    alice, _, host = await serving(caravan, ingress, replicas)
    half_dir = ingress.paths.state_dir / "half"
    half_port = free_port()
    half = start_haproxy(ingress_config(ingress.settings, half_port, ingress.gateway_port), half_dir,
                         log=half_dir.parent / "half.log")  # fmt: skip
    try:
        half_api, half_paths = RuntimeApi(IngressPaths(half_dir).socket), IngressPaths(half_dir)
        for name in (*ENDPOINT_MAPS, META_MAP):  # what the endpoint control plane's rebuild writes, its mark last
            held = await ingress.api.show_map(map_path(ingress.paths.state_dir, name))
            assert held or name == "endpoint_tokens", name  # alice has no endpoint token: her API token
            await half_api.replace_map(map_path(half_dir, name), held)
        answer = await asyncio.to_thread(raw, half_port, request(host, alice, extra="Connection: close\r\n"))
        assert answer.startswith(b"HTTP/1.1 503 ") and b'"UNAVAILABLE"' in answer, answer[:300]
        for name in MAPS:  # then the apps' rebuild, its mark last: alice's token passes (her replicas serve her)
            await half_api.replace_map(half_paths.map(name), await ingress.api.show_map(ingress.paths.map(name)))
        answer = await asyncio.to_thread(raw, half_port, request(host, alice, extra="Connection: close\r\n"))
        assert not answer.startswith((b"HTTP/1.1 401 ", b"HTTP/1.1 404 ")), answer[:300]
        assert b"being rebuilt" not in answer, answer[:300]
    finally:
        half.stop()
    # and the real thing: killed with -9, started again, asked at once and until it serves: never a 401
    ingress.service.process.kill()
    ingress.service.process.wait(10)
    ingress.start()
    statuses = []
    while not statuses or statuses[-1] != b"200":
        answer = await asyncio.to_thread(raw, ingress.port, request(host, alice, extra="Connection: close\r\n"))
        statuses.append(answer.split(b" ", 2)[1])
        assert len(statuses) < 2000, statuses[-5:]
    assert set(statuses) <= {b"503", b"200"}, statuses


class Recorded(RuntimeApi):
    """The real runtime API, every command it sends kept in order (a spy: HAProxy answers them all)."""

    def __init__(self, socket: Path) -> None:
        super().__init__(socket)
        self.sent: list[str] = []

    async def run(self, commands: Sequence[str]) -> list[str]:
        self.sent += commands
        return await super().run(commands)


async def test_a_prefilled_haproxy_routes_endpoints_at_once_and_is_refilled_behind_a_closed_mark(
    behind: tuple[Caravan, Ingress], replicas: tuple[Upstream, Upstream]
) -> None:
    """A new HAProxy (an ingress upgrade's) starts with the endpoints' maps and replicas as Redis has them
    (``gateway.planes.prefilled``): an endpoint serves from its first request, no plane needed (before: 503 until
    the endpoint plane rebuilt it). The plane's rebuild of it keeps the mark when it routes as Redis says; when Redis
    moved on since (an endpoint ended, another took its backend), the mark goes first: the refill is never seen
    half done, no request reaches another endpoint's replicas."""
    caravan, ingress = behind
    alice = await caravan.user("alice")
    first = inference("alice", replicas[0].port)
    await caravan.store.create([first])
    domain = caravan.settings.gateway.apps_domain
    first_host = endpoint_host(first.id, domain)
    await until_status(ingress, first_host, alice, 200)

    async def fresh(name: str) -> tuple[int, Path, Service]:
        state_dir, port = ingress.paths.state_dir / name, free_port()
        prefill = await prefilled(ingress.settings, caravan.store.redis, caravan.store, caravan.users)
        config = ingress_config(ingress.settings, port, ingress.gateway_port)
        config = dataclasses.replace(config, endpoint_servers=prefill.endpoint_servers)
        service = start_haproxy(config, state_dir, log=state_dir.parent / f"{name}.log", maps=prefill.maps)
        return port, state_dir, service

    def rebuilt_by(state_dir: Path) -> tuple[EndpointControl, Recorded]:
        paths = IngressPaths(state_dir)
        plane = EndpointControl(caravan.store.redis, Keys(ingress.settings.redis.prefix), caravan.store, paths, domain,
                                ingress.settings.endpoints.backends)  # fmt: skip
        plane.api = Recorded(paths.socket)
        return plane, plane.api

    def meta_commits(sent: list[str]) -> list[int]:
        return [i for i, c in enumerate(sent) if c.startswith("commit map") and c.endswith(f"{META_MAP}.map")]

    port, state_dir, service = await fresh("prefilled")
    try:
        answer = await asyncio.to_thread(raw, port, request(first_host, alice, extra="Connection: close\r\n"))
        assert answer.startswith(b"HTTP/1.1 200 ") and app_of(answer) == "main1", answer[:300]
        plane, api = rebuilt_by(state_dir)
        await plane.rebuild()  # Redis as prefilled: the mark stays until the new one replaces it
        servers = [i for i, c in enumerate(api.sent) if c.startswith("set server")]
        assert servers and meta_commits(api.sent) and min(meta_commits(api.sent)) > max(servers), api.sent
    finally:
        service.stop()

    port, state_dir, service = await fresh("moved")
    try:
        # Redis moves on before the plane rebuilds it: alice's first endpoint ends, a second one (on main2) is
        # assigned its backend by the rebuild
        await caravan.store.update(first.id, lambda s: s.evolve(status=SessionStatus.TERMINATED))
        second = inference("alice", replicas[1].port)
        await caravan.store.create([second])
        plane, api = rebuilt_by(state_dir)
        await plane.rebuild()
        servers = [i for i, c in enumerate(api.sent) if c.startswith("set server")]
        assert len(meta_commits(api.sent)) == 2 and meta_commits(api.sent)[0] < min(servers), api.sent
        second_host = endpoint_host(second.id, domain)
        answer = await asyncio.to_thread(raw, port, request(second_host, alice, extra="Connection: close\r\n"))
        assert app_of(answer) == "main2", answer[:300]
        answer = await asyncio.to_thread(raw, port, request(first_host, alice, extra="Connection: close\r\n"))
        assert answer.startswith(b"HTTP/1.1 404 "), answer[:300]
    finally:
        service.stop()
