"""Which Nomad device is which Caravan slot, and which utilization metrics belong to it: the one home of device
knowledge. The scheduler counts and reserves devices by it, the gateway admits requests by the slots it yields, and
the idle checker names device utilization by it.

A Nomad client reports device groups as ``vendor/type/name`` (``nvidia/gpu/Tesla T4``) with healthy instances. A
group counts as the slot the operator's ``device_slots`` names for it (most specific id first: ``vendor/type/name``,
then ``vendor/type``, then ``type``; scheduler configuration file), else the built-in names (:data:`BUILTIN_SLOTS`),
else ``<vendor>.<type>`` (``intel/gpu`` -> ``intel.gpu``). A slot's *device prefix* is what comes before its first dot
(``cuda.device`` and ``cuda.shares`` are both ``cuda``), and a device's utilization metrics are
``<prefix>_util`` (busy time, percent) and ``<prefix>_mem`` (device memory in use, percent).

Shares: a device offered as K shares (Caravan's simulated accelerator, :mod:`node_plugins.devices.sim`) is a group of K
instances named ``<model>@<device>`` with the attribute ``shares = K``, one group per physical device; each instance
counts 1/K of its slot (``sim.shares``: 0.5 is half a device), and a job asks for ``amount × K`` instances of the type
with a constraint on the model (Nomad fills one request from one group, so a kernel's shares are of one device).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

BUILTIN_SLOTS: Mapping[str, str] = MappingProxyType(
    {
        "nvidia/gpu": "cuda.device",
        "amd/gpu": "rocm.device",
        "nomad/file/mock": "mock.device",  # Nomad's example device plugin: fake devices for tests and demos
        "caravan-sim/gpu": "sim.device",  # Caravan's simulated accelerator (node_plugins/devices/sim): whole devices
        "caravan-sim/gpu-share": "sim.shares",  # ... and devices offered as shares
    }
)
"""Built-in slot names of Nomad devices (``vendor/type``)."""
METRIC_KINDS = ("util", "mem")
"""What is measured of every device: ``<prefix>_util`` and ``<prefix>_mem``."""

Device = tuple[str, str, str]
"""(vendor, type, name) as Nomad reports a device group."""
SHARE_MARK = "@"
"""A share group's name is ``<model>@<device>``."""
SHARES_ATTRIBUTE = "shares"
"""A share group's attribute: how many instances (shares) make one device."""
MODEL_ATTRIBUTE = "model"


@dataclass(frozen=True)
class DeviceAsk:
    """How a job asks Nomad for a device slot."""

    id: str
    """The Nomad device id of the ``device`` block: ``vendor/type[/name]`` or ``type``."""
    model: str | None = None
    """A model the block constrains ``${device.attr.model}`` to (share groups are named per device, not model)."""
    units: int = 1
    """Instances per unit of the slot: ``amount × units`` instances, rounded up (K for shares, 1 for devices)."""


MAX_REMEMBERED_DEVICES = 1024
"""Device ids whose metric prefix a catalog keeps (a cluster has a handful of kinds of device)."""


@dataclass(frozen=True)
class DeviceCatalog:
    names: Mapping[str, str] = field(default_factory=dict)
    """The operator's device names (``device_slots`` of the scheduler configuration): Nomad device id -> slot; they
    win over :data:`BUILTIN_SLOTS`."""
    _prefixes: dict[tuple[str, str, str], str] = field(default_factory=dict, init=False, compare=False, repr=False)
    """:meth:`metric_prefix_of`'s answers (the idle sweep asks for every device of every kernel, every sweep)."""

    def slot_of(self, vendor: str, kind: str, name: str) -> str:
        """The slot a Nomad device counts as."""
        for names in (self.names, BUILTIN_SLOTS):
            for device_id in (f"{vendor}/{kind}/{name}", f"{vendor}/{kind}/{model_of(name)}", f"{vendor}/{kind}", kind):
                if device_id in names:
                    return names[device_id]
        return f"{vendor}.{kind}"

    def metric_prefix_of(self, vendor: str, kind: str, name: str) -> str:
        """The prefix of the device's utilization metrics: its slot's device prefix (``nvidia/gpu`` -> ``cuda``)."""
        key = (vendor, kind, name)
        found = self._prefixes.get(key)
        if found is None:
            if len(self._prefixes) >= MAX_REMEMBERED_DEVICES:
                self._prefixes.clear()
            found = self._prefixes[key] = device_prefix(self.slot_of(vendor, kind, name))
        return found

    def metric_prefixes(self) -> frozenset[str]:
        """Every device prefix a named device has (built-in and the operator's)."""
        return frozenset(device_prefix(slot) for slot in (*BUILTIN_SLOTS.values(), *self.names.values()))

    def device_metrics(self) -> frozenset[str]:
        """The utilization metrics of every named device (an idle policy may set thresholds for them)."""
        return frozenset(f"{prefix}_{kind}" for prefix in self.metric_prefixes() for kind in METRIC_KINDS)

    def device_ids(self, devices: Iterable[Device]) -> dict[str, str]:
        """Device slot -> the Nomad device id a job asks for to reserve it, given every device the clients report:
        ``vendor/type/name`` when every device counted as that slot is the same, else the part they share
        (``vendor/type``, then ``type``). A slot whose devices are of different types gets none."""
        seen: dict[str, set[Device]] = defaultdict(set)
        for device in devices:
            seen[self.slot_of(*device)].add(device)
        found: dict[str, str] = {}
        for slot, same_slot in seen.items():
            vendors, kinds = {d[0] for d in same_slot}, {d[1] for d in same_slot}
            if len(kinds) != 1:
                continue  # different kinds of device under one slot: no single device block asks for them
            (vendor, kind, name) = next(iter(same_slot))
            found[slot] = (
                f"{vendor}/{kind}/{name}" if len(same_slot) == 1 else f"{vendor}/{kind}" if len(vendors) == 1 else kind
            )
        return found


def device_prefix(slot: str) -> str:
    """The device kind a slot belongs to: ``cuda.shares`` -> ``cuda``, ``cpu`` -> ``cpu``."""
    return slot.split(".", 1)[0]


def metric_prefix(metric: str) -> str:
    """``cuda_util`` -> ``cuda``; ``mem`` -> ``mem``."""
    return metric.split("_", 1)[0]


def model_of(name: str) -> str:
    """A device group's model: its name, less a share group's ``@<device>``."""
    return name.split(SHARE_MARK, 1)[0]


def units_of(attributes: Mapping[str, Any] | None) -> int:
    """Instances per device of a group, from its Nomad attributes (``{"shares": {"Int": 4}}``): K for a share group,
    else 1."""
    value = ((attributes or {}).get(SHARES_ATTRIBUTE) or {}).get("Int")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def device_asks(catalog: DeviceCatalog, groups: Iterable[tuple[Device, int]]) -> dict[str, DeviceAsk]:
    """Device slot -> how a job asks for it, given every device group the clients report with its units
    (:func:`units_of`). Share groups of one model are asked for by type and model (their names differ per device);
    with different share counts across clients a request counts in the finest (more instances: never less than
    asked)."""
    by_model: list[Device] = []
    units: dict[str, int] = defaultdict(lambda: 1)
    shared: set[str] = set()
    for (vendor, kind, name), group_units in groups:
        slot = catalog.slot_of(vendor, kind, name)
        units[slot] = max(units[slot], group_units)
        if SHARE_MARK in name:
            shared.add(slot)
        by_model.append((vendor, kind, model_of(name)))
    asks: dict[str, DeviceAsk] = {}
    for slot, device_id in catalog.device_ids(by_model).items():
        vendor_kind_model = device_id.split("/")
        if slot in shared and len(vendor_kind_model) == 3:
            asks[slot] = DeviceAsk("/".join(vendor_kind_model[:2]), vendor_kind_model[2], units[slot])
        else:
            asks[slot] = DeviceAsk(device_id, None, units[slot])
    return asks
