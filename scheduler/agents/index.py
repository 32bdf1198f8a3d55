"""Sorted agent index for ``concentrated`` / ``dispersed``: a placement costs O(log agents), not O(agents).

One index per request *signature* (the tuple of slot positions a request asks for, in priority order). Agents
lacking any of those slots are not members. Members are split into tiers by unused accelerator kinds (fewer first)
and each tier is sorted ascending by

* concentrated: ``(avail[k1], avail[k2], ..., ordinal)``  - the first key with ``avail[k1] >= need[k1]`` that fits
  on every slot is the smallest fitting key, i.e. the least remaining;
* dispersed: ``(-avail[k1], -avail[k2], ..., ordinal)`` - scanning from the front, the first fitting key is the
  most remaining; the scan stops where ``avail[k1] < need[k1]``.

Agent ordinals follow agent ids, so equal amounts break ties by id exactly as the reference selectors do.

Each amount is encoded as one non-negative word (``_Encoding``: shifted by a base, so the words sort as the amounts
do). Inside a tier the keys are bucketed by their first field (a few hundred distinct values at most: amounts are
multiples of a preset's size). Each bucket is one vector of machine integers (``librt.vecs``, compiled by mypyc), its
keys side by side, ``stride`` words each: the other amounts, then the ordinal. A bisection compares words in place
and an insertion moves them, where the buckets used to be lists of one big int per key, each a separate object read
cold (bench/README.md, ninth round). A search walks the buckets from the first that could fit and skips those short
of the second slot without reading them, eight at a time where it can (``_Tier``'s ``lasts`` and ``blocks``). Further
slots are checked against the key's own words.

A dispersed bucket holds its order back to front: its in-bucket words are the amounts themselves and its ordinal
word ``mask - ordinal``, so the best key is its last and a scan walks it from the end. The agent a search finds is
then near the end of its bucket, and taking its key out moves a few keys, not the whole bucket behind it (some 330
keys per placement at 10,000 agents, where one amount is shared by hundreds of agents). Putting it back into its new
bucket still moves about a third of that bucket (counted at 100,000 x 10,000: 130 keys of 367 behind it, median).

Dispersed also remembers, per request, the bucket where its last search found an agent: the buckets before it held
no agent that fits, and none ever will while amounts only go down (an agent only moves to a later bucket, and one
that did not fit does not fit with less), so the next search of the same request starts there. Anything that gives
amounts back (a rolled-back tentative placement, a released reservation) forgets these starts (``forget_starts``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from librt.vecs import append, extend, pop, vec
from mypy_extensions import i64

from scheduler.agents.vectors import Demand, amounts_of

__all__ = ["CONCENTRATED", "DISPERSED", "PackingIndex"]

CONCENTRATED = 1
DISPERSED = -1


class _Encoding:
    """Amounts at ``positions`` as words: field 0 (the bucket value) is ``direction * amount + bases[0]``, the others
    (the key inside the bucket, one word each) ``amount + bases[i]``, never negative; the key's last word is the
    ordinal (concentrated) or ``mask - ordinal`` (dispersed: its buckets are read back to front). Keys compare word by
    word, as the tuples they stand for.

    The bounds come from the pass's invariants: an agent's amount never rises above where the pass found it (only
    placements and holds are taken, and only they are given back), and falls below zero only by one hold of at most
    its capacity; ``field`` checks them anyway (a wrong order would place silently wrong)."""

    __slots__ = ("bases", "direction", "mask", "positions", "spans", "stride")

    def __init__(
        self,
        positions: tuple[int, ...],
        direction: int,
        vectors: list[vec[i64]],
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
        self.mask = max(agents - 1, 1)
        self.stride: i64 = max(len(positions), 1)
        """Words per in-bucket key: the fields after the first, and the ordinal's."""

    def field(self, index: int, amount: int) -> int:
        encoded = (self.direction * amount if index == 0 else amount) + self.bases[index]
        if not 0 <= encoded <= self.spans[index]:
            raise ValueError(f"amount {amount} at slot {self.positions[index]} is outside the index's range")
        return encoded

    def encode(self, ordinal: int, vector: vec[i64], key: vec[i64]) -> int:
        """The bucket value (field 0); the in-bucket key goes into ``key`` (``stride`` words, overwritten)."""
        positions = self.positions
        for index in range(1, len(positions)):
            key[index - 1] = self.field(index, vector[positions[index]])
        key[self.stride - 1] = ordinal if self.direction == CONCENTRATED else self.mask - ordinal
        return self.field(0, vector[positions[0]]) if positions else 0

    def least(self, index: int, amount: int) -> int:
        """The smallest field ``index`` of an amount >= ``amount`` (in-bucket fields; concentrated: also field 0)."""
        return amount + self.bases[index]

    def most(self, amount: int) -> int:
        """Dispersed: the largest bucket value (field 0) of an amount >= ``amount``."""
        return self.bases[0] - amount

    def ordinal(self, word: i64) -> int:
        """The agent of a key's last word."""
        return word if self.direction == CONCENTRATED else self.mask - word


def _below(bucket: vec[i64], at: i64, key: vec[i64], stride: i64) -> bool:
    """Whether key ``at`` of ``bucket`` sorts before ``key``."""
    base = at * stride
    for word in range(stride):
        mine, theirs = bucket[base + word], key[word]
        if mine != theirs:
            return mine < theirs
    return False


def _after(bucket: vec[i64], at: i64, key: vec[i64], stride: i64) -> bool:
    """Whether key ``at`` of ``bucket`` sorts after ``key``."""
    base = at * stride
    for word in range(stride):
        mine, theirs = bucket[base + word], key[word]
        if mine != theirs:
            return mine > theirs
    return False


def _bisect(bucket: vec[i64], key: vec[i64], stride: i64) -> i64:
    """The first key of ``bucket`` not before ``key`` (an index of keys, not words)."""
    low: i64 = 0
    high: i64 = len(bucket) // stride
    while low < high:
        middle = (low + high) // 2
        if _below(bucket, middle, key, stride):
            low = middle + 1
        else:
            high = middle
    return low


def _bisect_top(bucket: vec[i64], least: i64, stride: i64) -> i64:
    """The first key of ``bucket`` whose first word is at least ``least``."""
    low: i64 = 0
    high: i64 = len(bucket) // stride
    while low < high:
        middle = (low + high) // 2
        if bucket[middle * stride] < least:
            low = middle + 1
        else:
            high = middle
    return low


def _inserted(bucket: vec[i64], at: i64, key: vec[i64], stride: i64) -> vec[i64]:
    """``bucket`` with ``key`` inserted before key ``at`` (the keys behind it move up one place)."""
    size = len(bucket)
    bucket = extend(bucket, key)  # room for one more key (its words are put in place below)
    start = at * stride
    word = size - 1
    while word >= start:
        bucket[word + stride] = bucket[word]
        word -= 1
    for offset in range(stride):
        bucket[start + offset] = key[offset]
    return bucket


def _deleted(bucket: vec[i64], at: i64, stride: i64) -> vec[i64]:
    """``bucket`` without key ``at`` (the keys behind it move down one place)."""
    size = len(bucket)
    word = at * stride
    while word + stride < size:
        bucket[word] = bucket[word + stride]
        word += 1
    for _ in range(stride):
        bucket, _ = pop(bucket)
    return bucket


_BLOCK = 8
"""Buckets per block of ``_Tier.blocks``."""
CHUNK = 64
"""Keys per chunk of a dispersed bucket when a tier is built; a chunk grown to twice that is split in two."""
_EMPTY = -1
"""The last top word of an empty bucket (``_Tier``): below every word, so skipped as short of every amount."""


class _Tier:
    """The keys of one tier, bucketed by their first field: sorted ``values`` and, in the same order, ``lists`` (one
    sorted vector of in-bucket keys per value, ``stride`` words each: machine integers side by side, which a search and
    an insertion read and move without an object per key) and ``lasts`` (the first word of each bucket's last key: its
    most of the second slot). A scan skips a bucket short of the second slot on it without reading the bucket.
    ``blocks[b]`` is at least the largest of ``lasts[b * _BLOCK:(b + 1) * _BLOCK]`` (a last that goes up raises it;
    one that goes down leaves it, until a scan that walked the whole block sets it to what it saw): a scan skips a block
    of buckets short of the second slot on one comparison (a concentrated scan skipped some 33 buckets one by one at
    10,000 agents, 13 at 1,000: it starts at the bucket of the least left that may fit, and packing has left those
    buckets short of the second slot too).

    A bucket that empties stays, its last ``_EMPTY``: taking it out would move every bucket after it one position and
    so rebuild the blocks after it, at nearly every placement of a busy pass.

    Only concentrated tiers keep ``lasts`` and ``blocks`` (``blocked``): a dispersed search mostly finds its agent in
    the first bucket it looks at (it starts where the same request last found one), and its placements take the
    last key of a bucket, so their upkeep cost more than it saved (measured: slower in a same-run A/B). A dispersed
    tier reads a bucket's last key itself and drops a bucket that empties.

    A dispersed bucket is held in chunks (``chunk`` keys each when built, split in two at twice that): consecutive
    entries of ``values`` and ``lists`` with the same value, the largest keys first, so that walking the positions
    forward and each chunk back to front reads the bucket in its order. A placement puts the agent's key back into
    the bucket of its smaller amount, where an insertion moved a third of the bucket (some 130 keys at 100,000 x
    10,000, the pass's largest single cost in instructions: 18 % of ``drf/dispersed/greedy``, bench/README.md); in a
    chunk it moves a third of at most ``2 * chunk``. A concentrated placement mostly appends, so its buckets stay
    whole."""

    __slots__ = ("blocked", "blocks", "chunk", "lasts", "lists", "starts", "stride", "values")

    def __init__(
        self, keys: list[tuple[int, tuple[int, ...]]], stride: i64, blocked: bool = True, chunk: i64 = CHUNK
    ) -> None:
        """``keys``: (bucket value, in-bucket key as ``stride`` words) pairs."""
        self.stride, self.blocked, self.chunk = stride, blocked, chunk
        self.values: list[int] = []
        self.lists: vec[vec[i64]] = vec[vec[i64]]()  # nested: a bucket stored back is no new object
        ordered = sorted(keys)
        first = 0
        while first < len(ordered):
            value, end = ordered[first][0], first + 1
            while end < len(ordered) and ordered[end][0] == value:
                end += 1
            # one bucket; dispersed: chunks of ``chunk`` keys from its end (its largest keys first)
            step = end - first if blocked else chunk
            top = end
            while top > first:
                bottom = max(first, top - step)
                bucket = vec[i64]()
                for index in range(bottom, top):
                    bucket = extend(bucket, ordered[index][1])
                self.values.append(value)
                self.lists = append(self.lists, bucket)
                top = bottom
            first = end
        self.lasts = [bucket[len(bucket) - stride] for bucket in self.lists] if blocked else []
        self.blocks: list[int] = []
        self._reblock()
        self.starts: dict[tuple[int, ...], int] = {}  # dispersed: need -> first bucket value that may fit it

    def remove(self, value: int, key: vec[i64]) -> None:
        """Take ``key`` out of bucket ``value``."""
        position = bisect_left(self.values, value)
        if not self.blocked:
            position = self._chunk_of(position, key)
        self.remove_at(position, _bisect(self.lists[position], key, self.stride))

    def _chunk_of(self, position: i64, key: vec[i64]) -> i64:
        """Dispersed: the chunk of the bucket starting at ``position`` where ``key`` is or belongs (the first whose
        first key is not after it; the bucket's last chunk otherwise)."""
        values, lists, stride = self.values, self.lists, self.stride
        value = values[position]
        while position + 1 < len(values) and values[position + 1] == value and _after(lists[position], 0, key, stride):
            position += 1
        return position

    def remove_at(self, position: i64, at: i64) -> None:
        """Take key ``at`` out of bucket ``position`` (where a search just found it, or bisected)."""
        stride = self.stride
        bucket = self.lists[position] = _deleted(self.lists[position], at, stride)
        size = len(bucket)
        if self.blocked:
            if at * stride == size:  # it was the last
                self._set_last(position, bucket[size - stride] if size else _EMPTY)
        elif not size:
            self.values.pop(position)
            self.lists = _bucket_deleted(self.lists, position)

    def add(self, value: int, key: vec[i64]) -> None:
        stride = self.stride
        position = bisect_left(self.values, value)
        if position == len(self.values) or self.values[position] != value:
            self.values.insert(position, value)
            self.lists = _bucket_inserted(self.lists, position, extend(vec[i64](), key))
            if self.blocked:
                self.lasts.insert(position, key[0])
                self._reblock()
            return
        if not self.blocked:
            self._add_to_chunk(self._chunk_of(position, key), key)
            return
        bucket = self.lists[position]
        size = len(bucket)
        if not size or _below(bucket, size // stride - 1, key, stride):
            self.lists[position] = extend(bucket, key)  # mostly (the agent placed had the most it needed)
            self._set_last(position, key[0])
        else:
            self.lists[position] = _inserted(bucket, _bisect(bucket, key, stride), key, stride)

    def _add_to_chunk(self, position: i64, key: vec[i64]) -> None:
        """Dispersed: ``key`` into chunk ``position``; a chunk grown to ``2 * chunk`` keys is split in two, its larger
        half first."""
        stride = self.stride
        bucket = self.lists[position]
        bucket = _inserted(bucket, _bisect(bucket, key, stride), key, stride)
        if len(bucket) < 2 * self.chunk * stride:
            self.lists[position] = bucket
            return
        half = len(bucket) // stride // 2 * stride
        self.lists[position] = bucket[half:]
        self.values.insert(position + 1, self.values[position])
        self.lists = _bucket_inserted(self.lists, position + 1, bucket[:half])

    def _set_last(self, position: int, last: int) -> None:
        """Bucket ``position`` ends with a key whose first word is ``last`` now (``_EMPTY``: it is empty)."""
        self.lasts[position] = last
        block = position // _BLOCK
        if last > self.blocks[block]:
            self.blocks[block] = last

    def _reblock(self) -> None:
        """After a bucket came or went (the buckets after it moved one position)."""
        lasts = self.lasts
        self.blocks = [max(lasts[start : start + _BLOCK]) for start in range(0, len(lasts), _BLOCK)]

    def first_reaching(self, position: int, least: int) -> int:
        """The first bucket from ``position`` on whose last key's first word is >= ``least`` (0: the first bucket not
        empty; ``len(values)``: none)."""
        if not self.blocked:  # no bucket is empty
            lists, stride = self.lists, self.stride
            while position < len(lists):
                bucket = lists[position]
                if bucket[len(bucket) - stride] >= least:
                    break
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


def _bucket_inserted(lists: vec[vec[i64]], position: i64, bucket: vec[i64]) -> vec[vec[i64]]:
    """``lists`` with ``bucket`` inserted at ``position`` (rare: a bucket value not seen before)."""
    lists = append(lists, bucket)
    at = len(lists) - 1
    while at > position:
        lists[at] = lists[at - 1]
        at -= 1
    lists[position] = bucket
    return lists


def _bucket_deleted(lists: vec[vec[i64]], position: i64) -> vec[vec[i64]]:
    """``lists`` without bucket ``position`` (a dispersed bucket that emptied)."""
    at = position
    while at + 1 < len(lists):
        lists[at] = lists[at + 1]
        at += 1
    lists, _ = pop(lists)
    return lists


class PackingIndex:
    def __init__(
        self,
        positions: tuple[int, ...],
        direction: int,
        members: Iterable[tuple[int, int]],
        avail: vec[vec[i64]],
        capacity: list[list[int]],
        chunk: i64 = CHUNK,
    ) -> None:
        """``members``: (agent ordinal, unused accelerator kinds) of every agent having all ``positions``;
        ``avail`` and ``capacity``: every agent's amounts (``avail`` is read, never written); ``chunk``: keys per
        chunk of a dispersed bucket (``_Tier``)."""
        self.positions = positions
        self.direction = direction
        listed = list(members)
        self._encoding = encoding = _Encoding(
            positions,
            direction,
            [avail[ordinal] for ordinal, _ in listed],
            [capacity[ordinal] for ordinal, _ in listed],
            len(avail),
        )
        self._stride = encoding.stride
        self._key: vec[i64] = vec[i64]([0] * encoding.stride)  # the key being encoded (``take`` and ``put``)
        self._tier_of: list[_Tier | None] = [None] * len(avail)  # by ordinal (a list: cheaper than a dict)
        keys_by_tier: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        for ordinal, tier in listed:
            value = encoding.encode(ordinal, avail[ordinal], self._key)
            keys_by_tier.setdefault(tier, []).append((value, tuple(self._key)))
        tiers = {
            tier: _Tier(keys, encoding.stride, direction == CONCENTRATED, chunk) for tier, keys in keys_by_tier.items()
        }
        self._tier_order = [tiers[tier] for tier in sorted(tiers)]
        for ordinal, tier in listed:
            self._tier_of[ordinal] = tiers[tier]
        self._found = -1  # the agent the last search found, its bucket's position and its key's place in it
        self._found_position: i64 = 0
        self._found_at: i64 = 0

    def __contains__(self, ordinal: int) -> bool:
        return 0 <= ordinal < len(self._tier_of) and self._tier_of[ordinal] is not None

    def take(self, ordinal: int, vector: vec[i64]) -> None:
        """Before an agent's amounts change: take its key out (``vector``: its amounts still unchanged; nothing to
        do if it is not a member). ``put`` puts it back, re-sorted, once they have changed.

        Right after a search found the agent, its key is where the search left it; otherwise the unchanged amounts
        give it again (a key is not stored per agent: a placement would read it cold)."""
        tier = self._tier_of[ordinal]
        if tier is None:
            return
        if ordinal == self._found:  # placed right after this index found it: mostly
            self._found = -1
            position, at, stride = self._found_position, self._found_at, self._stride
            if position < len(tier.lists):
                bucket = tier.lists[position]
                end = (at + 1) * stride
                if end <= len(bucket) and self._encoding.ordinal(bucket[end - 1]) == ordinal:  # one key an agent
                    tier.remove_at(position, at)
                    return
        self._found = -1
        value = self._encoding.encode(ordinal, vector, self._key)
        tier.remove(value, self._key)

    def put(self, ordinal: int, vector: vec[i64]) -> None:
        """After ``take``: the agent's key for its changed amounts ``vector``."""
        tier = self._tier_of[ordinal]
        if tier is not None:
            value = self._encoding.encode(ordinal, vector, self._key)
            tier.add(value, self._key)

    def forget_starts(self) -> None:
        """Amounts went up (a rollback, a released reservation): a skipped bucket may fit again."""
        for tier in self._tier_order:
            tier.starts.clear()

    def find(self, demand: Demand) -> int | None:
        """The best member that fits ``demand`` (whose positions are exactly this index's), or None."""
        return self.search(amounts_of(demand))

    def search(self, need: tuple[int, ...]) -> int | None:
        """``find`` given the demand's amounts (``vectors.amounts_of``). Remembers where the key of the agent found
        is (``take`` then takes it out without a bisection)."""
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
        keys = len(tier.lists[position]) // self._stride
        return self._found_in(tier, position, 0 if self.direction == CONCENTRATED else keys - 1)

    def _found_in(self, tier: _Tier, position: i64, at: i64) -> int:
        """The agent of key ``at`` of bucket ``position``, remembered as found there."""
        self._found_position, self._found_at = position, at
        return self._encoding.ordinal(tier.lists[position][(at + 1) * self._stride - 1])

    def _fits_beyond_second(self, bucket: vec[i64], base: i64, need: tuple[int, ...]) -> bool:
        """Whether the key at word ``base`` has enough of the third slot on (its words: the amounts, encoded)."""
        bases = self._encoding.bases
        slot, size = 2, len(need)
        while slot < size and bucket[base + slot - 1] >= need[slot] + bases[slot]:
            slot += 1
        return slot == size

    def _scan_up(self, tier: _Tier, need: tuple[int, ...]) -> int | None:
        """Concentrated: the smallest key with every amount >= need."""
        encoding, lists, stride = self._encoding, tier.lists, self._stride
        start = bisect_left(tier.values, encoding.least(0, need[0]))
        if len(need) == 1:
            start = tier.first_reaching(start, 0)  # the first bucket not empty
            return self._first(tier, start) if start < len(lists) else None
        enough = encoding.least(1, need[1])  # the least first word with enough of the second slot
        position = tier.first_reaching(start, enough)  # the buckets before it are short of the second slot
        while position < len(lists):
            bucket = lists[position]
            for index in range(_bisect_top(bucket, enough, stride), len(bucket) // stride):
                if self._fits_beyond_second(bucket, index * stride, need):
                    return self._found_in(tier, position, index)
            position = tier.first_reaching(position + 1, enough)
        return None

    def _scan_down(self, tier: _Tier, need: tuple[int, ...]) -> int | None:
        """Dispersed (bucket values of negated amounts, buckets read back to front): the first key, in that order,
        whose every amount >= need."""
        encoding, values, lists, stride = self._encoding, tier.values, tier.lists, self._stride
        first = encoding.most(need[0])
        if len(need) == 1:
            position = tier.first_reaching(0, 0)  # the first bucket not empty
            return self._first(tier, position) if position < len(values) and values[position] <= first else None
        enough = encoding.least(1, need[1])  # the least first word with enough of the second slot
        start = tier.starts.get(need)
        for position in range(0 if start is None else bisect_left(values, start), len(values)):
            value = values[position]
            if value > first:  # from here on avail[k1] < need[k1]: nothing later fits
                return None
            bucket = lists[position]
            at = len(bucket) // stride - 1
            # a bucket ends with its most of the second slot: once short, the rest (towards its front) is
            while at >= 0 and bucket[at * stride] >= enough:
                if self._fits_beyond_second(bucket, at * stride, need):
                    tier.starts[need] = value
                    return self._found_in(tier, position, at)
                at -= 1
        return None
