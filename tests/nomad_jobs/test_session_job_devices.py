"""Device slots become ``device`` blocks in the kernel's task resources (pure rendering, read back with python-hcl2;
tests/e2e/test_devices.py checks that Nomad reserves them)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import hcl2
import pytest

from devices.catalog import DeviceAsk
from domain.model import Driver, Kernel, Session, SessionType
from nomad_jobs.session_job import JobContext, render_session_job

MIB = 1024 * 1024
DEVICES = {
    "mock.device": DeviceAsk("nomad/file/mock"),
    "cuda.device": DeviceAsk("nvidia/gpu"),
    "sim.shares": DeviceAsk("caravan-sim/gpu-share", "SimGPU-B", 4),
}


def session(*kernel_resources: dict[str, str]) -> Session:
    kernels = tuple(
        Kernel(
            role="main" if n == 1 else "sub",
            index=n,
            hostname="main1" if n == 1 else f"sub{n - 1}",
            image="",
            resources=resources,
        )
        for n, resources in enumerate(kernel_resources, 1)
    )
    return Session(
        id="s1",
        name="s1",
        owner_id="u",
        type=SessionType.BATCH,
        driver=Driver.RAW_EXEC,
        image="",
        resources=kernel_resources[0],
        kernels=kernels,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def task_resources(rendered: str, group: str = "main1") -> dict[str, Any]:
    """The resources block of ``group``'s task (python-hcl2 keeps the quotes of block labels)."""
    [job] = hcl2.loads(rendered)["job"][0].values()
    found = next(g[f'"{group}"'] for g in job["group"] if f'"{group}"' in g)
    [task] = found["task"][0].values()
    resources: dict[str, Any] = task["resources"][0]
    return resources


def devices_of(resources: dict[str, Any]) -> dict[str, int]:
    return {name.strip('"'): body["count"] for block in resources.get("device", []) for name, body in block.items()}


@pytest.mark.parametrize(
    ("requested", "devices"),
    [
        ({"cpu": "1"}, {}),
        ({"cpu": "1", "mock.device": "1"}, {"nomad/file/mock": 1}),
        ({"cpu": "1", "mock.device": "2", "cuda.device": "1"}, {"nomad/file/mock": 2, "nvidia/gpu": 1}),
        ({"cpu": "1", "mock.device": "0"}, {}),
        ({"cpu": "1", "mock.device": "0.5"}, {"nomad/file/mock": 1}),  # a part of a device reserves a whole one
        ({"cpu": "1", "tpu.device": "1"}, {}),  # no Nomad device known for the slot: nothing to reserve
        ({"cpu": "1", "sim.shares": "0.5"}, {"caravan-sim/gpu-share": 2}),  # half a device of 4 shares
        ({"cpu": "1", "sim.shares": "0.3"}, {"caravan-sim/gpu-share": 2}),  # 1.2 shares: rounded up
        ({"cpu": "1", "sim.shares": "1"}, {"caravan-sim/gpu-share": 4}),
    ],
)
def test_device_slots_become_device_blocks(requested: dict[str, str], devices: dict[str, int]) -> None:
    rendered = render_session_job(session(requested), JobContext(job_prefix="cv", devices=DEVICES)).hcl
    resources = task_resources(rendered)
    assert devices_of(resources) == devices
    assert resources["cpu"] == 1000


def test_each_kernel_reserves_its_own_devices() -> None:
    rendered = render_session_job(
        session({"mock.device": "1"}, {"cpu": "1"}), JobContext(job_prefix="cv", devices=DEVICES)
    ).hcl
    assert len(devices_of(task_resources(rendered, "main1"))) == 1
    assert devices_of(task_resources(rendered, "sub1")) == {}


def test_without_known_devices_nothing_is_rendered() -> None:
    rendered = render_session_job(session({"mock.device": "1"}), JobContext(job_prefix="cv")).hcl
    assert "device" not in rendered


def test_shares_are_constrained_to_the_model_the_slot_names() -> None:
    rendered = render_session_job(session({"sim.shares": "0.25"}), JobContext(job_prefix="cv", devices=DEVICES)).hcl
    [block] = task_resources(rendered)["device"]
    [constraint] = block['"caravan-sim/gpu-share"']["constraint"]
    # as python-hcl2 reads the source back: quoted, and "$${" is HCL's escape for a literal "${" (Nomad's own syntax)
    assert (constraint["attribute"], constraint["value"]) == ('"$${device.attr.model}"', '"SimGPU-B"')
