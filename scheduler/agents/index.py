"""Sorted agent index for ``concentrated`` / ``dispersed``: a placement costs O(log agents), not O(agents).

One index per request *signature* (the tuple of slot positions a request asks for, in priority order). Agents
lacking any of those slots are not members. Members are split into tiers by unused accelerator kinds (fewer first)
and each tier is a list of keys sorted ascending:

* concentrated: ``(avail[k1], avail[k2], ..., ordinal)``  - the first key with ``avail[k1] >= need[k1]`` that fits
  on every slot is the smallest fitting key, i.e. the least remaining;
* dispersed: ``(-avail[k1], -avail[k2], ..., ordinal)`` - scanning from the front, the first fitting key is the
  most remaining; the scan stops where ``avail[k1] < need[k1]``.

Agent ordinals follow agent ids, so equal amounts break ties by id exactly as the reference selectors do.

Inside a tier the keys are bucketed by their first amount (a few hundred distinct values at most: amounts are
multiples of a preset's size), each bucket a sorted list: a search walks the buckets from the first that could fit
and skips a bucket on its one extreme second amount (its last key for concentrated, its first for dispersed) without
a bisection, so a bucket short of the second slot costs one comparison.

Dispersed also remembers, per request, the bucket where its last search found an agent: the buckets before it held
no agent that fits, and none ever will while amounts only go down (an agent only moves to a later bucket, and one
that did not fit does not fit with less), so the next search of the same request starts there. Anything that gives
amounts back (a rolled-back tentative placement, a released reservation) forgets these starts (``forget_starts``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter

from scheduler.agents.vectors import Demand, amounts_of

__all__ = ["CONCENTRATED", "DISPERSED", "PackingIndex"]

CONCENTRATED = 1
DISPERSED = -1


class _Tier:
    """The keys of one tier, bucketed by their first component: sorted ``values`` and, in the same order, ``lists``
    (one sorted list of keys per value; ``buckets`` maps a value to its list)."""

    __slots__ = ("buckets", "lists", "starts", "values")

    def __init__(self, keys: list[tuple[int, ...]]) -> None:
        self.buckets: dict[int, list[tuple[int, ...]]] = {}
        for key in sorted(keys):
            self.buckets.setdefault(key[0], []).append(key)
        self.values = sorted(self.buckets)
        self.lists = [self.buckets[value] for value in self.values]  # a scan walks these without a dict lookup
        self.starts: dict[tuple[int, ...], int] = {}  # dispersed: need -> first bucket value that may fit it

    def move(self, old: tuple[int, ...], new: tuple[int, ...]) -> None:
        """Replace ``old`` by ``new`` (the one operation of every placement, in one step)."""
        buckets = self.buckets
        bucket = buckets[old[0]]
        del bucket[bisect_left(bucket, old)]
        if not bucket:
            del buckets[old[0]]
            position = bisect_left(self.values, old[0])
            del self.values[position]
            del self.lists[position]
        target = buckets.get(new[0])
        if target is None:
            target = buckets[new[0]] = [new]
            position = bisect_left(self.values, new[0])
            self.values.insert(position, new[0])
            self.lists.insert(position, target)
        else:
            insort(target, new)

    def first(self) -> int | None:
        return self.lists[0][0][-1] if self.lists else None

    def scan_up(self, need: tuple[int, ...]) -> int | None:
        """Concentrated: the smallest key with every amount >= need."""
        lists = self.lists
        start = bisect_left(self.values, need[0])
        if len(need) == 1:
            return lists[start][0][-1] if start < len(lists) else None
        second, size = need[1], len(need)
        for position in range(start, len(lists)):
            bucket = lists[position]
            if bucket[-1][1] < second:  # even its most of the second slot is short
                continue
            for index in range(bisect_left(bucket, (bucket[0][0], second)), len(bucket)):
                key = bucket[index]
                slot = 2
                while slot < size and key[slot] >= need[slot]:
                    slot += 1
                if slot == size:
                    return key[-1]
        return None

    def scan_down(self, need: tuple[int, ...]) -> int | None:
        """Dispersed (keys negated): the smallest key with every negated amount <= -need."""
        values, lists = self.values, self.lists
        if len(need) == 1:
            return lists[0][0][-1] if values and values[0] <= -need[0] else None
        first, second, size = -need[0], -need[1], len(need)
        start = self.starts.get(need)
        for position in range(0 if start is None else bisect_left(values, start), len(values)):
            value = values[position]
            if value > first:  # from here on avail[k1] < need[k1]: nothing later fits
                return None
            bucket = lists[position]
            if bucket[0][1] > second:  # even its most of the second slot is short
                continue
            for key in bucket:  # a bucket starts with its most of the second slot: once short, the rest is
                if key[1] > second:
                    break
                slot = 2
                while slot < size and key[slot] <= -need[slot]:
                    slot += 1
                if slot == size:
                    self.starts[need] = value
                    return key[-1]
        return None


def _picker(positions: tuple[int, ...]) -> Callable[[Sequence[int]], tuple[int, ...]]:
    """``vector -> tuple(vector[p] for p in positions)``, in C for two positions or more (one per placement)."""
    if len(positions) > 1:
        return itemgetter(*positions)
    return lambda vector: tuple([vector[position] for position in positions])


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
        self._pick = _picker(positions)
        tier_numbers: dict[int, int] = {}
        self._key_of: list[tuple[int, ...]] = [()] * len(avail)  # by ordinal (lists: cheaper than dicts); () = none
        keys_by_tier: dict[int, list[tuple[int, ...]]] = {}
        for ordinal, tier in members:
            key = self._key(ordinal, avail[ordinal])
            tier_numbers[ordinal] = tier
            self._key_of[ordinal] = key
            keys_by_tier.setdefault(tier, []).append(key)
        tiers = {tier: _Tier(keys) for tier, keys in keys_by_tier.items()}
        self._tier_order = [tiers[tier] for tier in sorted(tiers)]
        self._tier_of: list[_Tier | None] = [None] * len(avail)
        for ordinal, tier in tier_numbers.items():
            self._tier_of[ordinal] = tiers[tier]

    def __contains__(self, ordinal: int) -> bool:
        return 0 <= ordinal < len(self._key_of) and bool(self._key_of[ordinal])

    def _key(self, ordinal: int, vector: Sequence[int]) -> tuple[int, ...]:
        if self.direction == CONCENTRATED:
            return (*self._pick(vector), ordinal)
        return (*[-vector[position] for position in self.positions], ordinal)

    def update(self, ordinal: int, vector: Sequence[int]) -> None:
        """Re-sort one member after its available amounts changed."""
        new = self._key(ordinal, vector)
        tier = self._tier_of[ordinal]
        assert tier is not None, f"agent {ordinal} is not a member"
        tier.move(self._key_of[ordinal], new)
        self._key_of[ordinal] = new

    def forget_starts(self) -> None:
        """Amounts went up (a rollback, a released reservation): a skipped bucket may fit again."""
        for tier in self._tier_order:
            tier.starts.clear()

    def find(self, demand: Demand) -> int | None:
        """The best member that fits ``demand`` (whose positions are exactly this index's), or None."""
        return self.search(amounts_of(demand))

    def search(self, need: tuple[int, ...]) -> int | None:
        """``find`` given the demand's amounts (``vectors.amounts_of``)."""
        for tier in self._tier_order:
            if not need:
                found = tier.first()
            elif self.direction == CONCENTRATED:
                found = tier.scan_up(need)
            else:
                found = tier.scan_down(need)
            if found is not None:
                return found
        return None
