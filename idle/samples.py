"""Turn Nomad allocation stats into one utilization sample (metric -> percent). Pure: the caller fetches.

Input is the JSON of ``GET /v1/client/allocation/:id/stats`` (as :class:`nomad_jobs.stats.AllocStats` reads it)::

    {"ResourceUsage": {"CpuStats": {"Percent": 150.0, ...},
                       "MemoryStats": {"RSS": ..., "Usage": ..., "Cache": ..., "Measured": [...]},
                       "DeviceStats": [{"Vendor": "nvidia", "Type": "gpu", "Name": "...",
                                        "InstanceStats": {"<uuid>": {"Summary": {...},
                                                                     "Stats": {"Attributes": {...}}}}}]},
     "Tasks": {"<task>": {"ResourceUsage": {...}}}}

How each metric is computed (and which Backend.AI bugs this avoids):

* ``cpu_util`` = ``CpuStats.Percent / allocated cores``. Nomad's Percent is percent of *one* core summed
  over the allocation's tasks, so 2 busy cores of 4 read 200 and become 50. Per-core values are never
  summed into the result (Backend.AI #6092).
* ``mem`` = memory in use / allocated bytes × 100, computed once (Backend.AI 24.09.14 added it on top of
  a summed percentage). In use = RSS where the driver measures it (cgroups v1); otherwise
  ``Usage - Cache`` (cgroups v2 measures no RSS), so page cache of files read once does not look busy.
* ``<prefix>_util`` / ``<prefix>_mem`` per accelerator (the device prefix of the slot ``devices.catalog`` names it):
  the mean over the allocation's device instances of "GPU utilization" and of "Memory state"
  (used / total × 100; the instance's Summary when that gives no number: the NVIDIA plugin sets it to the same).
  "Memory utilization" is memory *bandwidth* in the NVIDIA plugin and is deliberately not used.

A metric whose input is missing or unreadable is left out of the sample rather than reported as 0:
the window then sees a gap instead of fake idleness. So is a whole reading in which Nomad measured nothing
(:func:`unmeasured`: a client without ``publish_allocation_metrics`` answers zeros).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from statistics import fmean
from typing import Any

from devices.catalog import DeviceCatalog
from domain.idle.metrics import CPU_UTIL, MEM
from nomad_jobs.stats import AllocStats, DeviceGroup, MemoryUsage, ResourceUsage, StatValue, usage_of

Json = Mapping[str, Any]


def kernel_sample(
    alloc_stats: AllocStats | Json,
    *,
    cores: float,
    memory_bytes: float,
    devices: DeviceCatalog | None = None,
) -> dict[str, float]:
    """One kernel's (allocation's) metrics in percent, normalized by what it was allocated (``alloc_stats``: as the
    Nomad client reads them, or the body's plain JSON)."""
    usage: ResourceUsage | None
    if isinstance(alloc_stats, AllocStats):
        usage = alloc_stats.usage
        if usage is None:
            usage = usage_of(_sum_task_usage(alloc_stats.task_usages()))
    else:
        plain = alloc_stats.get("ResourceUsage")
        usage = usage_of(plain if plain is not None else _sum_task_usage(alloc_stats.get("Tasks") or {}))
    cpu, memory, device_groups = usage.cpu_stats, usage.memory_stats, usage.device_stats
    sample: dict[str, float] = {}
    if unmeasured(usage):
        return sample
    if cpu is not None and cores > 0:
        percent = cpu.percent
        if type(percent) is not float or not -_INF < percent < _INF:  # the common case, a finite float, checked inline
            percent = _number(percent)
        if percent is not None:
            sample[CPU_UTIL] = percent / cores
    if memory is not None and memory_bytes > 0:
        in_use = _memory_in_use(memory)
        if in_use is not None:
            sample[MEM] = in_use / memory_bytes * 100
    if device_groups:
        sample.update(_device_metrics(device_groups, devices or DeviceCatalog()))
    return sample


_INF = math.inf


def unmeasured(usage: ResourceUsage) -> bool:
    """Is this Nomad's answer for an allocation whose client collects no statistics (``telemetry {
    publish_allocation_metrics = true }`` missing, the default outside ``-dev``)? Zeros with nothing ``Measured``
    and no devices: read as a gap, never as an idle session."""
    cpu, memory = usage.cpu_stats, usage.memory_stats
    return not ((cpu is not None and cpu.measured) or (memory is not None and memory.measured) or usage.device_stats)


def session_sample(kernel_samples: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """A session's metrics: per metric, the mean over the kernels that reported it."""
    if isinstance(kernel_samples, (list, tuple)) and len(kernel_samples) == 1:
        return dict(kernel_samples[0])  # one kernel (most sessions): each mean is its one value
    readings: dict[str, list[float]] = {}
    for sample in kernel_samples:
        for metric, value in sample.items():
            readings.setdefault(metric, []).append(value)
    return {metric: fmean(values) for metric, values in readings.items()}


def _sum_task_usage(tasks: Json) -> Json:
    # Older or partial answers may lack the allocation total; it is the tasks' sum (Nomad's ResourceUsage.Add).
    percent: float | None = None
    memory: dict[str, Any] = {}
    devices: list[Json] = []
    for task in tasks.values():
        usage = task.get("ResourceUsage") or {}
        task_percent = _number((usage.get("CpuStats") or {}).get("Percent"))
        if task_percent is not None:
            percent = (percent or 0.0) + task_percent
        for key, value in (usage.get("MemoryStats") or {}).items():
            memory[key] = sorted({*memory.get(key, ()), *value}) if key == "Measured" else memory.get(key, 0) + value
        devices.extend(usage.get("DeviceStats") or ())
    return {"CpuStats": {"Percent": percent}, "MemoryStats": memory or None, "DeviceStats": devices}


def _memory_in_use(stats: MemoryUsage) -> float | None:
    rss, usage, cache, measured = stats.rss, stats.usage, stats.cache, stats.measured
    if rss is None and usage is None and cache is None and measured is None:
        return None  # an empty MemoryStats: nothing read
    # byte counts are ints (or null: cgroups v2 measures no RSS) in Nomad's answers: those cases inline, anything else
    # through _number (0 when unreadable)
    rss = 0.0 if rss is None else float(rss) if type(rss) is int else (_number(rss) or 0.0)
    if (measured and "RSS" in measured) or (not measured and rss):
        return rss
    usage = float(usage) if type(usage) is int else (_number(usage) or 0.0)
    cache = float(cache) if type(cache) is int else (_number(cache) or 0.0)
    return max(usage - cache, 0.0)


def _device_metrics(groups: Iterable[DeviceGroup], devices: DeviceCatalog) -> dict[str, float]:
    readings: dict[str, list[float]] = {}
    for group in groups:
        prefix = devices.metric_prefix_of(str(group.vendor), str(group.type), str(group.name))
        util_metric, mem_metric = prefix + "_util", prefix + "_mem"
        for instance in (group.instance_stats or {}).values():
            attributes = instance.stats.attributes if instance.stats is not None else None
            util = _stat_percent(attributes.gpu_utilization if attributes else None, ratio=False)
            mem = _stat_percent(attributes.memory_state if attributes is not None else None, ratio=True)
            if mem is None:  # no number there: the Summary, which the NVIDIA plugin sets to the same figure
                mem = _stat_percent(instance.summary, ratio=True)
            if util is not None:
                readings.setdefault(util_metric, []).append(util)
            if mem is not None:
                readings.setdefault(mem_metric, []).append(mem)
    return {metric: values[0] if len(values) == 1 else fmean(values) for metric, values in readings.items()}


def _stat_percent(stat: StatValue | None, *, ratio: bool) -> float | None:
    """A device StatValue as percent: the numerator itself, or numerator / denominator × 100."""
    if stat is None:
        return None
    numerator = _number(stat.float_numerator_val)
    if numerator is None:
        numerator = _number(stat.int_numerator_val)
    if not ratio or numerator is None:
        return numerator
    denominator = _number(stat.float_denominator_val)
    if denominator is None:
        denominator = _number(stat.int_denominator_val)
    return numerator / denominator * 100 if denominator else None


def _number(value: object) -> float | None:
    # the common cases first: this runs for every reading of every sweep (None: a field Nomad left out)
    if value is None:
        return None
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is int:  # not bool (its own type), and always finite
        return float(value)
    # bool is an int subclass but never a reading; NaN or infinity would poison every average after it
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)
