"""A device slot is reserved by Nomad, not only counted by Caravan: the job's ``device`` block makes Nomad allocate
the instance to the task, and a second session asking for the one device of the dev agent (``nomad/file/mock``,
``mock0``) waits until the first has released it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from stores.known_resources import known_slot_types
from tests.harness import CREATE, Caravan

DESTROY = "mutation($ids: [ID!]!) { destroySession(ids: $ids) { id status } }"
WAITING = "query($id: ID!) { session(id: $id) { status waitReasons } }"


async def create_with_device(caravan: Caravan, name: str) -> str:
    resources = {"cpu": "0.1", "mem": "32m", "mock.device": "1"}
    data = await caravan.gql(
        CREATE,
        {
            "input": {
                "name": name,
                "type": "INTERACTIVE",
                "driver": "RAW_EXEC",
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


async def test_a_device_is_reserved_by_nomad_and_a_second_session_waits_for_it(caravan: Caravan) -> None:
    deadline = time.monotonic() + 15
    while "mock.device" not in await known_slot_types(caravan.store.redis, caravan.store.keys):
        assert time.monotonic() < deadline, "the scheduler never recorded mock.device"
        await asyncio.sleep(0.1)

    first = await caravan.wait_for(await create_with_device(caravan, "with-device-1"), "RUNNING")
    assert 'device "nomad/file/mock"' in first["jobHcl"]
    [device] = await devices_nomad_allocated(caravan, first["nomadJobId"])
    assert (device["Vendor"], device["Type"], device["Name"]) == ("nomad", "file", "mock")
    assert device["DeviceIDs"] == ["mock0"]

    second_id = await create_with_device(caravan, "with-device-2")
    deadline = time.monotonic() + 15
    while True:
        second = (await caravan.gql(WAITING, {"id": second_id}))["session"]
        if second["waitReasons"]:
            break
        assert time.monotonic() < deadline, second
        await asyncio.sleep(0.2)
    assert second["status"] == "PENDING"
    assert any("mock.device" in reason for reason in second["waitReasons"]), second["waitReasons"]

    await caravan.gql(DESTROY, {"ids": [first["id"]]})
    second = await caravan.wait_for(second_id, "RUNNING")
    [device] = await devices_nomad_allocated(caravan, second["nomadJobId"])
    assert device["DeviceIDs"] == ["mock0"]
