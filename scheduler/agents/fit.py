"""Placing one session on a group's agents (all or nothing) and making reservations, over ``GroupOccupancy``.

A ``Chooser`` picks one agent for one demand: the packing index for concentrated/dispersed, the cyclic scan for
round-robin, or a custom ``AgentSelector`` given ``AgentView`` candidates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from librt.vecs import vec
from mypy_extensions import i64

from scheduler.agents import ROUNDROBIN, resolve_selector, roundrobin
from scheduler.agents.base import AgentSelector, AgentView, SelectionRequest, SelectorConfig
from scheduler.agents.index import CONCENTRATED, DISPERSED
from scheduler.agents.occupancy import GroupOccupancy
from scheduler.agents.vectors import Demand, positions_of
from scheduler.pass_model import ClusterMode, PendingSession

__all__ = ["Attempt", "Chooser", "make_chooser", "packing_direction", "place", "reserve"]


class Chooser:
    """A base class, not a Protocol: compiled (ops/build-native), a call through it is a direct one."""

    none_means_full: bool = True
    """True when ``choose`` returning None proves that no agent fits (feeds the failed-request cache)."""

    def choose(self, session: PendingSession, kernel: int, demand: Demand) -> int | None:
        """An agent ordinal that fits ``demand`` now, or None."""
        raise NotImplementedError


@dataclass
class PackedChooser(Chooser):
    occupancy: GroupOccupancy

    def choose(self, session: PendingSession, kernel: int, demand: Demand) -> int | None:
        return self.occupancy.find_packed(demand)


@dataclass
class RoundRobinChooser(Chooser):
    occupancy: GroupOccupancy
    next_index: int

    def choose(self, session: PendingSession, kernel: int, demand: Demand) -> int | None:
        occupancy = self.occupancy
        picked, self.next_index = roundrobin.select(
            len(occupancy), self.next_index, occupancy.fitter(demand), occupancy.members(positions_of(demand))
        )
        return picked


@dataclass
class PluginChooser(Chooser):
    occupancy: GroupOccupancy
    selector: AgentSelector
    config: SelectorConfig

    def __post_init__(self) -> None:
        self.none_means_full = False  # a plugin may decline although agents fit

    def choose(self, session: PendingSession, kernel: int, demand: Demand) -> int | None:
        occupancy, codec = self.occupancy, self.occupancy.codec
        fitting = list(occupancy.fitting(demand))
        if not fitting:
            return None
        candidates = [  # a slot held for a reservation may be below zero for others: they see none of it
            AgentView(
                occupancy.ids[o],
                codec.dense_to_slots(occupancy.capacity[o]),
                codec.dense_to_slots([max(amount, 0) for amount in occupancy.avail[o]]),
            )
            for o in fitting
        ]
        role = session.kernels[kernel].role if session.cluster_mode is ClusterMode.MULTI_NODE else "main1"
        request = SelectionRequest(session.id, session.user, role, codec.to_slots(demand))
        picked = self.selector(request, candidates, self.config)
        if picked is None:
            return None
        by_id = {occupancy.ids[o]: o for o in fitting}
        if picked not in by_id:
            raise ValueError(f"agent selector returned {picked!r}, which is not one of the {len(fitting)} candidates")
        return by_id[picked]


def packing_direction(selector_name: str) -> int | None:
    return {"concentrated": CONCENTRATED, "dispersed": DISPERSED}.get(selector_name)


def make_chooser(
    name: str,
    occupancy: GroupOccupancy,
    plugins: Mapping[str, AgentSelector],
    config: SelectorConfig,
    roundrobin_next: int,
) -> Chooser:
    """The chooser for a configured selector name; unknown names raise with the list of valid ones."""
    selector = resolve_selector(name, plugins)
    if name == ROUNDROBIN:
        return RoundRobinChooser(occupancy, roundrobin_next)
    if packing_direction(name) is not None:
        return PackedChooser(occupancy)
    assert selector is not None
    return PluginChooser(occupancy, selector, config)


class Attempt:
    """One per attempt (a plain class: compiled, the cheapest record to build; a NamedTuple's constructor is Python).
    Not changed once built."""

    __slots__ = ("agents", "failed_kernel")

    def __init__(self, agents: tuple[int, ...] | None, failed_kernel: int = 0) -> None:
        self.agents = agents
        """One ordinal per kernel when placed (single-node: the same agent for all), else None."""
        self.failed_kernel = failed_kernel
        """Index into the demands of the one that found no agent."""


def place(
    occupancy: GroupOccupancy,
    chooser: Chooser,
    session: PendingSession,
    demands: Sequence[Demand],
    *,
    use_cache: bool,
    kernel_count: int,
) -> Attempt:
    """Place every demand in order against the state after the previous ones; roll all back if one fails.

    ``demands`` holds one summed demand for a single-node session, one per kernel for a multi-node one;
    ``kernel_count``: the session's kernels. Only a failure of the first demand (nothing tentative consumed) feeds the
    "smallest failed request" cache.
    """
    if len(demands) == 1:
        return _place_one(occupancy, chooser, session, demands[0], use_cache=use_cache, kernel_count=kernel_count)
    consumed: list[tuple[int, Demand]] = []
    for kernel, demand in enumerate(demands):
        first = not consumed
        if use_cache and first and occupancy.known_to_fail(demand):
            picked = None
        else:
            picked = chooser.choose(session, kernel, demand)
            if picked is None and use_cache and first and chooser.none_means_full:
                occupancy.remember_failure(demand)
        if picked is None:
            for ordinal, done in reversed(consumed):
                occupancy.rollback(ordinal, done)
            return Attempt(None, kernel)
        occupancy.consume(picked, demand)
        consumed.append((picked, demand))
    return Attempt(tuple(ordinal for ordinal, _ in consumed))


def _place_one(
    occupancy: GroupOccupancy,
    chooser: Chooser,
    session: PendingSession,
    demand: Demand,
    *,
    use_cache: bool,
    kernel_count: int,
) -> Attempt:
    """``place`` for a single demand (a single-node session): nothing tentative to roll back."""
    if use_cache and occupancy.known_to_fail(demand):
        return _NOT_PLACED
    picked = chooser.choose(session, 0, demand)
    if picked is None:
        if use_cache and chooser.none_means_full:
            occupancy.remember_failure(demand)
        return _NOT_PLACED
    occupancy.consume(picked, demand)
    return Attempt((picked,) * kernel_count)


_NOT_PLACED = Attempt(None, 0)


def reserve(occupancy: GroupOccupancy, session_id: str, demands: Sequence[Demand]) -> list[tuple[int, Demand]]:
    """Hold, for each demand, the unreserved agent it fits best (would fit when empty; most of it available now, then
    fewest unused accelerator kinds, then the first by id).

    All or nothing; returns the holds made (empty when some demand found no agent to reserve).
    """
    chosen: list[tuple[int, Demand]] = []
    for demand in demands:
        positions = positions_of(demand)
        taken = {ordinal for ordinal, _ in chosen}
        best: list[int] = []  # the candidates of the most progress so far, in id order
        most = -1.0
        for ordinal in occupancy.members(positions):
            if ordinal in occupancy.holds or ordinal in taken or not _could_host(occupancy.capacity[ordinal], demand):
                continue
            progress = _progress(occupancy.avail[ordinal], demand)
            if progress > most:
                best, most = [ordinal], progress
            elif progress == most:
                best.append(ordinal)
        if not best:
            return []
        chosen.append((min(best, key=partial(occupancy.unused_kinds, positions=positions)), demand))
    for ordinal, demand in chosen:
        occupancy.hold(ordinal, session_id, demand)
    return chosen


def _could_host(capacity: list[int], demand: Demand) -> bool:
    return all(capacity[position] >= amount for position, amount in demand)


def _progress(avail: vec[i64], demand: Demand) -> float:
    """How much of ``demand`` the agent has available now: the least fraction over its slots (1.0: all of it)."""
    progress = 1.0
    for position, amount in demand:
        progress = min(progress, min(max(avail[position], 0), amount) / amount)
    return progress
