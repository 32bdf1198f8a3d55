"""Sorted agent index for ``concentrated`` / ``dispersed``: a placement costs O(log agents), not O(agents).

One index per request *signature* (the tuple of slot positions a request asks for, in priority order). Agents
lacking any of those slots are not members. Members are split into tiers by unused accelerator kinds (fewer first)
and each tier is a list of keys sorted ascending:

* concentrated: ``(avail[k1], avail[k2], ..., ordinal)``  - the first key with ``avail[k1] >= need[k1]`` that fits
  on every slot is the smallest fitting key, i.e. the least remaining;
* dispersed: ``(-avail[k1], -avail[k2], ..., ordinal)`` - scanning from the front, the first fitting key is the
  most remaining; the scan stops where ``avail[k1] < need[k1]``.

Agent ordinals follow agent ids, so equal amounts break ties by id exactly as the reference selectors do.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence

from scheduler.agents.vectors import Demand, amounts_of

__all__ = ["CONCENTRATED", "DISPERSED", "PackingIndex"]

CONCENTRATED = 1
DISPERSED = -1


class PackingIndex:
    def __init__(
        self,
        positions: tuple[int, ...],
        direction: int,
        members: Iterable[tuple[int, int]],
        avail: Sequence[Sequence[int]],
    ) -> None:
        """``members``: (agent ordinal, unused accelerator kinds) of every agent having all ``positions``."""
        self.positions = positions
        self.direction = direction
        self._tier_of: dict[int, int] = {}
        self._key_of: dict[int, tuple[int, ...]] = {}
        self._tiers: dict[int, list[tuple[int, ...]]] = {}
        for ordinal, tier in members:
            key = self._key(ordinal, avail[ordinal])
            self._tier_of[ordinal] = tier
            self._key_of[ordinal] = key
            self._tiers.setdefault(tier, []).append(key)
        for keys in self._tiers.values():
            keys.sort()
        self._tier_order = sorted(self._tiers)

    def __contains__(self, ordinal: int) -> bool:
        return ordinal in self._key_of

    def _key(self, ordinal: int, vector: Sequence[int]) -> tuple[int, ...]:
        direction = self.direction
        return (*(direction * vector[position] for position in self.positions), ordinal)

    def update(self, ordinal: int, vector: Sequence[int]) -> None:
        """Re-sort one member after its available amounts changed."""
        old = self._key_of[ordinal]
        keys = self._tiers[self._tier_of[ordinal]]
        del keys[bisect_left(keys, old)]
        new = self._key(ordinal, vector)
        self._key_of[ordinal] = new
        insort(keys, new)

    def find(self, demand: Demand) -> int | None:
        """The best member that fits ``demand`` (whose positions are exactly this index's), or None."""
        need = amounts_of(demand)
        for tier in self._tier_order:
            keys = self._tiers[tier]
            if not need:
                if keys:
                    return keys[0][-1]
                continue
            found = self._scan_up(keys, need) if self.direction == CONCENTRATED else self._scan_down(keys, need)
            if found is not None:
                return found
        return None

    # Both scans walk the keys in runs of equal first amount ("groups"), jumping with bisect: inside a group the keys
    # are sorted by the second slot, so the agents short of it are skipped without being looked at. Amounts are
    # integers, hence the next group starts at ``(first + 1,)``.

    @staticmethod
    def _scan_up(keys: list[tuple[int, ...]], need: tuple[int, ...]) -> int | None:
        start, end = bisect_left(keys, (need[0],)), len(keys)
        if len(need) == 1:
            return keys[start][-1] if start < end else None
        rest = need[2:]
        while start < end:
            first = keys[start][0]
            index = bisect_left(keys, (first, need[1]), start)  # lands in the next group when this one is short
            while index < end and keys[index][0] == first:
                key = keys[index]
                if all(have >= want for have, want in zip(key[2:-1], rest, strict=True)):
                    return key[-1]
                index += 1
            start = index
        return None

    @staticmethod
    def _scan_down(keys: list[tuple[int, ...]], need: tuple[int, ...]) -> int | None:
        start, end = 0, len(keys)
        negated = tuple(-want for want in need)
        if len(need) == 1:
            return keys[0][-1] if keys and keys[0][0] <= negated[0] else None
        rest = negated[2:]
        while start < end:
            first = keys[start][0]
            if first > negated[0]:  # from here on avail[k1] < need[k1]: nothing later fits
                return None
            index = start  # a group starts with its most of the second slot: once short, the whole rest is
            while index < end and keys[index][0] == first and keys[index][1] <= negated[1]:
                if all(have <= want for have, want in zip(keys[index][2:-1], rest, strict=True)):
                    return keys[index][-1]
                index += 1
            start = bisect_left(keys, (first + 1,), index)
        return None
