"""An allocation's resource usage as Nomad's ``GET /v1/client/allocation/:id/stats`` answers it, read by msgspec.

The idle sweep reads one such body per kernel, every sweep: 10,000 of them took a quarter of a second with ``json``.
:class:`AllocStats` decodes only the allocation's total (``ResourceUsage``), and of it only the fields the idle sweep
reads (:class:`ResourceUsage`: msgspec skips the others without building them); the readings themselves are decoded
as they come (``idle.samples`` reads them leniently, a reading of the wrong type being a gap rather than an error). Its
tasks' usage stays undecoded (``Tasks``: half the body), read only when an older or partial answer lacks the total.
The structs are left out of the cyclic garbage collector (``gc=False``): decoded from JSON, they hold no cycles.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

Json = dict[str, Any]


class CpuUsage(msgspec.Struct, frozen=True, gc=False, rename="pascal"):
    percent: Any = None
    """Percent of one core, summed over the tasks (a number when Nomad measured it; read leniently)."""
    measured: Any = None
    """The names of the fields measured (a list, or null)."""


class MemoryUsage(
    msgspec.Struct,
    frozen=True,
    gc=False,
    rename={"rss": "RSS", "usage": "Usage", "cache": "Cache", "measured": "Measured"},
):
    rss: Any = None
    usage: Any = None
    cache: Any = None
    """Bytes (numbers when measured; read leniently)."""
    measured: Any = None


class StatValue(msgspec.Struct, frozen=True, gc=False, rename="pascal"):
    """One device statistic (Nomad's ``StatValue``): the numerator, and the denominator of a ratio (read leniently)."""

    float_numerator_val: Any = None
    int_numerator_val: Any = None
    float_denominator_val: Any = None
    int_denominator_val: Any = None


class DeviceAttributes(
    msgspec.Struct, frozen=True, gc=False, rename={"gpu_utilization": "GPU utilization", "memory_state": "Memory state"}
):
    """The two statistics of a device instance ``idle.samples`` reads (the others are skipped, not built)."""

    gpu_utilization: StatValue | None = None
    memory_state: StatValue | None = None


class InstanceStatsObject(msgspec.Struct, frozen=True, gc=False, rename="pascal"):
    attributes: DeviceAttributes | None = None


class DeviceInstance(msgspec.Struct, frozen=True, gc=False, rename="pascal"):
    summary: StatValue | None = None
    stats: InstanceStatsObject | None = None


class DeviceGroup(msgspec.Struct, frozen=True, gc=False, rename="pascal"):
    """One device group's usage: which device (read leniently) and each instance's statistics."""

    vendor: Any = None
    type: Any = None
    name: Any = None
    instance_stats: dict[str, DeviceInstance] | None = None


class ResourceUsage(msgspec.Struct, frozen=True, gc=False, rename="pascal"):
    """An allocation's (or a task's) usage: only the fields ``idle.samples`` reads are decoded, the rest skipped."""

    cpu_stats: CpuUsage | None = None
    memory_stats: MemoryUsage | None = None
    device_stats: list[DeviceGroup] | None = None
    """Device groups (most allocations have none)."""


class AllocStats(msgspec.Struct, frozen=True, gc=False, rename={"usage": "ResourceUsage", "tasks": "Tasks"}):
    usage: ResourceUsage | None = None
    """The allocation's total; None when Nomad sent none."""
    tasks: msgspec.Raw = msgspec.Raw(b"{}")
    """Task name -> ``{"ResourceUsage": ...}``, as JSON (:meth:`task_usages` reads it)."""

    @property
    def resource_usage(self) -> Json | None:
        """The allocation's total as plain JSON (the fields decoded only)."""
        converted: Json | None = msgspec.to_builtins(self.usage) if self.usage is not None else None
        return converted

    def task_usages(self) -> Json:
        """Task name -> its stats (``{}`` when there are none or they are not an object)."""
        tasks = _ANY.decode(self.tasks)
        return tasks if isinstance(tasks, dict) else {}


_ANY = msgspec.json.Decoder()
_STATS = msgspec.json.Decoder(AllocStats)


def parse_alloc_stats(body: bytes) -> AllocStats:
    """``body`` as :class:`AllocStats`; ``ValueError`` when it is not a JSON object with an object (or null) as its
    ``ResourceUsage``, its ``CpuStats`` and its ``MemoryStats``."""
    try:
        return _STATS.decode(body)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise ValueError(f"malformed allocation stats: {exc}") from exc


def usage_of(plain: Mapping[str, Any]) -> ResourceUsage:
    """A usage given as plain JSON (a task's, a sum of them, a test's) as :class:`ResourceUsage`; ``ValueError`` as
    :func:`parse_alloc_stats`."""
    try:
        return msgspec.convert(plain, ResourceUsage)
    except msgspec.ValidationError as exc:
        raise ValueError(f"malformed allocation stats: {exc}") from exc
