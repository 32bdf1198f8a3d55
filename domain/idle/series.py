"""A session's utilization over its life, per kernel, at a bounded resolution: what the session page charts.

The idle checker samples each kernel once a sweep (``idle.collect``); every :data:`SWEEPS_PER_POINT` sweeps
(:func:`due`, staggered) the session's series gets one :class:`SeriesPoint`: every kernel's sample at that sweep
(metric -> percent) and the thresholds the sweep judged the session by, so a chart draws them on the same axes. A
series never holds more than ``max_points`` points: when it grows past that, :func:`compact` merges the older half
pairwise (a weighted mean per kernel and metric), so the newest points keep their resolution and older ones get
coarser the older they are, as a session ages. Pure: the caller passes the moment of each point and stores the
result (``stores.idle``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

MAX_POINTS = 240
"""Points kept per session: four hours at full resolution (a point a minute at 15-second sweeps), older life coarser."""
SWEEPS_PER_POINT = 4
"""A session gets a point every this many sweeps (its first at once): a point costs about as much as the sweep's report
of the session, which a sweep of many sessions cannot afford every time on top of the rest (``bench/idle``)."""
SERIES_RETENTION = 24 * 3600.0
"""Seconds a session's series is kept after its last point (after the session ends, its page still charts it)."""

KernelSamples = Mapping[str, Mapping[str, float]]
"""Kernel hostname -> metric -> percent."""


class SeriesPoint(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """Stored as a JSON array (``[at, until, weight, kernels, thresholds]``): fewer bytes than an object, quicker to
    write (bench/README.md)."""

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


def due(session_id: str, sweep: int) -> bool:
    """Whether the session gets a point at the leader's ``sweep``-th sweep: every :data:`SWEEPS_PER_POINT` sweeps, its
    turn set by its id (the sessions' points spread evenly over the sweeps, whenever each started)."""
    return (hash(session_id) + sweep) % SWEEPS_PER_POINT == 0


def series_points(
    at: float, kernel_samples: Mapping[str, dict[str, dict[str, float]]], thresholds: Mapping[str, Mapping[str, float]]
) -> dict[str, SeriesPoint]:
    """Session id -> this sweep's point at ``at``, for every session some kernel of which was sampled: its kernels'
    samples as they are (``idle.collect`` makes fresh ones each sweep) and ``thresholds[session id]`` (what its plan
    judges; sessions share a handful of these mappings, each copied once here)."""
    copies: dict[int, dict[str, float]] = {}
    points = {}
    for session_id, kernels in kernel_samples.items():
        if not kernels:
            continue
        judged = thresholds.get(session_id) or _NONE
        copy = copies.get(id(judged))
        if copy is None:
            copy = copies[id(judged)] = dict(judged)
        points[session_id] = SeriesPoint(at, at, 1, kernels, copy)
    return points


_NONE: Mapping[str, float] = {}
