"""The pass as a whole: admits everything that fits at once, explains the rest, keeps groups apart."""

from __future__ import annotations

import gc
import random
from dataclasses import replace
from datetime import timedelta

import pytest

from domain.scheduling_config import GroupConfig
from domain.slots import ResourceSlots
from scheduler.agents.vectors import SlotCodec
from scheduler.pass_model import ClusterMode, PassConfig, Snapshot, WaitKind
from scheduler.scheduling_pass import _entries, _in_reservation_order, run_pass
from scheduler.wait_checks import CheckContext, Usage
from tests.scheduler.builders import T0, agent, placed_on, run, session, slots


def test_places_every_session_that_fits_in_one_pass() -> None:
    agents = [agent(f"a{n}", {"cpu": 4, "mem": "16g"}) for n in range(5)]
    result = run(agents, [session(f"s{n:02d}", {"cpu": 1, "mem": "4g"}, at=n) for n in range(20)])
    assert len(result.placements) == 20
    assert result.waiting == {} and result.queue_positions == {} and result.retry_increments == {}


def test_occupancy_of_others_is_respected() -> None:
    # 3 of 8 cpu are used by something that is not Caravan's
    result = run([agent("a1", {"cpu": 8}, {"cpu": 3})], [session(f"s{n}", {"cpu": 2}, at=n) for n in range(3)])
    assert set(result.placements) == {"s0", "s1"}


@pytest.mark.parametrize(
    ("name", "agents", "requested", "kind", "shortfall", "best", "text"),
    [
        (
            "no-fit-shortfall-vs-closest",
            [
                agent("a1", {"cpu": 8, "mem": "8g"}, {"cpu": 7}),
                agent("a2", {"cpu": 8, "mem": "8g"}, {"cpu": 5, "mem": "7g"}),
            ],
            {"cpu": 2, "mem": "2g"},
            WaitKind.NO_AGENT_FITS,
            {"cpu": 1},
            "a1",
            "the closest (a1) lacks cpu 1",
        ),
        (
            "never-fits-too-big",
            [agent("a1", {"cpu": 8}), agent("a2", {"cpu": 16})],
            {"cpu": 20},
            WaitKind.NEVER_FITS,
            {"cpu": 4},
            "a2",
            "bigger than any schedulable agent",
        ),
        (
            "never-fits-missing-slot",
            [agent("a1", {"cpu": 8})],
            {"cpu": 1, "tpu.device": 1},
            WaitKind.NEVER_FITS,
            {},
            None,
            "no schedulable agent of resource group g has tpu.device",
        ),
        (
            "never-fits-no-agents",
            [agent("a1", {"cpu": 8}, schedulable=False)],
            {"cpu": 1},
            WaitKind.NEVER_FITS,
            {},
            None,
            "resource group g has no schedulable agent",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_wait_explanations(
    name: str, agents: list, requested: dict, kind: WaitKind, shortfall: dict, best: str | None, text: str
) -> None:
    result = run(agents, [session("s", requested)])
    explanation = result.waiting["s"]
    assert explanation.kind is kind
    assert explanation.shortfall == slots(shortfall)
    assert explanation.best_agent == best
    assert text in explanation.message
    assert (result.retry_increments == {"s": 1}) is (kind is WaitKind.NO_AGENT_FITS)


def test_blocked_sessions_are_explained_and_numbered() -> None:
    pending = [
        session("ok", {"cpu": 1}, at=0),
        session("head", {"cpu": 4}, at=1),
        session("next", {"cpu": 1}, at=2),
        session("urgent", {"cpu": 1}, at=3, priority=50),
    ]
    result = run([agent("a1", {"cpu": 4}, {"cpu": 1})], pending)
    assert set(result.placements) == {"urgent", "ok"}
    assert result.waiting["next"].kind is WaitKind.BLOCKED and result.waiting["next"].blocked_by == "head"
    assert "head" in result.waiting["next"].message
    assert result.queue_positions == {"head": 1, "next": 2}


def test_groups_are_scheduled_independently_with_their_own_config() -> None:
    agents = [
        agent("g1-a", {"cpu": 4}, group="g1"),
        agent("g1-b", {"cpu": 4}, {"cpu": 2}, group="g1"),
        agent("g2-a", {"cpu": 4}, group="g2"),
        agent("g2-b", {"cpu": 4}, {"cpu": 2}, group="g2"),
    ]
    pending = [
        session("in-g1", {"cpu": 1}, group="g1"),
        session("in-g2", {"cpu": 1}, group="g2"),
        session("g2-blocker", {"cpu": 9}, group="g2", at=-1),
    ]
    config = PassConfig(
        GroupConfig(agent_selector="concentrated"), groups={"g2": GroupConfig(agent_selector="dispersed")}
    )
    result = run_pass(Snapshot(tuple(agents), tuple(pending)), config, T0)
    assert placed_on(result) == {"in-g1": "g1-b", "in-g2": "g2-a"}
    assert result.waiting["g2-blocker"].kind is WaitKind.NEVER_FITS


def test_run_pass_does_not_mutate_its_input() -> None:
    agents = (agent("a1", {"cpu": 4}),)
    pending = (session("s", {"cpu": 2}),)
    snapshot = Snapshot(agents, pending, roundrobin_state={"g": 0})
    first = run_pass(snapshot, PassConfig(GroupConfig(agent_selector="roundrobin")), T0)
    second = run_pass(snapshot, PassConfig(GroupConfig(agent_selector="roundrobin")), T0)
    assert first == second
    assert snapshot.agents[0].occupied == ResourceSlots() and snapshot.roundrobin_state == {"g": 0}


def test_fractional_and_byte_amounts_are_exact() -> None:
    # 0.1 + 0.2 cpu on a 0.3 cpu agent must fit exactly (no float drift); bytes to the byte
    agents = [agent("a1", {"cpu": "0.3", "mem": 3 * 1024**3 + 1})]
    pending = [
        session("x", {"cpu": "0.1", "mem": "1g"}, at=0),
        session("y", {"cpu": "0.2", "mem": 2 * 1024**3 + 1}, at=1),
    ]
    assert set(run(agents, pending).placements) == {"x", "y"}


def test_the_garbage_collector_is_left_as_the_pass_found_it() -> None:
    pending = [session("s1", {"cpu": 1})]
    assert gc.isenabled()
    run([agent("a", {"cpu": 4})], pending)
    assert gc.isenabled()
    gc.disable()
    try:
        run([agent("a", {"cpu": 4})], pending)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_sessions_asking_for_one_request_share_its_demands() -> None:
    """The walk's caches (never-fits, known failures) go by the demands' identity, so the sessions of one request
    share one tuple (compiled, a fixed-length tuple type once made a new one per session, and the caches never hit)."""
    first = session("s1", {"cpu": 1, "mem": 1024})
    same_object = replace(first, id="s2")  # one request object, as the snapshot reader shares presets
    equal_value = session("s3", {"cpu": 1, "mem": 1024})
    context = CheckContext(T0, {}, {}, {}, Usage())
    entries = _entries([first, same_object, equal_value], SlotCodec({"cpu", "mem"}, ("cpu",)), GroupConfig(), context)
    assert entries[0].demands is entries[1].demands
    assert entries[0].demands is entries[2].demands


def test_dispersed_sees_the_amounts_a_failed_multi_node_session_gave_back() -> None:
    # c1's kernels go to a (the most free), then b, then find nothing: both are rolled back. s2 asks for the same
    # amounts and must get a again; a search that remembered where it last found an agent (b's amounts) would skip
    # a, now back among the freest (fails if the rollback does not make the index forget those starts)
    agents = [agent("a", {"cpu": 8, "mem": "8g"}), agent("b", {"cpu": 7, "mem": "7g"}), agent("c", {"cpu": 1})]
    cluster = session("c1", {"cpu": 6, "mem": "6g"}, size=3, mode=ClusterMode.MULTI_NODE, priority=20, retries=1)
    result = run(
        agents,
        [cluster, session("s2", {"cpu": 6, "mem": "6g"}, at=1)],
        agent_selector="dispersed",
        retries_to_skip=1,
    )
    assert "c1" not in result.placements
    assert placed_on(result) == {"s2": "a"}


def test_dispersed_sees_the_amounts_a_released_reservation_gave_back() -> None:
    # h1 and h2 are overdue: h1 holds a, h2 holds x. h1 releases a and is placed there; then h2 releases x, which is
    # freer than a ever was, and must be placed on it (fails if the release does not make the index forget where
    # the same request was last found: the search would start past x and find nothing)
    agents = [agent("a", {"cpu": 8, "mem": "8g"}), agent("x", {"cpu": 10, "mem": "10g"})]
    overdue = [session(f"h{n}", {"cpu": 6, "mem": "6g"}, at=n, retries=1) for n in (1, 2)]
    result = run(
        agents,
        overdue,
        now=T0 + timedelta(hours=2),
        agent_selector="dispersed",
        retries_to_skip=1,
        reserve_after=timedelta(hours=1),
        max_reservations=2,
    )
    assert placed_on(result) == {"h1": "a", "h2": "x"}


@pytest.mark.parametrize("seed", range(3))
def test_holders_are_tried_highest_band_first_then_oldest_then_by_id(seed: int) -> None:
    """The first few found by a walk each, the rest sorted: one order throughout, the one a sort of all of them
    gives, with equal ages and equal ids among them (equal in all: as they came)."""
    rng = random.Random(seed)
    sessions = [
        session(f"s{rng.randrange(12):02d}", {"cpu": 1}, at=rng.randrange(8), priority=rng.choice([5, 10, 20]))
        for _ in range(40)
    ]
    entries = _entries(sessions, SlotCodec({"cpu"}, ("cpu",)), GroupConfig(), CheckContext(T0, {}, {}, {}, Usage()))
    for count in (0, 1, 3, 4, 5, 40):
        wanted = sorted(entries[:count], key=lambda entry: (-entry.priority, entry.created, entry.id))
        assert list(_in_reservation_order(entries[:count])) == wanted
