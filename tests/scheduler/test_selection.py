"""Session selection: retry threshold, priority bands, FIFO/LIFO/DRF order, reservations."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from domain.scheduling_config import GroupConfig
from scheduler.pass_model import PassConfig, PendingSession, Reservation, RunningSession, WaitKind
from scheduler.selection import UnknownStrategyError, get_strategy
from tests.scheduler.builders import T0, agent, placed_on, run, session, slots
from tests.scheduler.simulation import simulate


@dataclass(frozen=True)
class HolCase:
    name: str
    retries_to_skip: int
    big_retries: int
    strategy: str = "fifo"
    placed: frozenset[str] = frozenset()
    blocked: frozenset[str] = frozenset()


# a1 has 2 cpu free; "big" (oldest) wants 3, "small" wants 1
HOL_CASES = [
    HolCase("strict-head-blocks", 0, 0, blocked=frozenset({"small"})),
    HolCase("strict-ignores-retry-count", 0, 9, blocked=frozenset({"small"})),
    HolCase("below-threshold-still-blocks", 3, 2, blocked=frozenset({"small"})),
    HolCase("at-threshold-pushed-back", 3, 3, placed=frozenset({"small"})),
    HolCase("above-threshold-pushed-back", 1, 5, placed=frozenset({"small"})),
    HolCase("drf-below-threshold-blocks", 2, 1, "drf", blocked=frozenset({"small"})),
    HolCase("drf-pushed-back", 2, 2, "drf", placed=frozenset({"small"})),
]


@pytest.mark.parametrize("case", HOL_CASES, ids=[c.name for c in HOL_CASES])
def test_retry_threshold(case: HolCase) -> None:
    result = run(
        [agent("a1", {"cpu": 4}, {"cpu": 2})],
        [session("big", {"cpu": 3}, at=0, retries=case.big_retries), session("small", {"cpu": 1}, at=1)],
        session_strategy=case.strategy,
        retries_to_skip=case.retries_to_skip,
    )
    assert set(result.placements) == case.placed
    assert {sid for sid, w in result.waiting.items() if w.kind is WaitKind.BLOCKED} == case.blocked
    assert result.waiting["big"].kind is WaitKind.NO_AGENT_FITS
    assert result.retry_increments == {"big": 1}  # only attempted sessions are charged
    for sid in case.blocked:
        assert result.waiting[sid].blocked_by == "big"


@dataclass(frozen=True)
class OrderCase:
    name: str
    strategy: str
    pending: list[PendingSession]
    free_cpu: int
    placed: set[str]
    running: list[RunningSession] = field(default_factory=list)
    retries_to_skip: int = 0


ORDER_CASES = [
    OrderCase(
        "fifo-oldest-first", "fifo", [session("new", {"cpu": 1}, at=5), session("old", {"cpu": 1}, at=1)], 1, {"old"}
    ),
    OrderCase(
        "lifo-newest-first", "lifo", [session("new", {"cpu": 1}, at=5), session("old", {"cpu": 1}, at=1)], 1, {"new"}
    ),
    OrderCase(
        "higher-band-first-fifo",
        "fifo",
        [session("old-low", {"cpu": 1}, at=0, priority=5), session("new-high", {"cpu": 1}, at=9, priority=20)],
        1,
        {"new-high"},
    ),
    OrderCase(
        "higher-band-first-lifo",
        "lifo",
        [session("new-low", {"cpu": 1}, at=9, priority=5), session("old-high", {"cpu": 1}, at=0, priority=20)],
        1,
        {"old-high"},
    ),
    OrderCase(
        "blocked-high-band-blocks-lower-bands",
        "fifo",
        [session("high-big", {"cpu": 3}, at=5, priority=20), session("low-small", {"cpu": 1}, at=0, priority=5)],
        2,
        set(),
    ),
    OrderCase(
        "pushed-back-high-band-lets-lower-go",
        "fifo",
        [
            session("high-big", {"cpu": 3}, at=5, priority=20, retries=1),
            session("low-small", {"cpu": 1}, at=0, priority=5),
        ],
        2,
        {"low-small"},
        retries_to_skip=1,
    ),
    OrderCase(
        "pushed-back-goes-behind-its-band",
        "fifo",
        [session("old-pushed", {"cpu": 1}, at=0, retries=2), session("young", {"cpu": 1}, at=5)],
        1,
        {"young"},
        retries_to_skip=2,
    ),
    OrderCase(
        "lifo-blocks-like-fifo", "lifo", [session("old", {"cpu": 1}, at=0), session("new", {"cpu": 3}, at=1)], 2, set()
    ),
    OrderCase(
        "drf-lowest-share-first",
        "drf",
        [
            session("s1", {"cpu": 1}, user="u1", at=0),
            session("s2", {"cpu": 1}, user="u2", at=1),
            session("s3", {"cpu": 1}, user="u3", at=2),
        ],
        1,
        {"s3"},
        running=[RunningSession("r1", "u1", "g", slots(cpu=4)), RunningSession("r2", "u2", "g", slots(mem="50g"))],
    ),
    OrderCase(
        "drf-dominant-is-max-over-slots",
        "drf",
        [session("mem-heavy", {"cpu": 1}, user="u1", at=0), session("cpu-light", {"cpu": 1}, user="u2", at=1)],
        1,
        {"cpu-light"},
        running=[RunningSession("r1", "u1", "g", slots(mem="60g")), RunningSession("r2", "u2", "g", slots(cpu=3))],
    ),
    OrderCase(
        "drf-ties-by-age",
        "drf",
        [session("young", {"cpu": 1}, user="u1", at=5), session("old", {"cpu": 1}, user="u2", at=1)],
        1,
        {"old"},
    ),
    OrderCase(
        "drf-bands-before-shares",
        "drf",
        [session("rich-high", {"cpu": 1}, user="u1", at=5, priority=20), session("poor", {"cpu": 1}, user="u2")],
        1,
        {"rich-high"},
        running=[RunningSession("r1", "u1", "g", slots(cpu=9))],
    ),
]


@pytest.mark.parametrize("case", ORDER_CASES, ids=[c.name for c in ORDER_CASES])
def test_session_order(case: OrderCase) -> None:
    # one agent of 10 cpu / 100 GiB with ``free_cpu`` cpu free: the first session(s) in order take it
    result = run(
        [agent("a1", {"cpu": 10, "mem": "100g"}, {"cpu": 10 - case.free_cpu})],
        case.pending,
        running=tuple(case.running),
        session_strategy=case.strategy,
        retries_to_skip=case.retries_to_skip,
    )
    assert set(result.placements) == case.placed


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [("drf", ["a", "d", "b", "c"]), ("fifo", ["a", "b", "c", "d"]), ("lifo", ["d", "c", "b", "a"])],
)
def test_drf_shares_update_within_the_pass(strategy: str, expected: list[str]) -> None:
    # u2 already holds 0.5 of 4 cpu (share 0.125). With shares updated after each placement u1 (0.25 after "a")
    # must yield to u2 before placing "b"; frozen shares would give a, b, c, d. Round-robin over a0..a3 shows the order.
    agents = [agent(f"a{n}", {"cpu": 1}) for n in range(4)]
    pending = [
        session("a", {"cpu": 1}, user="u1", at=0),
        session("b", {"cpu": 1}, user="u1", at=1),
        session("c", {"cpu": 1}, user="u1", at=2),
        session("d", {"cpu": 1}, user="u2", at=3),
    ]
    result = run(
        agents,
        pending,
        running=(RunningSession("r", "u2", "g", slots(cpu="0.5")),),
        session_strategy=strategy,
        agent_selector="roundrobin",
    )
    order = sorted(placed_on(result), key=lambda sid: placed_on(result)[sid])
    assert order == expected


def test_drf_with_several_slots_and_users() -> None:
    # capacity cpu 8, cuda 4: u1 holds 2 cuda (0.5), u2 holds 3 cpu (0.375), u3 nothing.
    agents = [agent("a1", {"cpu": 8, "cuda.shares": 4}, {"cpu": 3, "cuda.shares": 2})]
    running = (
        RunningSession("r1", "u1", "g", slots({"cuda.shares": 2})),
        RunningSession("r2", "u2", "g", slots(cpu=3)),
    )
    pending = [session(f"{user}-{n}", {"cpu": 1}, user=user, at=n) for n in range(3) for user in ("u1", "u2", "u3")]
    # u3 (0) goes three times (1/8, 2/8, 3/8); then u2 (3/8 < u1's 1/2) -> u2 at 4/8; now u1 and u2 tie at 1/2 and
    # u1's head (at 0) is older than u2's (at 1). That is 5 cpu: a1 is full.
    result = run(agents, pending, running=running, session_strategy="drf", retries_to_skip=1)
    assert set(result.placements) == {"u3-0", "u3-1", "u3-2", "u2-0", "u1-0"}


def test_unknown_strategy_lists_valid_names() -> None:
    with pytest.raises(UnknownStrategyError, match="drf, fifo, lifo"):
        get_strategy("fair-share")
    with pytest.raises(UnknownStrategyError):
        run([agent("a1", {"cpu": 1})], [session("s", {"cpu": 1})], session_strategy="nope")


# -- reservations: a pushed-back session older than reserve_after holds the agent it fits best --


def _reservation_scene(reserve_after: timedelta | None, big_age: timedelta) -> tuple[list, list]:
    agents = [agent("a1", {"cpu": 4}, {"cpu": 3}), agent("a2", {"cpu": 2})]
    now = T0 + timedelta(hours=1)
    big = session("big", {"cpu": 4}, retries=5, at=int((now - big_age - T0).total_seconds()))
    smalls = [session(f"s{n}", {"cpu": 1}, at=3600 + n, retries=5) for n in range(3)]
    return agents, [big, *smalls]


@pytest.mark.parametrize(
    ("name", "reserve_after", "big_age", "reserved", "placed"),
    [
        ("no-reservation-configured", None, timedelta(hours=2), None, {"s0": "a1", "s1": "a2", "s2": "a2"}),
        ("not-overdue-yet", timedelta(hours=3), timedelta(hours=2), None, {"s0": "a1", "s1": "a2", "s2": "a2"}),
        ("overdue-reserves-a1", timedelta(hours=1), timedelta(hours=2), "a1", {"s0": "a2", "s1": "a2"}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_reservation_keeps_others_off_the_reserved_agent(
    name: str, reserve_after: timedelta | None, big_age: timedelta, reserved: str | None, placed: dict[str, str]
) -> None:
    agents, pending = _reservation_scene(reserve_after, big_age)
    result = run(agents, pending, retries_to_skip=1, reserve_after=reserve_after, agent_selector="concentrated")
    assert placed_on(result) == placed
    if reserved is None:
        assert result.reservations == ()
    else:
        assert result.reservations == (Reservation("big", reserved, slots(cpu=4)),)
        assert "reserved" in result.waiting["big"].message


def test_reservation_picks_agent_with_most_progress() -> None:
    # both could host cpu 4 when empty; a3 already has 3 of the 4 free
    agents = [agent("a1", {"cpu": 4}, {"cpu": 3}), agent("a3", {"cpu": 8}, {"cpu": 5}), agent("tiny", {"cpu": 2})]
    pending = [session("big", {"cpu": 4}, retries=1, at=0)]
    result = run(agents, pending, retries_to_skip=1, reserve_after=timedelta(0))
    assert [r.agent_id for r in result.reservations] == ["a3"]


def test_overdue_session_that_fits_now_is_placed_on_its_reservation() -> None:
    agents = [agent("a1", {"cpu": 4})]
    pending = [session("young", {"cpu": 1}, at=3000), session("old", {"cpu": 4}, retries=1, at=0)]
    result = run(agents, pending, retries_to_skip=1, reserve_after=timedelta(minutes=5))
    assert set(result.placements) == {"old"}  # without the reservation "young" (not pushed back) would go first
    assert result.waiting["young"].kind is WaitKind.NO_AGENT_FITS


@pytest.mark.parametrize(
    ("reserve_after", "starves"),
    [(None, True), (timedelta(minutes=10), False)],
    ids=["without-reservation-starves", "with-reservation-is-placed"],
)
def test_reservation_bounds_starvation(reserve_after: timedelta | None, starves: bool) -> None:
    # Four older 1-cpu sessions fill the agent, then a queue of 1-cpu sessions keeps taking every freed cpu: "big"
    # (pushed back after one failure) never sees 4 cpu free at once unless it reserves the agent.
    agents = [agent("a1", {"cpu": 4})]
    smalls = [session(f"s{n:03d}", {"cpu": 1}, at=n if n < 4 else 60 + n) for n in range(120)]
    config = PassConfig(GroupConfig(retries_to_skip=1, reserve_after=reserve_after))
    placed = simulate(agents, [session("big", {"cpu": 4}, at=10), *smalls], config, runs_for=3, max_passes=45)
    assert ("big" not in placed) is starves
    if not starves:
        assert placed["big"] < 20


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("fifo", ["old", "a", "b", "c", "new"]),
        ("lifo", ["new", "a", "b", "c", "old"]),
        ("drf", ["old", "a", "b", "c", "new"]),
    ],
)
def test_sessions_created_at_the_same_instant_go_by_id(strategy: str, expected: list[str]) -> None:
    # the order sorts on the creation time alone when no two are equal; equal times must still go by session id
    pending = [session(sid, {"cpu": 8}, at=at) for sid, at in (("c", 1), ("new", 2), ("a", 1), ("old", 0), ("b", 1))]
    result = run([agent("a1", {"cpu": 4})], pending, session_strategy=strategy, retries_to_skip=1)
    assert sorted(result.queue_positions, key=result.queue_positions.__getitem__) == expected
