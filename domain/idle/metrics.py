"""Utilization metric names, and which of them apply to a session.

A metric is a percentage named ``<prefix>_<what>``: ``cpu_util`` (percent of the allocated cores), ``mem``
(percent of the allocated memory), and per accelerator ``<prefix>_util`` (busy time) and ``<prefix>_mem``
(device memory in use), where ``<prefix>`` is the device prefix of the resource slots (``cuda`` for
``cuda.device`` / ``cuda.shares``).

A device metric applies only to a session that requests a non-zero amount of some slot with that prefix:
judging ``cuda_util`` of a CPU-only session would always find it "idle" (Backend.AI excludes these too).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from types import MappingProxyType

from domain.slots import device_prefix

CPU_UTIL = "cpu_util"
MEM = "mem"
ALWAYS_APPLICABLE = frozenset({CPU_UTIL, MEM})
"""Every session has cores and memory, so these are checked whatever it requested."""

DEVICE_METRIC_PREFIXES: Mapping[str, str] = MappingProxyType({"nvidia/gpu": "cuda", "amd/gpu": "rocm"})
"""Nomad device ``<Vendor>/<Type>`` → the slot/metric prefix Caravan uses for it."""

DEVICE_METRIC_KINDS = ("util", "mem")

KNOWN_METRICS = frozenset(
    ALWAYS_APPLICABLE
    | {f"{prefix}_{kind}" for prefix in DEVICE_METRIC_PREFIXES.values() for kind in DEVICE_METRIC_KINDS}
)
"""Every metric a policy file may name a threshold for."""


def metric_prefix(metric: str) -> str:
    """``cuda_util`` -> ``cuda``; ``mem`` -> ``mem``."""
    return metric.split("_", 1)[0]


SlotAmounts = Mapping[str, Decimal | float | int]
"""Requested slot -> amount, as the session asked (``{"cpu": 2, "cuda.shares": 0.5}``)."""


def requested_device_prefixes(requested_slots: SlotAmounts) -> frozenset[str]:
    """The device prefixes of every slot requested with a non-zero amount."""
    return frozenset({device_prefix(slot) for slot, amount in requested_slots.items() if amount})


def metric_applies(metric: str, device_prefixes: frozenset[str]) -> bool:
    """Whether ``metric`` is judged for a session whose non-zero slots have ``device_prefixes``."""
    return metric in ALWAYS_APPLICABLE or metric_prefix(metric) in device_prefixes
