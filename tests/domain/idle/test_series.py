"""The utilization series the session page charts: bounded, newest at full resolution, weighted means (pure)."""

from __future__ import annotations

import pytest

from domain.idle.config import CheckName, ThresholdOperator
from domain.idle.series import compact, merge, needs_compaction, point, series_points
from domain.idle.verdict import CheckReport, MetricReading, Verdict


def sweeps(n: int, start: float = 1000.0, every: float = 15.0) -> list:
    return [point(start + i * every, {"k1": {"cpu_util": float(i)}}, {"cpu_util": 5.0}) for i in range(n)]


def test_a_short_series_is_kept_as_it_is() -> None:
    points = sweeps(10)
    assert compact(points, 10) == points


def test_a_long_series_stays_bounded_and_keeps_its_whole_span() -> None:
    points: list = []
    for p in sweeps(5000):
        points = compact([*points, p], 100)
        assert len(points) <= 100
    assert points[0].at == 1000.0 and points[-1].until == 1000.0 + 4999 * 15.0
    assert sum(p.weight for p in points) == 5000  # every sweep counted once
    assert points[-1].weight == 1  # the newest at the sweep's resolution
    assert points[0].weight > points[len(points) // 2].weight  # older is coarser


def test_merged_values_are_means_weighted_by_the_sweeps_covered() -> None:
    a = merge(sweeps(3)[0], sweeps(3)[1])  # 0 and 1, weight 2
    b = merge(a, sweeps(3)[2])  # with 2, weight 1
    assert b.weight == 3 and b.kernels["k1"]["cpu_util"] == pytest.approx(1.0)
    assert sum(p.weight * p.kernels["k1"]["cpu_util"] for p in compact(sweeps(500), 40)) == pytest.approx(
        sum(range(500))
    )


def test_a_metric_or_kernel_only_one_side_has_keeps_its_value_and_the_newer_thresholds_win() -> None:
    older = point(1.0, {"k1": {"cpu_util": 10.0}}, {"cpu_util": 5.0})
    newer = point(2.0, {"k1": {"mem": 40.0}, "k2": {"cpu_util": 3.0}}, {"cpu_util": 7.0})
    merged = merge(older, newer)
    assert merged.kernels == {"k1": {"cpu_util": 10.0, "mem": 40.0}, "k2": {"cpu_util": 3.0}}
    assert merged.thresholds == {"cpu_util": 7.0} and (merged.at, merged.until) == (1.0, 2.0)


def test_the_stored_series_is_rewritten_only_every_half_of_its_bound() -> None:
    assert not needs_compaction(360, 240) and needs_compaction(361, 240)
    with pytest.raises(ValueError):
        compact(sweeps(3), 1)


def test_a_sweeps_points_carry_the_thresholds_its_verdict_judged() -> None:
    report = CheckReport(
        name=CheckName.UTILIZATION,
        expired=False,
        remaining=10.0,
        measured_against=None,
        operator=ThresholdOperator.ALL,
        readings=(MetricReading("cpu_util", 2.0, 30.0),),
    )
    verdict = Verdict(terminate=False, reason=None, reports=(report,))
    points = series_points(50.0, {"s1": {"k1": {"cpu_util": 2.0}}, "s2": {}}, {"s1": verdict})
    assert list(points) == ["s1"]
    assert points["s1"] == point(50.0, {"k1": {"cpu_util": 2.0}}, {"cpu_util": 30.0})
