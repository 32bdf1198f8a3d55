"""kill -9 the scheduler at random moments while 200 sessions are submitted: nothing is lost or doubled."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time

from core.settings import Settings
from domain.model import SessionResult, SessionStatus
from tests.harness import CREATE, KILLED_SCHEDULERS, running_caravan

SESSIONS = 200


def scheduler_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "CARAVAN_REDIS_URL": settings.redis.url,
        "CARAVAN_REDIS_PREFIX": settings.redis.prefix,
        "CARAVAN_NOMAD_ADDR": settings.nomad.addr,
        "CARAVAN_NOMAD_JOB_PREFIX": settings.nomad.job_prefix,
        "CARAVAN_HOME": str(settings.home),
        "CARAVAN_SECRETS_DIR": str(settings.secrets),  # it connects as the scheduler role
        "CARAVAN_RECONCILE_INTERVAL": "2",
        **KILLED_SCHEDULERS,
    }


async def start_scheduler(settings: Settings, log: object) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "caravan.cli", "scheduler", env=scheduler_env(settings), stdout=log, stderr=log
    )


async def test_scheduler_killed_at_random_loses_and_doubles_nothing(settings: Settings) -> None:
    rng = random.Random(7)
    async with contextlib.AsyncExitStack() as stack:  # the log closed after the schedulers' last exit
        log = stack.enter_context((settings.home / "scheduler.log").open("ab"))
        caravan = await stack.enter_async_context(running_caravan(settings, scheduler=False))
        process = await start_scheduler(settings, log)
        kills = 0

        async def submit_all() -> list[str]:
            ids = []
            for i in range(SESSIONS):
                data = await caravan.gql(
                    CREATE,
                    {
                        "input": {
                            "name": f"crash-{i:03d}",
                            "type": "BATCH",
                            "driver": "RAW_EXEC",
                            "startupCommand": f"exit {i % 3}",
                        }
                    },
                )
                ids.append(data["createSession"]["sessions"][0]["id"])
                await asyncio.sleep(rng.uniform(0, 0.02))
            return ids

        submitting = asyncio.create_task(submit_all())
        while not submitting.done() or kills < 8:
            await asyncio.sleep(rng.uniform(0.2, 1.5))
            process.send_signal(signal.SIGKILL)
            await process.wait()
            kills += 1
            process = await start_scheduler(settings, log)
        ids = await submitting
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                sessions = await caravan.store.get_many(ids)
                if all(s is not None and s.status.is_terminal for s in sessions):
                    break
                await asyncio.sleep(1)
        finally:
            process.send_signal(signal.SIGTERM)
            await process.wait()

        sessions = await caravan.store.get_many(ids)
        assert len(sessions) == SESSIONS and all(s is not None for s in sessions)
        jobs = {j["ID"]: j for j in await caravan.nomad.jobs(settings.nomad.job_prefix + "-")}
        assert len(jobs) == SESSIONS
        for i, session in enumerate(sessions):
            assert session is not None
            assert session.status is SessionStatus.TERMINATED, (session.id, session.status, session.status_info)
            expected = SessionResult.SUCCESS if i % 3 == 0 else SessionResult.FAILURE
            assert (session.result, session.exit_code) == (expected, i % 3), session.id
            assert session.nomad_job_id in jobs
            job = await caravan.nomad.job(session.nomad_job_id)
            assert job["Version"] == 0  # registered once, never re-registered
            allocs = await caravan.nomad.job_allocations(session.nomad_job_id)
            assert len(allocs) == 1, (session.id, len(allocs))
        print(f"{SESSIONS} sessions survived {kills} scheduler kills")
