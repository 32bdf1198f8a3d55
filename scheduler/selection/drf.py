"""``drf``: dominant resource fairness per user, shares updated as the pass places sessions.

A user's dominant share in a group = max over slots of (what the user occupies in the group) / (the group's total
capacity), counting running sessions and this pass's placements (textbook DRF: per user, summed, updated after each
allocation; Backend.AI legacy took the max of per-session shares, HEAD froze shares for the pass). The next session
is the oldest one of the user with the lowest share; equal shares go to the older head session.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from librt.vecs import vec
from mypy_extensions import i64

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


def order(entries: Sequence[QueueEntry], shares: ShareView) -> Iterator[QueueEntry]:
    """Users in a heap keyed by (dominant share, rank of their oldest waiting session in the age order); ranks are
    unique, so the order is total and any correct heap yields the same line. The heap and each session's link to its
    user's next one are native vectors (``librt.vecs``: compiled, flat arrays of machine floats and integers, no
    object per item): a 100k pass reads them once per placement, where lists of boxed ints and a heap of big-int
    keys were cold reads, allocations and generic comparisons (bench/README.md)."""
    line = by_age(entries, newest_first=False)
    following = vec[i64]([-1] * len(line))  # rank -> rank of the same user's next session (-1: none)
    heads: dict[str, int] = {}
    for rank in range(len(line) - 1, -1, -1):
        user = line[rank].user
        following[rank] = heads.get(user, -1)
        heads[user] = rank
    first = sorted((shares.share(user), rank) for user, rank in heads.items())  # sorted: already a heap
    heap = _Heap(vec[float]([share for share, _ in first]), vec[i64]([rank for _, rank in first]))
    while heap.size:
        rank = heap.ranks[0]
        entry = line[rank]
        yield entry
        rank = following[rank]
        if rank >= 0:  # only this user's share can have changed since it was pushed
            heap.replace_top(shares.share(entry.user), rank)
        else:
            heap.pop_top()


class _Heap:
    """A binary min-heap of (share, rank) pairs kept in two parallel native vectors; compared as that tuple would be
    (floats compare exactly, ranks break ties), without building one."""

    __slots__ = ("ranks", "shares", "size")

    def __init__(self, shares: vec[float], ranks: vec[i64]) -> None:
        self.shares, self.ranks, self.size = shares, ranks, len(ranks)

    def pop_top(self) -> None:
        self.size -= 1
        if self.size:
            self._sift_down(self.shares[self.size], self.ranks[self.size])

    def replace_top(self, share: float, rank: i64) -> None:
        self._sift_down(share, rank)

    def _sift_down(self, share: float, rank: i64) -> None:
        """Put (share, rank) at the top, then move it down to where it belongs."""
        shares, ranks, size = self.shares, self.ranks, self.size
        at: i64 = 0
        child: i64 = 1
        while child < size:
            right = child + 1
            if right < size and (
                shares[right] < shares[child] or (shares[right] == shares[child] and ranks[right] < ranks[child])
            ):
                child = right
            if share < shares[child] or (share == shares[child] and rank < ranks[child]):
                break
            shares[at], ranks[at] = shares[child], ranks[child]
            at, child = child, 2 * child + 1
        shares[at], ranks[at] = share, rank
