"""An inference endpoint's traffic over time, at a bounded resolution: what the web UI's Endpoints page charts.

The endpoint control plane samples HAProxy's counters every second; every :data:`STEP` seconds an endpoint gets one
:class:`EndpointPoint`: its requests per second over the step (from the request counter, not one sample's rate), and
its routable replicas and in-flight requests at the step's end. A series keeps its last :data:`MAX_POINTS` points (an
hour), so its size and resolution are bounded whatever the endpoint's age. Pure: the caller passes the moments and
stores the points (``stores.endpoint_access``).
"""

from __future__ import annotations

import msgspec

STEP = 5.0
"""Seconds between two points of an endpoint's series."""
MAX_POINTS = 720
"""Points kept per endpoint: the last hour."""


class EndpointPoint(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """Stored as a JSON array (``[at, rps, replicas, in_flight]``)."""

    at: float
    """Unix seconds of the step's end."""
    requests_per_second: float
    """Mean over the step."""
    replicas: int
    """Replicas taking traffic at the step's end."""
    in_flight: int


def due(last_at: float, now: float) -> bool:
    """Whether a point is due at ``now`` after one at ``last_at``."""
    return now - last_at >= STEP


def point(
    now: float, last_at: float, requests: int, last_requests: int, replicas: int, in_flight: int
) -> EndpointPoint:
    """The point of the step from ``last_at`` (the request counter then ``last_requests``) to ``now``."""
    elapsed = now - last_at
    rate = max(0, requests - last_requests) / elapsed if elapsed > 0 else 0.0
    return EndpointPoint(now, round(rate, 3), replicas, in_flight)
