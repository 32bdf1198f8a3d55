"""The simulated accelerator's configuration, inventory and load files (pure parts of
:mod:`node_plugins.devices.sim`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_plugins.devices.sim.config import ConfigError, SimConfig, parse_config
from node_plugins.devices.sim.inventory import Load, groups, instance_stats, parse_load, reservation_env, unknown_ids

GOOD = {
    "state_dir": "/var/lib/sim",
    "count": 2,
    "model": "SimGPU-16G",
    "memory_mib": 16384,
    "compute_capability": "8.0",
    "shares": 4,
    "fingerprint_period": "1s",
}


def test_a_good_block_parses() -> None:
    assert parse_config(GOOD) == SimConfig(Path("/var/lib/sim"), 2, "SimGPU-16G", 16384, "8.0", 4, 1.0)
    assert parse_config({**GOOD, "alloc_dir": "/nomad/alloc"}).alloc_dir == Path("/nomad/alloc")
    assert parse_config({**GOOD, "alloc_dir": ""}).alloc_dir is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("state_dir", "relative", "state_dir must be an absolute path"),
        ("state_dir", None, "state_dir must be a string"),
        ("alloc_dir", "data/alloc", "alloc_dir must be an absolute path"),
        ("count", 2.5, "count must be a whole number from 0 to 64"),
        ("count", 65, "count must be a whole number from 0 to 64"),
        ("model", "nvidia/gpu", "model must be 1-64 letters"),
        ("memory_mib", 0, "memory_mib must be a whole number"),
        ("compute_capability", "eight", 'compute_capability must look like "8.0"'),
        ("shares", 3, "shares must be one of 0, 1, 2, 4, 5"),
        ("fingerprint_period", "soon", "fingerprint_period: invalid duration"),
        ("fingerprint_period", "0.01s", "fingerprint_period must be between"),
    ],
)
def test_each_bad_field_is_named(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_config({**GOOD, field: value})
    assert str(caught.value).startswith("caravan-device-sim config: ")


def test_every_bad_field_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**GOOD, "count": -1, "shares": 7})
    assert "count" in str(caught.value) and "shares" in str(caught.value)


def test_whole_devices_are_one_group_and_shares_one_group_per_device() -> None:
    whole = parse_config({**GOOD, "shares": 0})
    [group] = groups(whole, {"gpu1": "overheating"})
    assert (group.vendor, group.type, group.name) == ("caravan-sim", "gpu", "SimGPU-16G")
    assert [(i.id, i.healthy, i.health_description) for i in group.instances] == [
        ("gpu0", True, ""),
        ("gpu1", False, "overheating"),
    ]
    assert group.attributes["memory"] == 16384 and group.attributes["compute_capability"] == "8.0"

    shared = groups(parse_config(GOOD), {"gpu0": ""})
    assert [g.name for g in shared] == ["SimGPU-16G@gpu0", "SimGPU-16G@gpu1"]
    assert [i.id for i in shared[1].instances] == ["gpu1-s0", "gpu1-s1", "gpu1-s2", "gpu1-s3"]
    assert all(not i.healthy and i.health_description == "marked unhealthy" for i in shared[0].instances)
    assert shared[0].attributes["shares"] == 4 and shared[0].attributes["device"] == "gpu0"


def test_reserve_env_names_the_devices_and_the_fraction() -> None:
    config = parse_config(GOOD)
    env = reservation_env(config, ["gpu1-s2", "gpu1-s3"], "/alloc/caravan-sim-ab12.load")
    assert env["CARAVAN_SIM_VISIBLE_DEVICES"] == "gpu1"
    assert env["CARAVAN_SIM_SHARES"] == "0.5"
    assert env["CARAVAN_SIM_MEMORY_MIB"] == "8192"
    assert env["CARAVAN_SIM_LOAD_FILE"] == "/alloc/caravan-sim-ab12.load"
    whole = reservation_env(parse_config({**GOOD, "shares": 0, "count": 12}), ["gpu10", "gpu2"], "/x")
    assert whole["CARAVAN_SIM_VISIBLE_DEVICES"] == "gpu2,gpu10" and "CARAVAN_SIM_SHARES" not in whole
    assert unknown_ids(config, ["gpu0-s0", "gpu9", "gpu0"]) == ["gpu9", "gpu0"]


@pytest.mark.parametrize(
    ("text", "load"),
    [
        ("util=80 mem_mib=2048\n", Load(80.0, 2048)),
        ("mem_mib=512", Load(0.0, 512)),
        ("util=12.5", Load(12.5, 0)),
        ("garbage util=oops", None),
        ("", None),
        ("util=nan", None),
    ],
)
def test_a_load_file_reads_leniently(text: str, load: Load | None) -> None:
    assert parse_load(text) == load


def test_stats_are_clamped_and_memory_spread_over_the_reservation() -> None:
    config = parse_config(GOOD)
    assert instance_stats(config, "gpu0-s0", None, 0) == instance_stats(config, "gpu0-s0", Load(), 1)
    reading = instance_stats(config, "gpu0-s0", Load(250.0, 6000), 2)
    assert (reading.util, reading.mem_used_mib, reading.mem_total_mib) == (100.0, 3000, 4096)
