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
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Sequence

from scheduler.agents.vectors import Demand, amounts_of

__all__ = ["CONCENTRATED", "DISPERSED", "PackingIndex"]

CONCENTRATED = 1
DISPERSED = -1


class _Tier:
    """The keys of one tier, bucketed by their first component (sorted ``values``, one sorted list per value).

    For every second-slot amount a search has asked for, ``lists`` keeps the sorted values of the buckets holding an
    agent with at least that much of the second slot: a search walks only those (agents short of memory but with
    cores left would otherwise be skipped one bucket at a time, dozens per search on a full cluster)."""

    __slots__ = ("buckets", "direction", "lists", "thresholds", "values")

    def __init__(self, keys: list[tuple[int, ...]], direction: int) -> None:
        self.buckets: dict[int, list[tuple[int, ...]]] = {}
        for key in sorted(keys):
            self.buckets.setdefault(key[0], []).append(key)
        self.values = sorted(self.buckets)
        self.direction = direction
        self.thresholds: list[int] = []
        self.lists: dict[int, list[int]] = {}

    def _best(self, value: int) -> int | None:
        """The most of the second slot an agent of bucket ``value`` has (None: no such bucket)."""
        bucket = self.buckets.get(value)
        if bucket is None:
            return None
        return bucket[-1][1] if self.direction == CONCENTRATED else -bucket[0][1]

    def with_second(self, amount: int) -> list[int]:
        """The sorted bucket values having an agent with at least ``amount`` of the second slot (kept current)."""
        found = self.lists.get(amount)
        if found is None:
            found = self.lists[amount] = [value for value in self.values if self._best(value) >= amount]  # type: ignore[operator]
            insort(self.thresholds, amount)
        return found

    def _relist(self, value: int, before: int | None, after: int | None) -> None:
        """Bucket ``value``'s best second amount went from ``before`` to ``after``: update the lists it crossed."""
        if before == after:
            return
        low: int | None
        if before is None or after is None:  # a bucket made or emptied: every list up to its best
            low, high, joins = None, after if before is None else before, before is None
        else:
            low, high, joins = min(before, after), max(before, after), after > before
        thresholds = self.thresholds
        assert high is not None
        crossed = thresholds[0 if low is None else bisect_right(thresholds, low) : bisect_right(thresholds, high)]
        for threshold in crossed:
            values = self.lists[threshold]
            if joins:
                insort(values, value)
            else:
                del values[bisect_left(values, value)]

    def move(self, old: tuple[int, ...], new: tuple[int, ...]) -> None:
        """``remove(old)`` then ``add(new)`` in one step (the one operation of every placement)."""
        buckets, values, thresholds = self.buckets, self.values, self.thresholds
        was, now = old[0], new[0]
        if thresholds:
            before_was, before_now = self._best(was), self._best(now)
        bucket = buckets[was]
        del bucket[bisect_left(bucket, old)]
        if not bucket:
            del buckets[was]
            del values[bisect_left(values, was)]
        target = buckets.get(now)
        if target is None:
            buckets[now] = [new]
            insort(values, now)
        else:
            insort(target, new)
        if thresholds:
            self._relist(was, before_was, self._best(was))
            if now != was:
                self._relist(now, before_now, self._best(now))

    def first(self) -> int | None:
        return self.buckets[self.values[0]][0][-1] if self.values else None

    def scan_up(self, need: tuple[int, ...]) -> int | None:
        """Concentrated: the smallest key with every amount >= need."""
        buckets = self.buckets
        if len(need) == 1:
            values = self.values
            start = bisect_left(values, need[0])
            return buckets[values[start]][0][-1] if start < len(values) else None
        second, rest = need[1], need[2:]
        values = self.with_second(second)
        for position in range(bisect_left(values, need[0]), len(values)):
            bucket = buckets[values[position]]
            for index in range(bisect_left(bucket, (bucket[0][0], second)), len(bucket)):
                key = bucket[index]
                if all(have >= want for have, want in zip(key[2:-1], rest, strict=True)):
                    return key[-1]
        return None

    def scan_down(self, need: tuple[int, ...]) -> int | None:
        """Dispersed (keys negated): the smallest key with every negated amount <= -need."""
        buckets = self.buckets
        negated = tuple(-want for want in need)
        if len(need) == 1:
            values = self.values
            return buckets[values[0]][0][-1] if values and values[0] <= negated[0] else None
        second, rest = negated[1], negated[2:]
        for value in self.with_second(need[1]):
            if value > negated[0]:  # from here on avail[k1] < need[k1]: nothing later fits
                return None
            for key in buckets[value]:  # a bucket starts with its most of the second slot: once short, the rest is
                if key[1] > second:
                    break
                if all(have <= want for have, want in zip(key[2:-1], rest, strict=True)):
                    return key[-1]
        return None


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
        tier_numbers: dict[int, int] = {}
        self._key_of: dict[int, tuple[int, ...]] = {}
        keys_by_tier: dict[int, list[tuple[int, ...]]] = {}
        for ordinal, tier in members:
            key = self._key(ordinal, avail[ordinal])
            tier_numbers[ordinal] = tier
            self._key_of[ordinal] = key
            keys_by_tier.setdefault(tier, []).append(key)
        tiers = {tier: _Tier(keys, direction) for tier, keys in keys_by_tier.items()}
        self._tier_order = [tiers[tier] for tier in sorted(tiers)]
        self._tier_of = {ordinal: tiers[tier] for ordinal, tier in tier_numbers.items()}

    def __contains__(self, ordinal: int) -> bool:
        return ordinal in self._key_of

    def _key(self, ordinal: int, vector: Sequence[int]) -> tuple[int, ...]:
        if self.direction == CONCENTRATED:
            return (*[vector[position] for position in self.positions], ordinal)
        return (*[-vector[position] for position in self.positions], ordinal)

    def update(self, ordinal: int, vector: Sequence[int]) -> None:
        """Re-sort one member after its available amounts changed."""
        key_of = self._key_of
        if self.direction == CONCENTRATED:
            new = (*[vector[position] for position in self.positions], ordinal)
        else:
            new = (*[-vector[position] for position in self.positions], ordinal)
        self._tier_of[ordinal].move(key_of[ordinal], new)
        key_of[ordinal] = new

    def find(self, demand: Demand) -> int | None:
        """The best member that fits ``demand`` (whose positions are exactly this index's), or None."""
        need = amounts_of(demand)
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
