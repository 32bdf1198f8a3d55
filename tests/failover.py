"""What a Redis failover test reports."""

from __future__ import annotations

from collections.abc import Iterable


def longest_gap(times: Iterable[float]) -> float:
    """The longest time between two consecutive acknowledgments (monotonic seconds): the window a failover cost."""
    ordered = sorted(times)
    return max((b - a for a, b in zip(ordered, ordered[1:], strict=False)), default=0.0)
