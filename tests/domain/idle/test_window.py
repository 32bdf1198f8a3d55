"""UtilizationWindow: fullness, trimming, gaps, round trips through its stored form (core.codec)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.codec import decode, encode
from domain.idle.window import UtilizationWindow, WindowDoc, record_sample

EMPTY = UtilizationWindow.empty(window_seconds=60, interval=15)


def read(stored: str | bytes) -> UtilizationWindow:
    """A window as the idle store reads it (``stores.idle.IdleStore.load_windows``)."""
    return UtilizationWindow.from_doc(decode(stored, WindowDoc))


def fed(values: list[float], *, every: float = 15.0, start: float = 1000.0) -> UtilizationWindow:
    window = EMPTY
    for i, value in enumerate(values):
        window = window.add(start + i * every, {"cpu_util": value})
    return window


@pytest.mark.parametrize(
    ("samples", "full"),
    [(0, False), (1, False), (3, False), (4, True), (10, True)],
    ids=lambda v: str(v),
)
def test_full_after_window_minus_one_interval_of_samples(samples: int, full: bool) -> None:
    window = fed([1.0] * samples)
    now = 1000.0 + max(samples - 1, 0) * 15
    assert window.is_full("cpu_util", now=now) is full


def test_keeps_only_what_the_window_needs() -> None:
    window = fed([float(v) for v in range(10)])
    assert [value for _, value in window.series["cpu_util"].samples()] == [6.0, 7.0, 8.0, 9.0]
    assert window.averages() == {"cpu_util": 7.5}


def test_jittered_sweeps_keep_the_sample_at_the_window_start() -> None:
    window = EMPTY
    for moment in (0.0, 14.0, 29.5, 44.0, 60.0):
        window = window.add(moment, {"cpu_util": 1.0})
    # 60 - 45 = 15: the sample at 14 is the newest one at or before the window start, so it stays
    assert [moment for moment, _ in window.series["cpu_util"].samples()] == [14.0, 29.5, 44.0, 60.0]
    assert window.is_full("cpu_util", now=60.0)


def test_repeated_or_older_sample_is_ignored() -> None:
    window = fed([1.0, 2.0])
    assert window.add(1015.0, {"cpu_util": 50.0}) == window
    assert window.add(900.0, {"cpu_util": 50.0}) == window


def test_gap_restarts_the_series_and_staleness_blocks_fullness() -> None:
    window = fed([1.0] * 4)
    assert window.is_full("cpu_util", now=1045.0)
    assert not window.is_full("cpu_util", now=1045.0 + 23)
    restarted = window.add(1045.0 + 23, {"cpu_util": 9.0})
    assert restarted.series["cpu_util"].samples() == ((1068.0, 9.0),)
    assert restarted.seconds_until_full("cpu_util", now=1068.0) == 45.0


def test_metrics_have_their_own_series() -> None:
    window = EMPTY.add(0, {"cpu_util": 1, "cuda_util": 2}).add(15, {"cpu_util": 1}).add(30, {"cpu_util": 1})
    assert window.seconds_until_full("cpu_util", now=30) == 15.0
    assert window.seconds_until_full("cuda_util", now=30) == 60.0  # stale: its next sample starts over


def test_metric_gone_for_longer_than_the_window_is_forgotten() -> None:
    window = EMPTY.add(0, {"cpu_util": 1, "cuda_util": 2})
    assert "cuda_util" in window.add(15, {"cpu_util": 1}).series
    assert "cuda_util" not in window.add(100, {"cpu_util": 1}).series


def test_json_round_trip() -> None:
    window = EMPTY.add(1.5, {"cpu_util": 0.1, "mem": 33.3}).add(16.5, {"cpu_util": 1e-9, "mem": 100.0})
    window = window.add(31.5, {"cpu_util": 2.0, "cuda_util": 50.0})
    assert read(encode(window.to_doc())) == window
    assert read(encode(window.to_doc()).decode()) == window


def test_json_shares_stamps_of_metrics_sampled_together() -> None:
    window = fed([1.0, 2.0, 3.0]).add(1045.0, {"cpu_util": 4.0, "mem": 5.0})
    doc = json.loads(encode(window.to_doc()))
    assert doc["stamps"] == [[1000000, 15000, 15000, 15000], [1045000]]
    assert doc["series"] == {"cpu_util": [0, [1000, 2000, 3000, 4000]], "mem": [1, [5000]]}


def test_samples_are_kept_to_a_thousandth() -> None:
    window = EMPTY.add(0.0004, {"cpu_util": 12.34567})
    assert window.series["cpu_util"].samples() == ((0.0, 12.346),)


def test_broken_readings_are_skipped() -> None:
    window = EMPTY.add(0, {"cpu_util": math.nan, "mem": math.inf, "cuda_util": 1.0})
    assert set(window.series) == {"cuda_util"}


GOOD = '"v": 1, "window_seconds": 60, "interval": 15'


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"v": 2, "window_seconds": 60, "interval": 15, "stamps": [], "series": {}}',
        '{"v": 1, "window_seconds": 60, "interval": 0, "stamps": [], "series": {}}',
        '{"v": 1, "window_seconds": 60, "stamps": [], "series": {}}',
        "{" + GOOD + ', "stamps": [[1000, 15000]], "series": {"cpu_util": [0, [3]]}}',
        "{" + GOOD + ', "stamps": [[]], "series": {"cpu_util": [0, []]}}',
        "{" + GOOD + ', "stamps": [[1000.5]], "series": {"cpu_util": [0, [1]]}}',
        "{" + GOOD + ', "stamps": [[1000]], "series": {"cpu_util": [0, ["x"]]}}',
        "{" + GOOD + ', "stamps": [[1000]], "series": {"cpu_util": [1, [1]]}}',
        "{" + GOOD + ', "stamps": [[1000]], "series": {"cpu_util": [-1, [1]]}}',
        "{" + GOOD + ', "stamps": [[1000]], "series": {"cpu_util": [0]}}',
    ],
)
def test_malformed_json_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        read(text)


def test_record_sample_starts_over_when_the_policy_changes_the_shape() -> None:
    window = record_sample(None, ts=0, sample={"cpu_util": 1}, window_seconds=60, interval=15)
    window = record_sample(window, ts=15, sample={"cpu_util": 1}, window_seconds=60, interval=15)
    assert len(window.series["cpu_util"].samples()) == 2
    reshaped = record_sample(window, ts=30, sample={"cpu_util": 5}, window_seconds=120, interval=15)
    assert (reshaped.window_seconds, reshaped.series["cpu_util"].samples()) == (120.0, ((30.0, 5.0),))


def test_record_sample_keeps_only_the_metrics_asked_for() -> None:
    sample = {"cpu_util": 1.0, "mem": 2.0, "cuda_util": 3.0}
    window = record_sample(None, ts=0, sample=sample, window_seconds=60, interval=15, metrics={"cpu_util", "cuda_util"})
    assert set(window.series) == {"cpu_util", "cuda_util"}


@given(
    values=st.lists(st.floats(min_value=0, max_value=400, allow_nan=False), min_size=1, max_size=60),
    window_samples=st.integers(min_value=1, max_value=20),
)
def test_regular_sampling_property(values: list[float], window_samples: int) -> None:
    """With one sample per interval: full iff enough samples; the average is the mean of the last ones."""
    window = UtilizationWindow.empty(window_seconds=15.0 * window_samples, interval=15.0)
    for i, value in enumerate(values):
        window = window.add(15.0 * i, {"cpu_util": value})
    now = 15.0 * (len(values) - 1)
    assert window.is_full("cpu_util", now=now) is (len(values) >= window_samples)
    kept = values[-window_samples:]
    # stored to a thousandth of a percent, so the mean is that close
    assert math.isclose(window.averages()["cpu_util"], sum(kept) / len(kept), abs_tol=0.0005 + 1e-9)


def test_versions_stay_as_they_were_when_an_older_one_is_appended_to() -> None:
    """A window is immutable: adding to an older version changes neither it nor a newer one."""
    base = fed([1.0, 2.0, 3.0])
    newer = base.add(1045.0, {"cpu_util": 4.0})
    branch = base.add(1045.0, {"cpu_util": 40.0})  # base again: must not overwrite newer's sample
    assert base.series["cpu_util"].samples() == ((1000.0, 1.0), (1015.0, 2.0), (1030.0, 3.0))
    assert newer.series["cpu_util"].values == (1000, 2000, 3000, 4000)
    assert branch.series["cpu_util"].values == (1000, 2000, 3000, 40000)
    assert (newer.average("cpu_util"), branch.average("cpu_util"), base.average("cpu_util")) == (2.5, 11.5, 2.0)


@given(st.lists(st.floats(min_value=0, max_value=1000), min_size=1, max_size=300))
def test_long_runs_keep_the_same_samples_and_sum_as_a_fresh_series(values: list[float]) -> None:
    """Trimming over hundreds of sweeps: the kept samples and their running sum stay exact."""
    window = fed(values)
    series = window.series["cpu_util"]
    assert series.values == tuple(round(v * 1000) for v in values[-4:])  # 60 s at 15 s: 45 s apart, 4 samples
    assert series.total == sum(series.values) and len(series.values) == len(series.stamps)
    assert read(encode(window.to_doc())) == window
