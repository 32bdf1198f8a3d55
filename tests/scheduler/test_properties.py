"""Properties over random clusters, queues and configs (hypothesis)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.agents import Agent
from domain.scheduling_config import GroupConfig
from domain.slots import ResourceSlots
from scheduler.agents import concentrated, dispersed
from scheduler.pass_model import ClusterMode, PassConfig, PassResult, PendingSession, Snapshot, WaitKind
from scheduler.scheduling_pass import run_pass
from scheduler.selection import drf
from scheduler.selection.base import QueueEntry
from scheduler.selection.drf import DominantShares
from tests.scheduler.builders import T0, agent, session
from tests.scheduler.simulation import simulate

NOW = T0 + timedelta(hours=1)
GIB = 1024**3


@st.composite
def agents(draw: st.DrawFn, *, busy: bool = True, groups: tuple[str, ...] = ("g", "h")) -> list[Agent]:
    made = []
    for n in range(draw(st.integers(1, 6))):
        capacity: dict[str, object] = {
            "cpu": draw(st.sampled_from([1, 2, 4, 8, 16])),
            "mem": draw(st.sampled_from([4, 16, 64])) * GIB,
        }
        accelerator = draw(st.sampled_from([None, "cuda.shares", "rocm.device"]))
        if accelerator:
            capacity[accelerator] = draw(st.sampled_from([1, 2, 4]))
        occupied = {slot: draw(st.integers(0, int(amount))) if busy else 0 for slot, amount in capacity.items()}
        made.append(
            agent(
                f"a{n}",
                capacity,
                occupied,
                group=draw(st.sampled_from(groups)),
                schedulable=draw(st.booleans()) if busy else True,
            )
        )
    return made


@st.composite
def sessions(draw: st.DrawFn, *, groups: tuple[str, ...] = ("g", "h"), max_size: int = 20) -> list[PendingSession]:
    made = []
    for n in range(draw(st.integers(0, max_size))):
        requested: dict[str, object] = {
            "cpu": draw(st.sampled_from(["0.5", 1, 2, 4])),
            "mem": draw(st.sampled_from([1, 2, 8])) * GIB,
        }
        accelerator = draw(st.sampled_from([None, None, "cuda.shares", "rocm.device"]))
        if accelerator:
            requested[accelerator] = draw(
                st.sampled_from(["0.5", 1, 2]) if accelerator == "cuda.shares" else st.just(1)
            )
        made.append(
            session(
                f"s{n:02d}",
                requested,
                user=draw(st.sampled_from(["u0", "u1", "u2"])),
                at=draw(st.integers(0, 50)),
                group=draw(st.sampled_from(groups)),
                size=draw(st.sampled_from([1, 1, 1, 2, 3])),
                mode=draw(st.sampled_from(list(ClusterMode))),
                priority=draw(st.sampled_from([5, 10, 10, 20])),
                retries=draw(st.integers(0, 3)),
            )
        )
    return made


def group_configs(
    *, selectors: tuple[str, ...] = ("concentrated", "dispersed", "roundrobin")
) -> st.SearchStrategy[GroupConfig]:
    return st.builds(
        GroupConfig,
        session_strategy=st.sampled_from(["fifo", "lifo", "drf"]),
        agent_selector=st.sampled_from(selectors),
        retries_to_skip=st.integers(0, 3),
        reserve_after=st.sampled_from([None, timedelta(0), timedelta(minutes=30)]),
        max_reservations=st.integers(0, 2),
    )


def assert_never_over_committed(all_agents: list[Agent], pending: list[PendingSession], result: PassResult) -> None:
    by_id = {a.id: a for a in all_agents}
    sessions_by_id = {s.id: s for s in pending}
    added: dict[str, ResourceSlots] = defaultdict(ResourceSlots)
    for session_id, kernels in result.placements.items():
        placed = sessions_by_id[session_id]
        assert [k.kernel_index for k in kernels] == list(range(len(placed.kernels)))
        if placed.cluster_mode is ClusterMode.SINGLE_NODE:
            assert len({k.agent_id for k in kernels}) == 1
        for kernel in kernels:
            target = by_id[kernel.agent_id]
            requested = placed.kernels[kernel.kernel_index].requested
            assert target.schedulable and target.resource_group == placed.resource_group
            assert all(target.capacity.amount(slot) > 0 for slot in requested), "landed on an agent lacking a slot"
            added[kernel.agent_id] += requested
    for agent_id, amount in added.items():
        target = by_id[agent_id]
        assert (target.occupied + amount).fits_in(target.capacity), f"{agent_id} over-committed"


@settings(max_examples=200, deadline=None)
@given(agents(), sessions(), group_configs())
def test_no_agent_slot_is_ever_over_committed(
    all_agents: list[Agent], pending: list[PendingSession], group: GroupConfig
) -> None:
    result = run_pass(Snapshot(tuple(all_agents), tuple(pending)), PassConfig(group), NOW)
    assert_never_over_committed(all_agents, pending, result)
    decided = set(result.placements) | set(result.waiting) | set(result.cancellations)
    assert decided == {s.id for s in pending} and not set(result.placements) & set(result.waiting)
    assert set(result.queue_positions) == set(result.waiting)


@settings(max_examples=200, deadline=None)
@given(
    agents(groups=("g",)),
    sessions(groups=("g",)),
    st.sampled_from(["fifo", "lifo"]),
    st.sampled_from(["concentrated", "dispersed", "roundrobin"]),
)
def test_strict_order_never_lets_a_later_session_overtake_for_resources(
    all_agents: list[Agent], pending: list[PendingSession], strategy: str, selector: str
) -> None:
    config = PassConfig(GroupConfig(session_strategy=strategy, agent_selector=selector, retries_to_skip=0))
    result = run_pass(Snapshot(tuple(all_agents), tuple(pending)), config, NOW)
    age = 1 if strategy == "fifo" else -1
    order = sorted(pending, key=lambda s: (-s.priority, age * s.created_at.timestamp(), s.id))
    short = [
        n for n, s in enumerate(order) if s.id in result.waiting and result.waiting[s.id].kind is WaitKind.NO_AGENT_FITS
    ]
    assert len(short) <= 1, "only the head of the line is ever attempted and found short"
    if short:
        later = {s.id for s in order[short[0] + 1 :]}
        assert not later & set(result.placements)
        assert {result.waiting[sid].kind for sid in later} <= {
            WaitKind.BLOCKED,
            WaitKind.CHECKS_FAILED,
            WaitKind.NEVER_FITS,
        }


def _fits_an_empty_cluster(s: PendingSession, cluster: list[Agent]) -> bool:
    if s.cluster_mode is ClusterMode.SINGLE_NODE:
        return any(s.requested.fits_in(a.capacity) for a in cluster)
    kernel = s.kernels[0].requested  # all kernels alike: one per agent that can hold one is enough
    return sum(1 for a in cluster if kernel.fits_in(a.capacity)) >= len(s.kernels)


@settings(max_examples=40, deadline=None)
@given(
    agents(busy=False, groups=("g",)),
    sessions(groups=("g",), max_size=12),
    group_configs(),
    st.integers(1, 3),
    st.integers(1, 3),
)
def test_with_retries_to_skip_every_session_that_fits_is_eventually_placed(
    cluster: list[Agent], pending: list[PendingSession], group: GroupConfig, retries_to_skip: int, runs_for: int
) -> None:
    feasible = [s for s in pending if _fits_an_empty_cluster(s, cluster)]
    config = PassConfig(replace(group, retries_to_skip=retries_to_skip))
    bound = (len(feasible) + 1) * (runs_for + retries_to_skip + 2)
    placed = simulate(cluster, feasible, config, runs_for=runs_for, max_passes=bound)
    assert set(placed) == {s.id for s in feasible}


@settings(max_examples=150, deadline=None)
@given(agents(), sessions(), group_configs(selectors=("concentrated", "dispersed")))
def test_indexed_selectors_choose_exactly_like_the_reference_selectors(
    all_agents: list[Agent], pending: list[PendingSession], group: GroupConfig
) -> None:
    snapshot = Snapshot(tuple(all_agents), tuple(pending))
    reference = {"ref": concentrated.select if group.agent_selector == "concentrated" else dispersed.select}
    indexed = run_pass(snapshot, PassConfig(group), NOW)
    plain = run_pass(snapshot, PassConfig(replace(group, agent_selector="ref"), plugin_selectors=reference), NOW)
    assert indexed.placements == plain.placements
    assert indexed.retry_increments == plain.retry_increments
    assert {k: w.kind for k, w in indexed.waiting.items()} == {k: w.kind for k, w in plain.waiting.items()}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 6), st.integers(0, 3)),  # user, age, share gained when placed
        max_size=40,
    ),
    st.dictionaries(st.integers(0, 5), st.integers(0, 4), max_size=6),  # what users already hold
)
def test_the_drf_order_is_the_lowest_share_then_the_oldest_head_after_every_placement(
    rows: list[tuple[int, int, int]], held: dict[int, int]
) -> None:
    """``drf.order`` (a heap over native vectors) against the definition, done the slow way: after every session
    yielded and placed, the next is the head (oldest, then by id) of the user with the lowest share, equal shares to
    the older head. Small integer amounts over a capacity of 12 make equal shares and equal ages common."""
    entries = [
        QueueEntry(
            session(f"s{n:02d}", {"cpu": 1}, user=f"u{user}", at=age),
            float(age),
            (),
            False,
            f"s{n:02d}",
            f"u{user}",
            None,
            10,
            1,
            "main1",
            False,
        )
        for n, (user, age, _) in enumerate(rows)
    ]
    gains = {f"s{n:02d}": gain for n, (_, _, gain) in enumerate(rows)}

    def shares() -> DominantShares:
        return DominantShares([12], {f"u{user}": [amount] for user, amount in held.items()})

    got, live = [], shares()
    for entry in drf.order(entries, live):
        got.append(entry.id)
        live.add(entry.user, ((0, gains[entry.id]),) if gains[entry.id] else ())
    expected, slow = [], shares()
    heads = defaultdict(list)
    for entry in sorted(entries, key=lambda entry: (entry.created, entry.id)):
        heads[entry.user].append(entry)
    while heads:
        user = min(heads, key=lambda user: (slow.share(user), heads[user][0].created, heads[user][0].id))
        entry = heads[user].pop(0)
        if not heads[user]:
            del heads[user]
        expected.append(entry.id)
        slow.add(entry.user, ((0, gains[entry.id]),) if gains[entry.id] else ())
    assert got == expected
