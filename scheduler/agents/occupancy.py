"""In-pass occupancy of one resource group: what every agent still has, updated as the pass places sessions.

This is the only mutable state of a pass and it lives for one pass only. ``avail[agent]`` is capacity minus occupied
minus what this pass placed minus holds (reservations) of other sessions; it only goes down during a pass except when
a tentative multi-node placement is rolled back or a reservation is released, which is what keeps the
"smallest failed request" cache sound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from librt.vecs import vec
from mypy_extensions import i64

from devices.catalog import device_prefix
from domain.agents import Agent
from scheduler.agents.index import PackingIndex
from scheduler.agents.ranking import accelerator_kinds
from scheduler.agents.vectors import Demand, SlotCodec, amounts_of, positions_of

__all__ = ["GroupOccupancy", "dominates"]

_FAILED_CACHE_SIZE = 16


def dominates(have: Sequence[int], need: Sequence[int]) -> bool:
    return all(h >= n for h, n in zip(have, need, strict=True))


def pareto_front(points: Sequence[tuple[tuple[int, ...], int]]) -> list[tuple[tuple[int, ...], int]]:
    """The (vector, ordinal) points no other point dominates; small in practice (agents come in a few shapes). Of
    equal vectors only the first by ordinal can be in it (it dominates the others), so they are folded into it first:
    10,000 agents' capacities are a few dozen distinct vectors."""
    first: dict[tuple[int, ...], int] = {}
    for vector, ordinal in points:
        known = first.get(vector)
        if known is None or ordinal < known:
            first[vector] = ordinal
    front: list[tuple[tuple[int, ...], int]] = []
    for vector, ordinal in sorted(first.items(), key=lambda point: (-sum(point[0]), point[1])):
        if not any(dominates(kept, vector) for kept, _ in front):
            front.append((vector, ordinal))
    return front


class GroupOccupancy:
    def __init__(self, agents: Sequence[Agent], codec: SlotCodec, direction: int | None) -> None:
        """``agents``: the schedulable agents of the group; ``direction``: the packing index to keep, if any."""
        ordered = sorted(agents, key=lambda agent: agent.id)
        self.codec = codec
        self.ids = [agent.id for agent in ordered]
        self.capacity = [codec.dense(agent.capacity, round_up=False) for agent in ordered]
        self.avail = vec[vec[i64]](  # native vectors: an amount is a machine integer, changed in place
            vec[i64](
                [cap - used for cap, used in zip(capacity, codec.dense(agent.occupied, round_up=True), strict=True)]
            )
            for capacity, agent in zip(self.capacity, ordered, strict=True)
        )
        kinds: dict[tuple[str, ...], frozenset[str]] = {}  # agents come in a few shapes: each computed once
        self._kinds = [
            kinds.get(names) or kinds.setdefault(names, accelerator_kinds(names))
            for names in (tuple(agent.capacity.keys()) for agent in ordered)
        ]
        self._asked_kinds: dict[tuple[int, ...], frozenset[str]] = {}
        self._direction = direction
        self._indexes: dict[tuple[int, ...], PackingIndex] = {}
        self._packed: dict[int, tuple[PackingIndex, tuple[int, ...], Demand]] = {}  # id(demand) -> index, amounts
        self._index_list: list[PackingIndex] = []  # the values of ``_indexes`` (a few signatures), as a list
        self._members: dict[tuple[int, ...], list[int]] = {}
        self._failed: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self._failed_exactly: dict[int, Demand] = {}  # id -> demand (kept alive): found no agent, or bigger than one
        self._failures = 0  # changes of ``_failed`` so far
        self._not_dominated: dict[int, tuple[int, Demand]] = {}  # id -> (``_failures`` when checked, demand)
        self._capacity_fronts: dict[tuple[int, ...], list[tuple[tuple[int, ...], int]]] = {}
        self._never_fits: dict[Demand, bool] = {}
        self._avail_fronts: dict[tuple[int, ...], list[tuple[tuple[int, ...], int]]] = {}
        self.holds: dict[int, tuple[str, Demand]] = {}

    def __len__(self) -> int:
        return len(self.ids)

    # -- static facts about the group --

    def members(self, positions: tuple[int, ...]) -> list[int]:
        """Agents having a non-zero capacity of every slot in ``positions`` (the others can never host it)."""
        if positions not in self._members:
            self._members[positions] = [
                ordinal for ordinal, capacity in enumerate(self.capacity) if all(capacity[p] > 0 for p in positions)
            ]
        return self._members[positions]

    def unused_kinds(self, ordinal: int, positions: tuple[int, ...]) -> int:
        asked = self._asked_kinds.get(positions)
        if asked is None:
            asked = self._asked_kinds[positions] = frozenset(device_prefix(self.codec.names[p]) for p in positions)
        return len(self._kinds[ordinal] - asked)

    def never_fits(self, demand: Demand) -> bool:
        """True when no agent could host ``demand`` even when empty."""
        if demand not in self._never_fits:
            agent, short = self.closest(demand, when_empty=True)
            self._never_fits[demand] = agent is None or bool(short)
        return self._never_fits[demand]

    # -- fitting --

    def fits(self, ordinal: int, demand: Demand) -> bool:
        avail = self.avail[ordinal]
        return all(avail[position] >= amount for position, amount in demand)

    def fitter(self, demand: Demand) -> Callable[[int], bool]:
        """``fits(ordinal, demand)`` as a function of the ordinal, unrolled for the common short demands."""
        avail = self.avail
        if len(demand) == 2:
            (p0, n0), (p1, n1) = demand
            return lambda ordinal: avail[ordinal][p0] >= n0 and avail[ordinal][p1] >= n1
        if len(demand) == 3:
            (p0, n0), (p1, n1), (p2, n2) = demand
            return lambda ordinal: (a := avail[ordinal])[p0] >= n0 and a[p1] >= n1 and a[p2] >= n2
        return lambda ordinal: self.fits(ordinal, demand)

    def fitting(self, demand: Demand) -> Iterator[int]:
        positions = positions_of(demand)
        return (ordinal for ordinal in self.members(positions) if self.fits(ordinal, demand))

    def known_to_fail(self, demand: Demand) -> bool:
        """A request at least as big as one that already found no agent cannot fit either (avail only shrank).

        Answered by identity where it can (a pass's demands are shared tuples, one per distinct request): a demand seen
        failing or dominating a failure, and one no failure dominated while the failures stay the same."""
        if not self._failed:  # nothing failed yet (most of a pass that places much)
            return False
        key = id(demand)
        if key in self._failed_exactly:  # a busy queue repeats a few presets: most failures are seen before
            return True
        checked = self._not_dominated.get(key)
        if checked is not None and checked[0] == self._failures:
            return False
        failed = self._failed.get(positions_of(demand))
        if failed:
            need = amounts_of(demand)
            if any(dominates(need, smaller) for smaller in failed):
                self._failed_exactly[key] = demand
                return True
        self._not_dominated[key] = (self._failures, demand)
        return False

    def remember_failure(self, demand: Demand) -> None:
        positions = positions_of(demand)
        need = amounts_of(demand)
        kept = [smaller for smaller in self._failed.get(positions, []) if not dominates(smaller, need)]
        self._failed[positions] = [need, *kept][:_FAILED_CACHE_SIZE]
        self._failed_exactly[id(demand)] = demand
        self._failures += 1

    def find_packed(self, demand: Demand) -> int | None:
        """The concentrated/dispersed choice via the sorted index (the group's ``direction`` must be set)."""
        assert self._direction is not None, "no packing index for this selector"
        known = self._packed.get(id(demand))  # by identity: requests share one demand tuple, kept alive here
        if known is None:
            positions = positions_of(demand)
            index = self._indexes.get(positions)
            if index is None:
                members = ((ordinal, self.unused_kinds(ordinal, positions)) for ordinal in self.members(positions))
                index = self._indexes[positions] = PackingIndex(
                    positions, self._direction, members, self.avail, self.capacity
                )
                self._index_list.append(index)
            known = self._packed[id(demand)] = (index, amounts_of(demand), demand)
        return known[0].search(known[1])

    # -- changing amounts --

    def consume(self, ordinal: int, demand: Demand) -> None:
        avail = self.avail[ordinal]
        indexes = self._index_list
        for index in indexes:  # each checks membership in its own per-agent list
            index.take(ordinal, avail)
        for position, amount in demand:
            avail[position] -= amount
        self._moved(ordinal, avail)

    def _give_back(self, ordinal: int, demand: Demand) -> None:
        avail = self.avail[ordinal]
        for index in self._index_list:
            index.take(ordinal, avail)
        for position, amount in demand:
            avail[position] += amount
        self._moved(ordinal, avail)
        for index in self._index_list:
            index.forget_starts()

    def _moved(self, ordinal: int, avail: vec[i64]) -> None:
        """After ``take`` from every index and a change of the agent's amounts."""
        for index in self._index_list:
            index.put(ordinal, avail)
        if self._avail_fronts:
            self._avail_fronts.clear()

    def rollback(self, ordinal: int, demand: Demand) -> None:
        """Undo a tentative ``consume`` (multi-node all-or-nothing); the state returns to one the cache has seen."""
        self._give_back(ordinal, demand)

    def hold(self, ordinal: int, session_id: str, demand: Demand) -> None:
        self.holds[ordinal] = (session_id, demand)
        self.consume(ordinal, demand)

    def release_holds(self, session_id: str) -> list[tuple[int, Demand]]:
        released = [(ordinal, demand) for ordinal, (holder, demand) in self.holds.items() if holder == session_id]
        for ordinal, demand in released:
            del self.holds[ordinal]
            self._give_back(ordinal, demand)
        if released:
            self._failed.clear()  # avail went up: earlier failures may fit now
            self._failed_exactly.clear()
            self._failures += 1
        return released

    # -- explanation --

    def closest(self, demand: Demand, *, when_empty: bool = False) -> tuple[int | None, list[tuple[int, int]]]:
        """The agent that lacks the least for ``demand`` and what it lacks (position, milli-amount), judged on what
        agents have available now or, with ``when_empty``, on their capacity.

        "Least" = fewest short slots, then the smallest sum of lacking fractions. An agent dominated by another is
        never closer, so only the Pareto front is searched (cached until amounts change).
        """
        positions = positions_of(demand)
        vectors, fronts = (self.capacity, self._capacity_fronts) if when_empty else (self.avail, self._avail_fronts)
        front = fronts.get(positions)
        if front is None:
            points = [(tuple(vectors[o][p] for p in positions), o) for o in self.members(positions)]
            front = fronts[positions] = pareto_front(points)
        best: tuple[tuple[int, float, int], list[tuple[int, int]]] | None = None
        for have, ordinal in front:
            short = [(p, amount - max(h, 0), amount) for h, (p, amount) in zip(have, demand, strict=True) if h < amount]
            score = (len(short), sum(lack / amount for _, lack, amount in short), ordinal)
            if best is None or score < best[0]:
                best = score, [(p, lack) for p, lack, _ in short]
        return (None, []) if best is None else (best[0][2], best[1])
