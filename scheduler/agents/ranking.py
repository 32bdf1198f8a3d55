"""How agents are compared: slot priority order and unused accelerator kinds (shared by every built-in selector)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from devices.catalog import device_prefix

__all__ = ["NON_ACCELERATOR_PREFIXES", "accelerator_kinds", "order_slots", "unused_accelerator_kinds"]

NON_ACCELERATOR_PREFIXES = frozenset({"cpu", "mem"})
DRIVER_MARKER = "driver:"


def order_slots(slots: Iterable[str], priority: Sequence[str]) -> list[str]:
    """Slots in priority order: an exact name or its device prefix (``cuda.shares`` ranks with ``cuda``) takes that
    rank; slots not in the list come after, alphabetically. (Backend.AI HEAD dropped the prefix rule; we keep it.)"""
    rank = {name: index for index, name in enumerate(priority)}

    def key(slot: str) -> tuple[int, str]:
        return rank.get(slot, rank.get(device_prefix(slot), len(priority))), slot

    return sorted(slots, key=key)


def accelerator_kinds(capacity_slots: Iterable[str]) -> frozenset[str]:
    """Device kinds an agent offers, from the slots it has a non-zero capacity of; cpu and mem are not accelerators,
    nor are the ``driver:<name>`` marker slots (scheduler.snapshot): a healthy driver is not scarce."""
    kinds = frozenset(device_prefix(slot) for slot in capacity_slots if not slot.startswith(DRIVER_MARKER))
    return kinds - NON_ACCELERATOR_PREFIXES


def unused_accelerator_kinds(capacity_slots: Iterable[str], requested_slots: Iterable[str]) -> int:
    """How many accelerator kinds of the agent the request leaves unused: a CPU-only session prefers CPU-only agents,
    so GPUs stay free for the sessions that need them. Kinds, not slots: ``cuda.device`` + ``cuda.mem`` count once."""
    return len(accelerator_kinds(capacity_slots) - {device_prefix(slot) for slot in requested_slots})
