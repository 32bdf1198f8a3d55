"""A session's recent utilization samples: an immutable sliding window, stored as a compact document.

One sample per sweep (every ``interval`` seconds) maps metric -> percent. Each metric keeps its own
series, because a device may miss a reading while the CPU does not.

Rules, chosen so that a window is "full" only when it really observed ``window_seconds`` of the session
(Backend.AI judged after the window's *time* had passed even with samples missing, PR #2205):

* A sample is taken to stand for the ``interval`` before it, so a series covers
  ``(first - interval, last]`` and is **full** once ``last - first >= window_seconds - interval``
  (40 samples for 600 s at 15 s) and its newest sample is fresh (at most ``1.5 × interval`` old).
* A gap of more than ``1.5 × interval`` between two samples (a missed sweep) restarts that series:
  the samples before the hole no longer count toward a full window.
* Adding trims samples older than needed, keeping one sample at or before the window's start, so the
  series never spans much more than the window. The average is the plain mean of the kept samples.
* Samples are stored in fixed point (milliseconds, thousandths of a percent): sums are exact and the JSON
  (:class:`WindowDoc`, written and read by ``core.codec``) is small and quick to write, which matters for 10,000
  sessions per sweep.
* A sample no newer than the last one is ignored (re-running a sweep is harmless).

The window records its own ``window_seconds`` and ``interval``; when the policy changes them,
:func:`record_sample` starts a fresh window rather than reinterpreting old samples.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import sub

MAX_GAP_INTERVALS = 1.5
"""A sample this many intervals after the previous one means a sweep was missed (jitter stays below)."""

JSON_VERSION = 1
SCALE = 1000
"""Fixed point: timestamps in milliseconds, values in thousandths of a percent (exact, compact JSON)."""


@dataclass(frozen=True, slots=True)
class MetricSeries:
    stamps: tuple[int, ...]
    """Unix milliseconds, strictly increasing."""
    values: tuple[int, ...]
    """Thousandths of a percent, one per stamp."""
    total: int = field(init=False, repr=False, compare=False)
    """The sum of ``values`` (thousandths of a percent), kept so an average walks no samples."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", sum(self.values))

    @classmethod
    def _of(cls, stamps: tuple[int, ...], values: tuple[int, ...], total: int) -> MetricSeries:
        """A series whose ``total`` the caller already knows (the sweep's append: no sum over the samples)."""
        series = object.__new__(cls)
        object.__setattr__(series, "stamps", stamps)
        object.__setattr__(series, "values", values)
        object.__setattr__(series, "total", total)
        return series

    def samples(self) -> tuple[tuple[float, float], ...]:
        """(unix seconds, percent) pairs, oldest first."""
        return tuple((stamp / SCALE, value / SCALE) for stamp, value in zip(self.stamps, self.values, strict=True))


@dataclass(frozen=True, slots=True)
class UtilizationWindow:
    window_seconds: float
    interval: float
    series: Mapping[str, MetricSeries] = field(default_factory=dict)
    max_gap_ms: int = field(init=False, repr=False, compare=False)
    """A newer sample further than this from the last one restarts the series."""
    span_needed_ms: int = field(init=False, repr=False, compare=False)
    """How far apart the first and last sample of a full series are."""

    def __post_init__(self) -> None:
        # derived once here: evaluate() reads them for every session of every sweep
        object.__setattr__(self, "max_gap_ms", round(self.interval * MAX_GAP_INTERVALS * SCALE))
        object.__setattr__(self, "span_needed_ms", round(max(self.window_seconds - self.interval, 0.0) * SCALE))

    @classmethod
    def empty(cls, *, window_seconds: float, interval: float) -> UtilizationWindow:
        check_shape(window_seconds, interval)
        return cls(window_seconds=float(window_seconds), interval=float(interval))

    def matches(self, *, window_seconds: float, interval: float) -> bool:
        return self.window_seconds == window_seconds and self.interval == interval

    def add(self, ts: float, metrics: Mapping[str, float]) -> UtilizationWindow:
        """A new window with the sample taken at ``ts`` (unix seconds) appended."""
        stamp, max_gap, forget_after = round(ts * SCALE), self.max_gap_ms, round(self.window_seconds * SCALE)
        if self.series.keys() <= metrics.keys():  # every sweep but one now and then: nothing to forget
            series = dict(self.series)
        else:
            series = {
                # forget metrics the session stopped reporting long ago (a device detached)
                metric: kept
                for metric, kept in self.series.items()
                if metric in metrics or stamp - kept.stamps[-1] <= forget_after + max_gap
            }
        for metric, percent in metrics.items():
            if not math.isfinite(percent):  # a broken reading; a gap is better than a poisoned average
                continue
            value, current = round(percent * SCALE), series.get(metric)
            if current is None or stamp - current.stamps[-1] > max_gap:
                series[metric] = MetricSeries((stamp,), (value,))
            elif stamp > current.stamps[-1]:
                series[metric] = self._appended(current, stamp, value)
        return self._with(series)

    def _with(self, series: Mapping[str, MetricSeries]) -> UtilizationWindow:
        """This window's shape with other series (its derived fields copied rather than computed again)."""
        window = object.__new__(UtilizationWindow)
        set_field = object.__setattr__
        set_field(window, "window_seconds", self.window_seconds)
        set_field(window, "interval", self.interval)
        set_field(window, "series", series)
        set_field(window, "max_gap_ms", self.max_gap_ms)
        set_field(window, "span_needed_ms", self.span_needed_ms)
        return window

    def _appended(self, current: MetricSeries, stamp: int, value: int) -> MetricSeries:
        stamps = current.stamps + (stamp,)
        values = current.values + (value,)
        # keep the newest sample at or before the window's start, and everything after it
        first = bisect_right(stamps, stamp - self.span_needed_ms) - 1
        if first > 0:
            dropped = values[0] if first == 1 else sum(values[:first])
            return MetricSeries._of(stamps[first:], values[first:], current.total + value - dropped)
        return MetricSeries._of(stamps, values, current.total + value)

    def seconds_until_full(self, metric: str, *, now: float) -> float:
        """0 when ``metric`` has a full, fresh window; otherwise the least time still to observe."""
        current = self.series.get(metric)
        if current is None or now * SCALE - current.stamps[-1] > self.max_gap_ms:
            return self.window_seconds  # the next sample starts a new run
        return max(self.span_needed_ms - (current.stamps[-1] - current.stamps[0]), 0) / SCALE

    def is_full(self, metric: str, *, now: float) -> bool:
        return self.seconds_until_full(metric, now=now) == 0.0

    def average(self, metric: str) -> float | None:
        """The mean of ``metric``'s kept samples in percent (full or not: :meth:`is_full` says whether to trust it)."""
        current = self.series.get(metric)
        return current.total / (len(current.values) * SCALE) if current is not None else None

    def averages(self) -> dict[str, float]:
        return {metric: s.total / (len(s.values) * SCALE) for metric, s in self.series.items()}

    # -- the stored form (the idle service keeps one window per session in Redis, through core.codec) --

    def to_doc(self) -> WindowDoc:
        """Metrics sampled together share one stamp list, stored as its first stamp then the differences."""
        tables: dict[tuple[int, ...], int] = {}
        series = {m: (tables.setdefault(s.stamps, len(tables)), s.values) for m, s in self.series.items()}
        stamps = [[s[0], *map(sub, s[1:], s)] for s in tables]
        return WindowDoc(JSON_VERSION, self.window_seconds, self.interval, stamps, series)

    @classmethod
    def from_doc(cls, doc: WindowDoc) -> UtilizationWindow:
        """Raise ``ValueError`` on anything malformed (``core.codec`` has checked the types); the caller then starts
        an empty window."""
        if doc.v != JSON_VERSION:
            raise ValueError(f"unsupported window version {doc.v!r}")
        check_shape(doc.window_seconds, doc.interval)
        tables = [tuple(accumulate(deltas)) for deltas in doc.stamps]
        series = {}
        for metric, (index, values) in doc.series.items():
            if not 0 <= index < len(tables):
                raise ValueError(f"malformed utilization window: no stamp list {index!r}")
            stamps = tables[index]
            if not stamps or len(stamps) != len(values):
                raise ValueError(f"malformed utilization window: series {metric!r} is empty or uneven")
            series[metric] = MetricSeries(stamps, tuple(values))
        return cls(doc.window_seconds, doc.interval, series)


@dataclass(frozen=True, slots=True)
class WindowDoc:
    """A window as Redis keeps it (version 1 of its JSON; ``UtilizationWindow.to_doc`` / ``from_doc``)."""

    v: int
    """The version: 1."""
    window_seconds: float
    interval: float
    """Seconds, as the window's own."""
    stamps: Sequence[Sequence[int]]
    """Stamp lists: each the unix milliseconds of its first sample, then the milliseconds since the one before."""
    series: Mapping[str, tuple[int, Sequence[int]]]
    """Metric -> (the index of its stamp list, its values in thousandths of a percent, one per stamp)."""


def check_shape(window_seconds: float, interval: float) -> None:
    if not (0 < window_seconds < math.inf and 0 < interval < math.inf):
        raise ValueError("window_seconds and interval must be positive")


def record_sample(
    window: UtilizationWindow | None,
    *,
    ts: float,
    sample: Mapping[str, float],
    window_seconds: float,
    interval: float,
    metrics: Collection[str] | None = None,
) -> UtilizationWindow:
    """The window after one sweep's sample; a fresh one if there was none or the policy changed its shape.

    ``metrics`` (the session's checked metrics, :func:`domain.idle.arbiter.checked_thresholds`) keeps only those:
    the others would cost storage and time every sweep without ever being judged.
    """
    if window is None or window.window_seconds != window_seconds or window.interval != interval:
        window = UtilizationWindow.empty(window_seconds=window_seconds, interval=interval)
    if metrics is not None:
        sample = {metric: value for metric, value in sample.items() if metric in metrics}
    return window.add(ts, sample)
