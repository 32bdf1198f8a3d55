"""Which Nomad device is which slot, and its utilization metrics (``devices.catalog``)."""

from __future__ import annotations

import pytest

from devices.catalog import DeviceAsk, DeviceCatalog, device_asks, device_prefix, metric_prefix, model_of, units_of


@pytest.mark.parametrize(
    ("names", "device", "slot"),
    [
        ({}, ("nvidia", "gpu", "Tesla T4"), "cuda.device"),
        ({}, ("amd", "gpu", "MI100"), "rocm.device"),
        ({}, ("nomad", "file", "mock"), "mock.device"),
        ({}, ("intel", "gpu", "Arc"), "intel.gpu"),
        ({"nomad/file/mock": "fake.device"}, ("nomad", "file", "mock"), "fake.device"),
        ({"nvidia/gpu/A100": "a100.device"}, ("nvidia", "gpu", "A100"), "a100.device"),  # most specific first
        ({"nvidia/gpu/A100": "a100.device"}, ("nvidia", "gpu", "T4"), "cuda.device"),
        ({"gpu": "any.gpu"}, ("acme", "gpu", "X"), "any.gpu"),
    ],
)
def test_a_device_counts_as_the_slot_named_for_it(
    names: dict[str, str], device: tuple[str, str, str], slot: str
) -> None:
    assert DeviceCatalog(names).slot_of(*device) == slot


def test_metrics_are_named_by_the_slots_device_prefix_including_the_operators_names() -> None:
    catalog = DeviceCatalog({"acme/npu": "npu.device"})
    assert catalog.metric_prefix_of("nvidia", "gpu", "T4") == "cuda"
    assert catalog.metric_prefix_of("acme", "npu", "N1") == "npu"
    assert {"cuda_util", "cuda_mem", "rocm_util", "npu_util", "npu_mem", "mock_util"} <= catalog.device_metrics()
    assert device_prefix("cuda.shares") == "cuda" and metric_prefix("cuda_util") == "cuda"


@pytest.mark.parametrize(
    ("names", "devices", "ids"),
    [
        ({}, [("nvidia", "gpu", "T4")], {"cuda.device": "nvidia/gpu/T4"}),
        ({}, [("nvidia", "gpu", "T4"), ("nvidia", "gpu", "A100")], {"cuda.device": "nvidia/gpu"}),
        ({"gpu": "any.gpu"}, [("acme", "gpu", "X"), ("other", "gpu", "Y")], {"any.gpu": "gpu"}),
        ({"acme/fpga": "acme.dev", "acme/gpu": "acme.dev"}, [("acme", "fpga", "F"), ("acme", "gpu", "G")], {}),
    ],
)
def test_a_job_reserves_a_slot_by_the_device_id_its_devices_share(
    names: dict[str, str], devices: list[tuple[str, str, str]], ids: dict[str, str]
) -> None:
    assert DeviceCatalog(names).device_ids(devices) == ids


SHARES_A = (("caravan-sim", "gpu-share", "SimGPU-B@gpu0"), 4)
SHARES_B = (("caravan-sim", "gpu-share", "SimGPU-B@gpu1"), 4)


@pytest.mark.parametrize(
    ("names", "groups", "asks"),
    [
        # whole devices: by model when only one model is reported, one instance a device
        ({}, [(("caravan-sim", "gpu", "SimGPU-A"), 1)], {"sim.device": DeviceAsk("caravan-sim/gpu/SimGPU-A")}),
        # share groups are named per device: asked for by type, constrained to the model, K instances a device
        ({}, [SHARES_A, SHARES_B], {"sim.shares": DeviceAsk("caravan-sim/gpu-share", "SimGPU-B", 4)}),
        # two models of shares: any of them, in the finest shares
        (
            {},
            [SHARES_A, (("caravan-sim", "gpu-share", "SimGPU-C@gpu0"), 8)],
            {"sim.shares": DeviceAsk("caravan-sim/gpu-share", None, 8)},
        ),
        # an operator's slot per model (device_slots by model, which names a share group's model too)
        (
            {"caravan-sim/gpu-share/SimGPU-B": "simb.shares"},
            [SHARES_A, (("caravan-sim", "gpu-share", "SimGPU-C@gpu0"), 4)],
            {
                "simb.shares": DeviceAsk("caravan-sim/gpu-share", "SimGPU-B", 4),
                "sim.shares": DeviceAsk("caravan-sim/gpu-share", "SimGPU-C", 4),
            },
        ),
    ],
)
def test_a_job_asks_for_shares_by_type_and_model(
    names: dict[str, str], groups: list[tuple[tuple[str, str, str], int]], asks: dict[str, DeviceAsk]
) -> None:
    assert device_asks(DeviceCatalog(names), groups) == asks


def test_a_share_groups_units_come_from_its_attributes() -> None:
    assert units_of({"shares": {"Int": 4}, "model": {"String": "X"}}) == 4
    assert units_of({"shares": {"Int": True}}) == units_of({}) == units_of(None) == 1
    assert model_of("SimGPU-B@gpu0") == model_of("SimGPU-B") == "SimGPU-B"
