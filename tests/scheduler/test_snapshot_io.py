"""A pass at its I/O edge, on real Redis and real Nomad, with no submitter running (placements stay SCHEDULED).

What the end-to-end tests cannot see: which writes a pass makes (none when nothing changed), the fence, the state
a new leader resumes from, and that the snapshot reads what Nomad and Redis hold.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from caravan.stack.nomad_agent import NomadAgent
from caravan.stack.nomad_cluster import NomadCluster
from core.clock import utcnow
from core.keys import Keys
from core.lease import Fence, LostLease
from core.settings import Settings
from domain.model import Driver, Kernel, Session, SessionStatus, SessionType
from domain.resource_policies import UserResourcePolicy
from domain.scheduling_config import SchedulingConfig, parse_scheduling_config
from domain.slots import SlotType
from nomad_jobs.client import NomadClient
from scheduler.placer import Placer
from stores.known_resources import known_resource_groups, known_slot_types
from stores.resource_policies import PolicyStore
from stores.sessions import SessionStore
from tests.cluster_fixtures import on_the_cluster, scheduler_config

S = SessionStatus


def new_session(*, cpu: str = "0.1", group: str = "default", owner: str = "u", **fields: Any) -> Session:
    resources = {"cpu": cpu, "mem": str(64 * 1024 * 1024)}
    kernel = Kernel(role="main", index=1, hostname="main1", image="", resources=resources)
    return Session(
        id=str(uuid.uuid4()),
        name="s-" + uuid.uuid4().hex[:8],
        owner_id=owner,
        type=SessionType.BATCH,
        driver=Driver.RAW_EXEC,
        image="",
        resources=resources,
        kernels=(kernel,),
        created_at=utcnow(),
        resource_group=group,
        startup_command="exit 0",
        **fields,
    )


@pytest.fixture
async def nomad(settings: Settings) -> AsyncIterator[NomadClient]:
    client = NomadClient(settings.for_role("scheduler").nomad)  # the placer reads Nomad with the scheduler's token
    yield client
    await client.aclose()


@pytest.fixture
async def fence(redis: Redis, keys: Keys) -> Fence:
    return Fence(keys.scheduler_fence, int(await redis.incr(keys.scheduler_fence)))


def placer(
    redis: Redis,
    keys: Keys,
    nomad: NomadClient,
    settings: Settings,
    fence: Fence | None,
    config: SchedulingConfig | None = None,
) -> Placer:
    return Placer(SessionStore(redis, keys), nomad, fence, settings, config or SchedulingConfig())


async def test_a_pass_places_explains_and_cancels(
    redis: Redis, keys: Keys, nomad: NomadClient, settings: Settings, nomad_agent: NomadAgent, fence: Fence
) -> None:
    store = SessionStore(redis, keys)
    assert await known_slot_types(redis, keys) == {"cpu": SlotType.COUNT, "mem": SlotType.BYTES}  # before any pass
    fits, too_big, orphan = new_session(), new_session(cpu="1000"), new_session(dependencies=("gone",))
    for session in (fits, too_big, orphan):
        await store.create([session])
    summary = await placer(redis, keys, nomad, settings, fence).run_pass()
    assert (summary.placed, summary.cancelled, summary.waiting) == (1, 1, 1)
    placed = await store.get(fits.id)
    assert placed is not None and placed.status is S.SCHEDULED
    assert placed.kernels[0].agent == nomad_agent.node_id
    assert placed.job_hcl and re.search(f'value += "{nomad_agent.node_id}"', placed.job_hcl)  # pinned
    assert re.search(r'node_pool += "default"', placed.job_hcl)
    waiting = await store.get(too_big.id)
    assert waiting is not None and (waiting.status, waiting.queue_position, waiting.retries) == (S.PENDING, 1, 0)
    assert waiting.wait_reasons[0].startswith("never-fits: cpu 1000, mem 64 MiB is bigger than any schedulable agent")
    cancelled = await store.get(orphan.id)
    assert cancelled is not None and (cancelled.status, cancelled.status_info) == (S.CANCELLED, "dependency-failed")
    assert (await known_slot_types(redis, keys)).keys() >= {"cpu", "mem"}


async def test_a_pass_records_the_node_pools_seen_and_the_configured_groups(
    redis: Redis, keys: Keys, nomad: NomadClient, settings: Settings, fence: Fence
) -> None:
    assert await redis.smembers(keys.known_resource_groups) == set()  # before any pass (the gateway adds default)
    config = parse_scheduling_config('resource_group "gpu" {\n  agent_selector = "concentrated"\n}\n')
    await placer(redis, keys, nomad, settings, fence, config).run_pass()  # nothing pending: the first pass still reads
    assert await redis.smembers(keys.known_resource_groups) == {"default", "gpu"}  # the dev agent's pool, the config's
    assert await known_resource_groups(redis, keys, configured=["cpu-only"]) == {"default", "gpu", "cpu-only"}


async def test_nothing_is_written_when_nothing_changed(
    redis: Redis, keys: Keys, nomad: NomadClient, settings: Settings, fence: Fence, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SessionStore(redis, keys)
    await store.create([new_session(cpu="1000"), new_session(cpu="1000")])
    pass_ = placer(redis, keys, nomad, settings, fence)
    await pass_.run_pass()
    writes: list[str] = []
    original = SessionStore.update

    async def counted(self: SessionStore, session_id: str, *args: Any, **kwargs: Any) -> Session | None:
        writes.append(session_id)
        return await original(self, session_id, *args, **kwargs)

    monkeypatch.setattr(SessionStore, "update", counted)
    await pass_.run_pass()
    assert writes == []


async def test_a_deposed_leader_writes_nothing(
    redis: Redis, keys: Keys, nomad: NomadClient, settings: Settings, fence: Fence
) -> None:
    store = SessionStore(redis, keys)
    session = new_session()
    await store.create([session])
    await redis.incr(keys.scheduler_fence)  # a new leader took over
    with pytest.raises(LostLease):
        await placer(redis, keys, nomad, settings, fence).run_pass()
    after = await store.get(session.id)
    assert after is not None and after.status is S.PENDING and after.kernels[0].agent is None


async def test_pending_timeout_and_policies_from_redis(
    redis: Redis, keys: Keys, nomad: NomadClient, settings: Settings, fence: Fence
) -> None:
    store = SessionStore(redis, keys)
    old = new_session(cpu="1000", group="slow")
    old = dataclasses.replace(old, created_at=old.created_at - timedelta(minutes=2))
    capped = new_session(owner="carol")
    await store.create([old])
    await store.create([capped])
    await PolicyStore(redis, keys).put_user("carol", UserResourcePolicy(total_resource_slots={"cpu": "0.05"}))
    config = parse_scheduling_config('resource_group "slow" {\n  pending_timeout = "1m"\n}', "s.hcl")
    await placer(redis, keys, nomad, settings, fence, config).run_pass()
    timed_out = await store.get(old.id)
    assert timed_out is not None and (timed_out.status, timed_out.status_info) == (S.CANCELLED, "pending-timeout")
    held = await store.get(capped.id)
    assert held is not None and held.status is S.PENDING
    assert held.wait_reasons == ("user-quota: user carol quota exceeded: cpu: 0 held + 0.1 requested > limit 0.05",)


async def test_round_robin_resumes_where_the_last_leader_stopped(
    redis: Redis, keys: Keys, settings: Settings, nomad_cluster: NomadCluster, fence: Fence
) -> None:
    clustered = on_the_cluster(settings, nomad_cluster).for_role("scheduler")
    config = parse_scheduling_config(scheduler_config('default {\n  agent_selector = "roundrobin"\n}'), "s.hcl")
    store = SessionStore(redis, keys)
    in_id_order = sorted(nomad_cluster.node_ids[name] for name in ("small", "medium", "large"))
    landed = []
    nomad = NomadClient(clustered.nomad)
    try:
        for _ in range(4):  # a new Placer each time: only Redis carries the rotation
            session = new_session()
            await store.create([session])
            await placer(redis, keys, nomad, clustered, fence, config).run_pass()
            placed = await store.get(session.id)
            assert placed is not None and placed.status is S.SCHEDULED
            landed.append(placed.kernels[0].agent)
    finally:
        await nomad.aclose()
    assert landed == [*in_id_order, in_id_order[0]]
    assert await redis.hget(keys.scheduler_roundrobin, "default") == "1"
