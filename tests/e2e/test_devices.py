"""Device slots end to end on the dev agent, whose Caravan device plugin offers two ``SimGPU-16G`` of four shares each
(``sim.shares`` 2): the job's ``device`` block makes Nomad reserve the shares, a session asking for more than is free
waits until a holder ends, the plugin's reservation reaches the kernel (env, load file) in docker and exec, and the
load a kernel writes is what the idle checker's utilization check reads (``sim_util``)."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from core.clock import utcnow
from domain.model import SessionStatus
from idle.samples import kernel_sample
from stores.known_resources import known_slot_types
from tests.conftest import DEFAULT_IMAGE
from tests.harness import CREATE, Caravan
from tests.idle.running import policy_file, running_idle, swept_since

DESTROY = "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id status } }"
WAITING = "query($id: ID!) { session(id: $id) { status waitReasons } }"


async def sim_shares_known(caravan: Caravan) -> None:
    deadline = time.monotonic() + 15
    while "sim.shares" not in await known_slot_types(caravan.store.redis, caravan.store.keys):
        assert time.monotonic() < deadline, "the scheduler never recorded sim.shares"
        await asyncio.sleep(0.1)


async def create(caravan: Caravan, name: str, shares: str, **fields: Any) -> str:
    resources = {"cpu": "0.1", "mem": "32m", "sim.shares": shares}
    fields.setdefault("type", "INTERACTIVE")
    fields.setdefault("driver", "RAW_EXEC")
    data = await caravan.gql(
        CREATE,
        {
            "input": {
                "name": name,
                **fields,
                "resources": [{"slot": slot, "amount": amount} for slot, amount in resources.items()],
            }
        },
    )
    return str(data["createSession"]["sessions"][0]["id"])


async def devices_nomad_allocated(caravan: Caravan, job_id: str) -> list[dict[str, Any]]:
    [allocation] = [a for a in await caravan.nomad.job_allocations(job_id) if a["ClientStatus"] == "running"]
    detail = await caravan.nomad.allocation(allocation["ID"])
    devices: list[dict[str, Any]] = detail["AllocatedResources"]["Tasks"]["kernel"].get("Devices") or []
    return devices


async def test_shares_are_reserved_by_nomad_and_a_session_waits_for_free_ones(caravan: Caravan) -> None:
    await sim_shares_known(caravan)
    first = await caravan.wait_for(await create(caravan, "whole-1", "1"), "RUNNING")
    assert 'device "caravan-sim/gpu-share"' in first["jobHcl"] and "count = 4" in first["jobHcl"]
    [device] = await devices_nomad_allocated(caravan, first["nomadJobId"])
    parent = device["Name"].split("@")[1]
    assert (device["Vendor"], device["Type"]) == ("caravan-sim", "gpu-share")
    assert sorted(device["DeviceIDs"]) == [f"{parent}-s{n}" for n in range(4)]  # one device's four shares
    second = await caravan.wait_for(await create(caravan, "whole-2", "1"), "RUNNING")
    [other] = await devices_nomad_allocated(caravan, second["nomadJobId"])
    assert other["Name"] != device["Name"]

    third_id = await create(caravan, "half", "0.5")
    deadline = time.monotonic() + 15
    while not (third := (await caravan.gql(WAITING, {"id": third_id}))["session"])["waitReasons"]:
        assert time.monotonic() < deadline, third
        await asyncio.sleep(0.2)
    assert third["status"] == "PENDING"
    assert any("sim.shares" in reason for reason in third["waitReasons"]), third["waitReasons"]

    await caravan.gql(DESTROY, {"ids": [first["id"]]})
    third = await caravan.wait_for(third_id, "RUNNING")
    [half] = await devices_nomad_allocated(caravan, third["nomadJobId"])
    assert half["Name"] == device["Name"] and len(half["DeviceIDs"]) == 2
    await caravan.gql(DESTROY, {"ids": [second["id"], third_id]})
    await caravan.wait_for(third_id, "TERMINATED")  # ended before the scheduler stops: not stopped mid-stop
    await caravan.wait_for(second["id"], "TERMINATED")


SHOW = "env | grep ^CARAVAN_SIM_ | sort; f=$CARAVAN_SIM_LOAD_FILE; echo 'util=42 mem_mib=1024' >$f && cat $f"


@pytest.mark.parametrize(
    "driver", [pytest.param("DOCKER", marks=pytest.mark.docker, id="docker"), pytest.param("EXEC", id="exec")]
)
async def test_the_reservation_reaches_the_kernel(caravan: Caravan, driver: str) -> None:
    await sim_shares_known(caravan)
    image = {"image": DEFAULT_IMAGE} if driver == "DOCKER" else {}
    session_id = await create(
        caravan, f"env-{driver.lower()}", "0.5", type="BATCH", driver=driver, startupCommand=SHOW, **image
    )
    session = await caravan.wait_for(session_id, "TERMINATED", "ERROR")
    out = session["mainKernel"]["logs"]["stdout"]
    assert session["result"] == "SUCCESS", (out, session["mainKernel"]["logs"]["stderr"])
    assert "CARAVAN_SIM_SHARES=0.5\n" in out and "CARAVAN_SIM_MODEL=SimGPU-16G\n" in out
    assert re.search(r"^CARAVAN_SIM_LOAD_FILE=/alloc/caravan-sim-[0-9a-f]{16}\.load$", out, re.M), out
    assert any(line.startswith("CARAVAN_SIM_VISIBLE_DEVICES=gpu") for line in out.splitlines())
    assert out.endswith("util=42 mem_mib=1024\n")  # the load file, in the allocation's directory, writable


IDLE_CHECKS = """query($id: ID!) { session(id: $id) { idleChecks { checks {
  name note utilization { metric average threshold } } } } }"""
GPU_BUSY = "echo util=85 mem_mib=2048 >$CARAVAN_SIM_LOAD_FILE; while :; do sleep 1; done"


async def device_reports(caravan: Caravan, session_id: str, metric: str, value: float, timeout: float = 60) -> None:
    """Wait until Nomad's statistics of the session's allocation carry ``metric`` at ``value``: the plugin finds a
    kernel's load file in its allocation's directory on its own schedule, and the idle checker must judge by it."""
    job = f"{caravan.settings.nomad.job_prefix}-{session_id}"
    deadline = time.monotonic() + timeout
    while True:
        running = [a for a in await caravan.nomad.job_allocations(job) if a["ClientStatus"] == "running"]
        sample = (
            kernel_sample(await caravan.nomad.alloc_stats(running[0]["ID"]), cores=1, memory_bytes=1) if running else {}
        )
        if sample.get(metric) == pytest.approx(value):
            return
        assert time.monotonic() < deadline, sample
        await asyncio.sleep(0.25)


"""A kernel that reports its device busy (the plugin's load file) and keeps no core busy."""


async def test_a_busy_gpu_survives_the_utilization_check_while_an_idle_one_is_reclaimed(
    caravan: Caravan, tmp_path: Path
) -> None:
    await sim_shares_known(caravan)
    policy = 'check_interval = "1s"\ndefaults {\n  utilization {\n    window = "2s"\n    thresholds {\n'
    policy += "      sim_util = 10\n    }\n  }\n}\n"
    busy = await create(caravan, "gpu-busy", "0.5", driver="EXEC", startupCommand=GPU_BUSY)
    idle = await create(caravan, "gpu-idle", "0.5", driver="EXEC", startupCommand="while :; do sleep 1; done")
    await caravan.wait_for(busy, "RUNNING")
    await caravan.wait_for(idle, "RUNNING")
    await device_reports(caravan, busy, "sim_util", 85)  # then the busy one is judged by its load from the start
    async with running_idle(caravan.settings, policy_file(tmp_path, policy)) as service:
        session = await caravan.wait_for(idle, "TERMINATED", "ERROR", timeout=30)
        assert (session["status"], session["statusInfo"]) == ("TERMINATED", "idle-utilization")
        await swept_since(service.idle_store, busy, utcnow() + timedelta(seconds=2))
        stored = await caravan.store.get(busy)
        assert stored is not None and stored.status is SessionStatus.RUNNING
        checks = (await caravan.gql(IDLE_CHECKS, {"id": busy}))["session"]["idleChecks"]["checks"]
    [utilization] = [c for c in checks if c["name"] == "UTILIZATION"]
    [reading] = utilization["utilization"]
    assert (reading["metric"], reading["threshold"], utilization["note"]) == ("sim_util", 10, "utilized")
    assert reading["average"] == pytest.approx(85)  # the kernel's own report, through the plugin and Nomad's stats
    await caravan.gql(DESTROY, {"ids": [busy]})
    await caravan.wait_for(busy, "TERMINATED")
