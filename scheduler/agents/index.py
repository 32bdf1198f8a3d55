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
could fit and skips those short of the second slot without reading them, eight at a time where it can (``_Tier``'s
``lasts`` and ``blocks``). Further slots are checked against the agent's amounts themselves.

A dispersed bucket holds its order back to front: its in-bucket fields are the amounts themselves and its ordinal
field ``mask - ordinal``, so the best key is its last and a scan walks it from the end. The agent a search finds is
then near the end of its bucket, and taking its key out moves a few keys, not the whole bucket behind it (some 330
keys per placement at 10,000 agents, where one amount is shared by hundreds of agents). Putting it back into its new
bucket still moves about a third of that bucket (counted at 100,000 x 10,000: 130 keys of 367 behind it, median).

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
    """Amounts at ``positions`` as fields of one int: field 0 (the bucket value) is ``direction * amount +
    bases[0]``, the others (the key inside the bucket) ``amount + bases[i]``, never negative, ``shifts[i]`` bits up;
    the lowest ``shifts[1]`` bits hold the ordinal (concentrated) or ``mask - ordinal`` (dispersed: its buckets are
    read back to front).

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
        for field, position in enumerate(positions):
            amounts = [vector[position] for vector in vectors]
            most_held = max([vector[position] for vector in capacity], default=0)
            high = max([most_held, *amounts])
            low = min([0, *amounts]) - most_held
            self.bases.append(high if field == 0 and direction == DISPERSED else -low)
            self.spans.append(high - low)
        self.shifts = [0] * len(positions)
        shift = max(agents - 1, 1).bit_length()
        self.mask = (1 << shift) - 1
        for field in range(len(positions) - 1, 0, -1):
            self.shifts[field] = shift
            shift += self.spans[field].bit_length()

    def field(self, index: int, amount: int) -> int:
        encoded = (self.direction * amount if index == 0 else amount) + self.bases[index]
        if not 0 <= encoded <= self.spans[index]:
            raise ValueError(f"amount {amount} at slot {self.positions[index]} is outside the index's range")
        return encoded

    def encode(self, ordinal: int, vector: list[int]) -> tuple[int, int]:
        """(bucket value: field 0, in-bucket key: fields 1.. and the ordinal)."""
        positions, shifts = self.positions, self.shifts
        key = ordinal if self.direction == CONCENTRATED else self.mask - ordinal
        if not positions:
            return 0, key
        for index in range(1, len(positions)):
            key |= self.field(index, vector[positions[index]]) << shifts[index]
        return self.field(0, vector[positions[0]]), key

    def least(self, index: int, amount: int) -> int:
        """The smallest field ``index`` of an amount >= ``amount`` (in-bucket fields; concentrated: also field 0)."""
        return amount + self.bases[index]

    def most(self, amount: int) -> int:
        """Dispersed: the largest bucket value (field 0) of an amount >= ``amount``."""
        return self.bases[0] - amount

    def ordinal(self, key: int) -> int:
        """The agent of an in-bucket key."""
        low = key & self.mask
        return low if self.direction == CONCENTRATED else self.mask - low


_BLOCK = 8
"""Buckets per block of ``_Tier.blocks``."""
_EMPTY = -1
"""The last key of an empty bucket (``_Tier``): below every key, so skipped as short of every amount."""


class _Tier:
    """The keys of one tier, bucketed by their first field: sorted ``values`` and, in the same order, ``lists`` (one
    sorted list of in-bucket keys per value; ``buckets`` maps a value to its list) and ``lasts`` (the top field of
    each list's last key, ``key >> top``: its most of the second slot, an int below 2**62 that compiled code compares
    inline, where whole keys are bigger and compared by a generic call). A scan skips a bucket short of the second
    slot on it without reading the bucket. ``blocks[b]`` is at least the largest of ``lasts[b * _BLOCK:(b + 1) *
    _BLOCK]`` (a last that goes up raises it; one that goes down leaves it, until a scan that walked the whole block
    sets it to what it saw): a scan skips a block of buckets short of the second slot on one comparison (a
    concentrated scan skipped some 33 buckets one by one at 10,000 agents, 13 at 1,000: it starts at the bucket of the
    least left that may fit, and packing has left those buckets short of the second slot too).

    A bucket that empties stays, its last ``_EMPTY`` (below every key): taking it out would move every bucket after
    it one position and so rebuild the blocks after it, at nearly every placement of a busy pass.

    Only concentrated tiers keep ``lasts`` and ``blocks`` (``blocked``): a dispersed search mostly finds its agent in
    the first bucket it looks at (it starts where the same request last found one), and its placements take the
    last key of a bucket, so their upkeep cost more than it saved (measured: slower in a same-run A/B). A dispersed
    tier reads a bucket's last key itself and drops a bucket that empties."""

    __slots__ = ("blocked", "blocks", "buckets", "lasts", "lists", "starts", "top", "values")

    def __init__(self, keys: list[tuple[int, int]], top: int = 0, blocked: bool = True) -> None:
        """``keys``: (bucket value, in-bucket key) pairs; ``top``: where the in-bucket key's top field starts."""
        self.top, self.blocked = top, blocked
        self.buckets: dict[int, list[int]] = {}
        for value, key in sorted(keys):
            self.buckets.setdefault(value, []).append(key)
        self.values = sorted(self.buckets)
        self.lists = [self.buckets[value] for value in self.values]  # a scan walks these without a dict lookup
        self.lasts = [bucket[-1] >> top for bucket in self.lists] if blocked else []
        self.blocks: list[int] = []
        self._reblock()
        self.starts: dict[tuple[int, ...], int] = {}  # dispersed: need -> first bucket value that may fit it

    def remove(self, value: int, key: int, bucket: list[int] | None = None, at: int = -1) -> None:
        """Take ``key`` out of bucket ``value``. ``bucket``, ``at``: the bucket and the position in it where the key
        was when a search just found it (saves the bisection's cold comparisons), or None and -1."""
        if bucket is None:
            bucket = self.buckets[value]
            at = bisect_left(bucket, key)
        bucket.pop(at)  # pop, not del: compiled, a direct list call
        if self.blocked:
            if at == len(bucket):  # it was the last
                self._set_last(bisect_left(self.values, value), bucket[at - 1] if at else _EMPTY)
        elif not bucket:
            del self.buckets[value]
            position = bisect_left(self.values, value)
            self.values.pop(position)
            self.lists.pop(position)

    def add(self, value: int, key: int) -> None:
        target = self.buckets.get(value)
        if target is None:
            target = self.buckets[value] = [key]
            position = bisect_left(self.values, value)
            self.values.insert(position, value)
            self.lists.insert(position, target)
            if self.blocked:
                self.lasts.insert(position, key >> self.top)
                self._reblock()
        elif self.blocked and (not target or key > target[-1]):  # mostly (the agent placed had the most it needed)
            target.append(key)
            self._set_last(bisect_left(self.values, value), key)
        else:
            insort(target, key)

    def _set_last(self, position: int, key: int) -> None:
        """Bucket ``position`` ends with ``key`` now (``_EMPTY``: it is empty)."""
        last = self.lasts[position] = key >> self.top
        block = position // _BLOCK
        if last > self.blocks[block]:
            self.blocks[block] = last

    def _reblock(self) -> None:
        """After a bucket came or went (the buckets after it moved one position)."""
        lasts = self.lasts
        self.blocks = [max(lasts[start : start + _BLOCK]) for start in range(0, len(lasts), _BLOCK)]

    def first_reaching(self, position: int, least: int) -> int:
        """The first bucket from ``position`` on whose last key's top field is >= ``least`` (0: the first bucket not
        empty; ``len(values)``: none)."""
        if not self.blocked:  # no bucket is empty
            lists = self.lists
            while position < len(lists) and lists[position][-1] >> self.top < least:
                position += 1
            return position
        lasts, blocks, size = self.lasts, self.blocks, len(self.lasts)
        while position < size:
            if position % _BLOCK:  # inside a block: bucket by bucket up to the next
                if lasts[position] >= least:
                    return position
                position += 1
                continue
            block = position // _BLOCK
            if blocks[block] < least:
                position += _BLOCK
                continue
            end, most = min(position + _BLOCK, size), _EMPTY
            while position < end:
                last = lasts[position]
                if last >= least:
                    return position
                if last > most:
                    most = last
                position += 1
            blocks[block] = most  # walked whole: what its largest is now
        return size


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
        self._tier_of: list[_Tier | None] = [None] * len(avail)  # by ordinal (a list: cheaper than a dict)
        keys_by_tier: dict[int, list[tuple[int, int]]] = {}
        encoded: list[tuple[int, int, int, int]] = []
        for ordinal, tier in listed:
            value, key = encoding.encode(ordinal, avail[ordinal])
            encoded.append((ordinal, tier, value, key))
            keys_by_tier.setdefault(tier, []).append((value, key))
        top = encoding.shifts[1] if len(positions) > 1 else 0
        tiers = {tier: _Tier(keys, top, direction == CONCENTRATED) for tier, keys in keys_by_tier.items()}
        self._tier_order = [tiers[tier] for tier in sorted(tiers)]
        for ordinal, tier, _, _ in encoded:
            self._tier_of[ordinal] = tiers[tier]
        self._found = -1  # the agent the last search found, its bucket and where its key is in it (``search``)
        self._found_value = 0
        self._found_bucket: list[int] = []
        self._found_at = 0

    def __contains__(self, ordinal: int) -> bool:
        return 0 <= ordinal < len(self._tier_of) and self._tier_of[ordinal] is not None

    def take(self, ordinal: int, vector: list[int]) -> None:
        """Before an agent's amounts change: take its key out (``vector``: its amounts still unchanged; nothing to
        do if it is not a member). ``put`` puts it back, re-sorted, once they have changed.

        The key is not stored per agent: a placement would read it cold (an object and a big int per agent and
        index, scattered over memory, the more the more agents). Right after a search found the agent, it is where
        the search left it; otherwise the unchanged amounts give it again."""
        tier = self._tier_of[ordinal]
        if tier is None:
            return
        if ordinal == self._found:  # placed right after this index found it: mostly
            self._found = -1
            bucket, at = self._found_bucket, self._found_at
            if at < len(bucket) and self._encoding.ordinal(bucket[at]) == ordinal:  # an agent has one key
                tier.remove(self._found_value, bucket[at], bucket, at)
                return
        self._found = -1
        value, key = self._encoding.encode(ordinal, vector)
        tier.remove(value, key)

    def put(self, ordinal: int, vector: list[int]) -> None:
        """After ``take``: the agent's key for its changed amounts ``vector``."""
        tier = self._tier_of[ordinal]
        if tier is not None:
            value, key = self._encoding.encode(ordinal, vector)
            tier.add(value, key)

    def forget_starts(self) -> None:
        """Amounts went up (a rollback, a released reservation): a skipped bucket may fit again."""
        for tier in self._tier_order:
            tier.starts.clear()

    def find(self, demand: Demand) -> int | None:
        """The best member that fits ``demand`` (whose positions are exactly this index's), or None."""
        return self.search(amounts_of(demand))

    def search(self, need: tuple[int, ...]) -> int | None:
        """``find`` given the demand's amounts (``vectors.amounts_of``). Remembers where in its bucket the key of the
        agent found is (``take`` then takes it out without a bisection)."""
        for tier in self._tier_order:
            if not need:
                position = tier.first_reaching(0, 0)
                found = self._first(tier, position) if position < len(tier.lists) else None
            elif self.direction == CONCENTRATED:
                found = self._scan_up(tier, need)
            else:
                found = self._scan_down(tier, need)
            if found is not None:
                self._found = found
                return found
        self._found = -1
        return None

    def _first(self, tier: _Tier, position: int) -> int:
        """The agent of the best key of bucket ``position``, remembered as found there."""
        bucket = tier.lists[position]
        self._found_value, self._found_bucket = tier.values[position], bucket
        self._found_at = 0 if self.direction == CONCENTRATED else len(bucket) - 1
        return self._encoding.ordinal(bucket[self._found_at])

    def _found_in(self, tier: _Tier, position: int, at: int) -> int:
        """The agent of key ``at`` of bucket ``position``, remembered as found there."""
        bucket = tier.lists[position]
        self._found_value, self._found_bucket, self._found_at = tier.values[position], bucket, at
        return self._encoding.ordinal(bucket[at])

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
            start = tier.first_reaching(start, 0)  # the first bucket not empty
            return self._first(tier, start) if start < len(lists) else None
        enough = encoding.least(1, need[1])  # the least field with enough of the second slot
        second = enough << encoding.shifts[1]  # the least in-bucket key with enough of it
        position = tier.first_reaching(start, enough)  # the buckets before it are short of the second slot
        while position < len(lists):
            bucket = lists[position]
            for index in range(bisect_left(bucket, second), len(bucket)):
                ordinal = encoding.ordinal(bucket[index])
                if self._fits_beyond_second(ordinal, need):
                    return self._found_in(tier, position, index)
            position = tier.first_reaching(position + 1, enough)
        return None

    def _scan_down(self, tier: _Tier, need: tuple[int, ...]) -> int | None:
        """Dispersed (bucket values of negated amounts, buckets read back to front): the first key, in that order,
        whose every amount >= need."""
        encoding, values, lists = self._encoding, tier.values, tier.lists
        first = encoding.most(need[0])
        if len(need) == 1:
            position = tier.first_reaching(0, 0)  # the first bucket not empty
            return self._first(tier, position) if position < len(values) and values[position] <= first else None
        second = encoding.least(1, need[1]) << encoding.shifts[1]  # the least in-bucket key with enough of slot 2
        start = tier.starts.get(need)
        for position in range(0 if start is None else bisect_left(values, start), len(values)):
            value = values[position]
            if value > first:  # from here on avail[k1] < need[k1]: nothing later fits
                return None
            bucket = lists[position]
            if bucket[-1] < second:  # even its most of the second slot is short
                continue
            # a bucket ends with its most of the second slot: once short, the rest (towards its front) is
            for index in range(len(bucket) - 1, -1, -1):
                key = bucket[index]
                if key < second:
                    break
                ordinal = encoding.ordinal(key)
                if self._fits_beyond_second(ordinal, need):
                    tier.starts[need] = value
                    return self._found_in(tier, position, index)
        return None
