"""The utilization check: grace period, window fullness, thresholds, operators, device applicability."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from domain.idle.arbiter import checked_thresholds, evaluate
from domain.idle.config import ThresholdOperator
from domain.idle.verdict import CheckReport, MetricReading, RemainingBasis, TerminationReason
from domain.idle.window import UtilizationWindow
from tests.domain.idle.factories import INTERVAL, at, facts, filled_window, outcome, policy, ts, utilization

ALL, ANY = ThresholdOperator.ALL, ThresholdOperator.ANY
CPU_ONLY = {"cpu": 2, "mem": 2**30}
WITH_GPU = {"cpu": 2, "mem": 2**30, "cuda.shares": 0.5}


@dataclass(frozen=True)
class Case:
    name: str
    thresholds: Mapping[str, float]
    sample: Mapping[str, float]
    expired: bool
    remaining: float | None = None
    basis: RemainingBasis | None = RemainingBasis.WINDOW
    operator: ThresholdOperator = ALL
    slots: Mapping[str, float] = field(default_factory=lambda: CPU_ONLY)
    samples_from: float = 0.0
    now: float = 45.0
    grace: float = 0.0


CASES = [
    # window 60 s sampled every 15 s: full once first and last sample are 45 s apart
    Case("below threshold, full window", {"cpu_util": 5}, {"cpu_util": 4.99}, True, 0.0),
    Case("just above threshold", {"cpu_util": 5}, {"cpu_util": 5.01}, False),
    Case("equal to threshold is utilized", {"cpu_util": 5}, {"cpu_util": 5.0}, False),
    Case("partly filled window", {"cpu_util": 5}, {"cpu_util": 0}, False, 15.0, now=30),
    Case("window with one sample", {"cpu_util": 5}, {"cpu_util": 0}, False, 45.0, samples_from=45),
    Case("before grace end", {"cpu_util": 5}, {"cpu_util": 0}, False, 55.0, RemainingBasis.GRACE_PERIOD, grace=100),
    Case("at grace end", {"cpu_util": 5}, {"cpu_util": 0}, True, 0.0, grace=45),
    Case("all: one metric above", {"cpu_util": 5, "mem": 10}, {"cpu_util": 1, "mem": 50}, False),
    Case("all: every metric below", {"cpu_util": 5, "mem": 10}, {"cpu_util": 1, "mem": 5}, True, 0.0),
    Case("any: one metric below", {"cpu_util": 5, "mem": 10}, {"cpu_util": 1, "mem": 50}, True, 0.0, operator=ANY),
    Case("any: none below", {"cpu_util": 5, "mem": 10}, {"cpu_util": 9, "mem": 50}, False, operator=ANY),
    Case("gpu metric ignored without a gpu slot", {"cpu_util": 5, "cuda_util": 50}, {"cpu_util": 1}, True, 0.0),
    Case("only a gpu threshold, no gpu slot", {"cuda_util": 50}, {"cpu_util": 1, "cuda_util": 0}, False, None, None),
    Case(
        "zero gpu slot is not a gpu",
        {"cpu_util": 5, "cuda_util": 50},
        {"cpu_util": 1},
        True,
        0.0,
        slots={"cpu": 1, "cuda.device": 0},
    ),
    Case(
        "gpu slot: gpu busy keeps it (all)",
        {"cpu_util": 5, "cuda_util": 5},
        {"cpu_util": 1, "cuda_util": 80},
        False,
        slots=WITH_GPU,
    ),
    Case(
        "gpu slot: cpu idle reclaims it (any)",
        {"cpu_util": 5, "cuda_util": 5},
        {"cpu_util": 1, "cuda_util": 80},
        True,
        0.0,
        operator=ANY,
        slots=WITH_GPU,
    ),
    Case(
        "gpu slot: gpu idle too (all)",
        {"cpu_util": 5, "cuda_util": 5},
        {"cpu_util": 1, "cuda_util": 0},
        True,
        0.0,
        slots=WITH_GPU,
    ),
    Case(
        "gpu slot but no gpu samples: no verdict",
        {"cpu_util": 5, "cuda_util": 5},
        {"cpu_util": 1},
        False,
        60.0,
        operator=ANY,
        slots=WITH_GPU,
    ),
    Case("stale samples: no verdict", {"cpu_util": 5}, {"cpu_util": 0}, False, 60.0, now=45 + 2 * INTERVAL),
    Case("no thresholds at all", {}, {"cpu_util": 0}, False, None, None),
]


def report_for(case: Case) -> CheckReport:
    window = filled_window(case.sample, start=case.samples_from, end=min(case.now, 45.0))
    util = utilization(case.thresholds, grace=case.grace, operator=case.operator)
    session = facts(slots=case.slots, window=window)
    return evaluate(now=at(case.now), session=session, policy=policy(util=util)).reports[2]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_utilization(case: Case) -> None:
    assert outcome(report_for(case)) == ("utilization", case.expired, case.remaining, case.basis)


def test_reports_averages_with_thresholds_of_checked_metrics_only() -> None:
    report = report_for(Case("x", {"cpu_util": 5, "mem": 10, "cuda_util": 3}, {"cpu_util": 2, "mem": 50}, False))
    assert report.operator is ALL
    assert report.readings == (MetricReading("cpu_util", 2.0, 5.0), MetricReading("mem", 50.0, 10.0))


def test_average_is_over_the_window_only() -> None:
    # busy for a minute, then idle for a minute: the busy samples have slid out of the window
    window = filled_window({"cpu_util": 90}, start=0, end=45).add(ts(60), {"cpu_util": 0})
    for moment in (75, 90, 105):
        window = window.add(ts(moment), {"cpu_util": 0})
    session = facts(window=window)
    verdict = evaluate(now=at(105), session=session, policy=policy(util=utilization({"cpu_util": 5})))
    assert (verdict.terminate, verdict.reason) == (True, TerminationReason.UTILIZATION)
    assert verdict.reports[2].readings[0].average == 0.0


def test_mean_of_mixed_samples() -> None:
    window = UtilizationWindow.empty(window_seconds=60, interval=INTERVAL)
    for moment, value in ((0, 0.0), (15, 10.0), (30, 0.0), (45, 10.0)):
        window = window.add(ts(moment), {"cpu_util": value})
    session = facts(window=window)
    at_five = evaluate(now=at(45), session=session, policy=policy(util=utilization({"cpu_util": 5})))
    above_five = evaluate(now=at(45), session=session, policy=policy(util=utilization({"cpu_util": 5.01})))
    assert (at_five.terminate, above_five.terminate) == (False, True)


def test_missed_sweep_restarts_the_window() -> None:
    window = filled_window({"cpu_util": 0}, start=0, end=30).add(ts(60), {"cpu_util": 0}).add(ts(75), {"cpu_util": 0})
    report = evaluate(
        now=at(75), session=facts(window=window), policy=policy(util=utilization({"cpu_util": 5}))
    ).reports[2]
    assert (report.expired, report.remaining) == (False, 30.0)


def test_window_of_another_shape_is_not_judged() -> None:
    window = filled_window({"cpu_util": 0}, start=0, end=150, window=120)
    util = utilization({"cpu_util": 5}, window=60)
    report = evaluate(now=at(150), session=facts(window=window), policy=policy(util=util)).reports[2]
    assert (report.expired, report.remaining, report.note) == (False, 60.0, "collecting samples")


def test_no_window_yet() -> None:
    report = evaluate(now=at(500), session=facts(), policy=policy(util=utilization({"cpu_util": 5}))).reports[2]
    assert (report.expired, report.remaining, report.readings) == (False, 60.0, (MetricReading("cpu_util", None, 5.0),))


@pytest.mark.parametrize(
    ("slots", "expected"),
    [
        (CPU_ONLY, {"cpu_util": 5.0}),
        (WITH_GPU, {"cpu_util": 5.0, "cuda_util": 3.0}),
        ({"cuda.device": 0}, {"cpu_util": 5.0}),
    ],
    ids=["cpu only", "with a gpu share", "zero gpus"],
)
def test_checked_thresholds(slots: Mapping[str, float], expected: dict[str, float]) -> None:
    assert checked_thresholds(utilization({"cpu_util": 5, "cuda_util": 3, "rocm_mem": 1}), slots) == expected


def test_disabled_utilization_check() -> None:
    window = filled_window({"cpu_util": 0}, start=0, end=45)
    report = evaluate(now=at(45), session=facts(window=window), policy=policy()).reports[2]
    assert (report.expired, report.remaining, report.note) == (False, None, "utilization check disabled")
