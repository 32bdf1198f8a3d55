"""Where and when sessions run, end to end on a real Nomad cluster of clients with different capacities.

The cluster (``tests/cluster_fixtures.py``): small 2 cores / 2 GiB, medium 4 / 4 GiB, large 8 / 8 GiB with two
``sim.device``, all in node pool ``default``; edge 2 / 1 GiB in node pool ``edge`` (the device tests' clients are in
pool ``gpu``). Sessions run ``raw_exec`` (as the admin) so that nothing but placement varies. Every expectation below
is worked out by hand from those capacities.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from caravan.stack.nomad_cluster import NomadCluster
from domain.resource_policies import UserResourcePolicy
from stores.known_resources import known_slot_types
from stores.resource_policies import PolicyStore
from tests.cluster_fixtures import OnCluster
from tests.harness import CREATE, Caravan, GraphQLErrors

QUERY = """query($id: ID!) { session(id: $id) {
  id status statusInfo result retries waitReasons queuePosition nomadJobId
  statusHistory { status at reason } kernels { hostname agent }
} }"""


async def create(caravan: Caravan, *, token: str | None = None, **fields: Any) -> str:
    session_input = {"name": "s-" + uuid.uuid4().hex[:8], "type": "INTERACTIVE", "driver": "RAW_EXEC", **fields}
    resources = session_input.pop("resources", {"cpu": "1", "mem": "256m"})
    session_input["resources"] = [{"slot": slot, "amount": amount} for slot, amount in resources.items()]
    data = await caravan.gql(CREATE, {"input": session_input}, **({"token": token} if token else {}))
    [session] = data["createSession"]["sessions"]
    return str(session["id"])


async def read(caravan: Caravan, session_id: str) -> dict[str, Any]:
    session: dict[str, Any] = (await caravan.gql(QUERY, {"id": session_id}))["session"]
    return session


async def eventually(
    caravan: Caravan, session_id: str, ok: Callable[[dict[str, Any]], bool], timeout: float = 30.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        session = await read(caravan, session_id)
        if ok(session):
            return session
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {session}")
        await asyncio.sleep(0.2)


def status(*wanted: str) -> Callable[[dict[str, Any]], bool]:
    return lambda session: session["status"] in wanted


async def ran_on(caravan: Caravan, cluster: NomadCluster, session_id: str) -> dict[str, str]:
    """Kernel hostname -> the client its allocation ran on, as Nomad reports it."""
    job = (await read(caravan, session_id))["nomadJobId"]
    names = cluster.node_names
    return {a["TaskGroup"]: names[a["NodeID"]] for a in await caravan.nomad.job_allocations(job)}


async def known_slots_include(caravan: Caravan, slot: str) -> None:
    """Wait for the scheduler to have recorded the agents' slots (its first pass)."""
    deadline = time.monotonic() + 15
    while slot not in await known_slot_types(caravan.store.redis, caravan.store.keys):
        assert time.monotonic() < deadline, f"{slot} never became a known slot"
        await asyncio.sleep(0.1)


SESSIONS = [
    ("a", {"cpu": "2", "mem": "1g"}),
    ("b", {"cpu": "1", "mem": "512m"}),
    ("c", {"cpu": "3", "mem": "1g"}),
    ("d", {"cpu": "1", "mem": "256m", "sim.device": "1"}),
]
LANDS = {
    # Agents without a device kind a session does not use come first (large has sim.device); then
    # concentrated takes the least cpu left (then mem), dispersed the most.
    "concentrated": {"a": "small", "b": "medium", "c": "medium", "d": "large"},
    # a: medium (4 > 2 cores left); b: medium (2 cores each, 3 GiB > 2 GiB left); c: 3 cores fit only large.
    "dispersed": {"a": "medium", "b": "medium", "c": "large", "d": "large"},
}


@pytest.mark.parametrize("selector", ["concentrated", "dispersed"])
async def test_sessions_land_where_the_selector_says(
    on_cluster: OnCluster, nomad_cluster: NomadCluster, selector: str
) -> None:
    async with on_cluster(f'default {{\n  agent_selector = "{selector}"\n}}') as caravan:
        await known_slots_include(caravan, "sim.device")
        ids = {}
        for name, resources in SESSIONS:  # one by one: each pass must count the placements before it
            ids[name] = await create(caravan, resources=resources)
            await eventually(caravan, ids[name], status("SCHEDULED", "PREPARING", "RUNNING"))
        for name, session_id in ids.items():
            session = await eventually(caravan, session_id, status("RUNNING"))
            assert await ran_on(caravan, nomad_cluster, session_id) == {"main1": LANDS[selector][name]}, name
            assert session["kernels"][0]["agent"] == nomad_cluster.node_ids[LANDS[selector][name]]


async def test_a_multi_node_session_spreads_its_kernels(on_cluster: OnCluster, nomad_cluster: NomadCluster) -> None:
    async with on_cluster('default {\n  agent_selector = "dispersed"\n}') as caravan:
        # each kernel goes where the most cpu (then mem) is left after the ones before it: medium (4 cores),
        # medium again (2 cores and 3.5 GiB beat small's 2 cores and 2 GiB), then small
        session_id = await create(
            caravan, clusterSize=3, clusterMode="MULTI_NODE", resources={"cpu": "2", "mem": "512m"}
        )
        await eventually(caravan, session_id, status("RUNNING"))
        assert await ran_on(caravan, nomad_cluster, session_id) == {
            "main1": "medium",
            "sub1": "medium",
            "sub2": "small",
        }


@pytest.mark.parametrize("retries_to_skip", [0, 1], ids=["strict-fifo", "skip-after-1"])
async def test_a_big_head_session_and_small_ones_behind_it(
    on_cluster: OnCluster, nomad_cluster: NomadCluster, retries_to_skip: int
) -> None:
    async with on_cluster(f"default {{\n  retries_to_skip = {retries_to_skip}\n}}") as caravan:
        # one core of large taken: 8 cores now fit nowhere, though large could hold them once empty
        holder = await create(caravan, designatedAgent=nomad_cluster.node_ids["large"])
        await eventually(caravan, holder, status("RUNNING"))
        big = await create(caravan, resources={"cpu": "8", "mem": "1g"})
        first_try = await eventually(caravan, big, lambda s: s["retries"] >= 1)
        assert first_try["status"] == "PENDING"
        assert first_try["waitReasons"] == [
            "no-agent-fits: no agent has cpu 8, mem 1 GiB free now; the closest "
            f"({nomad_cluster.node_ids['large']}) lacks cpu 1"
        ]
        small = await create(caravan)
        if retries_to_skip:
            await eventually(caravan, small, status("RUNNING"))
            assert await ran_on(caravan, nomad_cluster, small) == {"main1": "medium"}
            assert (await read(caravan, big))["status"] == "PENDING"
        else:
            waiting = await eventually(caravan, small, lambda s: s["queuePosition"] is not None)
            await eventually(caravan, big, lambda s: s["retries"] >= first_try["retries"] + 2)  # two passes more
            waiting = await read(caravan, small)
            assert (waiting["status"], waiting["queuePosition"]) == ("PENDING", 2)
            assert waiting["waitReasons"] == [f"blocked: waiting behind {big}, which is first in line"]
            head = await read(caravan, big)
            assert (head["status"], head["queuePosition"]) == ("PENDING", 1)
            assert head["retries"] > first_try["retries"]  # every pass is one more failed attempt


async def test_a_slot_no_agent_has_is_refused(on_cluster: OnCluster) -> None:
    async with on_cluster() as caravan:
        await known_slots_include(caravan, "sim.device")
        with pytest.raises(GraphQLErrors) as refused:
            await create(caravan, resources={"cpu": "1", "tpu.device": "1"})
        assert refused.value.codes == ["UNSUPPORTED_RESOURCE"]
        assert refused.value.errors[0]["extensions"]["field"] == "resources.tpu.device"
        assert await create(caravan, resources={"cpu": "1", "sim.device": "2"})  # agents report this one


async def test_dependencies_cascade_failure_and_wait_for_success(on_cluster: OnCluster) -> None:
    async with on_cluster() as caravan:
        batch: dict[str, Any] = {"type": "BATCH"}
        ok = await create(caravan, **batch, startupCommand="sleep 1")
        bad = await create(caravan, **batch, startupCommand="exit 1")
        after_ok = await create(caravan, **batch, startupCommand="exit 0", dependencies=[ok])
        after_bad = await create(caravan, **batch, startupCommand="exit 0", dependencies=[bad])
        after_after_bad = await create(caravan, **batch, startupCommand="exit 0", dependencies=[after_bad])
        waiting = await read(caravan, after_ok)
        assert waiting["status"] == "PENDING"
        assert waiting["waitReasons"] in ([], [f"dependencies: waiting for dependencies: {ok}"])  # [] before a pass
        failed = await eventually(caravan, bad, status("TERMINATED"))
        assert failed["result"] == "FAILURE"
        for dependent in (after_bad, after_after_bad):
            cancelled = await eventually(caravan, dependent, status("CANCELLED"))
            assert cancelled["statusInfo"] == "dependency-failed"
        done = await eventually(caravan, after_ok, status("TERMINATED"))
        assert done["result"] == "SUCCESS"
        finished = {c["status"]: c["at"] for c in (await read(caravan, ok))["statusHistory"]}
        scheduled = {c["status"]: c["at"] for c in done["statusHistory"]}["SCHEDULED"]
        assert scheduled >= finished["TERMINATED"]


async def test_a_future_start_waits_then_runs(on_cluster: OnCluster) -> None:
    async with on_cluster() as caravan:
        session_id = await create(caravan, type="BATCH", startupCommand="exit 0", startsAt="3s")
        waiting = await eventually(caravan, session_id, lambda s: s["queuePosition"] is not None)
        assert waiting["status"] == "PENDING" and waiting["queuePosition"] == 1
        [reason] = waiting["waitReasons"]
        assert reason.startswith("start-time: starts at ")
        starts_at = reason.removeprefix("start-time: starts at ")
        done = await eventually(caravan, session_id, status("TERMINATED"))
        assert done["result"] == "SUCCESS"
        scheduled = next(c["at"] for c in done["statusHistory"] if c["status"] == "SCHEDULED")
        assert scheduled.replace("Z", "+00:00") >= starts_at


async def test_resource_groups_are_node_pools(on_cluster: OnCluster, nomad_cluster: NomadCluster) -> None:
    async with on_cluster('resource_group "nowhere" {\n  pending_timeout = "3s"\n}') as caravan:
        edge = await create(caravan, resourceGroup="edge")
        nowhere = await create(caravan, resourceGroup="nowhere")
        await eventually(caravan, edge, status("RUNNING"))
        assert await ran_on(caravan, nomad_cluster, edge) == {"main1": "edge"}
        waiting = await eventually(caravan, nowhere, lambda s: bool(s["waitReasons"]))
        assert waiting["waitReasons"] == ["never-fits: resource group nowhere has no schedulable agent"]
        timed_out = await eventually(caravan, nowhere, status("CANCELLED"))
        assert timed_out["statusInfo"] == "pending-timeout"


async def test_user_policy_limits(on_cluster: OnCluster) -> None:
    async with on_cluster() as caravan:
        await caravan.user("alice")  # raw_exec is SUPERADMIN-only: the superadmin creates alice's sessions for her
        await PolicyStore(caravan.store.redis, caravan.store.keys).put_user(
            "alice", UserResourcePolicy(max_concurrent_sessions=1, max_pending_sessions=1)
        )
        running = await create(caravan, owner="alice")
        await eventually(caravan, running, status("RUNNING"))
        queued = await create(caravan, owner="alice", clientToken="queued")
        held = await eventually(caravan, queued, lambda s: bool(s["waitReasons"]))
        assert held["waitReasons"] == ["concurrency: user alice already runs 1 of 1 sessions"]
        with pytest.raises(GraphQLErrors) as refused:
            await create(caravan, owner="alice")
        assert refused.value.codes == ["QUOTA_EXCEEDED"]
        assert await create(caravan, owner="alice", clientToken="queued") == queued  # a retry adds nothing
