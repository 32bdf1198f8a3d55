"""The autoscaling policy, table-tested: windows, panic, cooldown, scale to zero, wakes, counter resets, gaps."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from core.errors import InvalidInput
from domain.autoscaling import (
    Decision,
    Metric,
    Replicas,
    Sample,
    ScalingRules,
    ScalingState,
    checked_rules,
    decide,
    observe,
    requests_between,
    window_value,
)

RULES = ScalingRules(min_replicas=1, max_replicas=10, target=10.0, scale_down_delay=30.0)


def series(
    start: float, end: float, in_flight: Callable[[float], int], rps: float = 0.0, first_total: int = 0
) -> list[Sample]:
    """One sample a second from ``start`` to ``end`` (inclusive); the counter grows by ``rps`` a second."""
    out, total = [], float(first_total)
    t = start
    while t <= end:
        out.append(Sample(at=t, in_flight=in_flight(t), requests_total=int(total)))
        total += rps
        t += 1.0
    return out


def run(
    rules: ScalingRules,
    samples: Sequence[Sample],
    *,
    start: int = 1,
    ready_lags: bool = False,
    state: ScalingState | None = None,
) -> list[Decision]:
    """Decide once a second over ``samples`` as the loop does: the replicas become what was decided (ready at once,
    or one tick later with ``ready_lags``)."""
    state = state or ScalingState()
    current, ready = start, start
    kept: tuple[Sample, ...] = ()
    decisions = []
    for sample in samples:
        kept = observe(kept, sample, keep=rules.stable_window + 1)
        decision = decide(rules, kept, Replicas(current, ready), state, now=sample.at)
        decisions.append(decision)
        state = decision.state
        ready = min(current, decision.desired) if ready_lags else decision.desired
        current = decision.desired
    return decisions


def changes(decisions: Sequence[Decision]) -> int:
    return sum(1 for a, b in zip(decisions, decisions[1:], strict=False) if a.desired != b.desired)


# -- the signal --


@pytest.mark.parametrize(
    ("before", "after", "counted"),
    [
        (100, 130, 30),  # counted
        (100, 100, 0),  # none
        (100, 7, 7),  # HAProxy restarted: the counter starts again from 0
        (100, 0, 0),  # restarted, nothing since
    ],
)
def test_requests_between_reads_a_drop_as_a_restart(before: int, after: int, counted: int) -> None:
    assert requests_between(Sample(0, 0, before), Sample(1, 0, after)) == counted


def test_rate_over_a_counter_reset_is_never_negative() -> None:
    samples = [Sample(0, 0, 1000), Sample(1, 0, 1020), Sample(2, 0, 10), Sample(3, 0, 30)]  # restart after t=1
    assert window_value(samples, Metric.RPS, now=3, window=3) == pytest.approx((20 + 10 + 20) / 3)


@pytest.mark.parametrize(
    ("samples", "metric", "expected"),
    [
        ([], Metric.IN_FLIGHT, None),
        ([Sample(10, 4, 0)], Metric.IN_FLIGHT, 4.0),
        ([Sample(10, 4, 0, held=2)], Metric.IN_FLIGHT, 6.0),  # held requests are demand too
        ([Sample(10, 0, 5)], Metric.RPS, None),  # a rate needs two samples
        ([Sample(0, 0, 0), Sample(10, 0, 50)], Metric.RPS, 5.0),  # the sample before the window starts it
        ([Sample(8, 2, 0), Sample(9, 4, 0), Sample(10, 6, 0)], Metric.IN_FLIGHT, 4.0),
    ],
)
def test_window_value(samples: list[Sample], metric: Metric, expected: float | None) -> None:
    assert window_value(samples, metric, now=10, window=6) == expected


def test_observe_keeps_the_window_and_ignores_repeats() -> None:
    kept = observe((), Sample(0, 1, 0), keep=5)
    kept = observe(kept, Sample(0, 9, 9), keep=5)  # the same sample read again (the ingress had not written)
    assert kept == (Sample(0, 1, 0),)
    for t in range(1, 10):
        kept = observe(kept, Sample(t, 1, 0), keep=5)
    assert [s.at for s in kept] == [4, 5, 6, 7, 8, 9]


# -- decisions, one at a time --


@pytest.mark.parametrize(
    ("name", "rules", "samples", "replicas", "state", "now", "wake", "desired", "panicking", "in_reason"),
    [
        (
            "steady at target",
            RULES,
            series(0, 60, lambda t: 20),
            Replicas(2, 2),
            ScalingState(),
            60,
            False,
            2,
            False,
            "20.0 in flight",
        ),
        (
            "more load: more replicas, no panic under 2x",
            RULES,
            series(0, 60, lambda t: 30),
            Replicas(2, 2),
            ScalingState(),
            60,
            False,
            3,
            False,
            "target 10",
        ),
        (
            "a burst panics and follows the panic window",
            RULES,
            series(0, 60, lambda t: 10 if t < 55 else 80),
            Replicas(1, 1),
            ScalingState(),
            60,
            False,
            8,
            True,
            "panic",
        ),
        (
            "capped at max",
            RULES,
            series(0, 60, lambda t: 500),
            Replicas(10, 10),
            ScalingState(),
            60,
            False,
            10,
            True,
            "capped at max 10",
        ),
        (
            "raised to min",
            ScalingRules(min_replicas=2, max_replicas=4, target=10),
            series(0, 60, lambda t: 0),
            Replicas(2, 2),
            ScalingState(last_request_at=0),
            60,
            False,
            2,
            False,
            "raised to min 2",
        ),
        (
            "no samples: replicas kept",
            RULES,
            [],
            Replicas(3, 3),
            ScalingState(),
            60,
            False,
            3,
            False,
            "no recent load sample",
        ),
        (
            "stale samples: replicas kept, even for an endpoint that may go to zero",
            ScalingRules(min_replicas=0, max_replicas=4, target=10, scale_to_zero_after=5),
            series(0, 30, lambda t: 0),
            Replicas(3, 3),
            ScalingState(last_request_at=0),
            100,
            False,
            3,
            False,
            "no recent load sample",
        ),
        (
            "stale samples above max: down to max",
            ScalingRules(min_replicas=1, max_replicas=2, target=10),
            [],
            Replicas(4, 4),
            ScalingState(),
            60,
            False,
            2,
            False,
            "capped at max 2",
        ),
        (
            "rps: 45 req/s at 10 per replica is 5",
            ScalingRules(min_replicas=1, max_replicas=10, metric=Metric.RPS, target=10),
            series(0, 60, lambda t: 1, rps=45),
            Replicas(5, 5),
            ScalingState(),
            60,
            False,
            5,
            False,
            "45.0 req/s",
        ),
        (
            "rps across an HAProxy restart",
            ScalingRules(min_replicas=1, max_replicas=10, metric=Metric.RPS, target=10),
            series(0, 30, lambda t: 1, rps=45, first_total=10_000) + series(31, 60, lambda t: 1, rps=45),
            Replicas(5, 5),
            ScalingState(),
            60,
            False,
            5,
            False,
            "req/s",
        ),
        (
            "wake at zero: one replica at once",
            ScalingRules(min_replicas=0, max_replicas=4, target=10),
            [],
            Replicas(0, 0),
            ScalingState(last_request_at=0),
            1000,
            True,
            1,
            False,
            "woken",
        ),
        (
            # Found in CI: a replica of a two-replica endpoint without rules died on a request, the activator held the
            # next one and asked for a wake, and the wake's "one replica" drained the other.
            "a wake keeps a fixed endpoint's replicas (it asks for one, never for fewer than min)",
            ScalingRules(min_replicas=2, max_replicas=2, target=10),
            series(940, 1000, lambda t: 0),
            Replicas(2, 1),
            ScalingState(last_request_at=0),
            1000,
            True,
            2,
            False,
            "raised to min 2",
        ),
        (
            "a wake within the bounds: one replica, over min 0",
            ScalingRules(min_replicas=0, max_replicas=4, target=10, scale_to_zero_after=30),
            series(940, 1000, lambda t: 0),
            Replicas(2, 0),
            ScalingState(last_request_at=0),
            1000,
            True,
            1,
            False,
            "woken",
        ),
        (
            "a held request is demand even before the wake is read",
            ScalingRules(min_replicas=0, max_replicas=4, target=10),
            [Sample(999, 0, 0), Sample(1000, 0, 0, held=1)],
            Replicas(0, 0),
            ScalingState(last_request_at=0),
            1000,
            False,
            1,
            False,
            "",
        ),
        (
            "idle past the window: to zero",
            ScalingRules(min_replicas=0, max_replicas=4, target=10, scale_to_zero_after=120, scale_down_delay=0),
            series(0, 200, lambda t: 0),
            Replicas(1, 1),
            ScalingState(last_request_at=0),
            200,
            False,
            0,
            False,
            "scaled to zero",
        ),
        (
            "idle, not yet long enough: one kept",
            ScalingRules(min_replicas=0, max_replicas=4, target=10, scale_to_zero_after=300, scale_down_delay=0),
            series(0, 200, lambda t: 0),
            Replicas(1, 1),
            ScalingState(last_request_at=0),
            200,
            False,
            1,
            False,
            "to zero after 300s",
        ),
        (
            "min 1 never goes to zero",
            ScalingRules(min_replicas=1, max_replicas=4, target=10, scale_to_zero_after=1, scale_down_delay=0),
            series(0, 200, lambda t: 0),
            Replicas(1, 1),
            ScalingState(last_request_at=0),
            200,
            False,
            1,
            False,
            "raised to min 1",
        ),
        (
            "at zero with no request stays at zero",
            ScalingRules(min_replicas=0, max_replicas=4, target=10, scale_down_delay=0),
            series(0, 200, lambda t: 0),
            Replicas(0, 0),
            ScalingState(last_request_at=0),
            200,
            False,
            0,
            False,
            "at zero",
        ),
    ],
)
def test_decide(
    name: str,
    rules: ScalingRules,
    samples: list[Sample],
    replicas: Replicas,
    state: ScalingState,
    now: float,
    wake: bool,
    desired: int,
    panicking: bool,
    in_reason: str,
) -> None:
    decision = decide(rules, samples, replicas, state, now=now, wake=wake)
    assert (decision.desired, decision.panicking) == (desired, panicking), (name, decision.reason)
    assert in_reason in decision.reason


def test_a_new_endpoint_is_not_scaled_to_zero_before_its_idle_window() -> None:
    """No request seen yet: the idle window counts from the first decision, not from the epoch."""
    rules = ScalingRules(min_replicas=0, max_replicas=2, target=10, scale_to_zero_after=60, scale_down_delay=0)
    decision = decide(rules, series(940, 1000, lambda t: 0), Replicas(1, 1), ScalingState(), now=1000)
    assert decision.desired == 1
    assert decision.state.last_request_at == 1000


# -- decisions over time --


def test_load_hovering_around_the_target_does_not_flap() -> None:
    """19 and 21 in flight by turns, target 10: two replicas. While the window fills, an odd number of samples
    averages just over 20 every other second: the delay holds that, and it settles once, never to move again."""
    decisions = run(RULES, series(0, 600, lambda t: 19 if int(t) % 2 else 21), start=2)
    assert changes(decisions) <= 1
    assert changes(decisions[100:]) == 0
    assert decisions[-1].desired == 2


def test_a_short_dip_does_not_scale_down_within_the_delay() -> None:
    """Four replicas busy, then ten quiet seconds, then busy again: the cooldown keeps all four."""
    load = series(0, 200, lambda t: 0 if 100 <= t < 110 else 40)
    decisions = run(ScalingRules(min_replicas=1, max_replicas=10, target=10, stable_window=6), load, start=4)
    assert min(d.desired for d in decisions[10:]) == 4


def test_noisy_load_changes_rarely() -> None:
    """Load jumping between 5 and 35 in flight each second (mean 20): the stable window sees 2, and holds it."""
    noise = [5, 35, 12, 28, 20, 33, 7, 25, 15, 20]
    decisions = run(RULES, series(0, 900, lambda t: noise[int(t) % len(noise)]), start=2)
    assert changes(decisions[120:]) == 0


def test_a_step_up_then_the_load_stops_scales_up_then_down_after_the_delay() -> None:
    rules = ScalingRules(min_replicas=1, max_replicas=10, target=10, stable_window=60, scale_down_delay=30)
    load = series(0, 400, lambda t: 60 if 100 <= t < 200 else 2)
    decisions = run(rules, load, ready_lags=True)
    by_second = {int(s.at): d for s, d in zip(load, decisions, strict=True)}
    assert by_second[99].desired == 1
    assert any(by_second[t].panicking for t in range(100, 110)), "a sixfold step panics"
    assert by_second[110].desired >= 6 - 1
    assert max(d.desired for d in decisions) == 6
    # Panic holds one stable window from its start; then the stable window decides; scale-down waits for the delay.
    assert all(by_second[t].desired == 6 for t in range(110, 200))
    assert by_second[200 + 30 - 1].desired > 1
    assert by_second[400].desired == 1


def test_panic_never_scales_down() -> None:
    """During a panic the short window may drop, but replicas do not."""
    load = series(0, 120, lambda t: 10 if t < 60 else (100 if t < 63 else 0))
    decisions = run(RULES, load)
    panic = [d for d in decisions if d.panicking]
    assert panic
    peaks = [d.desired for d in panic]
    assert peaks == sorted(peaks)


def test_scale_to_zero_then_wake() -> None:
    rules = ScalingRules(min_replicas=0, max_replicas=3, target=10, scale_to_zero_after=60, scale_down_delay=10)
    load = series(0, 30, lambda t: 5) + series(31, 200, lambda t: 0)
    decisions = run(rules, load)
    at_zero = next(i for i, d in enumerate(decisions) if d.desired == 0)
    assert load[at_zero].at >= 30 + 60  # not before the idle window
    after = decide(rules, load, Replicas(0, 0), decisions[-1].state, now=200, wake=True)
    assert after.desired == 1
    assert "woken" in after.reason


def test_a_counter_reset_is_not_read_as_traffic_or_idleness() -> None:
    """RPS mode: HAProxy restarts mid-way; the endpoint neither jumps nor drops."""
    rules = ScalingRules(min_replicas=1, max_replicas=10, metric=Metric.RPS, target=10, stable_window=30)
    load = series(0, 100, lambda t: 1, rps=30, first_total=1_000_000) + series(101, 300, lambda t: 1, rps=30)
    decisions = run(rules, load, start=3)
    assert {d.desired for d in decisions[35:]} == {3}


def test_missing_samples_hold_then_resume() -> None:
    """A gap of a minute in the samples (the ingress down): replicas kept through it."""
    rules = ScalingRules(min_replicas=0, max_replicas=10, target=10, scale_to_zero_after=30, scale_down_delay=5)
    before = series(0, 60, lambda t: 30)
    state = ScalingState()
    kept: tuple[Sample, ...] = ()
    for s in before:
        kept = observe(kept, s, keep=61)
        state = decide(rules, kept, Replicas(3, 3), state, now=s.at).state
    for now in range(61, 150):  # no sample comes in
        decision = decide(rules, kept, Replicas(3, 3), state, now=now)
        state = decision.state
        assert decision.desired == 3, decision.reason


# -- the rules, checked --


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"min_replicas": -1, "max_replicas": 2, "target": 1}, "minReplicas"),
        ({"min_replicas": 0, "max_replicas": 0, "target": 1}, "maxReplicas"),
        ({"min_replicas": 0, "max_replicas": 17, "target": 1}, "maxReplicas"),
        ({"min_replicas": 3, "max_replicas": 2, "target": 1}, "minReplicas"),
        ({"min_replicas": 0, "max_replicas": 2, "target": 0}, "target"),
        ({"min_replicas": 0, "max_replicas": 2, "target": float("nan")}, "target"),
        ({"min_replicas": 0, "max_replicas": 2, "target": 1, "stable_window": 0.5}, "stableWindow"),
        ({"min_replicas": 0, "max_replicas": 2, "target": 1, "panic_window": 90}, "panicWindow"),
        ({"min_replicas": 0, "max_replicas": 2, "target": 1, "panic_threshold": 1.0}, "panicThreshold"),
        ({"min_replicas": 0, "max_replicas": 2, "target": 1, "scale_to_zero_after": 0}, "scaleToZeroAfter"),
        ({"min_replicas": 0, "max_replicas": 2, "target": 1, "drain_timeout": 4000}, "drainTimeout"),
    ],
)
def test_bad_rules_name_their_field(fields: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        checked_rules(**fields)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_good_rules_take_the_defaults() -> None:
    rules = checked_rules(min_replicas=0, max_replicas=4, target=5)
    assert rules == ScalingRules(min_replicas=0, max_replicas=4, target=5.0)
