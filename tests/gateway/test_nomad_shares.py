"""Per-request and per-user caps on the gateway's Nomad calls (gateway.nomad_shares), and the call timeout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from core.errors import TransientError
from core.settings import Settings
from gateway.nomad_shares import NomadShares
from nomad_jobs.client import Admission, NomadClient


class Calls:
    """Calls that hold their admission until released, counting how many are in at once."""

    def __init__(self) -> None:
        self.inside = 0
        self.peak = 0
        self.release = asyncio.Event()

    async def call(self, admission: Admission) -> None:
        async with admission():
            self.inside += 1
            self.peak = max(self.peak, self.inside)
            await self.release.wait()
            self.inside -= 1

    async def settle(self) -> None:
        for _ in range(20):  # a few turns of the loop: everyone who can get in has
            await asyncio.sleep(0)


async def test_a_request_runs_at_most_its_share_at_once() -> None:
    shares, calls = NomadShares(per_request=2, per_user=10), Calls()
    request = shares.admission("alice")
    running = [asyncio.create_task(calls.call(request)) for _ in range(6)]
    await calls.settle()
    assert calls.inside == 2
    calls.release.set()
    await asyncio.gather(*running)
    assert calls.peak == 2


async def test_one_users_requests_share_one_cap_and_leave_room_for_another_user() -> None:
    shares, calls = NomadShares(per_request=2, per_user=3), Calls()
    heavy = [asyncio.create_task(calls.call(shares.admission("alice"))) for _ in range(4) for _ in range(2)]
    await calls.settle()
    assert calls.inside == 3  # four requests of alice's, two calls each: three at once in all
    async with asyncio.timeout(5):  # would wait forever if bob had to wait for alice's calls, which never end here
        async with shares.admission("bob")():
            pass
    calls.release.set()
    await asyncio.gather(*heavy)
    assert calls.peak == 3


async def test_a_call_waiting_too_long_fails_as_transient_and_the_client_serves_on(settings: Settings) -> None:
    nomad = NomadClient(settings.nomad, timeout=0.5)
    shut = asyncio.Semaphore(0)

    @contextlib.asynccontextmanager
    async def never() -> AsyncIterator[None]:
        async with shut:
            yield

    try:
        with pytest.raises(TransientError, match=r"did not answer within 0.5 s"):
            await nomad.admitted(never).leader()
        assert await nomad.leader()  # the view's wait held nothing of the client's
    finally:
        await nomad.aclose()
