"""Inference endpoints on a real HAProxy and Redis (no Nomad: INFERENCE sessions stored as the scheduler would write
them, their replicas loopback HTTP servers of the test's own): fail closed until built, rebuilt after a kill -9,
routes following the routable replicas, the activator reachable only through HAProxy."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator

import pytest

from caravan.stack.haproxy import ingress_config, start_haproxy
from caravan.stack.processes import free_port
from core.settings import Settings
from domain.endpoint_routes import endpoint_host
from domain.model import Session, SessionStatus, SessionType
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


def app_of(answer: bytes) -> str:
    return str(json.loads(answer.split(b"\r\n\r\n", 1)[1])["app"])


async def test_endpoint_routes_follow_the_routable_replicas_and_fail_closed(
    behind: tuple[Caravan, Ingress], replicas: tuple[Upstream, Upstream]
) -> None:
    caravan, ingress = behind
    alice = await caravan.user("alice")
    session = inference("alice", replicas[0].port, replicas[1].port)
    await caravan.store.create([session])
    host = endpoint_host(session.id, caravan.settings.gateway.apps_domain)
    await until_status(ingress, host, alice, 200)
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
