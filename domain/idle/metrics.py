"""Utilization metric names, and which of them apply to a session.

A metric is a percentage named ``<prefix>_<what>``: ``cpu_util`` (percent of the allocated cores), ``mem``
(percent of the allocated memory), and per accelerator ``<prefix>_util`` (busy time) and ``<prefix>_mem``
(device memory in use), where ``<prefix>`` is the device prefix of the resource slots (``cuda`` for
``cuda.device`` / ``cuda.shares``; which Nomad device is which slot: ``devices.catalog``).

A device metric applies only to a session that requests a non-zero amount of some slot with that prefix:
judging ``cuda_util`` of a CPU-only session would always find it "idle" (Backend.AI excludes these too).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from devices.catalog import DeviceCatalog, device_prefix, metric_prefix

CPU_UTIL = "cpu_util"
MEM = "mem"
ALWAYS_APPLICABLE = frozenset({CPU_UTIL, MEM})
"""Every session has cores and memory, so these are checked whatever it requested."""


def known_metrics(devices: DeviceCatalog | None = None) -> frozenset[str]:
    """Every metric a policy file may name a threshold for: CPU, memory, and each named device's (``devices``: the
    built-in names and the operator's ``device_slots``)."""
    return ALWAYS_APPLICABLE | (devices or DeviceCatalog()).device_metrics()


SlotAmounts = Mapping[str, Decimal | float | int]
"""Requested slot -> amount, as the session asked (``{"cpu": 2, "cuda.shares": 0.5}``)."""


_PREFIXES_OF: dict[tuple[str, ...], frozenset[str]] = {}
"""Requested slot names -> their device prefixes (sessions ask for a handful of slot sets; the sweep asks for each)."""
_MAX_REMEMBERED = 1024


def requested_device_prefixes(requested_slots: SlotAmounts) -> frozenset[str]:
    """The device prefixes of every slot requested with a non-zero amount."""
    slots = tuple([slot for slot, amount in requested_slots.items() if amount])
    prefixes = _PREFIXES_OF.get(slots)
    if prefixes is None:
        if len(_PREFIXES_OF) >= _MAX_REMEMBERED:
            _PREFIXES_OF.clear()
        prefixes = _PREFIXES_OF[slots] = frozenset({device_prefix(slot) for slot in slots})
    return prefixes


def metric_applies(metric: str, device_prefixes: frozenset[str]) -> bool:
    """Whether ``metric`` is judged for a session whose non-zero slots have ``device_prefixes``."""
    return metric in ALWAYS_APPLICABLE or metric_prefix(metric) in device_prefixes
