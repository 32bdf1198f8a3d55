"""Redis or Nomad unreachable: the gateway says UNAVAILABLE, the scheduler backs off and loses nothing."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlparse

from core.settings import Settings
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
