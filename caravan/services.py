"""Running Caravan's services: each alone, or all in one process for one machine."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from common.redis import connect
from common.settings import Settings
from gateway.app import create_app
from idle.reload import PolicySource, reload_on_sighup
from idle.service import IdleService
from nomad_jobs.client import NomadClient
from scheduler.service import Scheduler

log = logging.getLogger(__name__)


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def run_gateway(settings: Settings) -> None:
    config = uvicorn.Config(
        create_app(settings), host=settings.gateway.host, port=settings.gateway.port,
        log_level="warning", access_log=False, lifespan="on",
    )
    await uvicorn.Server(config).serve()


async def run_scheduler(settings: Settings) -> None:
    redis = await connect(settings.redis, give_up_after=float("inf"))
    nomad = NomadClient(settings.nomad)
    try:
        await Scheduler(settings, redis, nomad).run_forever()
    finally:
        await nomad.aclose()
        await redis.aclose()


async def run_idle(settings: Settings, policy: PolicySource | None = None) -> None:
    policy = policy or PolicySource(settings.idle.policy_path)  # a broken file stops us here
    redis = await connect(settings.redis, give_up_after=float("inf"))
    nomad = NomadClient(settings.nomad)
    try:
        service = IdleService(settings, redis, nomad, policy=policy)
        with reload_on_sighup(service.request_reload):
            await service.run_forever()
    finally:
        await nomad.aclose()
        await redis.aclose()


async def run_all(settings: Settings) -> None:
    idle_policy = PolicySource(settings.idle.policy_path)  # a broken file stops us before anything runs
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(run_gateway(settings))
        tasks.create_task(run_scheduler(settings))
        tasks.create_task(run_idle(settings, idle_policy))
