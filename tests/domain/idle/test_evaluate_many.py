"""``evaluate_many`` (the idle sweep's deadlines as arrays) against ``evaluate`` (the reference, one session at a time):
the same verdicts, and the same stored bytes (the last bit of every countdown included), on generated
batches of sessions sharing a few policies."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.codec import encode
from domain.idle.arbiter import Judged, SessionFacts, batch_of, checked_thresholds, evaluate, evaluate_many
from domain.idle.config import EffectivePolicy, ThresholdOperator
from domain.idle.window import UtilizationWindow
from domain.model import SessionType
from tests.domain.idle.factories import INTERVAL, T0, policy, ts, utilization

THRESHOLDS = {"cpu_util": 2.0, "mem": 50.0, "cuda_util": 5.0}
POLICIES = [
    policy(),
    policy(lifetime=3600.0, network=600.0),
    policy(lifetime=0.1, network=1e-9, util=utilization({"cpu_util": 2.0}, grace=30.0)),
    policy(network=600.0, util=utilization(THRESHOLDS, grace=0.0, window=60.0)),
    policy(lifetime=7200.0, util=utilization(THRESHOLDS, window=45.0, operator=ThresholdOperator.ANY)),
    policy(lifetime=3600.0, network=600.0, util=utilization({}, window=60.0)),
]
SLOTS = [{"cpu": 2.0, "mem": 2.0**30}, {"cpu": 1.0, "mem": 2.0**30, "cuda.shares": 1.0}]
moments = st.one_of(
    st.sampled_from([0.0, 0.1, 29.0, 30.0, 60.0, 600.0, 3600.0, 7200.0]), st.floats(-100.0, 8000.0, allow_nan=False)
)
readings = st.one_of(st.sampled_from([0.0, 1.999, 2.0, 5.0, 50.0]), st.floats(0.0, 200.0))
session = st.tuples(
    st.sampled_from(list(SessionType)),
    st.sampled_from(range(len(POLICIES))),
    st.sampled_from(range(len(SLOTS))),
    st.one_of(st.none(), moments),  # last activity, seconds after T0
    st.sampled_from([0, 0, 1, 3]),  # open connections
    st.lists(  # samples, oldest first: mostly of every metric, some missing one
        st.one_of(
            st.fixed_dictionaries({m: readings for m in THRESHOLDS}),
            st.dictionaries(st.sampled_from(sorted(THRESHOLDS)), st.one_of(st.none(), readings)),
        ),
        max_size=7,
    ),
    st.sampled_from([None, 45.0, 60.0]),  # the window's shape (None: no window)
)


def window_of(samples: list[dict[str, float | None]], seconds: float | None, end: float) -> UtilizationWindow | None:
    """A window fed ``samples`` one interval apart, the last at ``end`` seconds after T0."""
    if seconds is None:
        return None
    window = UtilizationWindow.empty(window_seconds=seconds, interval=INTERVAL)
    for i, sample in enumerate(samples):
        moment = end - INTERVAL * (len(samples) - 1 - i)
        window = window.add(ts(moment), {m: v for m, v in sample.items() if v is not None})
    return window


Read = tuple[Judged, float, int, list[float | None], list[float]]


def judged(now: float, facts: SessionFacts, chosen: EffectivePolicy) -> Read:
    """The session as the sweep hands it to ``evaluate_many``: its window read the way ``check_utilization`` reads
    it (the averages of its checked metrics, the seconds until all are full)."""
    checked = checked_thresholds(chosen.utilization, facts.requested_slots) if chosen.utilization else None
    averages: list[float | None] = []
    to_fill: list[float] = []
    if chosen.utilization is not None and checked:
        window = facts.window
        averages = [window.average(m) if window else None for m in checked]
        same = window is not None and window.window_seconds == chosen.utilization.window
        to_fill = [max(window.seconds_until_full(m, now=now) for m in checked) if same and window else 0.0]
        if not same:
            to_fill = [chosen.utilization.window]
    last = facts.last_activity.timestamp() if facts.last_activity else math.nan
    started = facts.started_at.timestamp()
    return Judged(facts.type, started, chosen, checked), last, facts.open_connections, averages, to_fill


@settings(max_examples=300, deadline=None)
@given(st.lists(session, max_size=12), moments)
def test_the_verdicts_and_their_bytes_are_evaluates(sessions: list[tuple], now_after: float) -> None:
    now = T0 + timedelta(seconds=now_after)
    batch: list[Judged] = []
    last_activity: list[float] = []
    open_connections: list[int] = []
    averages: list[float | None] = []
    to_fill: list[float] = []
    expected = []
    for kind, which, slots, last, connections, samples, shape in sessions:
        chosen = POLICIES[which]
        facts = SessionFacts(
            type=kind,
            started_at=T0,
            last_activity=T0 + timedelta(seconds=last) if last is not None else None,
            open_connections=connections,
            requested_slots=SLOTS[slots],
            window=window_of(samples, shape, now_after),
        )
        expected.append(evaluate(now=now, session=facts, policy=chosen))
        one, last_seen, connected, its_averages, its_fill = judged(now.timestamp(), facts, chosen)
        batch.append(one)
        last_activity.append(last_seen)
        open_connections.append(connected)
        averages += its_averages
        to_fill += its_fill
    verdicts = evaluate_many(now.timestamp(), batch, last_activity, open_connections, averages, to_fill)
    assert verdicts == expected
    assert [encode(v) for v in verdicts] == [encode(v) for v in expected]
    # the batch kept from a sweep of other sessions is not reused; one of the same sessions is
    kept = batch_of(batch, batch_of(batch[:-1]) if batch else None)
    assert batch_of(list(batch), kept) is kept
    assert evaluate_many(now.timestamp(), kept, last_activity, open_connections, averages, to_fill) == expected


@pytest.mark.parametrize("operator", list(ThresholdOperator))
@pytest.mark.parametrize(
    "sample",
    [{"cpu_util": 1.0, "mem": 10.0}, {"cpu_util": 1.0, "mem": 90.0}, {"cpu_util": 9.0, "mem": 90.0}],
    ids=["both-below", "one-below", "none-below"],
)
def test_full_windows_are_judged_by_the_operator(operator: ThresholdOperator, sample: dict[str, float]) -> None:
    chosen = policy(util=utilization({"cpu_util": 2.0, "mem": 50.0}, operator=operator))
    now = T0 + timedelta(seconds=120)
    facts = SessionFacts(
        type=SessionType.INTERACTIVE,
        started_at=T0,
        requested_slots=SLOTS[0],
        window=window_of([sample] * 6, 60.0, 120.0),
    )
    expected = evaluate(now=now, session=facts, policy=chosen)
    one, last, connected, averages, to_fill = judged(now.timestamp(), facts, chosen)
    assert evaluate_many(now.timestamp(), [one], [last], [connected], averages, to_fill) == [expected]
    below = [v < {"cpu_util": 2.0, "mem": 50.0}[m] for m, v in sample.items()]
    assert expected.terminate is (all(below) if operator is ThresholdOperator.ALL else any(below))


def test_one_average_per_checked_metric_is_required() -> None:
    chosen = POLICIES[3]
    checked = checked_thresholds(chosen.utilization, SLOTS[0]) if chosen.utilization else None
    one = Judged(SessionType.INTERACTIVE, ts(0.0), chosen, checked)
    with pytest.raises(ValueError, match="one average per checked metric"):
        evaluate_many(ts(100.0), [one], [math.nan], [0], [1.0], [0.0])
    with pytest.raises(ValueError, match="one last activity"):
        evaluate_many(ts(100.0), [one], [], [0], [1.0, 1.0], [0.0])
    assert evaluate_many(ts(100.0), [], [], [], [], []) == []
