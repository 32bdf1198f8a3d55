"""The utilization series the session page charts: bounded, newest at full resolution, weighted means (pure)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from core.codec import decode, encode
from domain.idle.series import (
    SWEEPS_PER_POINT,
    SeriesPoint,
    compact,
    due,
    merge,
    needs_compaction,
    point,
    series_points,
)


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


def test_a_sweeps_points_carry_each_kernels_sample_and_the_thresholds_judged() -> None:
    shared = MappingProxyType({"cpu_util": 30.0})
    samples = {"s1": {"k1": {"cpu_util": 2.0}}, "s2": {}, "s3": {"k1": {"mem": 1.0}, "k2": {"mem": 3.0}}}
    points = series_points(50.0, samples, {"s1": shared, "s3": shared})
    assert list(points) == ["s1", "s3"]  # s2: no kernel answered
    assert points["s1"] == point(50.0, {"k1": {"cpu_util": 2.0}}, {"cpu_util": 30.0})
    assert points["s3"].kernels == {"k1": {"mem": 1.0}, "k2": {"mem": 3.0}} and points["s3"].thresholds == shared
    assert decode(encode(points["s3"]), SeriesPoint) == points["s3"]  # stored as it is read back


def test_each_session_gets_a_point_every_few_sweeps_and_the_sweeps_share_them_out() -> None:
    ids = [f"session-{i}" for i in range(4000)]
    turns = [[i for i in ids if due(i, sweep)] for sweep in range(10, 10 + SWEEPS_PER_POINT)]
    assert sorted(i for turn in turns for i in turn) == sorted(ids)  # each exactly once in SWEEPS_PER_POINT sweeps
    assert all(abs(len(turn) - len(ids) / SWEEPS_PER_POINT) < len(ids) / 10 for turn in turns)
    assert [i for i in ids if due(i, 10 + SWEEPS_PER_POINT)] == turns[0]
