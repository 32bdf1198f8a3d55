"""The devices a configuration offers, as Nomad device groups, and what they report. Pure: health and load readings
come in as arguments (:mod:`node_plugins.devices.sim.state` reads them).

Instance ids are stable across restarts: devices ``gpu0``..``gpu<N-1>``; the shares of ``gpu0`` are ``gpu0-s0`` ..
``gpu0-s<K-1>``. Every share of a device has its device's health; a reservation's load counts for each of its
instances (utilization as written; memory spread over them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from node_plugins.devices.sim.config import SHARE_TYPE, VENDOR, WHOLE_TYPE, SimConfig


@dataclass(frozen=True)
class Instance:
    id: str
    device: str
    """The physical device this instance is (itself) or is a share of."""
    healthy: bool = True
    health_description: str = ""


@dataclass(frozen=True)
class Group:
    vendor: str
    type: str
    name: str
    instances: tuple[Instance, ...]
    attributes: Mapping[str, str | int | bool] = field(default_factory=dict)
    """Attribute -> value; ``memory`` is in MiB."""


@dataclass(frozen=True)
class Load:
    """What a workload wrote into its load file."""

    util: float = 0.0
    """Busy time, percent (0-100)."""
    mem_mib: int = 0
    """Device memory in use, MiB (for all of the reservation's instances)."""


@dataclass(frozen=True)
class InstanceStats:
    util: float
    mem_used_mib: int
    mem_total_mib: int


def device_ids(config: SimConfig) -> list[str]:
    return [f"gpu{n}" for n in range(config.count)]


def groups(config: SimConfig, unhealthy: Mapping[str, str]) -> tuple[Group, ...]:
    """The device groups to fingerprint, given ``unhealthy`` (device id -> why)."""
    attributes: dict[str, str | int | bool] = {
        "model": config.model,
        "memory": config.memory_mib,
        "compute_capability": config.compute_capability,
        "simulated": True,
    }

    def instance(instance_id: str, device: str) -> Instance:
        why = unhealthy.get(device)
        return Instance(instance_id, device, why is None, "" if why is None else why or "marked unhealthy")

    if not config.shares:
        whole = tuple(instance(device, device) for device in device_ids(config))
        return (Group(VENDOR, WHOLE_TYPE, config.model, whole, attributes),) if whole else ()
    return tuple(
        Group(
            VENDOR,
            SHARE_TYPE,
            f"{config.model}@{device}",
            tuple(instance(f"{device}-s{n}", device) for n in range(config.shares)),
            {**attributes, "device": device, "shares": config.shares},
        )
        for device in device_ids(config)
    )


def instances(config: SimConfig) -> dict[str, Instance]:
    """Instance id -> instance (health not read)."""
    return {i.id: i for g in groups(config, {}) for i in g.instances}


def instance_stats(config: SimConfig, instance_id: str, load: Load | None, holders: int) -> InstanceStats:
    """One instance's statistics: ``load`` is its reservation's (None: not reserved, or no reading), ``holders`` how
    many instances that reservation holds (its memory is spread over them)."""
    total = config.memory_mib // config.shares if config.shares else config.memory_mib
    if load is None:
        return InstanceStats(0.0, 0, total)
    used = min(total, load.mem_mib // max(holders, 1))
    return InstanceStats(min(max(load.util, 0.0), 100.0), max(used, 0), total)


def parse_load(text: str) -> Load | None:
    """A load file: ``util=<percent> mem_mib=<MiB>`` (either may be missing; whitespace or newlines between);
    None when nothing in it reads."""
    util: float | None = None
    mem: int | None = None
    for token in text.split():
        key, _, value = token.partition("=")
        try:
            if key == "util":
                util = float(value)
            elif key in ("mem_mib", "mem"):
                mem = int(float(value))
        except ValueError:
            continue
    if util is None and mem is None or util is not None and util != util:  # NaN reads as nothing
        return None
    return Load(util or 0.0, mem or 0)


def reservation_env(config: SimConfig, ids: Sequence[str], load_file: str) -> dict[str, str]:
    """The environment a reservation of ``ids`` gives its task (after ``NVIDIA_VISIBLE_DEVICES``); ``load_file`` is
    where the task writes its load."""
    known = instances(config)
    devices = sorted({known[i].device for i in ids}, key=lambda d: int(d[3:]))
    env = {
        "CARAVAN_SIM_VISIBLE_DEVICES": ",".join(devices),
        "CARAVAN_SIM_DEVICE_IDS": ",".join(ids),
        "CARAVAN_SIM_MODEL": config.model,
        "CARAVAN_SIM_LOAD_FILE": load_file,
    }
    if config.shares:
        env["CARAVAN_SIM_SHARES"] = _fraction(len(ids), config.shares)
        env["CARAVAN_SIM_MEMORY_MIB"] = str(config.memory_mib * len(ids) // config.shares)
    else:
        env["CARAVAN_SIM_MEMORY_MIB"] = str(config.memory_mib * len(ids))
    return env


def unknown_ids(config: SimConfig, ids: Iterable[str]) -> list[str]:
    known = instances(config)
    return [i for i in ids if i not in known]


def _fraction(part: int, whole: int) -> str:
    text = f"{part / whole:.3f}".rstrip("0").rstrip(".")
    return text or "0"
