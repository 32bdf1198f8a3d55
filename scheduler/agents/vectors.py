"""The one conversion point between ``ResourceSlots`` (exact Decimals) and the pass's integer vectors.

Inside a pass every amount is an ``int`` of milli-units (cores * 1000, bytes * 1000, ...): slot math is then exact
integer math over short lists, an order of magnitude cheaper than Decimal. Count slots are kept to 0.001 and bytes
are whole, so the conversion is exact for parsed input; anything finer is rounded against over-commit (requests
and occupancy up, capacity down).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from operator import itemgetter

from domain.slots import ResourceSlots
from scheduler.agents.ranking import order_slots

__all__ = ["MILLI", "Demand", "SlotCodec", "amounts_of", "positions_of"]

MILLI = 1000

Demand = tuple[tuple[int, int], ...]
"""A request as (slot position, milli-amount > 0) pairs, in slot priority order."""


def positions_of(demand: Demand) -> tuple[int, ...]:
    """The demand's *signature*: which slots it asks for (agents lacking one of them can never host it)."""
    return tuple(map(_first, demand))


def amounts_of(demand: Demand) -> tuple[int, ...]:
    return tuple(map(_second, demand))


_first, _second = itemgetter(0), itemgetter(1)


def _to_milli(amount: Decimal, *, round_up: bool) -> int:
    return int((amount * MILLI).to_integral_value(ROUND_CEILING if round_up else ROUND_FLOOR))


class SlotCodec:
    """Slot positions for one resource group, ordered by the group's resource priority."""

    def __init__(self, slot_names: Iterable[str], priority: Sequence[str]) -> None:
        self.names: tuple[str, ...] = tuple(order_slots(set(slot_names), priority))
        self.position: dict[str, int] = {name: index for index, name in enumerate(self.names)}
        self._demands: dict[ResourceSlots, Demand] = {}  # sessions mostly reuse a few presets

    def __len__(self) -> int:
        return len(self.names)

    def dense(self, slots: ResourceSlots, *, round_up: bool) -> list[int]:
        vector = [0] * len(self.names)
        for name, amount in slots.items():
            vector[self.position[name]] = _to_milli(amount, round_up=round_up)
        return vector

    def demand(self, slots: ResourceSlots) -> Demand:
        demand = self._demands.get(slots)
        if demand is None:
            pairs = ((self.position[name], _to_milli(amount, round_up=True)) for name, amount in slots.items())
            demand = self._demands[slots] = tuple(sorted(pair for pair in pairs if pair[1] > 0))
        return demand

    def to_slots(self, pairs: Iterable[tuple[int, int]]) -> ResourceSlots:
        return ResourceSlots(
            {self.names[position]: Decimal(amount).scaleb(-3).normalize() for position, amount in pairs}
        )

    def dense_to_slots(self, vector: Sequence[int]) -> ResourceSlots:
        return self.to_slots(enumerate(vector))
