"""Nomad allocation stats -> one utilization sample."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devices.catalog import DeviceCatalog
from idle.samples import kernel_sample, session_sample
from nomad_jobs.stats import parse_alloc_stats

GIB = 2**30


def gpu(uuid: str, util: int | None, used_mib: int, total_mib: int) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "Memory state": {"IntNumeratorVal": used_mib, "IntDenominatorVal": total_mib, "Unit": "MiB"},
        "Memory utilization": {"IntNumeratorVal": 99, "Unit": "%"},  # bandwidth: must not be used
    }
    attributes["GPU utilization"] = (
        {"IntNumeratorVal": util, "Unit": "%"} if util is not None else {"StringVal": "N/A", "Unit": "%"}
    )
    return {uuid: {"Summary": attributes["Memory state"], "Stats": {"Attributes": attributes}, "Timestamp": 1}}


def stats(
    *, percent: float = 0.0, memory: dict[str, Any] | None = None, devices: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    usage = {
        "CpuStats": {"Percent": percent, "TotalTicks": 1.0, "Measured": ["Percent", "Total Ticks"]},
        "MemoryStats": memory if memory is not None else {"RSS": GIB // 2, "Measured": ["RSS"]},
        "DeviceStats": devices or [],
    }
    return {"ResourceUsage": usage, "Tasks": {"main": {"ResourceUsage": usage}}, "Timestamp": 1}


@pytest.mark.parametrize(
    ("percent", "cores", "expected"),
    [(200.0, 4, 50.0), (100.0, 1, 100.0), (50.0, 0.5, 100.0), (0.0, 2, 0.0), (300.0, 2, 150.0)],
    ids=["2 of 4 cores", "1 of 1", "half a core", "first sample is 0", "over the allocation"],
)
def test_cpu_is_normalized_by_allocated_cores(percent: float, cores: float, expected: float) -> None:
    assert kernel_sample(stats(percent=percent), cores=cores, memory_bytes=GIB)["cpu_util"] == expected


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        ({"RSS": GIB // 4, "Usage": GIB, "Cache": GIB // 2, "Measured": ["RSS", "Cache", "Usage"]}, 25.0),
        ({"RSS": 0, "Usage": GIB, "Cache": GIB // 2, "Measured": ["Cache", "Swap", "Usage"]}, 50.0),
        ({"Usage": GIB // 4, "Cache": GIB // 2, "Measured": ["Cache", "Usage"]}, 0.0),
        ({"RSS": GIB // 2}, 50.0),
    ],
    ids=["cgroups v1: RSS", "cgroups v2: usage minus cache", "cache above usage clamps to 0", "no Measured list"],
)
def test_memory_percent_of_allocation(memory: dict[str, Any], expected: float) -> None:
    assert kernel_sample(stats(memory=memory), cores=1, memory_bytes=GIB)["mem"] == expected


def test_gpu_metrics_average_over_instances() -> None:
    group = {
        "Vendor": "nvidia",
        "Type": "gpu",
        "Name": "Tesla T4",
        "InstanceStats": {**gpu("a", 10, 1000, 4000), **gpu("b", 30, 3000, 4000)},
    }
    sample = kernel_sample(stats(devices=[group]), cores=1, memory_bytes=GIB)
    assert (sample["cuda_util"], sample["cuda_mem"]) == (20.0, 50.0)


def test_unreadable_gpu_utilization_is_left_out_not_zero() -> None:
    group = {"Vendor": "nvidia", "Type": "gpu", "Name": "T4", "InstanceStats": gpu("a", None, 1000, 4000)}
    sample = kernel_sample(stats(devices=[group]), cores=1, memory_bytes=GIB)
    assert "cuda_util" not in sample
    assert sample["cuda_mem"] == 25.0


def test_any_device_is_named_by_its_slots_prefix_the_operators_names_included() -> None:
    mock = {"Vendor": "nomad", "Type": "file", "Name": "mock", "InstanceStats": gpu("a", 10, 1, 2)}
    assert set(kernel_sample(stats(devices=[mock]), cores=1, memory_bytes=GIB)) == {
        "cpu_util",
        "mem",
        "mock_util",
        "mock_mem",
    }
    npu = {"Vendor": "acme", "Type": "npu", "Name": "N1", "InstanceStats": gpu("a", 30, 1, 4)}
    sample = kernel_sample(
        stats(devices=[npu]), cores=1, memory_bytes=GIB, devices=DeviceCatalog({"acme/npu": "npu.device"})
    )
    assert (sample["npu_util"], sample["npu_mem"]) == (30.0, 25.0)


def test_missing_inputs_give_no_metric() -> None:
    assert kernel_sample({"ResourceUsage": {}}, cores=2, memory_bytes=GIB) == {}
    assert kernel_sample(stats(percent=100), cores=0, memory_bytes=0) == {}


def test_tasks_are_summed_when_the_allocation_total_is_missing() -> None:
    task = {"CpuStats": {"Percent": 100.0}, "MemoryStats": {"RSS": GIB // 4, "Measured": ["RSS"]}}
    doc = {"Tasks": {"a": {"ResourceUsage": task}, "b": {"ResourceUsage": task}}}
    assert kernel_sample(doc, cores=4, memory_bytes=GIB) == {"cpu_util": 50.0, "mem": 50.0}


def test_session_sample_averages_over_kernels_reporting_each_metric() -> None:
    kernels = [{"cpu_util": 10.0, "mem": 20.0, "cuda_util": 90.0}, {"cpu_util": 30.0, "mem": 40.0}]
    assert session_sample(kernels) == {"cpu_util": 20.0, "mem": 30.0, "cuda_util": 90.0}


def test_no_tasks_no_total_gives_nothing() -> None:
    assert kernel_sample({"Tasks": {}}, cores=2, memory_bytes=GIB) == {}


SHAPES = {
    "total": stats(
        percent=150.0, devices=[{"Vendor": "nvidia", "Type": "gpu", "Name": "T4", "InstanceStats": gpu("g", 40, 1, 2)}]
    ),
    "cgroups v2": stats(memory={"Usage": GIB, "Cache": GIB // 4, "Measured": ["Cache", "Usage"]}),
    "tasks only": {"Tasks": {"a": {"ResourceUsage": {"CpuStats": {"Percent": 80}, "MemoryStats": {"RSS": GIB}}}}},
    "no tasks, no total": {"Tasks": {}},
    "nothing": {},
    "null total": {"ResourceUsage": None, "Tasks": {"a": {"ResourceUsage": {"CpuStats": {"Percent": 20.0}}}}},
    "odd readings": {"ResourceUsage": {"CpuStats": {"Percent": "high"}, "MemoryStats": {"RSS": True}}},
}


@pytest.mark.parametrize("body", SHAPES.values(), ids=SHAPES.keys())
def test_stats_read_by_the_client_give_the_sample_of_the_plain_json(body: dict[str, Any]) -> None:
    parsed = parse_alloc_stats(json.dumps(body).encode())
    assert kernel_sample(parsed, cores=2, memory_bytes=GIB) == kernel_sample(body, cores=2, memory_bytes=GIB)


@pytest.mark.parametrize(
    "body",
    [b"[]", b'{"ResourceUsage": []}', b"{", b'"stats"', b'{"ResourceUsage": {"CpuStats": "busy"}}'],
)
def test_malformed_stats_are_refused(body: bytes) -> None:
    with pytest.raises(ValueError, match="malformed allocation stats"):
        parse_alloc_stats(body)


def test_an_allocation_nomad_measured_nothing_for_is_a_gap_not_idleness() -> None:
    """The answer of a Nomad client without ``telemetry { publish_allocation_metrics = true }`` (seen on the dev
    stack's non-dev agent): zeros, nothing ``Measured``, no tasks. Read as 0 % it would reclaim busy sessions."""
    zeros = {"SystemMode": 0.0, "UserMode": 0.0, "TotalTicks": 0.0, "Percent": 0.0, "Measured": None}
    memory = {"RSS": 0, "Cache": 0, "Swap": 0, "Usage": 0, "MaxUsage": 0, "Measured": None}
    body = {"ResourceUsage": {"CpuStats": zeros, "MemoryStats": memory, "DeviceStats": None}, "Tasks": {}}
    assert kernel_sample(body, cores=1, memory_bytes=GIB) == {}
    assert kernel_sample(parse_alloc_stats(json.dumps(body).encode()), cores=1, memory_bytes=GIB) == {}
    measured_idle = stats(percent=0.0)  # a measured 0 stays a 0
    assert kernel_sample(measured_idle, cores=1, memory_bytes=GIB)["cpu_util"] == 0.0
