"""A session's utilization over its life, per kernel, at a bounded resolution: what the session page charts.

The idle checker samples each kernel once a sweep (``idle.collect``); each sweep appends one :class:`SeriesPoint` to
the session's series: every kernel's sample (metric -> percent) and the thresholds the sweep judged the session by, so a
chart draws them on the same axes. A series never holds more than ``max_points`` points: when it grows past that,
:func:`compact` merges the older half pairwise (a weighted mean per kernel and metric), so the newest samples keep
the sweep's resolution and older ones get coarser the older they are, as a session ages. Pure: the caller passes the
moment of each point and stores the result (``stores.idle``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from domain.idle.config import CheckName
from domain.idle.verdict import Verdict

MAX_POINTS = 240
"""Points kept per session: an hour at 15-second sweeps at full resolution, the older life coarser."""
SERIES_RETENTION = 24 * 3600.0
"""Seconds a session's series is kept after its last point (after the session ends, its page still charts it)."""

KernelSamples = Mapping[str, Mapping[str, float]]
"""Kernel hostname -> metric -> percent."""


class SeriesPoint(msgspec.Struct, frozen=True, gc=False):
    at: float
    """Unix seconds of the first sweep the point covers."""
    until: float
    """Unix seconds of the last sweep it covers (``at`` for one sweep's point)."""
    weight: int
    """How many sweeps it averages."""
    kernels: dict[str, dict[str, float]]
    thresholds: dict[str, float]
    """Metric -> percent: the thresholds judged at the newest sweep it covers (none when utilization is unchecked)."""


def point(at: float, kernels: KernelSamples, thresholds: Mapping[str, float]) -> SeriesPoint:
    """One sweep's point."""
    return SeriesPoint(at, at, 1, {k: dict(v) for k, v in kernels.items()}, dict(thresholds))


def merge(older: SeriesPoint, newer: SeriesPoint) -> SeriesPoint:
    """Two neighbouring points as one: per kernel and metric the mean weighted by the sweeps each covers (a metric only
    one of them has keeps its value); the newer point's thresholds."""
    kernels: dict[str, dict[str, float]] = {}
    for name in {**older.kernels, **newer.kernels}:
        a, b = older.kernels.get(name, {}), newer.kernels.get(name, {})
        merged: dict[str, float] = {}
        for metric in {**a, **b}:
            if metric in a and metric in b:
                merged[metric] = (a[metric] * older.weight + b[metric] * newer.weight) / (older.weight + newer.weight)
            else:
                merged[metric] = a[metric] if metric in a else b[metric]
        kernels[name] = merged
    return SeriesPoint(older.at, newer.until, older.weight + newer.weight, kernels, dict(newer.thresholds))


def compact(points: Sequence[SeriesPoint], max_points: int = MAX_POINTS) -> list[SeriesPoint]:
    """``points`` (oldest first) within ``max_points``: while there are more, the older half is merged pairwise."""
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    kept = list(points)
    while len(kept) > max_points:
        half = len(kept) // 2
        older = kept[: half - half % 2]
        kept = [merge(older[i], older[i + 1]) for i in range(0, len(older), 2)] + kept[len(older) :]
    return kept


def needs_compaction(length: int, max_points: int = MAX_POINTS) -> bool:
    """Whether a stored series of ``length`` points is rewritten compacted: once it holds half again as many as kept,
    so the rewrite (every point read and written) happens once per ``max_points / 2`` sweeps, not every sweep."""
    return length > max_points + max_points // 2


def judged_thresholds(verdict: Verdict) -> dict[str, float]:
    """Metric -> threshold (percent) the utilization check judged in ``verdict`` (none when it judged none)."""
    return {
        reading.metric: reading.threshold
        for report in verdict.reports
        if report.name is CheckName.UTILIZATION
        for reading in report.readings
    }


def series_points(
    at: float, kernel_samples: Mapping[str, KernelSamples], verdicts: Mapping[str, Verdict]
) -> dict[str, SeriesPoint]:
    """Session id -> this sweep's point at ``at``, for every session some kernel of which was sampled."""
    return {
        session_id: point(at, kernels, judged_thresholds(verdicts[session_id]) if session_id in verdicts else {})
        for session_id, kernels in kernel_samples.items()
        if kernels
    }
