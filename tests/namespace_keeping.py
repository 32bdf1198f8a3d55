"""A namespace keeper (``nomad_jobs.namespace_keeper``) beside a test's Caravan, on the test stack's one client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from caravan.stack.nomad_agent import NomadAgent
from core.redis import client as redis_client
from node_plugins.namespace_pool import Client
from nomad_jobs.namespace_keeper import NamespaceKeeper
from tests.conftest import STACK
from tests.harness import Caravan


@contextlib.asynccontextmanager
async def keeping(caravan: Caravan, agent: NomadAgent, size: int) -> AsyncIterator[NamespaceKeeper]:
    """A keeper of ``size`` pooled namespaces for ``caravan``'s namespace, its pool full before it is yielded;
    afterwards every namespace it made is deleted."""
    assert agent.network is not None, "the test stack's client has no session network"
    redis = redis_client(caravan.settings.redis)
    keeper = NamespaceKeeper(
        Client(agent.network.conflist(), agent.network.cni_path),
        caravan.nomad,
        redis,
        caravan.store.keys,
        agent.node_id,
        size,
        STACK["CARAVAN_PAUSE_IMAGE"],
    )
    task = asyncio.create_task(keeper.run_forever())
    try:
        while await redis.scard(keeper.key) < size:
            assert not task.done(), task
            await asyncio.sleep(0.1)
        yield keeper
    finally:
        try:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for job in await caravan.nomad.jobs(caravan.settings.nomad.job_prefix + "-"):
                await caravan.nomad.deregister(job["ID"], purge=True)
            await keeper.delete_all()
        finally:
            await redis.aclose()  # whatever the clean-up met: no connection left for a later test's collection
