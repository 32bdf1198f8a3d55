"""``drf``: dominant resource fairness per user, shares updated as the pass places sessions.

A user's dominant share in a group = max over slots of (what the user occupies in the group) / (the group's total
capacity), counting running sessions and this pass's placements (textbook DRF: per user, summed, updated after each
allocation; Backend.AI legacy took the max of per-session shares, HEAD froze shares for the pass). The next session
is the oldest one of the user with the lowest share; equal shares go to the older head session.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence

from scheduler.agents.vectors import Demand
from scheduler.selection.base import QueueEntry, ShareView, by_age

__all__ = ["DominantShares", "order"]


class DominantShares(ShareView):
    """Per-user occupancy of one group over its capacity (milli-unit vectors). Shares are floats: order only."""

    def __init__(self, capacity: Sequence[int], occupied_by_user: Mapping[str, Sequence[int]]) -> None:
        self._capacity = list(capacity)
        self._scale = [(position, cap) for position, cap in enumerate(self._capacity) if cap > 0]
        self._occupied = {user: list(vector) for user, vector in occupied_by_user.items()}
        self._shares = {user: self._compute(vector) for user, vector in self._occupied.items()}

    def _compute(self, occupied: Sequence[int]) -> float:
        return max([occupied[position] / cap for position, cap in self._scale], default=0.0)

    def share(self, user: str) -> float:
        share = self._shares.get(user)
        if share is None:  # not asked yet
            occupied = self._occupied.get(user)
            share = self._shares[user] = 0.0 if occupied is None else self._compute(occupied)
        return share

    def add(self, user: str, demand: Demand) -> None:
        """Count a placement. Amounts only grow, so a known share becomes the larger of itself and the placed slots'
        shares (the same float ``_compute`` would give: max picks one of the same quotients)."""
        occupied = self._occupied.get(user)
        if occupied is None:
            occupied = self._occupied[user] = [0] * len(self._capacity)
        for position, amount in demand:
            occupied[position] = occupied[position] + amount
        share = self._shares.get(user)
        if share is not None:
            capacity = self._capacity
            for position, _ in demand:
                if capacity[position] > 0:
                    placed = occupied[position] / capacity[position]
                    if placed > share:  # ``max``, without boxing floats (compiled)
                        share = placed
            self._shares[user] = share


_SCALE = 2.0**252
"""A share times this is a whole number for every share of at least 2**-200 (one milli-unit over a group's capacity is
always far more), so ``int(share * _SCALE)`` orders exactly as the shares do."""


def _key(share: float, rank: int, width: int) -> int:
    """A user's place in line as one int, so the heap compares ints (a tenth of the cost of tuples): its dominant share,
    then, in the lowest ``width`` bits, the rank of its oldest waiting session in the age order. Ranks are unique and
    follow (created, id), so this orders exactly as (share, created, id) would."""
    return int(share * _SCALE) << width | rank


def order(entries: Sequence[QueueEntry], shares: ShareView) -> Iterator[QueueEntry]:
    line = by_age(entries, newest_first=False)
    following = [-1] * len(line)  # rank -> rank of the same user's next session (-1: none)
    heads: dict[str, int] = {}
    for rank in range(len(line) - 1, -1, -1):
        user = line[rank].user
        following[rank] = heads.get(user, -1)
        heads[user] = rank
    width = len(line).bit_length()
    mask = (1 << width) - 1
    heap = [_key(shares.share(user), rank, width) for user, rank in heads.items()]
    heapq.heapify(heap)
    while heap:
        rank = heap[0] & mask
        entry = line[rank]
        yield entry
        rank = following[rank]
        if rank >= 0:  # only this user's share can have changed since it was pushed
            _replace_head(heap, _key(shares.share(entry.user), rank, width))
        else:
            heapq.heappop(heap)


def _replace_head(heap: list[int], key: int) -> None:
    size = len(heap)
    if (size < 2 or key < heap[1]) and (size < 3 or key < heap[2]):
        heap[0] = key
    else:
        heapq.heapreplace(heap, key)
