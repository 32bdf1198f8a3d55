"""A running kernel whose device turns unhealthy says so (pure: Nomad's node and allocation shapes)."""

from __future__ import annotations

from typing import Any

from domain.model import KernelObservation, SessionStatus
from nomad_jobs.observe import DEVICE_UNHEALTHY, unhealthy_devices, with_device_health

NODE = {
    "ID": "n1",
    "NodeResources": {
        "Devices": [
            {
                "Vendor": "caravan-sim",
                "Type": "gpu",
                "Name": "SimGPU-C",
                "Instances": [
                    {"ID": "gpu0", "Healthy": True, "HealthDescription": ""},
                    {"ID": "gpu1", "Healthy": False, "HealthDescription": "fan failure"},
                ],
            }
        ]
    },
}


def alloc(*ids: str, node: str = "n1") -> dict[str, Any]:
    device = {"Vendor": "caravan-sim", "Type": "gpu", "Name": "SimGPU-C", "DeviceIDs": list(ids)}
    return {"NodeID": node, "AllocatedResources": {"Tasks": {"kernel": {"Devices": [device]}}}}


RUNNING = KernelObservation(hostname="main1", status=SessionStatus.RUNNING, reason="kernel-running")


def test_a_kernel_holding_an_unhealthy_device_says_which_and_why() -> None:
    unhealthy = {"n1": unhealthy_devices(NODE)}
    assert unhealthy == {"n1": {"gpu1": "fan failure"}}
    seen = with_device_health(RUNNING, alloc("gpu1"), unhealthy)
    assert (seen.reason, seen.detail, seen.status) == (
        DEVICE_UNHEALTHY,
        "caravan-sim/gpu/SimGPU-C gpu1: fan failure",
        SessionStatus.RUNNING,
    )


def test_healthy_devices_other_nodes_and_ended_kernels_change_nothing() -> None:
    unhealthy = {"n1": unhealthy_devices(NODE)}
    assert with_device_health(RUNNING, alloc("gpu0"), unhealthy) == RUNNING
    assert with_device_health(RUNNING, alloc("gpu1", node="n2"), unhealthy) == RUNNING
    ended = KernelObservation(hostname="main1", status=SessionStatus.TERMINATED, reason="task-finished")
    assert with_device_health(ended, alloc("gpu1"), unhealthy) == ended
