"""One scheduling pass: every pending session of every resource group, placed if it fits, explained if not.

``run_pass(snapshot, config, now)`` is pure: no I/O, no clock, no state kept between calls (the round-robin position
and the retry counts go in with the snapshot and come out with the result). Per group:

1. Order the sessions (``scheduler.selection``: priority bands, push-back, the group's strategy).
2. Overdue pushed-back sessions reserve an agent before anything is placed, and are attempted first.
3. Walk the order: non-resource checks (``scheduler.wait_checks``) first - a failed dependency cancels, other failures
   just wait; then, unless an earlier session short of resources blocks the line, try to place it
   (``scheduler.agents.fit``) and fold the placement into the in-memory occupancy, DRF shares and usage.
4. Explain every session still waiting and number them in attempt order.

Cost: the order is a sort; a placement is O(log agents) with the packing index; once the line is blocked a session
costs only its checks; a request at least as big as one that already failed is skipped without looking at agents.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime
from itertools import chain, count

from domain.agents import Agent
from domain.scheduling_config import GroupConfig
from domain.slots import ResourceSlots
from scheduler.agents import resolve_selector
from scheduler.agents.base import SelectorConfig
from scheduler.agents.explain import explain_never_fits, explain_no_fit
from scheduler.agents.fit import Attempt, Chooser, RoundRobinChooser, make_chooser, packing_direction, place, reserve
from scheduler.agents.occupancy import GroupOccupancy
from scheduler.agents.vectors import Demand, SlotCodec
from scheduler.pass_model import (
    Cancellation,
    ClusterMode,
    KernelPlacement,
    PassConfig,
    PassResult,
    PendingSession,
    Reservation,
    RunningSession,
    Snapshot,
    WaitExplanation,
    WaitKind,
)
from scheduler.selection import drf, get_strategy
from scheduler.selection.base import QueueEntry, ShareView, by_age
from scheduler.selection.drf import DominantShares
from scheduler.selection.sequence import attempt_order, overdue_before
from scheduler.wait_checks import CheckContext, CheckResult, Usage, failed_checks, may_fail

__all__ = ["run_pass", "validate_config"]


_NONE_HOPELESS = -1
"""No demand of the request is hopeless (``_GroupWalk.hopeless``)."""


_NO_SHARES = ShareView()  # what an order other than DRF is given: it never asks


class _Outcomes:
    """Collects what the pass decided; turned into the frozen ``PassResult`` at the end."""

    def __init__(self, roundrobin_state: dict[str, int]) -> None:
        self.placements: dict[str, tuple[KernelPlacement, ...]] = {}
        self.waiting: dict[str, WaitExplanation] = {}
        self.retries: dict[str, int] = {}
        self.reservations: list[Reservation] = []
        self.cancellations: dict[str, Cancellation] = {}
        self.positions: dict[str, int] = {}
        self.roundrobin_state = roundrobin_state

    def result(self) -> PassResult:
        return PassResult(
            self.placements,
            self.waiting,
            self.retries,
            tuple(self.reservations),
            self.cancellations,
            self.positions,
            self.roundrobin_state,
        )


def validate_config(config: PassConfig) -> None:
    """Fail at startup, not in the middle of a pass: every configured strategy and selector name must resolve."""
    for group_config in (config.default, *config.groups.values()):
        get_strategy(group_config.session_strategy)
        resolve_selector(group_config.agent_selector, config.plugin_selectors)


def run_pass(snapshot: Snapshot, config: PassConfig, now: datetime) -> PassResult:
    # a pass allocates many small objects and frees them by reference counting; the cyclic collector would only walk
    # the whole snapshot again and again (a large share of a big pass: bench/README.md). Paused before anything is
    # allocated (``core.collector.collector_paused`` allocates its generator first, which can itself set off a full
    # collection of the caller's garbage, inside the pass)
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _run_pass(snapshot, config, now)
    finally:
        if enabled:
            gc.enable()


def _run_pass(snapshot: Snapshot, config: PassConfig, now: datetime) -> PassResult:
    outcomes = _Outcomes(dict(snapshot.roundrobin_state))
    context = CheckContext(
        now,
        snapshot.dependency_states,
        snapshot.user_policies,
        snapshot.project_policies,
        Usage.from_snapshot(snapshot),
    )
    pending: dict[str, list[PendingSession]] = defaultdict(list)
    requests: dict[int, ResourceSlots] = {}  # by identity: presets repeat as shared objects (the snapshot reader's)
    for session in snapshot.pending:  # one walk over the sessions for both
        pending[session.resource_group].append(session)
        for kernel in session.kernels:
            requests[id(kernel.requested)] = kernel.requested
    slot_names = _slot_names(snapshot, requests)
    agents: dict[str, list[Agent]] = defaultdict(list)
    for agent in snapshot.agents:
        if agent.schedulable:
            agents[agent.resource_group].append(agent)
    running: dict[str, list[RunningSession]] = defaultdict(list)
    for running_session in snapshot.running:
        running[running_session.resource_group].append(running_session)
    for group in sorted(pending):  # groups share user/project usage, so a fixed order keeps passes reproducible
        _schedule_group(
            group, pending[group], agents[group], running[group], config, slot_names, context, now, outcomes
        )
    return outcomes.result()


def _slot_names(snapshot: Snapshot, requests: dict[int, ResourceSlots]) -> set[str]:
    """Every slot named anywhere (``requests``: the pending sessions', by identity). Requests and occupancies are
    shared objects (presets repeat; the snapshot reader memoizes them): each distinct object is read once, found by
    identity (no Python-level hash per session)."""
    distinct = requests
    for agent in snapshot.agents:
        distinct[id(agent.capacity)], distinct[id(agent.occupied)] = agent.capacity, agent.occupied
    for running in snapshot.running:
        distinct[id(running.occupied)] = running.occupied
    names: set[str] = set()
    for slots in distinct.values():
        names.update(slots.keys())
    return names


def _entries(
    sessions: Sequence[PendingSession], codec: SlotCodec, config: GroupConfig, context: CheckContext
) -> list[QueueEntry]:
    """One entry per session; the demands of one request are one tuple, shared (sessions mostly reuse presets, as
    shared objects: found by identity first, which needs no Python-level hash, then by value)."""
    # ``tuple[Demand, ...]``, not ``tuple[Demand]``: compiled, a fixed-length tuple is a C struct, boxed again into a
    # new tuple wherever it is stored, so every entry had its own (and the walk's caches by identity never hit)
    single: dict[ResourceSlots, tuple[Demand, ...]] = {}
    same: dict[int, tuple[ResourceSlots, tuple[Demand, ...]]] = {}  # id(request) -> (request, kept alive; demands)
    entries = []
    skip, multi_node = config.retries_to_skip, ClusterMode.MULTI_NODE
    for session in sessions:
        kernels = session.kernels
        if session.cluster_mode is multi_node:
            demands: tuple[Demand, ...] = tuple(codec.demand(kernel.requested) for kernel in kernels)
        else:
            only = kernels[0].requested if len(kernels) == 1 else session.requested
            known = same.get(id(only))
            if known is None:
                known = same[id(only)] = (only, single.get(only) or single.setdefault(only, (codec.demand(only),)))
            demands = known[1]
        pushed_back = skip > 0 and session.retries >= skip  # is_pushed_back, inline
        created = session.created_at.timestamp()
        checked = may_fail(session, context)
        entries.append(
            QueueEntry(
                session,
                created,
                demands,
                pushed_back,
                session.id,
                session.user,
                session.project,
                session.priority,
                len(kernels),
                kernels[0].role,
                checked,
            )
        )
    return entries


def _total(demands: Sequence[Demand]) -> Demand:
    if len(demands) == 1:
        return demands[0]  # already summed and sorted
    summed: dict[int, int] = defaultdict(int)
    for demand in demands:
        for position, amount in demand:
            summed[position] += amount
    return tuple(sorted(summed.items()))


def _shares(occupancy: GroupOccupancy, running: Sequence[RunningSession]) -> DominantShares:
    capacity = [sum(column) for column in zip(*occupancy.capacity, strict=True)] or [0] * len(occupancy.codec)
    by_user: dict[str, list[int]] = {}
    dense: dict[int, list[int]] = {}  # by id: running sessions mostly share a few preset objects (alive meanwhile)
    for session in running:
        held = by_user.setdefault(session.user, [0] * len(occupancy.codec))
        vector = dense.get(id(session.occupied))
        if vector is None:
            vector = dense[id(session.occupied)] = occupancy.codec.dense(session.occupied, round_up=True)
        for position, amount in enumerate(vector):
            held[position] += amount
    return DominantShares(capacity, by_user)


def _role(entry: QueueEntry, demand_index: int) -> str | None:
    return entry.session.kernels[demand_index].role if len(entry.demands) > 1 else None


def _schedule_group(
    group: str,
    sessions: Sequence[PendingSession],
    agents: Sequence[Agent],
    running: Sequence[RunningSession],
    config: PassConfig,
    slot_names: set[str],
    context: CheckContext,
    now: datetime,
    outcomes: _Outcomes,
) -> None:
    group_config = config.for_group(group)
    order = get_strategy(group_config.session_strategy)
    codec = SlotCodec(slot_names, group_config.resource_priority)
    occupancy = GroupOccupancy(agents, codec, packing_direction(group_config.agent_selector))
    selector_config = SelectorConfig(group_config.resource_priority, group_config.selector_options)
    chooser = make_chooser(
        group_config.agent_selector,
        occupancy,
        config.plugin_selectors,
        selector_config,
        outcomes.roundrobin_state.get(group, 0),
    )
    shares = _shares(occupancy, running) if order is drf.order else None  # only DRF reads shares
    entries = _entries(sessions, codec, group_config, context)
    first = _reserve_for_overdue(entries, occupancy, group_config, context, now)
    holders = {entry.id for entry in first}
    # holders go first: they have waited longer than reserve_after, and a session that finds its agent reserved
    # must not be able to block the line in front of the holder
    rest = [entry for entry in entries if entry.id not in holders] if holders else entries
    walk = _GroupWalk(group, occupancy, chooser, shares, context, outcomes, holders)
    walk.walk(chain(first, attempt_order(rest, order, shares or _NO_SHARES)))
    walk.finish()
    if isinstance(chooser, RoundRobinChooser):
        outcomes.roundrobin_state[group] = chooser.next_index


class _GroupWalk:
    """One walk over a group's attempt order; mutable, lives for one group of one pass."""

    def __init__(
        self,
        group: str,
        occupancy: GroupOccupancy,
        chooser: Chooser,
        shares: DominantShares | None,
        context: CheckContext,
        outcomes: _Outcomes,
        holders: set[str],
    ) -> None:
        self.group, self.occupancy, self.chooser, self.shares = group, occupancy, chooser, shares
        self.context, self.outcomes, self.holders = context, outcomes, holders
        self.blocker: str | None = None
        self.hopeless: dict[int, int] = {}  # id(demands) -> index of the one no agent can ever host, or -1
        self.single: dict[str, list[tuple[KernelPlacement, ...] | None]] = {}  # role -> by agent; shared, immutable
        self.short: list[tuple[QueueEntry, int]] = []  # (entry, index of the demand that found no agent)
        self.still_waiting: list[str] = []

    def _visit(self, entry: QueueEntry) -> None:
        session_id = entry.id
        failures = failed_checks(entry.session, self.context) if entry.checked else None
        cancel = next((failure for failure in failures if failure.cancel_reason), None) if failures else None
        if cancel is not None:
            self.outcomes.cancellations[session_id] = Cancellation(
                session_id, str(cancel.cancel_reason), cancel.message
            )
            return
        self.still_waiting.append(session_id)
        not_attempted = self._not_attempted(entry, failures)
        if not_attempted is not None:
            self.outcomes.waiting[session_id] = not_attempted
            return
        attempt = _attempt(entry, self.occupancy, self.chooser, self.holders)
        if attempt.agents is not None:
            self.still_waiting.pop()
            self._placed(entry, attempt.agents)
            return
        self.outcomes.retries[session_id] = 1
        self.short.append((entry, attempt.failed_kernel))
        if not entry.pushed_back:
            self.blocker = session_id

    def walk(self, line: Iterator[QueueEntry]) -> None:
        """Visit the sessions in attempt order until one short of resources blocks the line."""
        for entry in line:
            self._visit(entry)
            if self.blocker is not None:
                self._wait_behind(self.blocker, line)
                return

    def _wait_behind(self, blocker: str, rest: Iterator[QueueEntry]) -> None:
        """The rest of the line once ``blocker`` blocks it: nothing more is attempted, so nothing changes but what
        their checks say (most have no check that can fail: they all get one shared explanation)."""
        message = f"waiting behind {blocker}, which is first in line"
        blocked = WaitExplanation(WaitKind.BLOCKED, message, blocked_by=blocker)
        context, waiting, still_waiting = self.context, self.outcomes.waiting, self.still_waiting
        for entry in rest:
            if entry.checked and failed_checks(entry.session, context):
                self._visit(entry)  # explained by its checks, or cancelled
            else:
                still_waiting.append(entry.id)
                waiting[entry.id] = blocked

    def _not_attempted(self, entry: QueueEntry, failures: list[CheckResult] | None) -> WaitExplanation | None:
        """Why the session is not even tried (cheap: no agent is looked at), or None to try it."""
        if failures:
            checks = tuple((failure.name, failure.message) for failure in failures)
            message = "; ".join(failure.message for failure in failures)
            return WaitExplanation(WaitKind.CHECKS_FAILED, message, failed_checks=checks)
        demands = entry.demands
        hopeless = self.hopeless.get(id(demands))  # static, and entries share one tuple per request
        if hopeless is None:  # not known yet (an ``is`` against an int sentinel never matched, compiled)
            hopeless = self.hopeless[id(demands)] = next(
                (i for i, demand in enumerate(demands) if self.occupancy.never_fits(demand)), _NONE_HOPELESS
            )
        if hopeless != _NONE_HOPELESS:
            return explain_never_fits(self.occupancy, self.group, entry.demands[hopeless], _role(entry, hopeless))
        return None

    def _placed(self, entry: QueueEntry, agents: tuple[int, ...]) -> None:
        session, ids = entry.session, self.occupancy.ids
        if len(agents) == 1:  # the common case: one outcome per role and agent, built once
            role, ordinal = entry.role, agents[0]
            by_agent = self.single.get(role)
            if by_agent is None:
                by_agent = self.single[role] = [None] * len(ids)
            placed: tuple[KernelPlacement, ...] | None = by_agent[ordinal]
            if placed is None:
                placed = by_agent[ordinal] = (KernelPlacement(0, role, ids[ordinal]),)
        else:
            placed = tuple(
                KernelPlacement(index, kernel.role, ids[ordinal])
                for index, (kernel, ordinal) in enumerate(zip(session.kernels, agents, strict=True))
            )
        self.outcomes.placements[entry.id] = placed
        self.context.usage.add_placed(entry.user, entry.project, session)
        if self.shares is not None:
            self.shares.add(entry.user, _total(entry.demands))

    def finish(self) -> None:
        """Explain the sessions short of resources (against the final state), list reservations, number the queue."""
        occupancy, outcomes = self.occupancy, self.outcomes
        reserved_agent = {holder: occupancy.ids[ordinal] for ordinal, (holder, _) in occupancy.holds.items()}
        explained: dict[tuple[Demand, str | None, str | None], WaitExplanation] = {}  # the state is final now
        for entry, kernel in self.short:
            key = (entry.demands[kernel], _role(entry, kernel), reserved_agent.get(entry.id))
            if key not in explained:
                explained[key] = explain_no_fit(occupancy, *key)
            outcomes.waiting[entry.id] = explained[key]
        for ordinal, (holder, demand) in sorted(occupancy.holds.items()):
            outcomes.reservations.append(Reservation(holder, occupancy.ids[ordinal], occupancy.codec.to_slots(demand)))
        outcomes.positions.update(zip(self.still_waiting, count(1)))


def _reserve_for_overdue(
    entries: Sequence[QueueEntry], occupancy: GroupOccupancy, config: GroupConfig, context: CheckContext, now: datetime
) -> list[QueueEntry]:
    """Reserve agents for overdue sessions, highest band and oldest first, up to ``max_reservations``; an agent holds
    one reservation at most. Returns the holders, in that order."""
    holders: list[QueueEntry] = []
    cutoff = overdue_before(config, now)  # is_overdue, with the subtraction done once
    if cutoff is None or config.max_reservations == 0:
        return holders
    before = cutoff.timestamp()  # against the entries' own timestamps (``by_age`` orders on them too)
    overdue = [entry for entry in entries if entry.pushed_back and entry.created < before]
    for entry in _in_reservation_order(overdue):
        if len(holders) >= config.max_reservations:
            break
        if entry.checked and failed_checks(entry.session, context):
            continue
        if any(occupancy.never_fits(demand) for demand in entry.demands):
            continue  # it could not be placed anyway; holding an agent for it would only waste it
        if reserve(occupancy, entry.id, entry.demands):
            holders.append(entry)
    return holders


_PICKED_BY_A_WALK = 4
"""How many holders ``_in_reservation_order`` finds by a walk each before it sorts the rest."""


def _in_reservation_order(entries: Sequence[QueueEntry]) -> Iterator[QueueEntry]:
    """Highest band first, oldest first, equal ages by id (equal in all three: as they came). Lazily: nearly every
    session of a busy queue can be overdue (the more the bigger the queue) and a pass mostly wants one holder
    (``max_reservations`` is 1 unless configured), so the first few are found by a walk each; only if more are
    wanted are the rest sorted, band by band."""
    rest = list(entries)
    for _ in range(_PICKED_BY_A_WALK):
        if not rest:
            return
        best = 0
        for position in range(1, len(rest)):
            if _reserves_before(rest[position], rest[best]):
                best = position
        yield rest.pop(best)  # the rest keep their order: equal ones still come as they came
    bands: dict[int, list[QueueEntry]] = defaultdict(list)
    for entry in rest:
        bands[entry.priority].append(entry)
    for priority in sorted(bands, reverse=True):
        yield from by_age(bands[priority], newest_first=False)


def _reserves_before(entry: QueueEntry, other: QueueEntry) -> bool:
    if entry.priority != other.priority:
        return entry.priority > other.priority
    if entry.created != other.created:
        return entry.created < other.created
    return entry.id < other.id


def _attempt(entry: QueueEntry, occupancy: GroupOccupancy, chooser: Chooser, holders: set[str]) -> Attempt:
    if not holders or entry.id not in holders:
        return place(occupancy, chooser, entry.session, entry.demands, use_cache=True, kernel_count=entry.kernel_count)
    released = occupancy.release_holds(entry.id)  # the holder sees its own reservation as free
    attempt = place(occupancy, chooser, entry.session, entry.demands, use_cache=False, kernel_count=entry.kernel_count)
    if attempt.agents is None:
        for ordinal, demand in released:
            occupancy.hold(ordinal, entry.id, demand)
    return attempt
