"""Agent selection: accelerator avoidance, slot priority, pack/spread, round-robin, cluster sessions, plugins."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from librt.vecs import vec
from mypy_extensions import i64

import scheduler.agents
from domain.agents import Agent
from domain.scheduling_config import GroupConfig
from scheduler.agents import UnknownSelectorError, load_plugin_selectors, roundrobin
from scheduler.agents.base import AgentView, SelectionRequest, SelectorConfig
from scheduler.agents.index import CHUNK, CONCENTRATED, DISPERSED, PackingIndex, _Tier
from scheduler.agents.occupancy import pareto_front
from scheduler.agents.ranking import order_slots
from scheduler.pass_model import ClusterMode, PassConfig, WaitKind
from scheduler.scheduling_pass import validate_config
from tests.scheduler.builders import agent, placed_on, run, session

MULTI = ClusterMode.MULTI_NODE


@dataclass(frozen=True)
class PickCase:
    name: str
    selector: str
    agents: list[Agent]
    requested: dict[str, object]
    expected: str
    priority: tuple[str, ...] = ("cuda", "rocm", "tpu", "cpu", "mem")


GPU_BIG = agent("gpu-big", {"cpu": 64, "mem": "256g", "cuda.shares": 8})
CPU_SMALL = agent("cpu-small", {"cpu": 8, "mem": "32g"})
# for slot priority: A has little cuda and lots of cpu free, B the opposite
CUDA_LOW = agent("A", {"cpu": 32, "cuda.shares": 4}, {"cuda.shares": 2, "cpu": 2})
CUDA_HIGH = agent("B", {"cpu": 32, "cuda.shares": 4}, {"cpu": 22})

PICK_CASES = [
    PickCase("cpu-only-avoids-gpu-agent-concentrated", "concentrated", [GPU_BIG, CPU_SMALL], {"cpu": 2}, "cpu-small"),
    PickCase("cpu-only-avoids-gpu-agent-dispersed", "dispersed", [GPU_BIG, CPU_SMALL], {"cpu": 2}, "cpu-small"),
    PickCase(
        "cpu-only-uses-gpu-agent-when-nothing-else-fits", "dispersed", [GPU_BIG, CPU_SMALL], {"cpu": 16}, "gpu-big"
    ),
    PickCase(
        "gpu-session-prefers-fewer-unused-kinds",
        "dispersed",
        [
            agent("cuda+rocm", {"cpu": 64, "cuda.shares": 8, "rocm.device": 2}),
            agent("cuda", {"cpu": 8, "cuda.shares": 1}),
        ],
        {"cuda.shares": 1},
        "cuda",
    ),
    PickCase(
        "two-slots-of-one-kind-count-once",
        "concentrated",
        [
            agent("cuda-2slots", {"cpu": 8, "cuda.shares": 4, "cuda.mem": "16g"}),
            agent("rocm", {"cpu": 4, "rocm.device": 1}),
        ],
        {"cpu": 1},
        "rocm",
    ),
    PickCase(
        "concentrated-packs-least-remaining",
        "concentrated",
        [agent("roomy", {"cpu": 8}), agent("tight", {"cpu": 8}, {"cpu": 6})],
        {"cpu": 2},
        "tight",
    ),
    PickCase(
        "dispersed-spreads-most-remaining",
        "dispersed",
        [agent("roomy", {"cpu": 8}), agent("tight", {"cpu": 8}, {"cpu": 6})],
        {"cpu": 2},
        "roomy",
    ),
    PickCase(
        "concentrated-skips-too-tight",
        "concentrated",
        [agent("roomy", {"cpu": 8}), agent("tight", {"cpu": 8}, {"cpu": 7})],
        {"cpu": 2},
        "roomy",
    ),
    PickCase(
        "cuda-prefix-ranks-first-concentrated", "concentrated", [CUDA_LOW, CUDA_HIGH], {"cuda.shares": 1, "cpu": 1}, "A"
    ),
    PickCase(
        "cuda-prefix-ranks-first-dispersed", "dispersed", [CUDA_LOW, CUDA_HIGH], {"cuda.shares": 1, "cpu": 1}, "B"
    ),
    PickCase(
        "cpu-first-priority-concentrated",
        "concentrated",
        [CUDA_LOW, CUDA_HIGH],
        {"cuda.shares": 1, "cpu": 1},
        "B",
        ("cpu", "cuda"),
    ),
    PickCase(
        "cpu-first-priority-dispersed",
        "dispersed",
        [CUDA_LOW, CUDA_HIGH],
        {"cuda.shares": 1, "cpu": 1},
        "A",
        ("cpu", "cuda"),
    ),
    PickCase(
        "second-slot-breaks-first-slot-tie",
        "concentrated",
        [agent("more-mem", {"cpu": 4, "mem": "8g"}), agent("less-mem", {"cpu": 4, "mem": "8g"}, {"mem": "4g"})],
        {"cpu": 1, "mem": "1g"},
        "less-mem",
    ),
    PickCase(
        "tie-breaks-by-id-concentrated",
        "concentrated",
        [agent("b", {"cpu": 4}), agent("a", {"cpu": 4})],
        {"cpu": 1},
        "a",
    ),
    PickCase(
        "tie-breaks-by-id-dispersed", "dispersed", [agent("b", {"cpu": 4}), agent("a", {"cpu": 4})], {"cpu": 1}, "a"
    ),
    PickCase(
        "never-on-agent-lacking-a-slot",
        "dispersed",
        [agent("cpu-huge", {"cpu": 128}), GPU_BIG],
        {"cuda.shares": "0.5"},
        "gpu-big",
    ),
    PickCase(
        "unschedulable-agent-excluded",
        "dispersed",
        [agent("draining", {"cpu": 64}, schedulable=False), agent("up", {"cpu": 4})],
        {"cpu": 1},
        "up",
    ),
]


@pytest.mark.parametrize("case", PICK_CASES, ids=[c.name for c in PICK_CASES])
def test_agent_pick(case: PickCase) -> None:
    result = run(
        case.agents, [session("s", case.requested)], agent_selector=case.selector, resource_priority=case.priority
    )
    assert placed_on(result) == {"s": case.expected}


def test_slot_priority_order_with_device_prefixes() -> None:
    slots = ["mem", "zeta", "cpu", "cuda.shares", "alpha.x", "rocm.device", "cuda.device", "tpu"]
    assert order_slots(slots, ("cuda", "rocm", "tpu", "cpu", "mem")) == [
        "cuda.device",
        "cuda.shares",
        "rocm.device",
        "tpu",
        "cpu",
        "mem",
        "alpha.x",
        "zeta",
    ]


def test_session_asking_for_a_slot_no_agent_has_never_fits() -> None:
    result = run([agent("a1", {"cpu": 64})], [session("s", {"cuda.shares": 1}), session("t", {"cpu": 1}, at=1)])
    assert result.waiting["s"].kind is WaitKind.NEVER_FITS
    assert "cuda.shares" in result.waiting["s"].message
    assert set(result.placements) == {"t"}  # never-fits blocks nobody
    assert "s" not in result.retry_increments


@pytest.mark.parametrize(("start", "first_agent", "next_index"), [(0, "a0", 0), (2, "a2", 2), (7, "a3", 3)])
def test_roundrobin_is_even_and_its_state_round_trips(start: int, first_agent: str, next_index: int) -> None:
    agents = [agent(f"a{n}", {"cpu": 8}) for n in range(4)]
    pending = [session(f"s{n:02d}", {"cpu": 1}, at=n) for n in range(12)]
    result = run(agents, pending, agent_selector="roundrobin", roundrobin_state={"g": start})
    assert placed_on(result)["s00"] == first_agent
    assert Counter(placed_on(result).values()) == {"a0": 3, "a1": 3, "a2": 3, "a3": 3}
    assert result.roundrobin_state == {"g": next_index}


def test_roundrobin_skips_agents_that_do_not_fit() -> None:
    agents = [agent("a0", {"cpu": 8}), agent("a1", {"cpu": 8}, {"cpu": 8}), agent("a2", {"cpu": 8})]
    result = run(
        agents,
        [session(f"s{n}", {"cpu": 1}, at=n) for n in range(3)],
        agent_selector="roundrobin",
        roundrobin_state={"g": 1},
    )
    assert placed_on(result) == {"s0": "a2", "s1": "a0", "s2": "a2"}
    assert result.roundrobin_state == {"g": 0}


@pytest.mark.parametrize(
    ("name", "agents", "size", "mode", "expected"),
    [
        (
            "single-node-sums-kernels",
            [agent("a4", {"cpu": 4}), agent("a8", {"cpu": 8})],
            3,
            ClusterMode.SINGLE_NODE,
            ["a8", "a8", "a8"],
        ),
        (
            "multi-node-packs-kernel-by-kernel",
            [agent("a1", {"cpu": 4}), agent("a2", {"cpu": 4}, {"cpu": 2})],
            3,
            MULTI,
            ["a2", "a1", "a1"],
        ),
        ("multi-node-may-share-an-agent", [agent("a1", {"cpu": 8})], 3, MULTI, ["a1", "a1", "a1"]),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_cluster_sessions(name: str, agents: list[Agent], size: int, mode: ClusterMode, expected: list[str]) -> None:
    result = run(agents, [session("c", {"cpu": 2}, size=size, mode=mode)], agent_selector="concentrated")
    kernels = result.placements["c"]
    assert [k.agent_id for k in kernels] == expected
    assert [k.role for k in kernels] == ["main1", "sub1", "sub2"]
    assert [k.kernel_index for k in kernels] == [0, 1, 2]


def test_single_node_that_no_agent_can_hold_never_fits_even_if_kernels_would() -> None:
    result = run([agent("a4", {"cpu": 4}), agent("a5", {"cpu": 4})], [session("c", {"cpu": 2}, size=3)])
    assert result.waiting["c"].kind is WaitKind.NEVER_FITS
    assert result.placements == {}


def test_multi_node_is_all_or_nothing() -> None:
    # 5 cpu free over two agents: two kernels of 2 fit, the third does not -> nothing placed and nothing consumed,
    # so the later 3-cpu session still finds a1's 3 cpu.
    agents = [agent("a1", {"cpu": 4}, {"cpu": 1}), agent("a2", {"cpu": 2})]
    pending = [session("c", {"cpu": 2}, size=3, mode=MULTI, retries=1, at=0), session("s", {"cpu": 3}, retries=1, at=1)]
    result = run(agents, pending, retries_to_skip=1, agent_selector="concentrated")
    assert placed_on(result) == {"s": "a1"}
    assert result.waiting["c"].kind is WaitKind.NO_AGENT_FITS
    assert "sub2" in result.waiting["c"].message


# -- custom selectors --


def pick_last(request: SelectionRequest, candidates: Sequence[AgentView], config: SelectorConfig) -> str | None:
    assert all(request.requested.fits_in(c.remaining) for c in candidates)
    return candidates[-1].id


def pick_none(request: SelectionRequest, candidates: Sequence[AgentView], config: SelectorConfig) -> str | None:
    return None


def pick_stranger(request: SelectionRequest, candidates: Sequence[AgentView], config: SelectorConfig) -> str | None:
    return "not-an-agent"


def test_custom_selector_is_used_and_sees_only_fitting_candidates() -> None:
    agents = [agent("a", {"cpu": 4}), agent("b", {"cpu": 4}), agent("full", {"cpu": 4}, {"cpu": 4})]
    result = run(
        agents,
        [session("s1", {"cpu": 3}), session("s2", {"cpu": 3}, at=1)],
        agent_selector="last",
        plugin_selectors={"last": pick_last},
    )
    assert placed_on(result) == {"s1": "b", "s2": "a"}


def test_custom_selector_may_decline() -> None:
    result = run(
        [agent("a", {"cpu": 4})],
        [session("s", {"cpu": 1})],
        agent_selector="none",
        plugin_selectors={"none": pick_none},
    )
    assert result.waiting["s"].kind is WaitKind.NO_AGENT_FITS and result.retry_increments == {"s": 1}


def test_custom_selector_returning_a_stranger_is_a_bug() -> None:
    with pytest.raises(ValueError, match="not-an-agent"):
        run(
            [agent("a", {"cpu": 4})],
            [session("s", {"cpu": 1})],
            agent_selector="bad",
            plugin_selectors={"bad": pick_stranger},
        )


def test_unknown_selector_lists_valid_names() -> None:
    with pytest.raises(UnknownSelectorError, match="concentrated, dispersed, last, roundrobin"):
        run(
            [agent("a", {"cpu": 4})],
            [session("s", {"cpu": 1})],
            agent_selector="packed",
            plugin_selectors={"last": pick_last},
        )


def test_config_is_validated_up_front() -> None:
    validate_config(
        PassConfig(
            GroupConfig(), groups={"gpu": GroupConfig(agent_selector="last")}, plugin_selectors={"last": pick_last}
        )
    )
    with pytest.raises(UnknownSelectorError):
        validate_config(PassConfig(GroupConfig(), groups={"gpu": GroupConfig(agent_selector="last")}))


def test_plugins_load_from_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = [EntryPoint("last", "tests.scheduler.test_agents:pick_last", scheduler.agents.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(
        scheduler.agents, "entry_points", lambda group: fake if group == "caravan.agent_selectors" else []
    )
    assert load_plugin_selectors() == {"last": pick_last}
    assert load_plugin_selectors(["dispersed", "last"]) == {"last": pick_last}
    with pytest.raises(UnknownSelectorError, match="missing"):
        load_plugin_selectors(["missing"])


@pytest.mark.parametrize("start", range(7))
def test_roundrobin_over_candidates_picks_what_a_scan_of_every_agent_picks(start: int) -> None:
    fitting = {1, 4, 5}  # the candidates are the agents that could fit at all; only some fit now
    candidates = [1, 2, 4, 5]
    everything = roundrobin.select(6, start, fitting.__contains__)
    assert roundrobin.select(6, start, fitting.__contains__, candidates) == everything
    assert roundrobin.select(6, start, set().__contains__, candidates) == (None, start % 6)


@pytest.mark.parametrize("chunk", [1, 3, CHUNK])
@pytest.mark.parametrize("direction", [CONCENTRATED, DISPERSED])
@pytest.mark.parametrize("seed", range(4))
def test_a_packing_index_moved_where_its_searches_found_agents_answers_as_one_built_afresh(
    direction: int, seed: int, chunk: int
) -> None:
    """A placement takes the agent's key out of its bucket where the search just found it; a change of an agent the
    last search did not find (or one after a search that found nothing) takes the key its old amounts give. After a
    seeded mix of both, amounts going down and, now and then, back up, every search answers as an index built from
    the final amounts (with the default chunks), and its buckets hold exactly that index's keys. Dispersed buckets
    in chunks of 1 and 3 keys split and empty chunks all along."""
    rng = random.Random(seed * 2 + direction)
    positions = (0, 1, 2)
    capacity = [[rng.choice([8000, 16000]), rng.choice([16000, 64000]), rng.choice([2000, 4000])] for _ in range(60)]
    avail = vec[vec[i64]](vec[i64](vector) for vector in capacity)
    members = [(ordinal, rng.choice([0, 1])) for ordinal in range(len(avail)) if rng.random() < 0.9]
    index = PackingIndex(positions, direction, members, avail, capacity, chunk)
    needs = [(cpu, mem, gpu) for cpu in (500, 1000, 2000) for mem in (1000, 4000, 8000) for gpu in (0, 500)]
    hinted = given_back = 0
    for _ in range(600):
        need = rng.choice(needs)
        found = index.search(need)
        ordinal = found if found is not None and rng.random() < 0.8 else rng.randrange(len(avail))
        sign = -1 if rng.random() < 0.9 else 1  # a rollback or a released hold gives amounts back
        if sign == 1 and all(
            have + amount <= cap for have, amount, cap in zip(avail[ordinal], need, capacity[ordinal], strict=True)
        ):
            given_back += 1
        elif sign == 1 or not all(have >= amount for have, amount in zip(avail[ordinal], need, strict=True)):
            continue
        hinted += ordinal == found
        index.take(ordinal, avail[ordinal])
        for position, amount in enumerate(need):
            avail[ordinal][position] += sign * amount
        index.put(ordinal, avail[ordinal])
        if sign == 1:
            index.forget_starts()
    fresh = PackingIndex(positions, direction, members, avail, capacity)
    assert hinted > 100 and given_back > 5
    assert [index.search(need) for need in needs] == [fresh.search(need) for need in needs]
    assert [_buckets(tier) for tier in index._tier_order] == [_buckets(tier) for tier in fresh._tier_order]


def _buckets(tier: _Tier) -> list[tuple[int, list[tuple[int, ...]]]]:
    """The tier's buckets that are not empty, each key as its tuple of words, checked against each other and against
    ``lasts`` and ``blocks``; a dispersed bucket's chunks joined, checked to be in order (largest keys first) and of
    1 to ``2 * chunk - 1`` keys."""
    assert tier.values == sorted(tier.values) and len(tier.lists) == len(tier.values)
    buckets = [_keys(bucket, tier.stride) for bucket in tier.lists]
    assert all(bucket == sorted(bucket) for bucket in buckets)
    if tier.blocked:
        assert tier.values == sorted(set(tier.values))
        assert tier.lasts == [bucket[-1][0] if bucket else -1 for bucket in buckets]
        assert len(tier.blocks) == (len(tier.lasts) + 7) // 8
        assert all(bound >= max(tier.lasts[block * 8 : block * 8 + 8]) for block, bound in enumerate(tier.blocks))
        return [(value, bucket) for value, bucket in zip(tier.values, buckets, strict=True) if bucket]
    assert tier.lasts == tier.blocks == []
    assert all(0 < len(chunk) < 2 * tier.chunk for chunk in buckets)
    joined: dict[int, list[tuple[int, ...]]] = {}
    for value, chunk in zip(tier.values, buckets, strict=True):
        earlier = joined.setdefault(value, [])
        assert not earlier or chunk[-1] < earlier[0]  # a later chunk holds smaller keys
        joined[value] = chunk + earlier
    return list(joined.items())


def _keys(bucket: vec[i64], stride: int) -> list[tuple[int, ...]]:
    words = list(bucket)
    assert len(words) % stride == 0
    return [tuple(words[at : at + stride]) for at in range(0, len(words), stride)]


def _key(*words: int) -> vec[i64]:
    return vec[i64](words)


def test_a_tier_empties_and_fills_buckets() -> None:
    unblocked = _Tier([(1, (10, 0)), (1, (20, 1)), (2, (5, 2))], 2, blocked=False)  # dispersed: an emptied bucket goes
    unblocked.remove(2, _key(5, 2))
    unblocked.add(1, _key(15, 3))
    assert _buckets(unblocked) == [(1, [(10, 0), (15, 3), (20, 1)])] and unblocked.values == [1]
    tier = _Tier([(1, (10, 0)), (1, (20, 1)), (1, (30, 2)), (2, (5, 3))], 2)
    tier.remove_at(0, 1)  # (20, 1), where a search found it
    tier.remove(2, _key(5, 3))  # bisected; its bucket empties
    tier.add(3, _key(35, 4))
    tier.add(1, _key(15, 5))
    tier.add(1, _key(40, 6))  # a new last
    tier.remove(3, _key(35, 4))
    tier.add(3, _key(36, 4))
    tier.add(3, _key(33, 7))
    tier.add(3, _key(33, 1))  # equal first words: the second decides
    tier.remove_at(0, 3)  # (40, 6), the last, where a search found it
    assert _buckets(tier) == [(1, [(10, 0), (15, 5), (30, 2)]), (3, [(33, 1), (33, 7), (36, 4)])]
    assert tier.values == [1, 2, 3]  # bucket 2 emptied, and stays
    assert tier.lasts == [30, -1, 36]


def test_a_dispersed_bucket_is_held_in_chunks_its_largest_keys_first() -> None:
    tier = _Tier([*[(1, (k, k)) for k in range(5)], (2, (7, 9))], 2, blocked=False, chunk=2)
    assert tier.values == [1, 1, 1, 2]
    assert [_keys(chunk, 2) for chunk in tier.lists] == [[(3, 3), (4, 4)], [(1, 1), (2, 2)], [(0, 0)], [(7, 9)]]
    tier.add(1, _key(5, 10))  # after every key: into the first chunk
    tier.add(1, _key(4, 5))  # the first chunk has 2 * chunk keys: split, its larger half first
    tier.add(1, _key(0, 1))  # before every key: into the last chunk
    assert [_keys(chunk, 2) for chunk in tier.lists] == [
        [(4, 5), (5, 10)],
        [(3, 3), (4, 4)],
        [(1, 1), (2, 2)],
        [(0, 0), (0, 1)],
        [(7, 9)],
    ]
    tier.remove(1, _key(1, 1))  # found in the third chunk
    tier.remove_at(3, 0)  # (0, 0), where a search found it
    tier.remove(1, _key(0, 1))  # its chunk empties, and goes
    assert tier.values == [1, 1, 1, 2]
    assert _buckets(tier) == [(1, [(2, 2), (3, 3), (4, 4), (4, 5), (5, 10)]), (2, [(7, 9)])]


@pytest.mark.parametrize("seed", range(3))
def test_a_tier_finds_the_first_bucket_reaching_a_key_as_a_walk_of_every_bucket_does(seed: int) -> None:
    """Blocks of buckets skipped on their largest last key, buckets emptied and refilled, new buckets in between:
    after every step, ``first_reaching`` answers as a walk over every bucket's keys would."""
    rng = random.Random(seed)
    keys = {ordinal: (rng.randrange(0, 400, 10), (rng.randrange(1000), ordinal)) for ordinal in range(64)}
    tier = _Tier(list(keys.values()), 2)
    for _ in range(500):
        ordinal = rng.randrange(64)
        value, words = keys[ordinal]
        tier.remove(value, _key(*words))
        keys[ordinal] = (rng.randrange(0, 400, 5), (rng.randrange(1000), ordinal))
        value, words = keys[ordinal]
        tier.add(value, _key(*words))
        least, start = rng.randrange(1000), rng.randrange(len(tier.values) + 1)
        walked = next(
            (p for p in range(start, len(tier.values)) if any(key[0] >= least for key in _keys(tier.lists[p], 2))),
            len(tier.values),
        )
        assert tier.first_reaching(start, least) == walked
    assert _buckets(tier) == sorted(
        (value, sorted(k for v, k in keys.values() if v == value)) for value in {v for v, _ in keys.values()}
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 2)), max_size=30), st.randoms())
def test_the_pareto_front_is_every_point_no_point_before_it_dominates(
    vectors: list[tuple[int, int, int]], rng: random.Random
) -> None:
    """``pareto_front`` (equal vectors folded first) against its definition: in the order of most in total, then by
    ordinal, every point that no point before it dominates (equal counts as dominating)."""
    points = [(vector, ordinal) for ordinal, vector in enumerate(vectors)]
    rng.shuffle(points)
    ordered = sorted(points, key=lambda point: (-sum(point[0]), point[1]))
    expected = [
        point
        for at, point in enumerate(ordered)
        if not any(all(a >= b for a, b in zip(other, point[0], strict=True)) for other, _ in ordered[:at])
    ]
    assert pareto_front(points) == expected
