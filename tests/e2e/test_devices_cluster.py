"""Simulated accelerators on the multi-client cluster (``tests/cluster_fixtures.py``): clients with different devices,
placement by model, fractional shares, a device turned unhealthy mid-run.

Node pool ``gpu`` holds gpu-b (one ``SimGPU-B`` as four shares: ``sim.shares`` 1) and gpu-c (two whole ``SimGPU-C``);
large in pool ``default`` has two whole ``SimGPU-A``. The scheduler configuration names SimGPU-C a slot of its own
(``simc.device``): a session asks for that model by its slot, and the job's device block names the model.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from caravan.stack.nomad_cluster import NomadCluster
from node_plugins.devices.sim.state import StateDir
from stores.known_resources import known_slot_types
from tests.cluster_fixtures import OnCluster
from tests.harness import CREATE, Caravan

CONFIG = 'device_slots = { "caravan-sim/gpu/SimGPU-C" = "simc.device" }'
QUERY = """query($id: ID!) { session(id: $id) { id status waitReasons jobHcl nomadJobId
  kernels { statusInfo statusDetail } } }"""
DESTROY = "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id } }"
GROUPS = """{ resourceGroups { name free { slot amount } agents { name capacity { slot amount }
  occupied { slot amount } } } }"""


async def create(caravan: Caravan, group: str, **resources: str) -> str:
    session_input = {
        "name": "d-" + uuid.uuid4().hex[:8],
        "type": "INTERACTIVE",
        "driver": "RAW_EXEC",
        "resourceGroup": group,
        "resources": [{"slot": slot, "amount": amount} for slot, amount in {"cpu": "0.5", **resources}.items()],
    }
    data = await caravan.gql(CREATE, {"input": session_input})
    return str(data["createSession"]["sessions"][0]["id"])


async def eventually(
    caravan: Caravan, session_id: str, ok: Callable[[dict[str, Any]], bool], timeout: float = 30.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not ok(session := (await caravan.gql(QUERY, {"id": session_id}))["session"]):
        assert time.monotonic() < deadline, f"not reached within {timeout}s: {session}"
        await asyncio.sleep(0.2)
    return dict(session)


async def destroy(caravan: Caravan, *ids: str) -> None:
    """Destroy the sessions and wait until they have ended: the scheduler is not stopped mid-stop."""
    await caravan.gql(DESTROY, {"ids": list(ids)})
    for session_id in ids:
        await eventually(caravan, session_id, lambda s: s["status"] in ("TERMINATED", "CANCELLED", "ERROR"))


def running(session: dict[str, Any]) -> bool:
    return session["status"] == "RUNNING"


def waiting_for(slot: str) -> Callable[[dict[str, Any]], bool]:
    return lambda s: s["status"] == "PENDING" and any(slot in reason for reason in s["waitReasons"])


async def granted(caravan: Caravan, cluster: NomadCluster, session_id: str) -> tuple[str, dict[str, Any]]:
    """(client name, the device Nomad granted the session's one kernel)."""
    job = (await caravan.gql(QUERY, {"id": session_id}))["session"]["nomadJobId"]
    [alloc] = [a for a in await caravan.nomad.job_allocations(job) if a["ClientStatus"] == "running"]
    [device] = (await caravan.nomad.allocation(alloc["ID"]))["AllocatedResources"]["Tasks"]["kernel"]["Devices"]
    return cluster.node_names[alloc["NodeID"]], device


async def slots_known(caravan: Caravan, *slots: str) -> None:
    deadline = time.monotonic() + 15
    while not set(slots) <= set(await known_slot_types(caravan.store.redis, caravan.store.keys)):
        assert time.monotonic() < deadline, f"{slots} never became known slots"
        await asyncio.sleep(0.1)


async def agent_slots(caravan: Caravan, agent: str) -> dict[str, dict[str, Decimal]]:
    groups = (await caravan.gql(GROUPS))["resourceGroups"]
    [found] = [a for g in groups for a in g["agents"] or [] if a["name"] == agent]
    return {kind: {r["slot"]: Decimal(r["amount"]) for r in found[kind]} for kind in ("capacity", "occupied")}


async def test_each_client_offers_its_devices_and_a_model_lands_where_it_is(
    on_cluster: OnCluster, nomad_cluster: NomadCluster
) -> None:
    async with on_cluster(CONFIG) as caravan:
        await slots_known(caravan, "sim.device", "simc.device", "sim.shares")
        model_c = await create(caravan, "gpu", **{"simc.device": "1"})
        model_a = await create(caravan, "default", **{"sim.device": "1"})
        session = await eventually(caravan, model_c, running)
        assert 'device "caravan-sim/gpu/SimGPU-C"' in session["jobHcl"]
        client, device = await granted(caravan, nomad_cluster, model_c)
        assert (client, device["Name"]) == ("gpu-c", "SimGPU-C")
        session = await eventually(caravan, model_a, running)
        assert 'device "caravan-sim/gpu/SimGPU-A"' in session["jobHcl"]
        assert (await granted(caravan, nomad_cluster, model_a))[0] == "large"
        gpu_c = await agent_slots(caravan, "gpu-c")
        assert gpu_c["capacity"]["simc.device"] == 2 and gpu_c["occupied"]["simc.device"] == 1
        assert (await agent_slots(caravan, "gpu-b"))["capacity"]["sim.shares"] == 1
        await destroy(caravan, model_a, model_c)


async def test_two_halves_share_one_device_and_a_third_waits(
    on_cluster: OnCluster, nomad_cluster: NomadCluster
) -> None:
    async with on_cluster(CONFIG) as caravan:
        await slots_known(caravan, "sim.shares")
        first = await create(caravan, "gpu", **{"sim.shares": "0.5"})
        second = await create(caravan, "gpu", **{"sim.shares": "0.5"})
        for session_id in (first, second):
            session = await eventually(caravan, session_id, running)
            assert "count = 2" in session["jobHcl"] and "${device.attr.model}" in session["jobHcl"]
        (client_1, device_1), (client_2, device_2) = [await granted(caravan, nomad_cluster, s) for s in (first, second)]
        assert client_1 == client_2 == "gpu-b" and device_1["Name"] == device_2["Name"] == "SimGPU-B@gpu0"
        assert len({*device_1["DeviceIDs"], *device_2["DeviceIDs"]}) == 4  # four different shares of one device
        assert (await agent_slots(caravan, "gpu-b"))["occupied"]["sim.shares"] == 1

        third = await create(caravan, "gpu", **{"sim.shares": "0.5"})
        await eventually(caravan, third, waiting_for("sim.shares"))
        await destroy(caravan, first)
        await eventually(caravan, third, running)
        await destroy(caravan, second, third)


async def test_a_device_turned_unhealthy_mid_run(on_cluster: OnCluster, nomad_cluster: NomadCluster) -> None:
    state = StateDir(nomad_cluster.device_dirs["gpu-c"])
    async with on_cluster(CONFIG) as caravan:
        await slots_known(caravan, "simc.device")
        holder = await create(caravan, "gpu", **{"simc.device": "1"})
        await eventually(caravan, holder, running)
        _, device = await granted(caravan, nomad_cluster, holder)
        [held] = device["DeviceIDs"]
        other = {"gpu0": "gpu1", "gpu1": "gpu0"}[held]
        try:
            state.mark(other, "fan failure (simulated)")  # the free one: nothing is left for a newcomer
            deadline = time.monotonic() + 15
            while (await agent_slots(caravan, "gpu-c"))["capacity"].get("simc.device") != 1:
                assert time.monotonic() < deadline, "the unhealthy device still counts"
                await asyncio.sleep(0.2)
            newcomer = await create(caravan, "gpu", **{"simc.device": "1"})
            await eventually(caravan, newcomer, waiting_for("simc.device"))
            state.mark(held, "ECC errors (simulated)")  # the one in use: its session keeps running, and says why
            troubled = await eventually(caravan, holder, lambda s: s["kernels"][0]["statusInfo"] == "device-unhealthy")
            assert troubled["status"] == "RUNNING"
            assert troubled["kernels"][0]["statusDetail"] == f"caravan-sim/gpu/SimGPU-C {held}: ECC errors (simulated)"
        finally:
            state.mark(other, None)
            state.mark(held, None)
        await eventually(caravan, newcomer, running)  # healthy again: schedulable at once
        await eventually(caravan, holder, lambda s: s["kernels"][0]["statusInfo"] == "kernel-running")
        assert (await granted(caravan, nomad_cluster, newcomer))[1]["DeviceIDs"] == [other]
        await destroy(caravan, holder, newcomer)
