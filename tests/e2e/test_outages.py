"""Redis or Nomad unreachable: the gateway says UNAVAILABLE, the scheduler backs off and loses nothing."""

from __future__ import annotations

import uuid
from dataclasses import replace
from urllib.parse import urlparse

from core.secrets import ensure_app_cookie_key
from core.settings import Settings
from domain.apps import app_host
from domain.endpoint_routes import endpoint_host
from gateway.apps.ingress_config import LAUNCH_PATH
from gateway.endpoints.ingress import ACTIVATOR_HEADER, activator_secret
from tests.faults import NetworkCut
from tests.harness import CREATE, GraphQLErrors, running_caravan

BATCH = {"type": "BATCH", "driver": "EXEC", "startupCommand": "exit 0"}


async def test_gateway_answers_unavailable_without_redis(settings: Settings) -> None:
    async with NetworkCut(urlparse(settings.redis.url).port or 6379) as cut:
        behind_cut = replace(settings, redis=replace(settings.redis, url=f"redis://127.0.0.1:{cut.port}/0"))
        async with running_caravan(behind_cut, scheduler=False) as caravan:
            assert (await caravan.gql("{ viewer { id } }"))["viewer"]["id"] == "admin"
            cut.set_cut(True)
            for query in ("{ viewer { id } }", "{ sessions { edges { node { id } } } }"):
                try:
                    await caravan.gql(query)
                except GraphQLErrors as raised:
                    assert raised.codes == ["UNAVAILABLE"], raised.errors
                    assert "Traceback" not in raised.errors[0]["message"]
                else:
                    raise AssertionError("expected UNAVAILABLE")
            ready = await caravan.http.get(caravan.url.replace("/graphql", "/readyz"))
            assert ready.status_code == 503 and ready.json()["redis"] != "ok"
            # what reads Redis before the routes (an app's launch exchange, the endpoint activator) answers as they
            # do: 503 UNAVAILABLE, retry (before: Starlette's 500 and a traceback in the log)
            root = caravan.url.replace("/graphql", "/")
            domain = settings.gateway.apps_domain
            activator = {ACTIVATOR_HEADER: activator_secret(ensure_app_cookie_key(settings.secrets))}
            for host, path, headers in (
                (app_host("web", str(uuid.uuid4()), domain), LAUNCH_PATH.lstrip("/") + "?code=x", {}),
                (endpoint_host(str(uuid.uuid4()), domain), "", activator),
            ):
                answer = await caravan.http.get(root + path, headers={"Host": host, **headers})
                assert answer.status_code == 503, (host, answer.status_code, answer.text)
                assert answer.json()["error"]["code"] == "UNAVAILABLE" and answer.headers["retry-after"] == "1"
            cut.set_cut(False)
            assert (await caravan.gql("{ viewer { id } }"))["viewer"]["id"] == "admin"


async def test_scheduler_rides_out_nomad_and_redis_outages(settings: Settings) -> None:
    nomad_port = urlparse(settings.nomad.addr).port or 4646
    redis_port = urlparse(settings.redis.url).port or 6379
    # The gateway talks to Redis directly; the scheduler reaches both services through the cuts.
    async with (
        NetworkCut(nomad_port) as nomad_cut,
        NetworkCut(redis_port) as redis_cut,
        running_caravan(settings, scheduler=False) as caravan,
    ):
        scheduler_settings = replace(
            settings,
            nomad=replace(settings.nomad, addr=f"http://127.0.0.1:{nomad_cut.port}"),
            redis=replace(settings.redis, url=f"redis://127.0.0.1:{redis_cut.port}/0"),
        )
        async with running_caravan(scheduler_settings, serve=False):
            nomad_cut.set_cut(True)
            first = [await create(caravan, f"during-nomad-{i}") for i in range(3)]
            await nomad_cut.refused_at_least(3)  # the scheduler tried to reach Nomad, and failed, three times
            for session_id in first:
                session = await caravan.store.get(session_id)
                assert session and session.status.value in ("PENDING", "SCHEDULED")
            nomad_cut.set_cut(False)
            redis_cut.set_cut(True)
            second = [await create(caravan, f"during-redis-{i}") for i in range(3)]
            await redis_cut.refused_at_least(3)  # and Redis, three times
            redis_cut.set_cut(False)
            for session_id in first + second:
                session = await caravan.wait_for(session_id, "TERMINATED", "ERROR", timeout=120)
                assert session["result"] == "SUCCESS", (session["status"], session["statusInfo"], session)
            jobs = await caravan.nomad.jobs(settings.nomad.job_prefix + "-")
            assert len(jobs) == len(first + second)


async def create(caravan: object, name: str) -> str:
    data = await caravan.gql(CREATE, {"input": {**BATCH, "name": name}})  # type: ignore[attr-defined]
    return str(data["createSession"]["sessions"][0]["id"])
