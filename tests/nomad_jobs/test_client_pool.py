"""The Nomad client's connection pool survives calls cancelled while it is contended (encode/httpcore#1093).

httpcore 1.0.9 (pinned by httpx 0.28.1) leaks a pool slot whenever a call is cancelled after the pool assigned it a
connection it has not opened yet; once every slot leaked, each call waits for the pool timeout and fails, against a
healthy Nomad. This drives that exact pattern against the real Nomad agent (with httpx 0.28.1 it fails: every slot
leaks within a few rounds).
"""

from __future__ import annotations

import asyncio
import random
import time

from core.settings import Settings
from nomad_jobs.client import NomadClient

POOL = 4
"""Connections of the client under test: small, so that a few leaked slots would fill it."""
CALLS = 4 * POOL
"""Calls started at once each round: four per connection, so most of them queue for one."""
ROUNDS = 100
CHURN = 5.0
"""Seconds of rounds at most (a leaking pool makes each round wait for its timeout)."""


async def test_calls_cancelled_under_contention_leave_the_pool_serving(settings: Settings) -> None:
    nomad = NomadClient(settings.nomad, timeout=1.0, max_connections=POOL)
    shuffle = random.Random(1093)
    try:
        deadline = time.monotonic() + CHURN
        for _ in range(ROUNDS):
            calls = [asyncio.create_task(nomad.leader()) for _ in range(CALLS)]
            for _ in range(shuffle.randint(1, 10)):  # a few turns of the loop: connecting, queued, some answered
                await asyncio.sleep(0)
            for call in shuffle.sample(calls, CALLS // 2):
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            if time.monotonic() > deadline:
                break
        answers = await asyncio.gather(*(nomad.leader() for _ in range(CALLS)), return_exceptions=True)
        failed = [a for a in answers if isinstance(a, BaseException)]
        assert not failed, f"{len(failed)} of {CALLS} calls failed after the churn: {failed[0]!r}"
    finally:
        await nomad.aclose()
