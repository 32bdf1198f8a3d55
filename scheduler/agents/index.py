"""Sorted agent index for ``concentrated`` / ``dispersed``: a placement costs O(log agents), not O(agents).

One index per request *signature* (the tuple of slot positions a request asks for, in priority order). Agents
lacking any of those slots are not members. Members are split into tiers by unused accelerator kinds (fewer first)
and each tier is sorted ascending by

* concentrated: ``(avail[k1], avail[k2], ..., ordinal)``  - the first key with ``avail[k1] >= need[k1]`` that fits
  on every slot is the smallest fitting key, i.e. the least remaining;
* dispersed: ``(-avail[k1], -avail[k2], ..., ordinal)`` - scanning from the front, the first fitting key is the
  most remaining; the scan stops where ``avail[k1] < need[k1]``.

Agent ordinals follow agent ids, so equal amounts break ties by id exactly as the reference selectors do.

Each key is one non-negative ``int`` (``_Encoding``): every amount shifted to a field of fixed width, the ordinal in
the lowest bits, so the ints sort exactly as those tuples and a bisection compares ints, not tuples. Inside a tier
the keys are bucketed by their first field (a few hundred distinct values at most: amounts are multiples of a
preset's size), each bucket a sorted list of the rest of the key: a search walks the buckets from the first that
could fit and skips a bucket on its one extreme second amount (its last key for concentrated, its first for
dispersed) without a bisection, so a bucket short of the second slot costs one comparison. Further slots are checked
against the agent's amounts themselves.

Dispersed also remembers, per request, the bucket where its last search found an agent: the buckets before it held
no agent that fits, and none ever will while amounts only go down (an agent only moves to a later bucket, and one
that did not fit does not fit with less), so the next search of the same request starts there. Anything that gives
amounts back (a rolled-back tentative placement, a released reservation) forgets these starts (``forget_starts``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

from scheduler.agents.vectors import Demand, amounts_of

__all__ = ["CONCENTRATED", "DISPERSED", "PackingIndex"]

CONCENTRATED = 1
DISPERSED = -1


class _Encoding:
    """Amounts at ``positions`` as fields of one int: field ``i`` is ``direction * amount + bases[i]``, never
    negative, ``shifts[i]`` bits up; the ordinal takes the lowest ``shifts[-1]`` bits. Field 0 is the bucket value,
    the others and the ordinal the key inside the bucket.

    The bounds come from the pass's invariants: an agent's amount never rises above where the pass found it (only
    placements and holds are taken, and only they are given back), and falls below zero only by one hold of at most
    its capacity; ``field`` checks them anyway (a wrong order would place silently wrong)."""

    __slots__ = ("bases", "direction", "mask", "positions", "shifts", "spans")

    def __init__(
        self,
        positions: tuple[int, ...],
        direction: int,
        vectors: list[list[int]],
        capacity: list[list[int]],
        agents: int,
    ) -> None:
        self.positions = positions
        self.direction = direction
        self.bases: list[int] = []
        self.spans: list[int] = []
        for position in positions:
            amounts = [vector[position] for vector in vectors]
            most_held = max([vector[position] for vector in capacity], default=0)
            high = max([most_held, *amounts])
            low = min([0, *amounts]) - most_held
            self.bases.append(-low if direction == CONCENTRATED else high)
            self.spans.append(high - low)
        self.shifts = [0] * len(positions)
        shift = max(agents - 1, 1).bit_length()
        self.mask = (1 << shift) - 1
        for field in range(len(positions) - 1, 0, -1):
            self.shifts[field] = shift
            shift += self.spans[field].bit_length()

    def field(self, index: int, amount: int) -> int:
        encoded = self.direction * amount + self.bases[index]
        if not 0 <= encoded <= self.spans[index]:
            raise ValueError(f"amount {amount} at slot {self.positions[index]} is outside the index's range")
        return encoded

    def encode(self, ordinal: int, vector: list[int]) -> tuple[int, int]:
        """(bucket value: field 0, in-bucket key: fields 1.. and the ordinal)."""
        positions, shifts = self.positions, self.shifts
        if not positions:
            return 0, ordinal
        key = ordinal
        for index in range(1, len(positions)):
            key |= self.field(index, vector[positions[index]]) << shifts[index]
        return self.field(0, vector[positions[0]]), key

    def least(self, index: int, amount: int) -> int:
        """Concentrated: the smallest field ``index`` of an amount >= ``amount``."""
        return amount + self.bases[index]

    def most(self, index: int, amount: int) -> int:
        """Dispersed: the largest field ``index`` of an amount >= ``amount``."""
        return self.bases[index] - amount


class _Tier:
    """The keys of one tier, bucketed by their first field: sorted ``values`` and, in the same order, ``lists`` (one
    sorted list of in-bucket keys per value; ``buckets`` maps a value to its list)."""

    __slots__ = ("buckets", "lists", "starts", "values")

    def __init__(self, keys: list[tuple[int, int]]) -> None:
        self.buckets: dict[int, list[int]] = {}
        for value, key in sorted(keys):
            self.buckets.setdefault(value, []).append(key)
        self.values = sorted(self.buckets)
        self.lists = [self.buckets[value] for value in self.values]  # a scan walks these without a dict lookup
        self.starts: dict[tuple[int, ...], int] = {}  # dispersed: need -> first bucket value that may fit it

    def move(self, old_value: int, old: int, new_value: int, new: int, at: int = -1) -> None:
        """Replace key ``old`` of bucket ``old_value`` by ``new`` of ``new_value`` (every placement, in one step).
        ``at``: where ``old`` likely is in its bucket (a search just found it there), checked before it is used."""
        buckets = self.buckets
        bucket = buckets[old_value]
        if not (0 <= at < len(bucket) and bucket[at] == old):  # a hint saves the bisection's cold comparisons
            at = bisect_left(bucket, old)
        bucket.pop(at)  # pop, not del: compiled, a direct list call
        if not bucket:
            del buckets[old_value]
            position = bisect_left(self.values, old_value)
            self.values.pop(position)
            self.lists.pop(position)
        target = buckets.get(new_value)
        if target is None:
            target = buckets[new_value] = [new]
            position = bisect_left(self.values, new_value)
            self.values.insert(position, new_value)
            self.lists.insert(position, target)
        else:
            insort(target, new)


class _Member:
    """Where one agent's key sits in an index: its tier, bucket value and in-bucket key, together (a placement reads
    them for a cold agent: one object is one cache miss, where lists by ordinal were one per field, and an int above
    2**62 one more)."""

    __slots__ = ("key", "tier", "value")

    def __init__(self, tier: _Tier, value: int, key: int) -> None:
        self.tier = tier
        self.value = value
        self.key = key


class PackingIndex:
    def __init__(
        self,
        positions: tuple[int, ...],
        direction: int,
        members: Iterable[tuple[int, int]],
        avail: list[list[int]],
        capacity: list[list[int]],
    ) -> None:
        """``members``: (agent ordinal, unused accelerator kinds) of every agent having all ``positions``;
        ``avail`` and ``capacity``: every agent's amounts (lists: indexed without a generic call; ``avail`` is
        read, never written, by later searches)."""
        self.positions = positions
        self.direction = direction
        self._avail = avail
        listed = list(members)
        self._encoding = encoding = _Encoding(
            positions,
            direction,
            [avail[ordinal] for ordinal, _ in listed],
            [capacity[ordinal] for ordinal, _ in listed],
            len(avail),
        )
        self._member_of: list[_Member | None] = [None] * len(avail)  # by ordinal (a list: cheaper than a dict)
        keys_by_tier: dict[int, list[tuple[int, int]]] = {}
        encoded: list[tuple[int, int, int, int]] = []
        for ordinal, tier in listed:
            value, key = encoding.encode(ordinal, avail[ordinal])
            encoded.append((ordinal, tier, value, key))
            keys_by_tier.setdefault(tier, []).append((value, key))
        tiers = {tier: _Tier(keys) for tier, keys in keys_by_tier.items()}
        self._tier_order = [tiers[tier] for tier in sorted(tiers)]
        for ordinal, tier, value, key in encoded:
            self._member_of[ordinal] = _Member(tiers[tier], value, key)
        self._found = -1  # the agent the last search found, and where in its bucket its key is (``search``)
        self._found_at = 0

    def __contains__(self, ordinal: int) -> bool:
        return 0 <= ordinal < len(self._member_of) and self._member_of[ordinal] is not None

    def update(self, ordinal: int, vector: list[int]) -> None:
        """Re-sort one agent after its available amounts changed (nothing to do if it is not a member)."""
        member = self._member_of[ordinal]
        if member is None:
            return
        value, key = self._encoding.encode(ordinal, vector)
        at = self._found_at if ordinal == self._found else -1  # placed right after this index found it: mostly
        self._found = -1
        member.tier.move(member.value, member.key, value, key, at)
        member.value, member.key = value, key

    def forget_starts(self) -> None:
        """Amounts went up (a rollback, a released reservation): a skipped bucket may fit again."""
        for tier in self._tier_order:
            tier.starts.clear()

    def find(self, demand: Demand) -> int | None:
        """The best member that fits ``demand`` (whose positions are exactly this index's), or None."""
        return self.search(amounts_of(demand))

    def search(self, need: tuple[int, ...]) -> int | None:
        """``find`` given the demand's amounts (``vectors.amounts_of``). Remembers where in its bucket the key of the
        agent found is (``update`` then takes it out without a bisection)."""
        self._found_at = 0  # the scans set it when the key is not its bucket's first
        for tier in self._tier_order:
            if not need:
                found = tier.lists[0][0] & self._encoding.mask if tier.lists else None
            elif self.direction == CONCENTRATED:
                found = self._scan_up(tier, need)
            else:
                found = self._scan_down(tier, need)
            if found is not None:
                self._found = found
                return found
        self._found = -1
        return None

    def _fits_beyond_second(self, ordinal: int, need: tuple[int, ...]) -> bool:
        vector, positions = self._avail[ordinal], self.positions
        slot, size = 2, len(need)
        while slot < size and vector[positions[slot]] >= need[slot]:
            slot += 1
        return slot == size

    def _scan_up(self, tier: _Tier, need: tuple[int, ...]) -> int | None:
        """Concentrated: the smallest key with every amount >= need."""
        encoding, lists = self._encoding, tier.lists
        start = bisect_left(tier.values, encoding.least(0, need[0]))
        if len(need) == 1:
            return lists[start][0] & encoding.mask if start < len(lists) else None
        second = encoding.least(1, need[1]) << encoding.shifts[1]  # the least in-bucket key with enough of slot 2
        for position in range(start, len(lists)):
            bucket = lists[position]
            if bucket[-1] < second:  # even its most of the second slot is short
                continue
            for index in range(bisect_left(bucket, second), len(bucket)):
                ordinal = bucket[index] & encoding.mask
                if self._fits_beyond_second(ordinal, need):
                    self._found_at = index
                    return ordinal
        return None

    def _scan_down(self, tier: _Tier, need: tuple[int, ...]) -> int | None:
        """Dispersed (fields of negated amounts): the smallest key whose every amount >= need."""
        encoding, values, lists = self._encoding, tier.values, tier.lists
        first = encoding.most(0, need[0])
        if len(need) == 1:
            return lists[0][0] & encoding.mask if values and values[0] <= first else None
        beyond = (encoding.most(1, need[1]) + 1) << encoding.shifts[1]  # in-bucket keys short of slot 2 and up
        start = tier.starts.get(need)
        for position in range(0 if start is None else bisect_left(values, start), len(values)):
            value = values[position]
            if value > first:  # from here on avail[k1] < need[k1]: nothing later fits
                return None
            bucket = lists[position]
            if bucket[0] >= beyond:  # even its most of the second slot is short
                continue
            # a bucket starts with its most of the second slot: once short, the rest is
            for index in range(len(bucket)):
                key = bucket[index]
                if key >= beyond:
                    break
                ordinal = key & encoding.mask
                if self._fits_beyond_second(ordinal, need):
                    tier.starts[need] = value
                    self._found_at = index
                    return ordinal
        return None
