"""The operator's scheduling configuration: HCL and JSON alike, groups inherit from the default, errors name the
line."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from domain.scheduling_config import (
    DEFAULT_RESOURCE_PRIORITY,
    GroupConfig,
    SchedulingConfigError,
    load_scheduling_config,
    parse_scheduling_config,
)

FULL_HCL = """
cpu_mhz_per_core = 1000
device_slots = { "nomad/file/mock" = "fake.device" }
default {
  session_strategy  = "drf"
  retries_to_skip   = 3
  reserve_after     = "10m"
  pending_timeout   = "1h"
}
resource_group "gpu" {
  agent_selector    = "concentrated"
  pending_timeout   = 0
  resource_priority = ["cuda", "mem", "cpu"]
  selector_options  = { spread = 2 }
}
"""

FULL_JSON = {
    "cpu_mhz_per_core": 1000,
    "device_slots": {"nomad/file/mock": "fake.device"},
    "default": {"session_strategy": "drf", "retries_to_skip": 3, "reserve_after": "10m", "pending_timeout": "1h"},
    "resource_group": {
        "gpu": {
            "agent_selector": "concentrated",
            "pending_timeout": 0,
            "resource_priority": ["cuda", "mem", "cpu"],
            "selector_options": {"spread": 2},
        }
    },
}


def test_no_file_means_the_defaults() -> None:
    config = load_scheduling_config(None)
    assert config.default_group == GroupConfig()
    assert config.groups == {} and config.pending_timeout("any") is None
    assert config.cpu_mhz_per_core is None and config.source == "built-in"


@pytest.mark.parametrize("suffix", ["hcl", "json"])
def test_a_group_inherits_what_it_does_not_set(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"scheduler.{suffix}"
    path.write_text(FULL_HCL if suffix == "hcl" else json.dumps(FULL_JSON))
    config = load_scheduling_config(path)
    default = GroupConfig(session_strategy="drf", retries_to_skip=3, reserve_after=timedelta(minutes=10))
    assert config.default_group == default
    gpu = config.for_group("gpu")
    assert (gpu.session_strategy, gpu.retries_to_skip, gpu.reserve_after) == ("drf", 3, timedelta(minutes=10))
    assert (gpu.agent_selector, gpu.resource_priority) == ("concentrated", ("cuda", "mem", "cpu"))
    assert dict(gpu.selector_options) == {"spread": 2}
    assert config.for_group("other") == default
    assert config.pending_timeout("gpu") is None  # 0 = never, even though the default has one
    assert config.pending_timeout("other") == timedelta(hours=1)
    assert config.cpu_mhz_per_core == 1000 and config.source == str(path)


def test_device_slots_extend_the_built_in_names() -> None:
    devices = parse_scheduling_config(FULL_HCL, "s.hcl").devices
    assert devices.slot_of("nomad", "file", "mock") == "fake.device"
    assert devices.slot_of("nvidia", "gpu", "Tesla T4") == "cuda.device"
    assert devices.slot_of("intel", "gpu", "Arc") == "intel.gpu"
    assert parse_scheduling_config("", "s.hcl").devices.slot_of("nomad", "file", "mock") == "mock.device"
    assert parse_scheduling_config("", "s.hcl").default_group.resource_priority == DEFAULT_RESOURCE_PRIORITY


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("bogus = 1", 1, "bogus: unknown key"),
        ("default {\n  retries_to_skip = -1\n}", 2, "default.retries_to_skip: expected a whole number >= 0"),
        ("default {\n  retries_to_skip = 1.5\n}", 2, "default.retries_to_skip: expected a whole number >= 0"),
        ('default {\n  reserve_after = "soon"\n}', 2, "default.reserve_after: invalid duration 'soon'"),
        ('default {\n  pending_timeout = "-5m"\n}', 2, "default.pending_timeout: duration must not be negative"),
        ('default {\n  agent_selector = "${x}"\n}', 2, "interpolation is not allowed"),
        ('default {\n  resource_priority = "cpu"\n}', 2, "expected a list of slot names"),
        ("default {}\ndefault {}", 2, "default: given more than once"),
        ('resource_group "a" {}\nresource_group "a" {}', 2, "resource_group.a: defined more than once"),
        ("resource_group {}", 1, 'needs one name, as in resource_group "gpu"'),
        ("default {\n  retries_to_skip = 1\n  retries_to_skip = 2\n}", 3, "assigned more than once"),
        ("cpu_mhz_per_core = 0", 1, "expected a whole number of MHz > 0"),
        ('device_slots = { "nvidia/gpu" = "cpu" }', 1, "cannot count a device as 'cpu'"),
        ("default {\n  retries_to_skip = \n}", 2, "syntax error"),
        (
            'default {\n  default_resources = {\n    mem = "lots"\n  }\n}',
            3,
            "default.default_resources.mem: expected a size such as",
        ),
        (
            'resource_group "a" {\n  default_resources = { cpu = 0 }\n}',
            2,
            "resource_group.a.default_resources.cpu: must be more than 0",
        ),
        (
            'default {\n  default_resources = { mem = "8m" }\n}',
            2,
            "default.default_resources.mem: must be at least 16m",
        ),
        ('default {\n  default_resources = { cpu = "-1" }\n}', 2, "default_resources.cpu: must not be negative"),
        ("default {\n  default_resources = { cpu = true }\n}", 2, "default_resources.cpu: expected an amount"),
        ('default {\n  default_resources = "1 cpu"\n}', 2, "default.default_resources: expected a block or object"),
    ],
    ids=lambda v: v if isinstance(v, str) and "\n" not in v and len(v) < 40 else "",
)
def test_a_broken_file_is_refused_with_line_and_reason(text: str, line: int, reason: str) -> None:
    with pytest.raises(SchedulingConfigError) as refused:
        parse_scheduling_config(text, "scheduler.hcl")
    assert refused.value.line == line
    assert reason in refused.value.reason
    assert str(refused.value).startswith(f"scheduler.hcl:{line}: ")


@pytest.mark.parametrize("suffix", ["hcl", "json"])
def test_default_resources_merge_slot_by_slot_over_the_built_in_ones(tmp_path: Path, suffix: str) -> None:
    """Built-in 0.25 cpu and 256 MiB; the default block's over them, a group's over the default block's."""
    assert dict(load_scheduling_config(None).default_resources("any")) == {"cpu": "0.25", "mem": str(256 << 20)}
    hcl = """
default {
  default_resources = { cpu = 0.5 }
}
resource_group "gpu" {
  default_resources = { mem = "1g", "cuda.device" = 1 }
}
resource_group "plain" {
  agent_selector = "concentrated"
}
"""
    doc = {
        "default": {"default_resources": {"cpu": 0.5}},
        "resource_group": {
            "gpu": {"default_resources": {"mem": "1g", "cuda.device": 1}},
            "plain": {"agent_selector": "concentrated"},
        },
    }
    path = tmp_path / f"scheduler.{suffix}"
    path.write_text(hcl if suffix == "hcl" else json.dumps(doc))
    config = load_scheduling_config(path)
    assert dict(config.default_resources("gpu")) == {"cpu": "0.5", "mem": str(1 << 30), "cuda.device": "1"}
    assert (
        dict(config.default_resources("plain"))
        == dict(config.default_resources("unconfigured"))
        == {"cpu": "0.5", "mem": str(256 << 20)}
    )


def test_json_errors_name_the_key(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.json"
    path.write_text(json.dumps({"resource_group": {"gpu": {"max_reservations": "two"}}}))
    with pytest.raises(SchedulingConfigError, match=r"scheduler.json:-: resource_group.gpu.max_reservations: expected"):
        load_scheduling_config(path)
    path.write_text("{not json")
    with pytest.raises(SchedulingConfigError, match="not valid JSON"):
        load_scheduling_config(path)


def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SchedulingConfigError, match="cannot read the file"):
        load_scheduling_config(tmp_path / "missing.hcl")
